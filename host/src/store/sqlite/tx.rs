//! One SQLite transaction as the engine sees it ([`Tx`]): buckets, slots and meta through
//! the row cache, operations and queues in SQL.

use super::super::row_cache::RowCache;
use super::super::{
    ledger_sql, record, KeyRole, OwnedObject, QueuedJob, StoreError, StoredKey, Tx,
};
use crate::alerts::Alert;
use crate::bucket;
use crate::model::{Operation, Priority};
use crate::spend::SpendRow;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) struct SqliteTx<'a> {
    pub(super) tx: &'a Connection,
    pub(super) rows: &'a mut RowCache,
}

/// The operations of rows of `tenant, key, record`.
fn operations_of(mut rows: rusqlite::Rows<'_>) -> Result<Vec<Operation>, StoreError> {
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(record::from_sqlite(r.get(0)?, r.get(1)?, r.get_ref(2)?)?);
    }
    Ok(out)
}

fn job_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<QueuedJob> {
    Ok(QueuedJob {
        tenant: r.get(0)?,
        key: r.get(1)?,
        tokens: r.get::<_, i64>(2)? as u64,
        not_before_ms: r.get(3)?,
        expire_at_ms: r.get(4)?,
        priority: Priority::from_rank(r.get(5)?),
    })
}

impl SqliteTx<'_> {
    /// A page of operations by `sql` (after a tenant and key, at most `limit`).
    fn page(
        &mut self,
        sql: &str,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        let (tenant, key) = after.unwrap_or(("", ""));
        let mut st = self.tx.prepare_cached(sql)?;
        let ops = operations_of(st.query(params![tenant, key, limit])?);
        ops
    }
}

