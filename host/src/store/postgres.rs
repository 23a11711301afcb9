//! The PostgreSQL store: one authority for many replicas. Every transaction first takes one
//! transaction-scoped advisory lock, so the engine's transactions are serialised across all
//! replicas exactly as SQLite serialises them within one process (no deadlock, no
//! serialization failure to retry, nothing a caller could see as a wrong answer). The
//! database's clock is the one clock for refill and deadlines.

use super::op_cache::OpCache;
use super::row_cache::RowCache;
use super::{
    schema, together_then_apart, BatchAttempt, Isolation, Prefetch, QueuedJob, Store, StoreError,
    StoredKey, Tx,
};
use crate::bucket;
use crate::model::{Operation, Priority};
use postgres::{Client, Row, Statement, Transaction};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The first wait before connecting again after a failed attempt; it doubles up to
/// [`MOST_RECONNECT_WAIT`], so a database that is down is not hammered.
const FIRST_RECONNECT_WAIT: Duration = Duration::from_millis(100);
const MOST_RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// The advisory lock every engine transaction takes first.
const ENGINE_LOCK: i64 = 0x746f_6c6c_6761_7465; // "tollgate"

const STATEMENTS: &[(&str, &str)] = &[
    ("bucket", "SELECT balance_micro, updated_ms FROM buckets WHERE name = $1"),
    ("slots", "SELECT in_use FROM slots WHERE scope = $1"),
    ("flush_buckets", "INSERT INTO buckets (name, balance_micro, updated_ms)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
        ON CONFLICT (name) DO UPDATE SET balance_micro = EXCLUDED.balance_micro,
        updated_ms = EXCLUDED.updated_ms"),
    ("flush_operations", "INSERT INTO operations (tenant, key, state, worker, record)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        ON CONFLICT (tenant, key) DO UPDATE SET state = EXCLUDED.state,
        worker = EXCLUDED.worker, record = EXCLUDED.record"),
    ("prefetch_buckets", "SELECT name, balance_micro, updated_ms FROM buckets WHERE name = ANY($1)"),
    ("prefetch_slots", "SELECT scope, in_use FROM slots WHERE scope = ANY($1)"),
    ("prefetch_operations", "SELECT tenant, key, record FROM operations
        WHERE tenant = ANY($1) AND key = ANY($2)"),
    ("flush_slots", "INSERT INTO slots (scope, in_use) SELECT * FROM unnest($1::text[], $2::bigint[])
        ON CONFLICT (scope) DO UPDATE SET in_use = EXCLUDED.in_use"),
    ("operation", "SELECT record FROM operations WHERE tenant = $1 AND key = $2"),
    ("operations", "SELECT tenant, key, record FROM operations ORDER BY tenant, key"),
    ("operations_after", "SELECT tenant, key, record FROM operations
        WHERE (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3"),
    ("unknown_after", "SELECT tenant, key, record FROM operations
        WHERE state = 'unknown' AND (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3"),
    ("delete_operation", "DELETE FROM operations WHERE tenant = $1 AND key = $2"),
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

impl Store for PgStore {
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.ensure_connected()?;
        // The outer error is the store's own (begin, lock, commit); the inner one `f`'s.
        let attempt = (|| -> Result<Result<T, E>, StoreError> {
            let mut tx = self.client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ENGINE_LOCK])?;
            let mut rows = RowCache::default();
            let mut ops = OpCache::default();
            let result = f(&mut PgTx {
                tx: &mut tx,
                st: &self.statements,
                rows: &mut rows,
                ops: &mut ops,
            });
            if result.is_ok() {
                flush(&mut tx, &self.statements, &mut rows, &mut ops)?;
                tx.commit()?;
            }
            Ok(result)
        })();
        match attempt {
            Ok(result) => result,
            Err(e) => Err(self.classify(e).into()),
        }
    }

    /// Together first, with savepoints only if a job failed (see `Isolation`).
    fn transaction_many<T>(
        &mut self,
        n: usize,
        mut f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.ensure_connected()?;
        match together_then_apart(|isolation| self.run_batch(n, &mut f, isolation)) {
            Ok(results) => Ok(results
                .into_iter()
                .map(|r| r.map_err(|e| self.classify(e)))
                .collect()),
            Err(e) => Err(self.classify(e)),
        }
    }

    fn clock_ms(&mut self) -> Result<Option<i64>, StoreError> {
        self.ensure_connected()?;
        match self.client.query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        ) {
            Ok(row) => Ok(Some(row.get(0))),
            Err(e) => Err(self.classify(e.into())),
        }
    }
}

impl PgStore {
    /// Runs the jobs in one transaction and commits it; `None` (nothing written) when a
    /// job failed under [`Isolation::Together`].
    fn run_batch<T>(
        &mut self,
        n: usize,
        f: &mut impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
        isolation: Isolation,
    ) -> BatchAttempt<T> {
        let savepoints = isolation == Isolation::Savepoints;
        let mut tx = self.client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ENGINE_LOCK])?;
        let mut out = Vec::with_capacity(n);
        // One cache for the batch: rows read once, written once before the commit.
        let mut rows = RowCache::default();
        let mut ops = OpCache::default();
        for i in 0..n {
            if savepoints {
                tx.batch_execute("SAVEPOINT item")?;
            }
            let result = f(
                i,
                &mut PgTx {
                    tx: &mut tx,
                    st: &self.statements,
                    rows: &mut rows,
                    ops: &mut ops,
                },
            );
            match (&result, savepoints) {
                (Ok(_), true) => {
                    rows.keep();
                    ops.keep();
                    tx.batch_execute("RELEASE SAVEPOINT item")?
                }
                (Err(_), true) => {
                    // The piece's cached changes go with its SQL ones.
                    rows.roll_back();
                    ops.roll_back();
                    tx.batch_execute("ROLLBACK TO SAVEPOINT item; RELEASE SAVEPOINT item")?
                }
                (Ok(_), false) => {
                    rows.keep();
                    ops.keep();
                }
                // Dropping `tx` rolls it back.
                (Err(_), false) => return Ok(None),
            }
            out.push(result);
        }
        flush(&mut tx, &self.statements, &mut rows, &mut ops)?;
        tx.commit()?;
        Ok(Some(out))
    }
}

struct PgTx<'a, 'b> {
    tx: &'a mut Transaction<'b>,
    st: &'a HashMap<&'static str, Statement>,
    rows: &'a mut RowCache,
    ops: &'a mut OpCache,
}

/// Writes the operations the transaction changed so far, in one statement.
fn flush_operations(
    tx: &mut Transaction<'_>,
    st: &HashMap<&'static str, Statement>,
    ops: &mut OpCache,
) -> Result<(), StoreError> {
    let dirty = ops.take_dirty();
    if dirty.is_empty() {
        return Ok(());
    }
    let mut records = Vec::with_capacity(dirty.len());
    for op in &dirty {
        records.push(serde_json::to_string(op)?);
    }
    let tenants: Vec<&str> = dirty.iter().map(|o| o.tenant.as_str()).collect();
    let keys: Vec<&str> = dirty.iter().map(|o| o.key.as_str()).collect();
    let states: Vec<&str> = dirty.iter().map(|o| o.state.as_str()).collect();
    let workers: Vec<Option<&str>> = dirty.iter().map(|o| o.worker.as_deref()).collect();
    tx.execute(
        &st["flush_operations"],
        &[&tenants, &keys, &states, &workers, &records],
    )?;
    Ok(())
}

/// Writes what the transaction changed: operations, then buckets and slot counts, one
/// statement each (rows in key order, so concurrent writers would lock them in one order).
fn flush(
    tx: &mut Transaction<'_>,
    st: &HashMap<&'static str, Statement>,
    rows: &mut RowCache,
    ops: &mut OpCache,
) -> Result<(), StoreError> {
    flush_operations(tx, st, ops)?;
    let flush = rows.take_flush();
    if !flush.buckets.is_empty() {
        let names: Vec<&str> = flush.buckets.iter().map(|(n, _)| n.as_str()).collect();
        let balances: Vec<i64> = flush.buckets.iter().map(|(_, s)| s.balance_micro).collect();
        let updated: Vec<i64> = flush.buckets.iter().map(|(_, s)| s.updated_ms).collect();
        tx.execute(&st["flush_buckets"], &[&names, &balances, &updated])?;
    }
    if !flush.slots.is_empty() {
        let scopes: Vec<&str> = flush.slots.iter().map(|(s, _)| s.as_str()).collect();
        let in_use: Vec<i64> = flush.slots.iter().map(|(_, n)| i64::from(*n)).collect();
        tx.execute(&st["flush_slots"], &[&scopes, &in_use])?;
    }
    Ok(())
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

impl PgTx<'_, '_> {
    fn opt(
        &mut self,
        name: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.tx.query_opt(&self.st[name], params)?)
    }

    /// Writes the cached operations before a statement that reads the table.
    fn flush_operations(&mut self) -> Result<(), StoreError> {
        flush_operations(self.tx, self.st, self.ops)
    }

    /// A page of operations by the statement `name` (after a tenant and key, at most `limit`).
    fn page(
        &mut self,
        name: &str,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        let (tenant, key) = after.unwrap_or(("", ""));
        let rows = self
            .tx
            .query(&self.st[name], &[&tenant, &key, &i64::from(limit)])?;
        rows.iter()
            .map(|r| {
                Ok(Operation::from_record(
                    r.get(0),
                    r.get(1),
                    r.get::<_, &str>(2),
                )?)
            })
            .collect()
    }

    fn exec(
        &mut self,
        name: &str,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        Ok(self.tx.execute(&self.st[name], params)?)
    }
}

impl Tx for PgTx<'_, '_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.rows.bucket(name) {
            return Ok(s);
        }
        let s = self.opt("bucket", &[&name])?.map(|r| bucket::State {
            balance_micro: r.get(0),
            updated_ms: r.get(1),
        });
        self.rows.bucket_read(name, s);
        Ok(s)
    }
    fn set_bucket(&mut self, name: &str, s: bucket::State) -> Result<(), StoreError> {
        self.rows.set_bucket(name, s);
        Ok(())
    }
    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.rows.slots(scope) {
            return Ok(n);
        }
        let n = self
            .opt("slots", &[&scope])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32);
        self.rows.slots_read(scope, n);
        Ok(n)
    }
    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError> {
        self.rows.set_slots(scope, in_use);
        Ok(())
    }
    fn prefetch(&mut self, hint: &Prefetch) -> Result<(), StoreError> {
        let buckets: Vec<&str> = hint
            .buckets
            .iter()
            .filter(|n| self.rows.bucket(n).is_none())
            .map(String::as_str)
            .collect();
        if !buckets.is_empty() {
            let found = self.tx.query(&self.st["prefetch_buckets"], &[&buckets])?;
            let mut states: HashMap<String, bucket::State> = found
                .iter()
                .map(|r| {
                    let state = bucket::State {
                        balance_micro: r.get(1),
                        updated_ms: r.get(2),
                    };
                    (r.get::<_, String>(0), state)
                })
                .collect();
            for name in buckets {
                self.rows.bucket_read(name, states.remove(name));
            }
        }
        let slots: Vec<&str> = hint
            .slots
            .iter()
            .filter(|s| self.rows.slots(s).is_none())
            .map(String::as_str)
            .collect();
        if !slots.is_empty() {
            let found = self.tx.query(&self.st["prefetch_slots"], &[&slots])?;
            let mut in_use: HashMap<String, u32> = found
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u32))
                .collect();
            for scope in slots {
                self.rows
                    .slots_read(scope, in_use.remove(scope).unwrap_or(0));
            }
        }
        let wanted: Vec<&(String, String)> = hint
            .operations
            .iter()
            .filter(|(t, k)| self.ops.get(t, k).is_none())
            .collect();
        if !wanted.is_empty() {
            let tenants: Vec<&str> = wanted.iter().map(|(t, _)| t.as_str()).collect();
            let keys: Vec<&str> = wanted.iter().map(|(_, k)| k.as_str()).collect();
            let found = self
                .tx
                .query(&self.st["prefetch_operations"], &[&tenants, &keys])?;
            let mut ops: HashMap<(String, String), Operation> = HashMap::new();
            for r in &found {
                let op = Operation::from_record(r.get(0), r.get(1), r.get::<_, &str>(2))?;
                ops.insert((op.tenant.clone(), op.key.clone()), op);
            }
            for (t, k) in wanted {
                let op = ops.remove(&(t.clone(), k.clone()));
                self.ops.read(t, k, op);
            }
        }
        Ok(())
    }
    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        if let Some(op) = self.ops.get(tenant, key) {
            return Ok(op);
        }
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
        self.ops.put(op);
        Ok(())
    }
    fn operations(&mut self) -> Result<Vec<Operation>, StoreError> {
        self.flush_operations()?;
        let rows = self.tx.query(&self.st["operations"], &[])?;
        rows.iter()
            .map(|r| {
                Ok(Operation::from_record(
                    r.get(0),
                    r.get(1),
                    r.get::<_, &str>(2),
                )?)
            })
            .collect()
    }
    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.flush_operations()?;
        self.page("operations_after", after, limit)
    }
    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.flush_operations()?;
        self.page("unknown_after", after, limit)
    }
    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        self.flush_operations()?;
        // Cached copies would carry the old name: read them again.
        *self.ops = OpCache::default();
        self.exec("rename_worker", &[&from, &to])
    }
    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.flush_operations()?;
        self.exec("delete_operation", &[&tenant, &key])?;
        self.ops.deleted(tenant, key);
        Ok(())
    }
    fn count_unknown(&mut self) -> Result<u64, StoreError> {
        self.flush_operations()?;
        let row = self.opt("count_unknown", &[])?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }
    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        self.flush_operations()?;
        Ok(self
            .opt("unfinished", &[&worker])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32))
    }
    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        if let Some(v) = self.rows.meta(name) {
            return Ok(v);
        }
        let v: Option<String> = self.opt("meta", &[&name])?.map(|r| r.get(0));
        self.rows.meta_read(name, v.clone());
        Ok(v)
    }
    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        self.exec("set_meta", &[&name, &value])?;
        self.rows.meta_written(name, value);
        Ok(())
    }
    fn enqueue(&mut self, j: &QueuedJob) -> Result<(), StoreError> {
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
        let removed = self.exec("dequeue", &[&tenant, &key])?;
        if removed > 0 {
            self.exec("depth_down", &[&tenant, &(removed as i64)])?;
        }
        Ok(())
    }
    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
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
        Ok(self
            .opt("ready_head", &[&tenant, &now_ms, &band.rank()])?
            .map(|r| job(&r)))
    }
    fn next_backlogged(
        &mut self,
        band: Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        let row = match after {
            Some(after) => self.opt("next_after", &[&after, &band.rank()])?,
            None => self.opt("next_first", &[&band.rank()])?,
        };
        Ok(row.map(|r| r.get(0)))
    }
    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .opt("policy_component", &[&digest])?
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }
    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.exec("put_policy_component", &[&digest, &bytes])
            .map(drop)
    }
    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self.tx.query(&self.st["written_tenants"], &[])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError> {
        self.exec("put_written_tenant", &[&name, &written])
            .map(drop)
    }
    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError> {
        Ok(self.exec("delete_written_tenant", &[&name])? > 0)
    }
    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError> {
        self.flush_operations()?;
        Ok(self
            .opt("tenant_has_work", &[&tenant])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn api_keys(&mut self) -> Result<Vec<StoredKey>, StoreError> {
        let rows = self.tx.query(&self.st["api_keys"], &[])?;
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
        self.exec(
            "put_api_key",
            &[&key.id, &key.sha256, &key.role, &key.subject],
        )
        .map(drop)
    }
    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError> {
        Ok(self.exec("delete_api_key", &[&id])? > 0)
    }
    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError> {
        self.exec("retain_policy_components", &[&keep[0], &keep[1], &keep[2]])
            .map(drop)
    }
    fn band_has_jobs(&mut self, tenant: &str, band: Priority) -> Result<bool, StoreError> {
        Ok(self
            .opt("band_has_jobs", &[&tenant, &band.rank()])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        Ok(self
            .tx
            .query(&self.st["infeasible"], &[&now_ms])?
            .iter()
            .map(job)
            .collect())
    }
    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        Ok(self
            .opt("deficit", &[&tenant])?
            .map_or(0, |r| r.get::<_, i64>(0) as u64))
    }
    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.exec(
            "set_deficit",
            &[&tenant, &(deficit.min(i64::MAX as u64) as i64)],
        )
        .map(drop)
    }
}
