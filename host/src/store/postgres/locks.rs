//! How replicas sharing one PostgreSQL database keep out of each other's way.
//!
//! A batch that names every row it writes (admissions, completions, reconciliations: its
//! operations, its tenants' buckets, slots and queues, the global and model buckets) takes
//! the engine's lock *shared* and one advisory lock per named row, all in one sorted order,
//! so two replicas' batches run at once unless they touch the same row, and cannot deadlock.
//! Anything else (dispatch across tenants, listings, meta, policy and directory writes)
//! takes the engine's lock *exclusive* and has the store to itself. A row a shared batch
//! did not name is locked only if it is free at once (`pg_try_advisory_xact_lock`, never a
//! wait out of order); if it is not, the batch is undone and run again exclusive.
//!
//! A release that knew only the exclusive lock conflicts with both modes, so replicas of
//! the two releases side by side still never interleave.

use std::collections::HashSet;

/// The engine's advisory lock (the one-key form): shared by named batches, exclusive for
/// the rest.
pub(super) const ENGINE_LOCK: i64 = 0x746f_6c6c_6761_7465; // "tollgate"

/// What one row is, for its lock: the two-key form of advisory locks, a key space apart
/// from [`ENGINE_LOCK`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct RowLock(i64);

impl RowLock {
    /// The lock of row `name` of `kind` (`bucket`, `slots`, `op`, `queue`). FNV-1a over
    /// both, so every replica and release names a row by the same number; two rows that
    /// share a number only wait for each other, never break anything.
    fn of(kind: &str, name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in kind.bytes().chain([0]).chain(name.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        RowLock(h as i64)
    }

    /// The lock of a bucket.
    pub(super) fn bucket(name: &str) -> Self {
        Self::of("bucket", name)
    }

    /// The lock of a scope's slot count.
    pub(super) fn slots(scope: &str) -> Self {
        Self::of("slots", scope)
    }

    /// The lock of a tenant's queue.
    pub(super) fn queue(tenant: &str) -> Self {
        Self::of("queue", tenant)
    }

    /// The lock of an operation.
    pub(super) fn operation(tenant: &str, key: &str) -> Self {
        Self::of("op", &format!("{tenant}\0{key}"))
    }

    /// The lock of an object a tenant owns (a stored response).
    pub(super) fn object(tenant: &str, kind: &str, id: &str) -> Self {
        Self::of("object", &format!("{tenant}\0{kind}\0{id}"))
    }

    /// The two 32-bit keys `pg_advisory_xact_lock(int4, int4)` takes.
    pub(super) fn keys(self) -> (i32, i32) {
        ((self.0 >> 32) as i32, self.0 as i32)
    }
}

/// What a transaction holds.
#[derive(Debug)]
pub(super) enum Held {
    /// The engine's lock shared and these rows' locks.
    Shared(HashSet<RowLock>),
    /// The engine's lock exclusive: the store to itself.
    Exclusive,
}

impl Held {
    /// The statements (one simple query, one round trip) that begin a transaction and take
    /// the engine's lock exclusive.
    pub(super) fn begin_exclusive_sql() -> String {
        format!("BEGIN; SELECT pg_advisory_xact_lock({ENGINE_LOCK})")
    }

    /// The statements that begin a transaction, take the engine's lock shared and then
    /// `rows`' locks in ascending order (`unnest` yields an array in its order, and the
    /// aggregate takes each lock as its row arrives); with the rows they hold.
    pub(super) fn begin_shared(rows: impl IntoIterator<Item = RowLock>) -> (String, Held) {
        let mut sorted: Vec<RowLock> = rows.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut sql = format!("BEGIN; SELECT pg_advisory_xact_lock_shared({ENGINE_LOCK})");
        if !sorted.is_empty() {
            let list = |part: fn((i32, i32)) -> i32| {
                let numbers: Vec<String> =
                    sorted.iter().map(|r| part(r.keys()).to_string()).collect();
                numbers.join(",")
            };
            sql.push_str(&format!(
                "; SELECT count(pg_advisory_xact_lock(a, b)) \
                 FROM unnest('{{{}}}'::int4[], '{{{}}}'::int4[]) AS u(a, b)",
                list(|(a, _)| a),
                list(|(_, b)| b),
            ));
        }
        (sql, Held::Shared(sorted.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_one_lock_whoever_asks_and_kinds_are_apart() {
        assert_eq!(RowLock::of("bucket", "a"), RowLock::of("bucket", "a"));
        assert_ne!(RowLock::of("bucket", "a"), RowLock::of("slots", "a"));
        assert_ne!(RowLock::operation("a", "b"), RowLock::operation("b", "a"));
        // The number is part of the contract between replicas: it must not move.
        assert_eq!(
            RowLock::of("bucket", "global.requests").0,
            0x17fb_c655_8683_bde6_u64 as i64
        );
    }

    #[test]
    fn locks_are_taken_in_one_order_whatever_order_they_are_named_in() {
        let rows = [
            RowLock::of("bucket", "b"),
            RowLock::of("bucket", "a"),
            RowLock::of("slots", "global"),
            RowLock::of("bucket", "a"),
        ];
        let (forward, held) = Held::begin_shared(rows);
        let (backward, _) = Held::begin_shared(rows.into_iter().rev());
        assert_eq!(forward, backward);
        assert!(forward.starts_with("BEGIN; SELECT pg_advisory_xact_lock_shared("));
        assert_eq!(forward.matches("pg_advisory_xact_lock(").count(), 1);
        let Held::Shared(set) = held else {
            panic!("a named batch holds its rows")
        };
        assert_eq!(set.len(), 3);
    }
}
