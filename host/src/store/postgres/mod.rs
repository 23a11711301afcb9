//! The PostgreSQL store: one authority for many replicas. A batch of admissions and
//! completions locks the rows it names, in one order, and runs beside other replicas'
//! batches; anything else has the store to itself (see `locks`). Either way no two
//! transactions ever write the same row at once: no deadlock, no serialization failure to
//! retry, nothing a caller could see as a wrong answer. A batch is four round trips: begin
//! with its locks, read its rows, write them back, commit. The database's clock is the one
//! clock for refill and deadlines.
//!
//! Its rooms: this file holds the connection and the transactions' shape; `tx` the reads
//! and writes one transaction makes; `statements` the SQL; `locks` how replicas share the
//! rows; `op_cache` the operations a batch read and wrote; `wire` a batch's reads and
//! writes as one statement each; `tls` the connection's encryption.

mod locks;
mod op_cache;
mod statements;
mod tls;
mod tx;
mod wire;

use super::row_cache::RowCache;
use super::{
    schema, together_then_apart, BatchAttempt, Isolation, Prefetch, Store, StoreError, Tx,
};
use locks::{Held, RowLock, ENGINE_LOCK};
use op_cache::OpCache;
use postgres::{Client, Statement};
use statements::Statements;
use std::time::{Duration, Instant};
use tx::PgTx;

/// The first wait before connecting again after a failed attempt; it doubles up to
/// [`MOST_RECONNECT_WAIT`], so a database that is down is not hammered.
const FIRST_RECONNECT_WAIT: Duration = Duration::from_millis(100);
const MOST_RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// A connection to the shared PostgreSQL authority.
pub struct PgStore {
    client: Client,
    statements: Statements,
    /// A private schema to drop when the store is dropped (conformance runs).
    scratch_schema: Option<String>,
    /// Where to connect again when the connection is lost, and in which schema.
    url: String,
    search_path: Option<String>,
    /// When the next attempt to connect again may be made, and the wait after a failure.
    next_attempt: Option<Instant>,
    reconnect_wait: Duration,
}