impl Tx for SqliteTx<'_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.rows.bucket(name) {
            return Ok(s);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT balance_micro, updated_ms FROM buckets WHERE name = ?1")?;
        let s = st
            .query_row([name], |r| {
                Ok(bucket::State {
                    balance_micro: r.get(0)?,
                    updated_ms: r.get(1)?,
                })
            })
            .optional()?;
        self.rows.bucket_read(name, s);
        Ok(s)
    }

    fn set_bucket(&mut self, name: &str, s: bucket::State) -> Result<(), StoreError> {
        // Written to SQL when the transaction commits.
        self.rows.set_bucket(name, s);
        Ok(())
    }

    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.rows.slots(scope) {
            return Ok(n);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT in_use FROM slots WHERE scope = ?1")?;
        let n = st
            .query_row([scope], |r| r.get::<_, u32>(0))
            .optional()?
            .unwrap_or(0);
        self.rows.slots_read(scope, n);
        Ok(n)
    }

    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError> {
        // Written to SQL when the transaction commits.
        self.rows.set_slots(scope, in_use);
        Ok(())
    }

    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT record FROM operations WHERE tenant = ?1 AND key = ?2")?;
        let mut rows = st.query([tenant, key])?;
        match rows.next()? {
            Some(r) => Ok(Some(record::from_sqlite(
                tenant.to_string(),
                key.to_string(),
                r.get_ref(0)?,
            )?)),
            None => Ok(None),
        }
    }

    fn put_operation(&mut self, op: &Operation) -> Result<(), StoreError> {
        let record = record::pack(op)?;
        let mut st = self.tx.prepare_cached(
            "INSERT INTO operations (tenant, key, state, worker, record) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (tenant, key) DO UPDATE SET state = ?3, worker = ?4, record = ?5",
        )?;
        st.execute(params![
            op.tenant,
            op.key,
            op.state.as_str(),
            op.worker,
            record
        ])?;
        Ok(())
    }

    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page(
            "SELECT tenant, key, record FROM operations WHERE (tenant, key) > (?1, ?2)
             ORDER BY tenant, key LIMIT ?3",
            after,
            limit,
        )
    }

    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page(
            "SELECT tenant, key, record FROM operations
             WHERE state = 'unknown' AND (tenant, key) > (?1, ?2) ORDER BY tenant, key LIMIT ?3",
            after,
            limit,
        )
    }

    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        // Read and written back whole: a finished operation's record is packed, not JSON.
        let mut claimed = operations_of(
            self.tx
                .prepare_cached("SELECT tenant, key, record FROM operations WHERE worker = ?1")?
                .query([from])?,
        )?;
        for op in &mut claimed {
            op.worker = Some(to.to_string());
            self.put_operation(op)?;
        }
        Ok(claimed.len() as u64)
    }

    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.tx
            .prepare_cached("DELETE FROM operations WHERE tenant = ?1 AND key = ?2")?
            .execute([tenant, key])?;
        // Its saved answer goes with it: the key is new again.
        self.tx
            .prepare_cached("DELETE FROM answers WHERE tenant = ?1 AND key = ?2")?
            .execute([tenant, key])?;
        Ok(())
    }

    fn count_unknown(&mut self) -> Result<u64, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT COUNT(*) FROM operations WHERE state = 'unknown'")?;
        Ok(st.query_row([], |r| r.get::<_, i64>(0))? as u64)
    }

    fn operations(&mut self) -> Result<Vec<Operation>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT tenant, key, record FROM operations ORDER BY tenant, key")?;
        let ops = operations_of(st.query([])?);
        ops
    }

    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT COUNT(*) FROM operations WHERE worker = ?1 AND state IN ('active', 'unknown')",
        )?;
        Ok(st.query_row([worker], |r| r.get(0))?)
    }

    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        if let Some(v) = self.rows.meta(name) {
            return Ok(v);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT value FROM meta WHERE name = ?1")?;
        let v: Option<String> = st.query_row([name], |r| r.get(0)).optional()?;
        self.rows.meta_read(name, v.clone());
        Ok(v)
    }

    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        let mut st = self.tx.prepare_cached(
            "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = ?2",
        )?;
        st.execute([name, value])?;
        self.rows.meta_written(name, value);
        Ok(())
    }

    fn enqueue(&mut self, job: &QueuedJob) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO queue (tenant, key, tokens, not_before_ms, expire_at_ms, priority)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                job.tenant,
                job.key,
                job.tokens as i64,
                job.not_before_ms,
                job.expire_at_ms,
                job.priority.rank()
            ])?;
        self.tx
            .prepare_cached(
                "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES (?1, 1, 0)
                 ON CONFLICT (tenant) DO UPDATE SET depth = depth + 1",
            )?
            .execute([&job.tenant])?;
        Ok(())
    }

    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let removed = self
            .tx
            .prepare_cached("DELETE FROM queue WHERE tenant = ?1 AND key = ?2")?
            .execute([tenant, key])?;
        if removed > 0 {
            self.tx
                .prepare_cached("UPDATE tenant_queues SET depth = depth - ?2 WHERE tenant = ?1")?
                .execute(params![tenant, removed as i64])?;
        }
        Ok(())
    }

    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT depth FROM tenant_queues WHERE tenant = ?1")?;
        Ok(st
            .query_row([tenant], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    fn ready_head(
        &mut self,
        tenant: &str,
        band: Priority,
        now_ms: i64,
    ) -> Result<Option<QueuedJob>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
             WHERE priority = ?3 AND tenant = ?1 AND not_before_ms <= ?2 ORDER BY seq LIMIT 1",
        )?;
        Ok(st
            .query_row(params![tenant, now_ms, band.rank()], job_from_row)
            .optional()?)
    }

    fn next_backlogged(
        &mut self,
        band: Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        // Two statements, so that each is a plain seek on the band index.
        let row = match after {
            Some(after) => self
                .tx
                .prepare_cached(
                    "SELECT tenant FROM queue WHERE priority = ?2 AND tenant > ?1
                     ORDER BY tenant LIMIT 1",
                )?
                .query_row(params![after, band.rank()], |r| r.get(0))
                .optional()?,
            None => self
                .tx
                .prepare_cached(
                    "SELECT tenant FROM queue WHERE priority = ?1 ORDER BY tenant LIMIT 1",
                )?
                .query_row([band.rank()], |r| r.get(0))
                .optional()?,
        };
        Ok(row)
    }

    fn answer(
        &mut self,
        tenant: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT bytes FROM answers WHERE tenant = ?1 AND key = ?2 AND expires_ms > ?3",
        )?;
        Ok(st
            .query_row(params![tenant, key, now_ms], |r| r.get(0))
            .optional()?)
    }

    fn put_answer(
        &mut self,
        tenant: &str,
        key: &str,
        expires_ms: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO answers (tenant, key, expires_ms, size, bytes) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, key) DO UPDATE SET \
                 expires_ms = excluded.expires_ms, size = excluded.size, bytes = excluded.bytes",
            )?
            .execute(params![tenant, key, expires_ms, bytes.len() as i64, bytes])?;
        Ok(())
    }

    fn delete_answers(&mut self, by_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let n = self
            .tx
            .prepare_cached(
                "DELETE FROM answers WHERE rowid IN (SELECT rowid FROM answers \
                 WHERE expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2)",
            )?
            .execute(params![by_ms, limit])?;
        Ok(n as u64)
    }

    fn answer_bytes(&mut self) -> Result<u64, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT COALESCE(SUM(size), 0) FROM answers")?;
        Ok(st.query_row([], |r| r.get::<_, i64>(0))?.max(0) as u64)
    }

    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT bytes FROM policies WHERE digest = ?1")?;
        Ok(st.query_row([digest], |r| r.get(0)).optional()?)
    }

    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO policies (digest, bytes) VALUES (?1, ?2) ON CONFLICT (digest) DO NOTHING",
            )?
            .execute(params![digest, bytes])?;
        Ok(())
    }

    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT name, written FROM tenants ORDER BY name")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO tenants (name, written) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET written = ?2",
            )?
            .execute(params![name, written])?;
        Ok(())
    }

    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .tx
            .prepare_cached("DELETE FROM tenants WHERE name = ?1")?
            .execute([name])?;
        Ok(n > 0)
    }

    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM operations WHERE tenant = ?1
             AND state IN ('queued', 'active', 'unknown', 'retry_pending'))",
        )?;
        Ok(st.query_row([tenant], |r| r.get(0))?)
    }

    fn api_keys(&mut self) -> Result<Vec<StoredKey>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT id, sha256, role, subject FROM api_keys ORDER BY id")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut keys = Vec::new();
        for row in rows {
            let (id, sha256, role, subject) = row?;
            keys.push(StoredKey {
                role: KeyRole::from_stored(&role, &id)?,
                id,
                sha256,
                subject,
            });
        }
        Ok(keys)
    }

    fn put_api_key(&mut self, key: &StoredKey) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO api_keys (id, sha256, role, subject) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![key.id, key.sha256, key.role.as_str(), key.subject])?;
        Ok(())
    }

    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .tx
            .prepare_cached("DELETE FROM api_keys WHERE id = ?1")?
            .execute([id])?;
        Ok(n > 0)
    }

    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError> {
        self.tx
            .prepare_cached("DELETE FROM policies WHERE digest NOT IN (?1, ?2, ?3)")?
            .execute(params![keep[0], keep[1], keep[2]])?;
        Ok(())
    }

    fn band_has_jobs(&mut self, tenant: &str, band: Priority) -> Result<bool, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM queue WHERE priority = ?2 AND tenant = ?1)",
        )?;
        Ok(st.query_row(params![tenant, band.rank()], |r| r.get(0))?)
    }

    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
             WHERE expire_at_ms <= ?1 ORDER BY expire_at_ms, seq",
        )?;
        let rows = st.query_map([now_ms], job_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<Option<OwnedObject>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT model, deployment, created_ms FROM owned_objects \
             WHERE tenant = ?1 AND kind = ?2 AND id = ?3",
        )?;
        Ok(st
            .query_row(params![tenant, kind, id], |r| {
                Ok(OwnedObject {
                    kind: kind.to_string(),
                    id: id.to_string(),
                    model: r.get(0)?,
                    deployment: r.get(1)?,
                    created_ms: r.get(2)?,
                })
            })
            .optional()?)
    }

    fn put_owned_object(&mut self, tenant: &str, o: &OwnedObject) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO owned_objects (tenant, kind, id, model, deployment, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (tenant, kind, id) DO UPDATE SET \
                 model = excluded.model, deployment = excluded.deployment, \
                 created_ms = excluded.created_ms",
            )?
            .execute(params![
                tenant,
                o.kind,
                o.id,
                o.model,
                o.deployment,
                o.created_ms
            ])?;
        Ok(())
    }

    fn delete_owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .tx
            .prepare_cached(
                "DELETE FROM owned_objects WHERE tenant = ?1 AND kind = ?2 AND id = ?3",
            )?
            .execute(params![tenant, kind, id])?;
        Ok(n > 0)
    }

    fn delete_owned_objects(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let n = self
            .tx
            .prepare_cached(
                "DELETE FROM owned_objects WHERE rowid IN (SELECT rowid FROM owned_objects \
                 WHERE created_ms < ?1 ORDER BY created_ms LIMIT ?2)",
            )?
            .execute(params![before_ms, limit])?;
        Ok(n as u64)
    }

    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT deficit FROM tenant_queues WHERE tenant = ?1")?;
        Ok(st
            .query_row([tenant], |r| r.get::<_, i64>(0))
            .optional()?
            .unwrap_or(0) as u64)
    }

    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES (?1, 0, ?2)
                 ON CONFLICT (tenant) DO UPDATE SET deficit = ?2",
            )?
            .execute(params![tenant, deficit.min(i64::MAX as u64) as i64])?;
        Ok(())
    }

    fn add_spend(&mut self, row: &SpendRow) -> Result<(), StoreError> {
        self.tx.prepare_cached(ledger_sql::ADD)?.execute(params![
            row.hour_ms,
            row.tenant,
            row.groups_text(),
            row.model,
            row.deployment,
            big(row.calls),
            big(row.input_tokens),
            big(row.output_tokens),
            big(row.cached_input_tokens),
            big(row.cache_write_tokens),
            big(row.reasoning_tokens),
            big(row.cost_microusd),
        ])?;
        Ok(())
    }

    fn spend_rows(&mut self, from_ms: i64, to_ms: i64) -> Result<Vec<SpendRow>, StoreError> {
        let mut st = self.tx.prepare_cached(ledger_sql::ROWS)?;
        let rows = st.query_map(params![from_ms, to_ms], |r| {
            let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
            Ok(SpendRow {
                hour_ms: r.get(0)?,
                tenant: r.get(1)?,
                groups: SpendRow::groups_from_text(&r.get::<_, String>(2)?),
                model: r.get(3)?,
                deployment: r.get(4)?,
                calls: n(5)?,
                input_tokens: n(6)?,
                output_tokens: n(7)?,
                cached_input_tokens: n(8)?,
                cache_write_tokens: n(9)?,
                reasoning_tokens: n(10)?,
                cost_microusd: n(11)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn delete_spend(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let n = self
            .tx
            .prepare_cached(
                "DELETE FROM spend WHERE rowid IN (SELECT rowid FROM spend \
                 WHERE hour_ms < ?1 LIMIT ?2)",
            )?
            .execute(params![before_ms, limit])?;
        Ok(n as u64)
    }

    fn put_alert(&mut self, a: &Alert) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(ledger_sql::PUT_ALERT)?
            .execute(params![
                a.id,
                a.budget,
                a.webhook,
                a.secret_env,
                a.payload,
                a.attempts,
                a.next_ms
            ])?;
        Ok(())
    }

    fn due_alerts(&mut self, now_ms: i64, limit: u32) -> Result<Vec<Alert>, StoreError> {
        self.alert_rows(now_ms, limit)
    }

    fn alert_tried(
        &mut self,
        id: &str,
        attempts: u32,
        next_ms: i64,
        sent_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(ledger_sql::ALERT_TRIED)?
            .execute(params![id, attempts, next_ms, sent_ms])?;
        Ok(())
    }

    fn pending_alerts(&mut self) -> Result<u64, StoreError> {
        let mut st = self.tx.prepare_cached(ledger_sql::PENDING_ALERTS)?;
        Ok(st.query_row([], |r| r.get::<_, i64>(0))?.max(0) as u64)
    }

    fn delete_sent_alerts(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let n = self
            .tx
            .prepare_cached(
                "DELETE FROM alerts WHERE rowid IN (SELECT rowid FROM alerts \
                 WHERE sent_ms IS NOT NULL AND sent_ms < ?1 LIMIT ?2)",
            )?
            .execute(params![before_ms, limit])?;
        Ok(n as u64)
    }
}

impl SqliteTx<'_> {
    fn alert_rows(&mut self, now_ms: i64, limit: u32) -> Result<Vec<Alert>, StoreError> {
        let mut st = self.tx.prepare_cached(ledger_sql::DUE_ALERTS)?;
        let rows = st.query_map(params![now_ms, limit], |r| {
            Ok(Alert {
                id: r.get(0)?,
                budget: r.get(1)?,
                webhook: r.get(2)?,
                secret_env: r.get(3)?,
                payload: r.get(4)?,
                attempts: r.get::<_, i64>(5)?.clamp(0, i64::from(u32::MAX)) as u32,
                next_ms: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// A count as the store's BIGINT.
fn big(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}
