//! One PostgreSQL transaction's reads and writes: rows come from the batch's caches when
//! read before, from the database otherwise; writes go to the caches, flushed before the
//! commit (see `wire`).

use super::locks::{Held, RowLock};
use super::op_cache::OpCache;
use super::statements::Statements;
use super::wire::{self, Wanted};
use crate::alerts::Alert;
use crate::bucket;
use crate::model::{Operation, Priority};
use crate::spend::SpendRow;
use crate::store::row_cache::RowCache;
use crate::store::{record, KeyRole, OwnedObject, Prefetch, QueuedJob, StoreError, StoredKey, Tx};
use postgres::{Client, Row, Statement};

/// A transaction open on the connection, with the caches of the batch it belongs to.
pub(super) struct PgTx<'a> {
    pub(super) client: &'a mut Client,
    pub(super) st: &'a Statements,
    pub(super) rows: &'a mut RowCache,
    pub(super) ops: &'a mut OpCache,
    /// What the transaction holds; a row outside it is locked only if free at once.
    pub(super) held: &'a mut Held,
    /// The database's clock, once read in this transaction.
    pub(super) now_ms: Option<i64>,
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
        statement: &Statement,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.client.query_opt(statement, params)?)
    }

    fn exec(
        &mut self,
        statement: &Statement,
        params: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        Ok(self.client.execute(statement, params)?)
    }

    /// Reads `wanted` into the caches in one statement, and the database's clock with it.
    fn read_ahead(&mut self, wanted: Wanted<'_>) -> Result<(), StoreError> {
        let now_ms = wanted.read(self.client, &self.st.prefetch, self.rows, self.ops)?;
        self.now_ms.get_or_insert(now_ms);
        Ok(())
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
        let got: bool = self.client.query_one(&self.st.try_lock, &[&a, &b])?.get(0);
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
        wire::write_operations(self.client, &self.st.flush_operations, self.ops)
    }

    /// A page of operations by the statement `name` (after a tenant and key, at most `limit`).
    fn page(
        &mut self,
        statement: &Statement,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        let (tenant, key) = after.unwrap_or(("", ""));
        let rows = self
            .client
            .query(statement, &[&tenant, &key, &i64::from(limit)])?;
        rows.iter().map(operation).collect()
    }
}

fn operation(r: &Row) -> Result<Operation, StoreError> {
    record::from_text(r.get(0), r.get(1), r.get::<_, &str>(2))
}