impl PgStore {
    /// Connects to `url` (`postgres://…` or key=value form) and creates or checks the schema.
    ///
    /// # Errors
    /// [`StoreError::Postgres`] when the server cannot be reached or refuses;
    /// [`StoreError::Schema`] when a later release wrote the schema.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(url, None)
    }

    /// As [`PgStore::open`], in a fresh schema of its own that is dropped with the store:
    /// every scenario of a conformance run starts empty, as on SQLite.
    pub fn open_scratch(url: &str, name: &str) -> Result<Self, StoreError> {
        Self::connect(url, Some((name.to_string(), true)))
    }

    /// Another connection to a scratch schema made by [`PgStore::open_scratch`] (a second
    /// replica in a benchmark); it does not drop the schema.
    pub fn open_in_schema(url: &str, name: &str) -> Result<Self, StoreError> {
        Self::connect(url, Some((name.to_string(), false)))
    }

    fn connect(url: &str, schema: Option<(String, bool)>) -> Result<Self, StoreError> {
        let search_path = schema.as_ref().map(|(s, _)| s.clone());
        let mut client = tls::connect(url)?;
        let mut scratch = None;
        if let Some((schema, fresh)) = schema {
            if fresh {
                client.batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
                ))?;
                scratch = Some(schema.clone());
            }
            client.batch_execute(&format!("SET search_path TO \"{schema}\""))?;
        }
        {
            let mut tx = client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ENGINE_LOCK])?;
            tx.batch_execute(&schema::tables("BIGSERIAL PRIMARY KEY", "BYTEA"))?;
            let found: Option<String> = tx
                .query_opt(schema::READ_VERSION_SQL, &[])?
                .map(|r| r.get(0));
            if schema::check_version(found.clone(), schema::POSTGRES_VERSION)? {
                for sql in schema::upgrades(found.as_deref(), schema::POSTGRES_PRIORITY_SINCE) {
                    tx.batch_execute(sql)?;
                }
                tx.execute(
                    &schema::record_version_sql("$1"),
                    &[&schema::POSTGRES_VERSION.to_string()],
                )?;
            }
            tx.commit()?;
        }
        let statements = Statements::prepare(&mut client)?;
        Ok(PgStore {
            client,
            statements,
            scratch_schema: scratch,
            url: url.to_string(),
            search_path,
            next_attempt: None,
            reconnect_wait: FIRST_RECONNECT_WAIT,
        })
    }

    /// Connects again if the connection was lost: at once the first time, then after a
    /// wait that doubles with each failure. While it cannot, every transaction fails with
    /// [`StoreError::Unavailable`] before touching anything.
    fn ensure_connected(&mut self) -> Result<(), StoreError> {
        if !self.client.is_closed() {
            return Ok(());
        }
        if self.next_attempt.is_some_and(|at| Instant::now() < at) {
            return Err(StoreError::Unavailable(
                "the database connection is lost; connecting again".into(),
            ));
        }
        let attempt = (|| -> Result<(Client, Statements), StoreError> {
            let mut client = tls::connect(&self.url)?;
            if let Some(schema) = &self.search_path {
                client.batch_execute(&format!("SET search_path TO \"{schema}\""))?;
            }
            let statements = Statements::prepare(&mut client)?;
            Ok((client, statements))
        })();
        match attempt {
            Ok((client, statements)) => {
                self.client = client;
                self.statements = statements;
                self.next_attempt = None;
                self.reconnect_wait = FIRST_RECONNECT_WAIT;
                tracing::info!("connected to the database again");
                Ok(())
            }
            Err(e) => {
                self.next_attempt = Some(Instant::now() + self.reconnect_wait);
                self.reconnect_wait = (self.reconnect_wait * 2).min(MOST_RECONNECT_WAIT);
                Err(StoreError::Unavailable(format!(
                    "connecting to the database again: {e}"
                )))
            }
        }
    }

    /// `e` as the store's absence when the connection is gone or the server is shutting
    /// down or starting up (SQLSTATE class 08, 57P01 to 57P03).
    fn classify(&self, e: StoreError) -> StoreError {
        let Some(pe) = (match &e {
            StoreError::Postgres(source) => source.downcast_ref::<postgres::Error>(),
            _ => None,
        }) else {
            return e;
        };
        let lost = self.client.is_closed()
            || pe.is_closed()
            || pe.code().is_some_and(|c| {
                let code = c.code();
                code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
            });
        if lost {
            StoreError::Unavailable(pe.to_string())
        } else if pe.code().is_some_and(|c| c.code() == "53100") {
            StoreError::DiskFull(pe.to_string())
        } else {
            e
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(schema) = &self.scratch_schema {
            let _ = self
                .client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}

/// An open transaction on the connection: rolled back when dropped uncommitted, so every
/// early return leaves the connection clean.
struct Open<'c> {
    client: &'c mut Client,
    done: bool,
}

impl<'c> Open<'c> {
    /// Sends `begin` (a `BEGIN` and the locks, one round trip).
    fn begin(client: &'c mut Client, begin: &str) -> Result<Self, StoreError> {
        let open = Open {
            client,
            done: false,
        };
        open.client.batch_execute(begin)?;
        Ok(open)
    }

    /// Writes the caches' changes with `flush` and commits.
    fn commit(
        mut self,
        flush: &Statement,
        rows: &mut RowCache,
        ops: &mut OpCache,
    ) -> Result<(), StoreError> {
        wire::write(self.client, flush, ops, rows)?;
        self.client.batch_execute("COMMIT")?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.client.batch_execute("ROLLBACK");
        }
    }
}

