//! Operations read and written by one PostgreSQL transaction, kept in memory: each is read
//! from the server at most once (or fetched with the batch's others at once, see
//! [`crate::store::Prefetch`]) and written once, just before the commit, with the batch's others in
//! one statement (write-behind, as `row_cache` does for buckets and slots).
//!
//! Each change is journalled so that a rolled-back savepoint puts the old values back.
//! Anything that reads the operations table in SQL flushes first (it must see the writes);
//! a flush inside a savepoint that then rolls back is undone by the server, and the journal
//! marks the values it restores to be written again, so the two never disagree.

use crate::model::Operation;
use foldhash::{HashMap, HashSet};

type Key = (String, String);

#[derive(Default)]
pub(crate) struct OpCache {
    /// `Some(None)`: known absent.
    ops: HashMap<Key, Option<Operation>>,
    dirty: HashSet<Key>,
    /// The cached value before each change of the open savepoint (`None`: not cached).
    undo: Vec<(Key, Option<Option<Operation>>)>,
}

impl OpCache {
    /// The cached operation: `None` when not cached, `Some(None)` when known absent.
    pub fn get(&self, tenant: &str, key: &str) -> Option<Option<Operation>> {
        self.ops
            .get(&(tenant.to_string(), key.to_string()))
            .cloned()
    }

    /// Remembers an operation as read from the server (absent: `None`).
    pub fn read(&mut self, tenant: &str, key: &str, op: Option<Operation>) {
        self.ops.insert((tenant.to_string(), key.to_string()), op);
    }

    /// Writes an operation (to the server at the next flush).
    pub fn put(&mut self, op: &Operation) {
        let k = (op.tenant.clone(), op.key.clone());
        let old = self.ops.insert(k.clone(), Some(op.clone()));
        self.dirty.insert(k.clone());
        self.undo.push((k, old));
    }

    /// An operation the server deleted in this savepoint.
    pub fn deleted(&mut self, tenant: &str, key: &str) {
        let k = (tenant.to_string(), key.to_string());
        let old = self.ops.insert(k.clone(), None);
        self.dirty.remove(&k);
        self.undo.push((k, old));
    }

    /// The open savepoint succeeded: its changes stay.
    pub fn keep(&mut self) {
        self.undo.clear();
    }

    /// The open savepoint rolled back: puts back what it changed, newest first. A value put
    /// back is written again at the next flush (the server may have rolled back a flush of
    /// this savepoint to something older).
    pub fn roll_back(&mut self) {
        while let Some((k, old)) = self.undo.pop() {
            match old {
                Some(Some(op)) => {
                    self.dirty.insert(k.clone());
                    self.ops.insert(k, Some(op));
                }
                Some(None) => {
                    self.dirty.remove(&k);
                    self.ops.insert(k, None);
                }
                None => {
                    self.dirty.remove(&k);
                    self.ops.remove(&k);
                }
            }
        }
    }

    /// The operations to write now, in (tenant, key) order; they count as written.
    pub fn take_dirty(&mut self) -> Vec<Operation> {
        let mut out: Vec<Operation> = self
            .dirty
            .drain()
            .filter_map(|k| self.ops.get(&k).cloned().flatten())
            .collect();
        out.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OpState;

    fn op(key: &str, attempt: u32) -> Operation {
        let record = format!(
            r#"{{"fingerprint":"f","route":"interactive","state":"active","attempt":{attempt},
            "deadline_ms":1,"input_tokens":1,"max_output_tokens":1,"optional_context_tokens":0,
            "reserved_tokens":2,"estimated_exec_ms":0,"degraded":false,"holds_slot":true,
            "holds_tenant_slot":false,"tokens_reserved":true,"policy_digest":"d"}}"#
        );
        Operation::from_record("t".into(), key.into(), &record).unwrap()
    }

    #[test]
    fn a_rolled_back_savepoint_puts_back_what_it_changed_and_rewrites_it() {
        let mut c = OpCache::default();
        c.read("t", "a", None);
        c.put(&op("a", 1));
        c.keep();
        // The next piece changes a, creates b, flushes (a read of the table), then fails.
        c.put(&op("a", 2));
        c.put(&op("b", 1));
        assert_eq!(c.take_dirty().len(), 2);
        c.roll_back();
        assert_eq!(c.get("t", "a").unwrap().unwrap().attempt, 1);
        assert_eq!(c.get("t", "b"), None);
        // a's first version was flushed inside the rolled-back savepoint: written again.
        let again = c.take_dirty();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].key.as_str(), again[0].attempt), ("a", 1));
        assert!(c.take_dirty().is_empty());
    }

    #[test]
    fn deletions_and_absences_are_remembered() {
        let mut c = OpCache::default();
        c.put(&op("x", 1));
        c.keep();
        c.deleted("t", "x");
        assert_eq!(c.get("t", "x"), Some(None));
        c.roll_back();
        assert_eq!(c.get("t", "x").unwrap().unwrap().state, OpState::Active);
    }
}
