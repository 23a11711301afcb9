//! A PostgreSQL batch's reads and writes as one statement each: the rows it needs read
//! ahead together, the rows it changed written back together.

use super::op_cache::OpCache;
use super::row_cache::{Flush, RowCache};
use super::{Prefetch, StoreError};
use crate::bucket;
use crate::model::Operation;
use postgres::{Client, Row, Statement};

/// The rows of a hint that are not cached yet.
pub(super) struct Wanted<'h> {
    pub buckets: Vec<&'h str>,
    pub slots: Vec<&'h str>,
    pub operations: Vec<&'h (String, String)>,
    pub meta: Vec<&'h str>,
}

impl<'h> Wanted<'h> {
    /// `hint`'s rows that `cached` does not know yet.
    pub(super) fn of(hint: &'h Prefetch, rows: &RowCache, ops: &OpCache) -> Self {
        Wanted {
            buckets: hint
                .buckets
                .iter()
                .filter(|n| rows.bucket(n).is_none())
                .map(String::as_str)
                .collect(),
            slots: hint
                .slots
                .iter()
                .filter(|s| rows.slots(s).is_none())
                .map(String::as_str)
                .collect(),
            operations: hint
                .operations
                .iter()
                .filter(|(t, k)| ops.get(t, k).is_none())
                .collect(),
            meta: hint
                .meta
                .iter()
                .filter(|m| rows.meta(m).is_none())
                .map(String::as_str)
                .collect(),
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
                    let op =
                        Operation::from_record(name.clone(), key.clone(), r.get::<_, &str>(5))?;
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

/// Writes the changed operations, buckets and slot counts with `flush`, one statement.
pub(super) fn write(
    client: &mut Client,
    flush: &Statement,
    ops: &[Operation],
    rows: &Flush,
) -> Result<(), StoreError> {
    if ops.is_empty() && rows.buckets.is_empty() && rows.slots.is_empty() {
        return Ok(());
    }
    let mut records = Vec::with_capacity(ops.len());
    for op in ops {
        records.push(serde_json::to_string(op)?);
    }
    let tenants: Vec<&str> = ops.iter().map(|o| o.tenant.as_str()).collect();
    let keys: Vec<&str> = ops.iter().map(|o| o.key.as_str()).collect();
    let states: Vec<&str> = ops.iter().map(|o| o.state.as_str()).collect();
    let workers: Vec<Option<&str>> = ops.iter().map(|o| o.worker.as_deref()).collect();
    let names: Vec<&str> = rows.buckets.iter().map(|(n, _)| n.as_str()).collect();
    let balances: Vec<i64> = rows.buckets.iter().map(|(_, s)| s.balance_micro).collect();
    let updated: Vec<i64> = rows.buckets.iter().map(|(_, s)| s.updated_ms).collect();
    let scopes: Vec<&str> = rows.slots.iter().map(|(s, _)| s.as_str()).collect();
    let in_use: Vec<i64> = rows.slots.iter().map(|(_, n)| i64::from(*n)).collect();
    client.execute(
        flush,
        &[
            &tenants, &keys, &states, &workers, &records, &names, &balances, &updated, &scopes,
            &in_use,
        ],
    )?;
    Ok(())
}
