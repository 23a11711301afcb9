//! A PostgreSQL batch's reads and writes as one statement each: the rows it needs read
//! ahead together, the rows it changed written back together.

use super::op_cache::OpCache;
use crate::bucket;
use crate::model::Operation;
use crate::store::row_cache::{Flush, RowCache};
use crate::store::{record, Prefetch, StoreError};
use postgres::{Client, Row, Statement};

/// The names of `names` that `missing` says are not cached yet.
fn missing(names: &[String], missing: impl Fn(&str) -> bool) -> Vec<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| missing(n))
        .collect()
}

/// The rows of a hint that are not cached yet.
pub(super) struct Wanted<'h> {
    pub buckets: Vec<&'h str>,
    pub slots: Vec<&'h str>,
    pub operations: Vec<&'h (String, String)>,
    pub meta: Vec<&'h str>,
}

impl<'h> Wanted<'h> {
    /// `hint`'s rows that the caches do not know yet.
    pub(super) fn of(hint: &'h Prefetch, rows: &RowCache, ops: &OpCache) -> Self {
        Wanted {
            buckets: missing(&hint.buckets, |n| rows.bucket(n).is_none()),
            slots: missing(&hint.slots, |s| rows.slots(s).is_none()),
            operations: hint
                .operations
                .iter()
                .filter(|(t, k)| ops.get(t, k).is_none())
                .collect(),
            meta: missing(&hint.meta, |m| rows.meta(m).is_none()),
        }
    }

    /// Puts what `found` holds (absence included) into the caches.
    fn fill(self, mut found: Found, rows: &mut RowCache, ops: &mut OpCache) {
        for name in self.buckets {
            rows.bucket_read(name, found.buckets.remove(name));
        }
        for scope in self.slots {
            rows.slots_read(scope, found.slots.remove(scope).unwrap_or(0));
        }
        for (t, k) in self.operations {
            ops.read(t, k, found.operations.remove(&(t.clone(), k.clone())));
        }
        for name in self.meta {
            rows.meta_read(name, found.meta.remove(name));
        }
    }

    /// Reads the wanted rows with `prefetch` (buckets, slot counts, operations and meta
    /// values, one row each, tagged by kind) and puts them, absence included, into the caches;
    /// answers the database's clock, read by the same statement.
    pub(super) fn read(
        self,
        client: &mut Client,
        prefetch: &Statement,
        rows: &mut RowCache,
        ops: &mut OpCache,
    ) -> Result<i64, StoreError> {
        let tenants: Vec<&str> = self.operations.iter().map(|(t, _)| t.as_str()).collect();
        let keys: Vec<&str> = self.operations.iter().map(|(_, k)| k.as_str()).collect();
        let answer = client.query(
            prefetch,
            &[&self.buckets, &self.slots, &tenants, &keys, &self.meta],
        )?;
        let found = Found::of(&answer)?;
        let now_ms = found
            .now_ms
            .ok_or_else(|| StoreError::Schema("the database's clock was not read".into()))?;
        self.fill(found, rows, ops);
        Ok(now_ms)
    }
}

/// What a read found.
#[derive(Default)]
struct Found {
    buckets: std::collections::HashMap<String, bucket::State>,
    slots: std::collections::HashMap<String, u32>,
    operations: std::collections::HashMap<(String, String), Operation>,
    meta: std::collections::HashMap<String, String>,
    now_ms: Option<i64>,
}

impl Found {
    /// The rows of the prefetch statement's answer.
    fn of(answer: &[Row]) -> Result<Found, StoreError> {
        let mut found = Found::default();
        for r in answer {
            let name: String = r.get(1);
            match r.get::<_, i16>(0) {
                0 => {
                    let state = bucket::State {
                        balance_micro: r.get(3),
                        updated_ms: r.get(4),
                    };
                    found.buckets.insert(name, state);
                }
                1 => {
                    found.slots.insert(name, r.get::<_, i64>(3) as u32);
                }
                2 => {
                    let key: String = r.get(2);
                    let op = record::from_text(name.clone(), key.clone(), r.get::<_, &str>(5))?;
                    found.operations.insert((name, key), op);
                }
                3 => {
                    found.meta.insert(name, r.get(5));
                }
                _ => found.now_ms = Some(r.get(3)),
            }
        }
        Ok(found)
    }
}

/// The operations a transaction changed, as the write statements' arrays.
struct DirtyOperations {
    tenants: Vec<String>,
    keys: Vec<String>,
    states: Vec<&'static str>,
    workers: Vec<Option<String>>,
    records: Vec<String>,
}

impl DirtyOperations {
    fn take(ops: &mut OpCache) -> Result<Self, StoreError> {
        let dirty = ops.take_dirty();
        let mut out = DirtyOperations {
            tenants: Vec::with_capacity(dirty.len()),
            keys: Vec::with_capacity(dirty.len()),
            states: Vec::with_capacity(dirty.len()),
            workers: Vec::with_capacity(dirty.len()),
            records: Vec::with_capacity(dirty.len()),
        };
        for op in dirty {
            out.records.push(record::to_text(&op)?);
            out.states.push(op.state.as_str());
            out.tenants.push(op.tenant);
            out.keys.push(op.key);
            out.workers.push(op.worker);
        }
        Ok(out)
    }
}

/// Writes the operations changed so far with `flush_operations`, one statement (before a
/// statement that reads the table).
pub(super) fn write_operations(
    client: &mut Client,
    flush_operations: &Statement,
    ops: &mut OpCache,
) -> Result<(), StoreError> {
    let d = DirtyOperations::take(ops)?;
    if d.tenants.is_empty() {
        return Ok(());
    }
    client.execute(
        flush_operations,
        &[&d.tenants, &d.keys, &d.states, &d.workers, &d.records],
    )?;
    Ok(())
}

/// Writes every changed operation, bucket and slot count with `flush`, one statement.
pub(super) fn write(
    client: &mut Client,
    flush: &Statement,
    ops: &mut OpCache,
    rows: &mut RowCache,
) -> Result<(), StoreError> {
    let d = DirtyOperations::take(ops)?;
    let rows: Flush = rows.take_flush();
    if d.tenants.is_empty() && rows.buckets.is_empty() && rows.slots.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = rows.buckets.iter().map(|(n, _)| n.as_str()).collect();
    let balances: Vec<i64> = rows.buckets.iter().map(|(_, s)| s.balance_micro).collect();
    let updated: Vec<i64> = rows.buckets.iter().map(|(_, s)| s.updated_ms).collect();
    let scopes: Vec<&str> = rows.slots.iter().map(|(s, _)| s.as_str()).collect();
    let in_use: Vec<i64> = rows.slots.iter().map(|(_, n)| i64::from(*n)).collect();
    client.execute(
        flush,
        &[
            &d.tenants, &d.keys, &d.states, &d.workers, &d.records, &names, &balances, &updated,
            &scopes, &in_use,
        ],
    )?;
    Ok(())
}
