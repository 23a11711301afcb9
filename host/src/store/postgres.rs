//! The PostgreSQL store: one authority for many replicas. A batch of admissions and
//! completions locks the rows it names, in one order, and runs beside other replicas'
//! batches; anything else has the store to itself (see `pg_locks`). Either way no two
//! transactions ever write the same row at once: no deadlock, no serialization failure to
//! retry, nothing a caller could see as a wrong answer. A batch is four round trips: begin
//! with its locks, read its rows, write them back, commit. The database's clock is the one
//! clock for refill and deadlines.

use super::op_cache::OpCache;
use super::pg_locks::{Held, RowLock, ENGINE_LOCK};
use super::pg_wire::{self, Wanted};
use super::row_cache::RowCache;
use super::{
    schema, together_then_apart, BatchAttempt, Isolation, Prefetch, QueuedJob, Store, StoreError,
    StoredKey, Tx,
};
use crate::bucket;
use crate::model::{Operation, Priority};
use postgres::{Client, Row, Statement};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first wait before connecting again after a failed attempt; it doubles up to
/// [`MOST_RECONNECT_WAIT`], so a database that is down is not hammered.
const FIRST_RECONNECT_WAIT: Duration = Duration::from_millis(100);
const MOST_RECONNECT_WAIT: Duration = Duration::from_secs(2);

