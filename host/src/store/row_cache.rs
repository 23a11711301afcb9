//! Buckets, slot counts and meta values kept in memory. Every decision reads a handful of
//! these rows and writes most of them back; kept here, the reads cost nothing after the
//! first and each row written by a batch reaches SQL once, just before the batch commits
//! (write-behind inside the transaction). SQLite, with one writer, keeps the cache between
//! transactions; PostgreSQL, shared by replicas, one per transaction (taken under the
//! engine's lock, so nobody else writes these rows meanwhile).
//!
//! Each change is journalled so that a rolled-back piece of work (a savepoint) puts the old
//! values back. The owner empties the cache whenever it cannot vouch for it: another
//! connection committed, or a transaction failed to commit.

use crate::bucket;
use foldhash::{HashMap, HashSet};

#[derive(Default)]
pub(crate) struct RowCache {
    buckets: HashMap<String, Option<bucket::State>>,
    slots: HashMap<String, u32>,
    meta: HashMap<String, Option<String>>,
    /// Rows changed in the open transaction and not yet written to SQL.
    dirty_buckets: HashSet<String>,
    dirty_slots: HashSet<String>,
    /// How to undo the open savepoint's changes, oldest first.
    undo: Vec<Undo>,
}

/// A row's cached value before a change (`None`: it was not cached) and whether it was
/// already waiting to be written.
enum Undo {
    Bucket(String, Option<Option<bucket::State>>, bool),
    Slots(String, Option<u32>, bool),
    Meta(String, Option<Option<String>>),
}

/// What a flush must write: the changed rows, in a fixed order.
pub(crate) struct Flush {
    pub buckets: Vec<(String, bucket::State)>,
    pub slots: Vec<(String, u32)>,
}

impl RowCache {
    pub fn bucket(&self, name: &str) -> Option<Option<bucket::State>> {
        self.buckets.get(name).copied()
    }

    /// Remembers a row as read from SQL.
    pub fn bucket_read(&mut self, name: &str, state: Option<bucket::State>) {
        self.buckets.insert(name.to_string(), state);
    }

    pub fn set_bucket(&mut self, name: &str, state: bucket::State) {
        let was_dirty = mark(&mut self.dirty_buckets, name);
        let old = replace(&mut self.buckets, name, Some(state));
        self.undo
            .push(Undo::Bucket(name.to_string(), old, was_dirty));
    }

    pub fn slots(&self, scope: &str) -> Option<u32> {
        self.slots.get(scope).copied()
    }

    pub fn slots_read(&mut self, scope: &str, in_use: u32) {
        self.slots.insert(scope.to_string(), in_use);
    }

    pub fn set_slots(&mut self, scope: &str, in_use: u32) {
        let was_dirty = mark(&mut self.dirty_slots, scope);
        let old = replace(&mut self.slots, scope, in_use);
        self.undo
            .push(Undo::Slots(scope.to_string(), old, was_dirty));
    }

    pub fn meta(&self, name: &str) -> Option<Option<String>> {
        self.meta.get(name).cloned()
    }

    pub fn meta_read(&mut self, name: &str, value: Option<String>) {
        self.meta.insert(name.to_string(), value);
    }

    /// Meta values are written to SQL at once; the cache only follows.
    pub fn meta_written(&mut self, name: &str, value: &str) {
        let old = self.meta.insert(name.to_string(), Some(value.to_string()));
        self.undo.push(Undo::Meta(name.to_string(), old));
    }

    /// The open savepoint succeeded: its changes stay.
    pub fn keep(&mut self) {
        self.undo.clear();
    }

    /// The open savepoint rolled back: puts back what it changed, newest change first.
    pub fn roll_back(&mut self) {
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Bucket(name, old, was_dirty) => {
                    if !was_dirty {
                        self.dirty_buckets.remove(&name);
                    }
                    restore(&mut self.buckets, name, old);
                }
                Undo::Slots(scope, old, was_dirty) => {
                    if !was_dirty {
                        self.dirty_slots.remove(&scope);
                    }
                    restore(&mut self.slots, scope, old);
                }
                Undo::Meta(name, old) => restore(&mut self.meta, name, old),
            }
        }
    }

    /// The rows to write before the transaction commits; they count as written from now on.
    pub fn take_flush(&mut self) -> Flush {
        let mut buckets: Vec<(String, bucket::State)> = self
            .dirty_buckets
            .drain()
            .filter_map(|n| self.buckets.get(&n).copied().flatten().map(|s| (n, s)))
            .collect();
        buckets.sort_by(|a, b| a.0.cmp(&b.0));
        let mut slots: Vec<(String, u32)> = self
            .dirty_slots
            .drain()
            .filter_map(|s| self.slots.get(&s).map(|n| (s, *n)))
            .collect();
        slots.sort();
        self.undo.clear();
        Flush { buckets, slots }
    }

    /// Forgets everything (the database may hold other values than these).
    pub fn clear(&mut self) {
        *self = RowCache::default();
    }
}

/// Adds `key` to `set`; whether it was there already. Allocates only for a new key (a
/// decision sets a handful of rows that are almost always cached).
fn mark(set: &mut HashSet<String>, key: &str) -> bool {
    set.contains(key) || !set.insert(key.to_string())
}

/// Sets `map[key]` to `value` and returns what it held, allocating only for a new key.
fn replace<V>(map: &mut HashMap<String, V>, key: &str, value: V) -> Option<V> {
    match map.get_mut(key) {
        Some(held) => Some(std::mem::replace(held, value)),
        None => map.insert(key.to_string(), value),
    }
}

fn restore<V>(map: &mut HashMap<String, V>, key: String, old: Option<V>) {
    match old {
        Some(v) => {
            map.insert(key, v);
        }
        None => {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(balance_micro: i64) -> bucket::State {
        bucket::State {
            balance_micro,
            updated_ms: 1,
        }
    }

    #[test]
    fn a_rolled_back_savepoint_leaves_no_trace() {
        let mut c = RowCache::default();
        c.bucket_read("a", None);
        c.set_bucket("a", state(5));
        c.keep();
        c.set_bucket("a", state(3));
        c.set_bucket("b", state(9));
        c.set_slots("global", 2);
        c.meta_written("downstream", "0");
        c.roll_back();
        assert_eq!(c.bucket("a"), Some(Some(state(5))));
        assert_eq!(c.bucket("b"), None);
        assert_eq!(c.slots("global"), None);
        assert_eq!(c.meta("downstream"), None);
        let flush = c.take_flush();
        assert_eq!(flush.buckets, vec![("a".to_string(), state(5))]);
        assert!(flush.slots.is_empty());
    }

    #[test]
    fn a_flush_writes_each_changed_row_once_with_its_last_value() {
        let mut c = RowCache::default();
        for i in 0..3 {
            c.set_bucket("t.requests", state(10 - i));
            c.set_slots("global", i as u32);
            c.keep();
        }
        c.set_slots("tenant.a", 1);
        c.keep();
        let flush = c.take_flush();
        assert_eq!(flush.buckets, vec![("t.requests".to_string(), state(8))]);
        assert_eq!(
            flush.slots,
            vec![("global".to_string(), 2), ("tenant.a".to_string(), 1)]
        );
        // Written rows stay cached and are not written again.
        assert_eq!(c.slots("global"), Some(2));
        assert!(c.take_flush().buckets.is_empty());
    }
}