impl Store for PgStore {
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.ensure_connected()?;
        // The outer error is the store's own (begin, lock, commit); the inner one `f`'s.
        let attempt = (|| -> Result<Result<T, E>, StoreError> {
            let open = Open::begin(&mut self.client, &Held::begin_exclusive_sql())?;
            let mut rows = RowCache::default();
            let mut ops = OpCache::default();
            let mut held = Held::Exclusive;
            let result = f(&mut PgTx {
                client: open.client,
                st: &self.statements,
                rows: &mut rows,
                ops: &mut ops,
                held: &mut held,
                now_ms: None,
            });
            if result.is_ok() {
                open.commit(&self.statements.flush, &mut rows, &mut ops)?;
            }
            Ok(result)
        })();
        match attempt {
            Ok(result) => result,
            Err(e) => Err(self.classify(e).into()),
        }
    }

    fn transaction_many<T>(
        &mut self,
        n: usize,
        f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.transaction_batch(n, &Prefetch::default(), f)
    }

    /// Together first, with savepoints only if a job failed (see `Isolation`); with the
    /// hint's rows locked when it names all the batch writes, else (or when a job reached a
    /// row another replica held) with the store to itself.
    fn transaction_batch<T>(
        &mut self,
        n: usize,
        hint: &Prefetch,
        mut f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.ensure_connected()?;
        let mut exclusive = !hint.complete;
        loop {
            let run = together_then_apart(|isolation| {
                self.run_batch(n, hint, exclusive, &mut f, isolation)
            });
            return match run {
                Err(StoreError::Contended) if !exclusive => {
                    tracing::debug!("a batch met a row held elsewhere; running it alone");
                    exclusive = true;
                    continue;
                }
                Ok(results) => Ok(results
                    .into_iter()
                    .map(|r| r.map_err(|e| self.classify(e)))
                    .collect()),
                Err(e) => Err(self.classify(e)),
            };
        }
    }

    fn clock_ms(&mut self) -> Result<Option<i64>, StoreError> {
        self.ensure_connected()?;
        match self.client.query_one(&self.statements.clock, &[]) {
            Ok(row) => Ok(Some(row.get(0))),
            Err(e) => Err(self.classify(e.into())),
        }
    }
}

/// The locks a batch with `hint` takes: the rows it names, or the whole store.
fn batch_locks(hint: &Prefetch, exclusive: bool) -> (String, Held) {
    if exclusive {
        return (Held::begin_exclusive_sql(), Held::Exclusive);
    }
    let rows = hint
        .buckets
        .iter()
        .map(|b| RowLock::bucket(b))
        .chain(hint.slots.iter().map(|s| RowLock::slots(s)))
        .chain(hint.queues.iter().map(|t| RowLock::queue(t)))
        .chain(
            hint.operations
                .iter()
                .map(|(t, k)| RowLock::operation(t, k)),
        );
    Held::begin_shared(rows)
}

impl PgStore {
    /// Runs the jobs in one transaction and commits it; `None` (nothing written) when a
    /// job failed under [`Isolation::Together`]; [`StoreError::Contended`] (nothing
    /// written) when a job reached a row another replica held.
    fn run_batch<T>(
        &mut self,
        n: usize,
        hint: &Prefetch,
        exclusive: bool,
        f: &mut impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
        isolation: Isolation,
    ) -> BatchAttempt<T> {
        let savepoints = isolation == Isolation::Savepoints;
        // One cache for the batch: rows read once, written once before the commit.
        let mut rows = RowCache::default();
        let mut ops = OpCache::default();
        // Begin and lock in one round trip, then read the hint's rows in one statement, the
        // database's clock with them, after the locks were granted.
        let (begin, mut held) = batch_locks(hint, exclusive);
        let open = Open::begin(&mut self.client, &begin)?;
        let mut out = Vec::with_capacity(n);
        let mut tx = PgTx {
            client: open.client,
            st: &self.statements,
            rows: &mut rows,
            ops: &mut ops,
            held: &mut held,
            now_ms: None,
        };
        tx.prefetch(hint)?;
        for i in 0..n {
            if savepoints {
                tx.client.batch_execute("SAVEPOINT item")?;
            }
            let result = f(i, &mut tx);
            match (&result, savepoints) {
                // Dropping `open` rolls the attempt back.
                (Err(StoreError::Contended), _) => return Err(StoreError::Contended),
                (Ok(_), true) => {
                    tx.rows.keep();
                    tx.ops.keep();
                    tx.client.batch_execute("RELEASE SAVEPOINT item")?
                }
                (Err(_), true) => {
                    // The piece's cached changes go with its SQL ones.
                    tx.rows.roll_back();
                    tx.ops.roll_back();
                    tx.client
                        .batch_execute("ROLLBACK TO SAVEPOINT item; RELEASE SAVEPOINT item")?
                }
                (Ok(_), false) => {
                    tx.rows.keep();
                    tx.ops.keep();
                }
                (Err(_), false) => return Ok(None),
            }
            out.push(result);
        }
        open.commit(&self.statements.flush, &mut rows, &mut ops)?;
        Ok(Some(out))
    }
}