const STATEMENTS: &[(&str, &str)] = &[
    ("bucket", "SELECT balance_micro, updated_ms FROM buckets WHERE name = $1"),
    ("slots", "SELECT in_use FROM slots WHERE scope = $1"),
    ("flush_operations", "INSERT INTO operations (tenant, key, state, worker, record)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        ON CONFLICT (tenant, key) DO UPDATE SET state = EXCLUDED.state,
        worker = EXCLUDED.worker, record = EXCLUDED.record"),
    ("prefetch", "SELECT 0::int2, name, NULL::text, balance_micro, updated_ms, NULL::text
            FROM buckets WHERE name = ANY($1)
        UNION ALL SELECT 1::int2, scope, NULL::text, in_use, NULL::bigint, NULL::text
            FROM slots WHERE scope = ANY($2)
        UNION ALL SELECT 2::int2, tenant, key, NULL::bigint, NULL::bigint, record
            FROM operations WHERE tenant = ANY($3) AND key = ANY($4)
        UNION ALL SELECT 3::int2, name, NULL::text, NULL::bigint, NULL::bigint, value
            FROM meta WHERE name = ANY($5)
        UNION ALL SELECT 4::int2, '', NULL::text,
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint, NULL::bigint, NULL::text"),
    ("flush", "WITH o AS (INSERT INTO operations (tenant, key, state, worker, record)
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
            ON CONFLICT (tenant, key) DO UPDATE SET state = EXCLUDED.state,
            worker = EXCLUDED.worker, record = EXCLUDED.record),
        b AS (INSERT INTO buckets (name, balance_micro, updated_ms)
            SELECT * FROM unnest($6::text[], $7::bigint[], $8::bigint[])
            ON CONFLICT (name) DO UPDATE SET balance_micro = EXCLUDED.balance_micro,
            updated_ms = EXCLUDED.updated_ms),
        s AS (INSERT INTO slots (scope, in_use) SELECT * FROM unnest($9::text[], $10::bigint[])
            ON CONFLICT (scope) DO UPDATE SET in_use = EXCLUDED.in_use)
        SELECT 1"),
    ("clock", "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"),
    ("try_lock", "SELECT pg_try_advisory_xact_lock($1, $2)"),
    ("operation", "SELECT record FROM operations WHERE tenant = $1 AND key = $2"),
    ("operations", "SELECT tenant, key, record FROM operations ORDER BY tenant, key"),
    ("operations_after", "SELECT tenant, key, record FROM operations
        WHERE (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3"),
    ("unknown_after", "SELECT tenant, key, record FROM operations
        WHERE state = 'unknown' AND (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3"),
    ("delete_operation", "DELETE FROM operations WHERE tenant = $1 AND key = $2"),
    ("delete_operation_answer", "DELETE FROM answers WHERE tenant = $1 AND key = $2"),
    ("rename_worker", "UPDATE operations SET worker = $2,
        record = jsonb_set(record::jsonb, '{worker}', to_jsonb($2::text))::text WHERE worker = $1"),
    ("count_unknown", "SELECT COUNT(*) FROM operations WHERE state = 'unknown'"),
    ("unfinished", "SELECT COUNT(*) FROM operations WHERE worker = $1 AND state IN ('active', 'unknown')"),
    ("meta", "SELECT value FROM meta WHERE name = $1"),
    ("set_meta", "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2"),
    ("enqueue", "INSERT INTO queue (tenant, key, tokens, not_before_ms, expire_at_ms, priority) VALUES ($1, $2, $3, $4, $5, $6)"),
    ("depth_up", "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES ($1, 1, 0)
        ON CONFLICT (tenant) DO UPDATE SET depth = tenant_queues.depth + 1"),
    ("dequeue", "DELETE FROM queue WHERE tenant = $1 AND key = $2"),
    ("depth_down", "UPDATE tenant_queues SET depth = depth - $2 WHERE tenant = $1"),
    ("depth", "SELECT depth FROM tenant_queues WHERE tenant = $1"),
    ("ready_head", "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
        WHERE priority = $3 AND tenant = $1 AND not_before_ms <= $2 ORDER BY seq LIMIT 1"),
    ("next_after", "SELECT tenant FROM queue WHERE priority = $2 AND tenant > $1 ORDER BY tenant LIMIT 1"),
    ("next_first", "SELECT tenant FROM queue WHERE priority = $1 ORDER BY tenant LIMIT 1"),
    ("band_has_jobs", "SELECT EXISTS (SELECT 1 FROM queue WHERE priority = $2 AND tenant = $1)"),
    ("infeasible", "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
        WHERE expire_at_ms <= $1 ORDER BY expire_at_ms, seq"),
    ("deficit", "SELECT deficit FROM tenant_queues WHERE tenant = $1"),
    ("policy_component", "SELECT bytes FROM policies WHERE digest = $1"),
    ("answer", "SELECT bytes FROM answers WHERE tenant = $1 AND key = $2 AND expires_ms > $3"),
    ("put_answer", "INSERT INTO answers (tenant, key, expires_ms, size, bytes) VALUES ($1, $2, $3, $4, $5) \
        ON CONFLICT (tenant, key) DO UPDATE SET expires_ms = EXCLUDED.expires_ms, size = EXCLUDED.size, bytes = EXCLUDED.bytes"),
    ("delete_answers", "DELETE FROM answers WHERE ctid IN \
        (SELECT ctid FROM answers WHERE expires_ms <= $1 ORDER BY expires_ms LIMIT $2)"),
    ("answer_bytes", "SELECT COALESCE(SUM(size), 0)::BIGINT FROM answers"),
    ("put_policy_component", "INSERT INTO policies (digest, bytes) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING"),
    ("written_tenants", "SELECT name, written FROM tenants ORDER BY name"),
    ("put_written_tenant", "INSERT INTO tenants (name, written) VALUES ($1, $2)
        ON CONFLICT (name) DO UPDATE SET written = $2"),
    ("delete_written_tenant", "DELETE FROM tenants WHERE name = $1"),
    ("tenant_has_work", "SELECT EXISTS (SELECT 1 FROM operations WHERE tenant = $1
        AND state IN ('queued', 'active', 'unknown', 'retry_pending'))"),
    ("api_keys", "SELECT id, sha256, role, subject FROM api_keys ORDER BY id"),
    ("put_api_key", "INSERT INTO api_keys (id, sha256, role, subject) VALUES ($1, $2, $3, $4)"),
    ("delete_api_key", "DELETE FROM api_keys WHERE id = $1"),
    ("retain_policy_components", "DELETE FROM policies WHERE digest NOT IN ($1, $2, $3)"),
    ("set_deficit", "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES ($1, 0, $2)
        ON CONFLICT (tenant) DO UPDATE SET deficit = $2"),
];

/// A connection to the shared PostgreSQL authority.
pub struct PgStore {
    client: Client,
    statements: HashMap<&'static str, Statement>,
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
        let mut client = super::postgres_tls::connect(url)?;
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
        let statements = prepare(&mut client)?;
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
        let attempt = (|| -> Result<(Client, HashMap<&'static str, Statement>), StoreError> {
            let mut client = super::postgres_tls::connect(&self.url)?;
            if let Some(schema) = &self.search_path {
                client.batch_execute(&format!("SET search_path TO \"{schema}\""))?;
            }
            let statements = prepare(&mut client)?;
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
        let StoreError::Postgres(pe) = &e else {
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
        } else {
            e
        }
    }
}

/// Prepares every statement the store uses on `client`.
fn prepare(client: &mut Client) -> Result<HashMap<&'static str, Statement>, StoreError> {
    let mut statements = HashMap::new();
    for (name, sql) in STATEMENTS {
        statements.insert(*name, client.prepare(sql)?);
    }
    Ok(statements)
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
        pg_wire::write(self.client, flush, ops, rows)?;
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
                open.commit(&self.statements["flush"], &mut rows, &mut ops)?;
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
        match self.client.query_one(&self.statements["clock"], &[]) {
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
        open.commit(&self.statements["flush"], &mut rows, &mut ops)?;
        Ok(Some(out))
    }
}

struct PgTx<'a> {
    client: &'a mut Client,
    st: &'a HashMap<&'static str, Statement>,
    rows: &'a mut RowCache,
    ops: &'a mut OpCache,
    /// What the transaction holds; a row outside it is locked only if free at once.
    held: &'a mut Held,
    /// The database's clock, once read in this transaction.
    now_ms: Option<i64>,
}

fn job(r: &Row) -> QueuedJob {
    QueuedJob {
        tenant: r.get(0),
        key: r.get(1),
        tokens: r.get::<_, i64>(2) as u64,
        not_before_ms: r.get(3),
        expire_at_ms: r.get(4),
        priority: crate::model::Priority::from_rank(r.get(5)),
    }
}

impl PgTx<'_> {
    fn opt(
        &mut self,
        name: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.client.query_opt(&self.st[name], params)?)
    }

    fn exec(
        &mut self,
        name: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        Ok(self.client.execute(&self.st[name], params)?)
    }

    /// Holds `row`'s lock: already held, or taken now if it is free at once (never a wait
    /// out of order); [`StoreError::Contended`] when another replica holds it.
    fn need(&mut self, row: RowLock) -> Result<(), StoreError> {
        let Held::Shared(held) = &mut *self.held else {
            return Ok(());
        };
        if held.contains(&row) {
            return Ok(());
        }
        let (a, b) = row.keys();
        let got: bool = self
            .client
            .query_one(&self.st["try_lock"], &[&a, &b])?
            .get(0);
        if !got {
            return Err(StoreError::Contended);
        }
        held.insert(row);
        Ok(())
    }

    /// Holds the whole store: what reaches beyond named rows runs only alone.
    fn need_store(&mut self) -> Result<(), StoreError> {
        match self.held {
            Held::Exclusive => Ok(()),
            Held::Shared(_) => Err(StoreError::Contended),
        }
    }

    /// Writes the cached operations before a statement that reads the table.
    fn flush_operations(&mut self) -> Result<(), StoreError> {
        pg_wire::write_operations(self.client, &self.st["flush_operations"], self.ops)
    }

    /// A page of operations by the statement `name` (after a tenant and key, at most `limit`).
    fn page(
        &mut self,
        name: &str,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        let (tenant, key) = after.unwrap_or(("", ""));
        let rows = self
            .client
            .query(&self.st[name], &[&tenant, &key, &i64::from(limit)])?;
        rows.iter().map(operation).collect()
    }
}

fn operation(r: &Row) -> Result<Operation, StoreError> {
    Ok(Operation::from_record(
        r.get(0),
        r.get(1),
        r.get::<_, &str>(2),
    )?)
}

impl Tx for PgTx<'_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.rows.bucket(name) {
            return Ok(s);
        }
        self.need(RowLock::bucket(name))?;
        let s = self.opt("bucket", &[&name])?.map(|r| bucket::State {
            balance_micro: r.get(0),
            updated_ms: r.get(1),
        });
        self.rows.bucket_read(name, s);
        Ok(s)
    }
    fn set_bucket(&mut self, name: &str, s: bucket::State) -> Result<(), StoreError> {
        self.need(RowLock::bucket(name))?;
        self.rows.set_bucket(name, s);
        Ok(())
    }
    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.rows.slots(scope) {
            return Ok(n);
        }
        self.need(RowLock::slots(scope))?;
        let n = self
            .opt("slots", &[&scope])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32);
        self.rows.slots_read(scope, n);
        Ok(n)
    }
    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError> {
        self.need(RowLock::slots(scope))?;
        self.rows.set_slots(scope, in_use);
        Ok(())
    }
    /// Reads the hint's rows in one statement. The transaction holds them already (their
    /// locks or the whole store), so what is read stays true until the commit.
    fn prefetch(&mut self, hint: &Prefetch) -> Result<(), StoreError> {
        let now_ms = Wanted::of(hint, self.rows, self.ops).read(
            self.client,
            &self.st["prefetch"],
            self.rows,
            self.ops,
        )?;
        self.now_ms.get_or_insert(now_ms);
        Ok(())
    }
    fn store_now_ms(&mut self) -> Result<Option<i64>, StoreError> {
        if self.now_ms.is_none() {
            self.now_ms = Some(self.client.query_one(&self.st["clock"], &[])?.get(0));
        }
        Ok(self.now_ms)
    }
    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        if let Some(op) = self.ops.get(tenant, key) {
            return Ok(op);
        }
        self.need(RowLock::operation(tenant, key))?;
        let op = match self.opt("operation", &[&tenant, &key])? {
            Some(r) => Some(Operation::from_record(
                tenant.to_string(),
                key.to_string(),
                r.get::<_, &str>(0),
            )?),
            None => None,
        };
        self.ops.read(tenant, key, op.clone());
        Ok(op)
    }
    fn put_operation(&mut self, op: &Operation) -> Result<(), StoreError> {
        self.need(RowLock::operation(&op.tenant, &op.key))?;
        self.ops.put(op);
        Ok(())
    }
    fn operations(&mut self) -> Result<Vec<Operation>, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        let rows = self.client.query(&self.st["operations"], &[])?;
        rows.iter().map(operation).collect()
    }
    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page("operations_after", after, limit)
    }
    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page("unknown_after", after, limit)
    }
    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        // Cached copies would carry the old name: read them again.
        *self.ops = OpCache::default();
        self.exec("rename_worker", &[&from, &to])
    }
    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        self.exec("delete_operation", &[&tenant, &key])?;
        // Its saved answer goes with it: the key is new again.
        self.exec("delete_operation_answer", &[&tenant, &key])?;
        self.ops.deleted(tenant, key);
        Ok(())
    }
    fn count_unknown(&mut self) -> Result<u64, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        let row = self.opt("count_unknown", &[])?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }
    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        Ok(self
            .opt("unfinished", &[&worker])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32))
    }
    /// Meta rows are written only with the store held whole, so any transaction reads them.
    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        if let Some(v) = self.rows.meta(name) {
            return Ok(v);
        }
        let v: Option<String> = self.opt("meta", &[&name])?.map(|r| r.get(0));
        self.rows.meta_read(name, v.clone());
        Ok(v)
    }
    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec("set_meta", &[&name, &value])?;
        self.rows.meta_written(name, value);
        Ok(())
    }
    fn enqueue(&mut self, j: &QueuedJob) -> Result<(), StoreError> {
        self.need(RowLock::queue(&j.tenant))?;
        self.exec(
            "enqueue",
            &[
                &j.tenant,
                &j.key,
                &(j.tokens as i64),
                &j.not_before_ms,
                &j.expire_at_ms,
                &j.priority.rank(),
            ],
        )?;
        self.exec("depth_up", &[&j.tenant]).map(drop)
    }
    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.need(RowLock::queue(tenant))?;
        let removed = self.exec("dequeue", &[&tenant, &key])?;
        if removed > 0 {
            self.exec("depth_down", &[&tenant, &(removed as i64)])?;
        }
        Ok(())
    }
    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
        self.need(RowLock::queue(tenant))?;
        Ok(self
            .opt("depth", &[&tenant])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32))
    }
    fn ready_head(
        &mut self,
        tenant: &str,
        band: Priority,
        now_ms: i64,
    ) -> Result<Option<QueuedJob>, StoreError> {
        self.need_store()?;
        Ok(self
            .opt("ready_head", &[&tenant, &now_ms, &band.rank()])?
            .map(|r| job(&r)))
    }
    fn next_backlogged(
        &mut self,
        band: Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.need_store()?;
        let row = match after {
            Some(after) => self.opt("next_after", &[&after, &band.rank()])?,
            None => self.opt("next_first", &[&band.rank()])?,
        };
        Ok(row.map(|r| r.get(0)))
    }
    fn answer(
        &mut self,
        tenant: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.need(RowLock::operation(tenant, key))?;
        Ok(self
            .opt("answer", &[&tenant, &key, &now_ms])?
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }
    fn put_answer(
        &mut self,
        tenant: &str,
        key: &str,
        expires_ms: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.need(RowLock::operation(tenant, key))?;
        let size = bytes.len() as i64;
        self.exec("put_answer", &[&tenant, &key, &expires_ms, &size, &bytes])
            .map(drop)
    }
    fn delete_answers(&mut self, by_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.need_store()?;
        self.exec("delete_answers", &[&by_ms, &i64::from(limit)])
    }
    fn answer_bytes(&mut self) -> Result<u64, StoreError> {
        self.need_store()?;
        let row = self.client.query_one(&self.st["answer_bytes"], &[])?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .opt("policy_component", &[&digest])?
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }
    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec("put_policy_component", &[&digest, &bytes])
            .map(drop)
    }
    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self.client.query(&self.st["written_tenants"], &[])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec("put_written_tenant", &[&name, &written])
            .map(drop)
    }
    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self.exec("delete_written_tenant", &[&name])? > 0)
    }
    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        Ok(self
            .opt("tenant_has_work", &[&tenant])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn api_keys(&mut self) -> Result<Vec<StoredKey>, StoreError> {
        let rows = self.client.query(&self.st["api_keys"], &[])?;
        Ok(rows
            .iter()
            .map(|r| StoredKey {
                id: r.get(0),
                sha256: r.get(1),
                role: r.get(2),
                subject: r.get(3),
            })
            .collect())
    }
    fn put_api_key(&mut self, key: &StoredKey) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            "put_api_key",
            &[&key.id, &key.sha256, &key.role, &key.subject],
        )
        .map(drop)
    }
    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self.exec("delete_api_key", &[&id])? > 0)
    }
    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec("retain_policy_components", &[&keep[0], &keep[1], &keep[2]])
            .map(drop)
    }
    fn band_has_jobs(&mut self, tenant: &str, band: Priority) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self
            .opt("band_has_jobs", &[&tenant, &band.rank()])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        self.need_store()?;
        Ok(self
            .client
            .query(&self.st["infeasible"], &[&now_ms])?
            .iter()
            .map(job)
            .collect())
    }
    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        self.need_store()?;
        Ok(self
            .opt("deficit", &[&tenant])?
            .map_or(0, |r| r.get::<_, i64>(0) as u64))
    }
    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            "set_deficit",
            &[&tenant, &(deficit.min(i64::MAX as u64) as i64)],
        )
        .map(drop)
    }
}