impl Tx for PgTx<'_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.rows.bucket(name) {
            return Ok(s);
        }
        self.need(RowLock::bucket(name))?;
        let s = self.opt(&self.st.bucket, &[&name])?.map(|r| bucket::State {
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
            .opt(&self.st.slots, &[&scope])?
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
        self.read_ahead(Wanted::of(hint, self.rows, self.ops))
    }
    /// Locks every row of `hint` not held yet in one statement (each only if free at
    /// once), then reads those not cached in another.
    fn reach(&mut self, hint: &Prefetch) -> Result<(), StoreError> {
        if let Held::Shared(held) = &mut *self.held {
            let mut wanted: Vec<RowLock> = hint
                .buckets
                .iter()
                .map(|b| RowLock::bucket(b))
                .chain(hint.slots.iter().map(|s| RowLock::slots(s)))
                .filter(|r| !held.contains(r))
                .collect();
            wanted.sort_unstable();
            wanted.dedup();
            if !wanted.is_empty() {
                let (a, b): (Vec<i32>, Vec<i32>) = wanted.iter().map(|r| r.keys()).unzip();
                let missed: i64 = self.client.query_one(&self.st.try_locks, &[&a, &b])?.get(0);
                if missed > 0 {
                    return Err(StoreError::Contended);
                }
                held.extend(wanted);
            }
        }
        let wanted = Wanted::of(hint, self.rows, self.ops);
        if wanted.buckets.is_empty() && wanted.slots.is_empty() {
            return Ok(());
        }
        self.read_ahead(wanted)
    }
    fn store_now_ms(&mut self) -> Result<Option<i64>, StoreError> {
        if self.now_ms.is_none() {
            self.now_ms = Some(self.client.query_one(&self.st.clock, &[])?.get(0));
        }
        Ok(self.now_ms)
    }
    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        if let Some(op) = self.ops.get(tenant, key) {
            return Ok(op);
        }
        self.need(RowLock::operation(tenant, key))?;
        let op = match self.opt(&self.st.operation, &[&tenant, &key])? {
            Some(r) => Some(record::from_text(
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
        let rows = self.client.query(&self.st.operations, &[])?;
        rows.iter().map(operation).collect()
    }
    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page(&self.st.operations_after, after, limit)
    }
    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.page(&self.st.unknown_after, after, limit)
    }
    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        // Cached copies would carry the old name: read them again.
        *self.ops = OpCache::default();
        // Read and written back whole: a finished operation's record is packed, not JSON.
        let rows = self.client.query(&self.st.claimed_by, &[&from])?;
        for r in &rows {
            let mut op = operation(r)?;
            op.worker = Some(to.to_string());
            self.put_operation(&op)?;
        }
        Ok(rows.len() as u64)
    }
    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        self.exec(&self.st.delete_operation, &[&tenant, &key])?;
        // Its saved answer goes with it: the key is new again.
        self.exec(&self.st.delete_operation_answer, &[&tenant, &key])?;
        self.ops.deleted(tenant, key);
        Ok(())
    }
    fn count_unknown(&mut self) -> Result<u64, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        let row = self.opt(&self.st.count_unknown, &[])?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0)) as u64)
    }
    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        Ok(self
            .opt(&self.st.unfinished, &[&worker])?
            .map_or(0, |r| r.get::<_, i64>(0) as u32))
    }
    /// Meta rows are written only with the store held whole, so any transaction reads them.
    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        if let Some(v) = self.rows.meta(name) {
            return Ok(v);
        }
        let v: Option<String> = self.opt(&self.st.meta, &[&name])?.map(|r| r.get(0));
        self.rows.meta_read(name, v.clone());
        Ok(v)
    }
    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(&self.st.set_meta, &[&name, &value])?;
        self.rows.meta_written(name, value);
        Ok(())
    }
    fn enqueue(&mut self, j: &QueuedJob) -> Result<(), StoreError> {
        self.need(RowLock::queue(&j.tenant))?;
        self.exec(
            &self.st.enqueue,
            &[
                &j.tenant,
                &j.key,
                &(j.tokens as i64),
                &j.not_before_ms,
                &j.expire_at_ms,
                &j.priority.rank(),
            ],
        )?;
        self.exec(&self.st.depth_up, &[&j.tenant]).map(drop)
    }
    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.need(RowLock::queue(tenant))?;
        let removed = self.exec(&self.st.dequeue, &[&tenant, &key])?;
        if removed > 0 {
            self.exec(&self.st.depth_down, &[&tenant, &(removed as i64)])?;
        }
        Ok(())
    }
    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
        self.need(RowLock::queue(tenant))?;
        Ok(self
            .opt(&self.st.depth, &[&tenant])?
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
            .opt(&self.st.ready_head, &[&tenant, &now_ms, &band.rank()])?
            .map(|r| job(&r)))
    }
    fn next_backlogged(
        &mut self,
        band: Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.need_store()?;
        let row = match after {
            Some(after) => self.opt(&self.st.next_after, &[&after, &band.rank()])?,
            None => self.opt(&self.st.next_first, &[&band.rank()])?,
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
            .opt(&self.st.answer, &[&tenant, &key, &now_ms])?
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
        self.exec(
            &self.st.put_answer,
            &[&tenant, &key, &expires_ms, &size, &bytes],
        )
        .map(drop)
    }
    fn delete_answers(&mut self, by_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.need_store()?;
        self.exec(&self.st.delete_answers, &[&by_ms, &i64::from(limit)])
    }
    fn answer_bytes(&mut self) -> Result<u64, StoreError> {
        self.need_store()?;
        let row = self.client.query_one(&self.st.answer_bytes, &[])?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .opt(&self.st.policy_component, &[&digest])?
            .map(|r| r.get::<_, Vec<u8>>(0)))
    }
    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(&self.st.put_policy_component, &[&digest, &bytes])
            .map(drop)
    }
    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = self.client.query(&self.st.written_tenants, &[])?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(&self.st.put_written_tenant, &[&name, &written])
            .map(drop)
    }
    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self.exec(&self.st.delete_written_tenant, &[&name])? > 0)
    }
    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        self.flush_operations()?;
        Ok(self
            .opt(&self.st.tenant_has_work, &[&tenant])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn api_keys(&mut self) -> Result<Vec<StoredKey>, StoreError> {
        let rows = self.client.query(&self.st.api_keys, &[])?;
        rows.iter()
            .map(|r| {
                let id: String = r.get(0);
                Ok(StoredKey {
                    role: KeyRole::from_stored(r.get(2), &id)?,
                    id,
                    sha256: r.get(1),
                    subject: r.get(3),
                })
            })
            .collect()
    }
    fn put_api_key(&mut self, key: &StoredKey) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.put_api_key,
            &[&key.id, &key.sha256, &key.role.as_str(), &key.subject],
        )
        .map(drop)
    }
    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self.exec(&self.st.delete_api_key, &[&id])? > 0)
    }
    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.retain_policy_components,
            &[&keep[0], &keep[1], &keep[2]],
        )
        .map(drop)
    }
    fn band_has_jobs(&mut self, tenant: &str, band: Priority) -> Result<bool, StoreError> {
        self.need_store()?;
        Ok(self
            .opt(&self.st.band_has_jobs, &[&tenant, &band.rank()])?
            .is_some_and(|r| r.get::<_, bool>(0)))
    }
    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        self.need_store()?;
        Ok(self
            .client
            .query(&self.st.infeasible, &[&now_ms])?
            .iter()
            .map(job)
            .collect())
    }
    fn owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<Option<OwnedObject>, StoreError> {
        self.need(RowLock::object(tenant, kind, id))?;
        Ok(self
            .opt(&self.st.owned_object, &[&tenant, &kind, &id])?
            .map(|r| OwnedObject {
                kind: kind.to_string(),
                id: id.to_string(),
                model: r.get(0),
                deployment: r.get(1),
                created_ms: r.get(2),
            }))
    }
    fn put_owned_object(&mut self, tenant: &str, o: &OwnedObject) -> Result<(), StoreError> {
        self.need(RowLock::object(tenant, &o.kind, &o.id))?;
        self.exec(
            &self.st.put_owned_object,
            &[
                &tenant,
                &o.kind,
                &o.id,
                &o.model,
                &o.deployment,
                &o.created_ms,
            ],
        )
        .map(drop)
    }
    fn delete_owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        self.need(RowLock::object(tenant, kind, id))?;
        Ok(self.exec(&self.st.delete_owned_object, &[&tenant, &kind, &id])? > 0)
    }
    fn delete_owned_objects(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.delete_owned_objects,
            &[&before_ms, &i64::from(limit)],
        )
    }
    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        self.need_store()?;
        Ok(self
            .opt(&self.st.deficit, &[&tenant])?
            .map_or(0, |r| r.get::<_, i64>(0) as u64))
    }
    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.set_deficit,
            &[&tenant, &(deficit.min(i64::MAX as u64) as i64)],
        )
        .map(drop)
    }
    fn add_spend(&mut self, row: &SpendRow) -> Result<(), StoreError> {
        // A tenant's ledger rows are guarded by its queue's lock, which every batch that
        // finishes the tenant's calls names.
        self.need(RowLock::queue(&row.tenant))?;
        let big = |n: u64| n.min(i64::MAX as u64) as i64;
        self.exec(
            &self.st.add_spend,
            &[
                &row.hour_ms,
                &row.tenant,
                &row.groups_text(),
                &row.model,
                &row.deployment,
                &big(row.calls),
                &big(row.input_tokens),
                &big(row.output_tokens),
                &big(row.cached_input_tokens),
                &big(row.cache_write_tokens),
                &big(row.reasoning_tokens),
                &big(row.cost_microusd),
            ],
        )
        .map(drop)
    }
    fn spend_rows(&mut self, from_ms: i64, to_ms: i64) -> Result<Vec<SpendRow>, StoreError> {
        let rows = self
            .client
            .query(&self.st.spend_rows, &[&from_ms, &to_ms])?;
        Ok(rows
            .iter()
            .map(|r| {
                let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                SpendRow {
                    hour_ms: r.get(0),
                    tenant: r.get(1),
                    groups: SpendRow::groups_from_text(r.get::<_, &str>(2)),
                    model: r.get(3),
                    deployment: r.get(4),
                    calls: n(5),
                    input_tokens: n(6),
                    output_tokens: n(7),
                    cached_input_tokens: n(8),
                    cache_write_tokens: n(9),
                    reasoning_tokens: n(10),
                    cost_microusd: n(11),
                }
            })
            .collect())
    }
    fn delete_spend(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.need_store()?;
        self.exec(&self.st.delete_spend, &[&before_ms, &i64::from(limit)])
    }
    fn put_alert(&mut self, a: &Alert) -> Result<(), StoreError> {
        // An alert is written with its budget's spend, under that bucket's lock.
        self.need(RowLock::bucket(&a.budget))?;
        self.exec(
            &self.st.put_alert,
            &[
                &a.id,
                &a.budget,
                &a.webhook,
                &a.secret_env,
                &a.payload,
                &i64::from(a.attempts),
                &a.next_ms,
            ],
        )
        .map(drop)
    }
    fn due_alerts(&mut self, now_ms: i64, limit: u32) -> Result<Vec<Alert>, StoreError> {
        self.need_store()?;
        let rows = self
            .client
            .query(&self.st.due_alerts, &[&now_ms, &i64::from(limit)])?;
        Ok(rows
            .iter()
            .map(|r| Alert {
                id: r.get(0),
                budget: r.get(1),
                webhook: r.get(2),
                secret_env: r.get(3),
                payload: r.get(4),
                attempts: r.get::<_, i64>(5).clamp(0, i64::from(u32::MAX)) as u32,
                next_ms: r.get(6),
            })
            .collect())
    }
    fn alert_tried(
        &mut self,
        id: &str,
        attempts: u32,
        next_ms: i64,
        sent_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.alert_tried,
            &[&id, &i64::from(attempts), &next_ms, &sent_ms],
        )
        .map(drop)
    }
    fn pending_alerts(&mut self) -> Result<u64, StoreError> {
        let row = self.client.query_one(&self.st.pending_alerts, &[])?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
    fn delete_sent_alerts(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.need_store()?;
        self.exec(
            &self.st.delete_sent_alerts,
            &[&before_ms, &i64::from(limit)],
        )
    }
}
