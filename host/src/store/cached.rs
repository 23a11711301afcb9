//! A read cache over one piece of work, for PostgreSQL (SQLite keeps its rows in a cache of
//! its own, `row_cache`): the engine reads a tenant's buckets and slots for the policy's
//! snapshot and again to reserve; inside one piece the second read is the first one's answer
//! (writes go through and update it), sparing a round trip to the server.

use super::{QueuedJob, StoreError, Tx};
use crate::bucket;
use crate::model::Operation;
use std::collections::HashMap;

pub(super) struct Cached<'a> {
    inner: &'a mut dyn Tx,
    buckets: HashMap<String, Option<bucket::State>>,
    slots: HashMap<String, u32>,
}

impl<'a> Cached<'a> {
    pub(super) fn new(inner: &'a mut dyn Tx) -> Self {
        Cached {
            inner,
            buckets: HashMap::new(),
            slots: HashMap::new(),
        }
    }
}

impl Tx for Cached<'_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.buckets.get(name) {
            return Ok(*s);
        }
        let s = self.inner.bucket(name)?;
        self.buckets.insert(name.to_string(), s);
        Ok(s)
    }
    fn set_bucket(&mut self, name: &str, state: bucket::State) -> Result<(), StoreError> {
        self.inner.set_bucket(name, state)?;
        self.buckets.insert(name.to_string(), Some(state));
        Ok(())
    }
    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.slots.get(scope) {
            return Ok(*n);
        }
        let n = self.inner.slots_in_use(scope)?;
        self.slots.insert(scope.to_string(), n);
        Ok(n)
    }
    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError> {
        self.inner.set_slots_in_use(scope, in_use)?;
        self.slots.insert(scope.to_string(), in_use);
        Ok(())
    }
    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        self.inner.operation(tenant, key)
    }
    fn put_operation(&mut self, op: &Operation) -> Result<(), StoreError> {
        self.inner.put_operation(op)
    }
    fn operations(&mut self) -> Result<Vec<Operation>, StoreError> {
        self.inner.operations()
    }
    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.inner.operations_after(after, limit)
    }
    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError> {
        self.inner.unknown_operations_after(after, limit)
    }
    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        self.inner.rename_worker(from, to)
    }
    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.inner.delete_operation(tenant, key)
    }
    fn count_unknown(&mut self) -> Result<u64, StoreError> {
        self.inner.count_unknown()
    }
    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        self.inner.unfinished_claims(worker)
    }
    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        self.inner.meta(name)
    }
    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        self.inner.set_meta(name, value)
    }
    fn enqueue(&mut self, job: &QueuedJob) -> Result<(), StoreError> {
        self.inner.enqueue(job)
    }
    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        self.inner.dequeue(tenant, key)
    }
    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
        self.inner.queue_depth(tenant)
    }
    fn ready_head(
        &mut self,
        tenant: &str,
        band: crate::model::Priority,
        now_ms: i64,
    ) -> Result<Option<QueuedJob>, StoreError> {
        self.inner.ready_head(tenant, band, now_ms)
    }
    fn next_backlogged(
        &mut self,
        band: crate::model::Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.inner.next_backlogged(band, after)
    }
    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.policy_component(digest)
    }
    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put_policy_component(digest, bytes)
    }
    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.written_tenants()
    }
    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError> {
        self.inner.put_written_tenant(name, written)
    }
    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError> {
        self.inner.delete_written_tenant(name)
    }
    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError> {
        self.inner.tenant_has_work(tenant)
    }
    fn api_keys(&mut self) -> Result<Vec<super::StoredKey>, StoreError> {
        self.inner.api_keys()
    }
    fn put_api_key(&mut self, key: &super::StoredKey) -> Result<(), StoreError> {
        self.inner.put_api_key(key)
    }
    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError> {
        self.inner.delete_api_key(id)
    }
    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError> {
        self.inner.retain_policy_components(keep)
    }
    fn band_has_jobs(
        &mut self,
        tenant: &str,
        band: crate::model::Priority,
    ) -> Result<bool, StoreError> {
        self.inner.band_has_jobs(tenant, band)
    }
    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        self.inner.infeasible(now_ms)
    }
    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        self.inner.deficit(tenant)
    }
    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.inner.set_deficit(tenant, deficit)
    }
}
