//! Bucket balances written as an append-only log (SQLite only).
//!
//! Every decision changes two or three bucket rows, and the tenants of one batch are spread
//! over the whole `buckets` table: upserting them in place dirtied about one random B-tree
//! page per admission, each a 4 KiB WAL frame. Instead, each commit appends one row to
//! `bucket_log` holding the batch's changed buckets (the rows always land on the table's
//! last page), and the balances are folded into `buckets` now and then.
//!
//! The rule that keeps this correct: a bucket's state is its newest log entry if it has
//! one, else its `buckets` row. Every commit that changes a bucket logs it in the same
//! transaction, so a fold may write any bucket's current value at any time; log rows are
//! deleted only once every bucket they name has been written since.
//!
//! Folding goes in epochs so that no commit carries a long one: once `fold_at` rows were
//! appended, the buckets named so far are written `fold_chunk` per commit from the row
//! cache (which holds every bucket this connection logged), and when all are written the
//! rows up to the epoch's start are deleted, `fold_chunk` per commit, oldest first
//! (deleting 4096 rows at once held the writer 10–16 ms). When the cache cannot vouch for
//! the log (at open, after another connection committed, after a failed commit), the next
//! transaction first folds the whole log from SQL.

use super::super::row_cache::RowCache;
use super::StoreError;
use crate::bucket;
use foldhash::{HashMap, HashSet};
use rusqlite::{params, Connection};

/// The table, created beside the shared schema (schema version 2 of SQLite).
pub(super) const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS bucket_log (seq INTEGER PRIMARY KEY, states BLOB NOT NULL);";

/// Log rows appended before an epoch of folding begins.
const FOLD_AT: u64 = 4096;
/// Buckets written into `buckets`, or log rows deleted, per commit during an epoch.
const FOLD_CHUNK: usize = 64;

/// This connection's view of the log.
pub(super) struct BucketLog {
    /// The row cache holds every bucket the log names; false until a fold from SQL made it
    /// so (at open, and whenever the cache was emptied).
    known: bool,
    /// The open transaction folded the log from SQL: if it rolls back, the log is back.
    folded_in_open_tx: bool,
    /// Buckets logged since the current epoch began (all of the log when none runs).
    logged: HashSet<String>,
    /// Rows appended since the current epoch began.
    rows: u64,
    /// The newest row this connection appended.
    last_seq: i64,
    epoch: Option<Epoch>,
    fold_at: u64,
    fold_chunk: usize,
}

/// A fold in progress: the rows up to `upto` go once every bucket in `pending` is written.
struct Epoch {
    upto: i64,
    pending: Vec<String>,
}

impl Default for BucketLog {
    fn default() -> Self {
        Self::with_limits(FOLD_AT, FOLD_CHUNK)
    }
}

impl BucketLog {
    pub(super) fn with_limits(fold_at: u64, fold_chunk: usize) -> Self {
        BucketLog {
            known: false,
            folded_in_open_tx: false,
            logged: HashSet::default(),
            rows: 0,
            last_seq: 0,
            epoch: None,
            fold_at: fold_at.max(1),
            fold_chunk: fold_chunk.max(1),
        }
    }

    /// At the start of each transaction: folds the whole log from SQL if the row cache
    /// cannot vouch for it, so that every `buckets` row read afterwards is current.
    pub(super) fn begin(&mut self, tx: &Connection) -> Result<(), StoreError> {
        if !self.known {
            fold_from_sql(tx)?;
            self.folded_in_open_tx = true;
        }
        Ok(())
    }

    /// Inside the committing transaction, after the batch: logs `changed` (the batch's
    /// buckets, as the row cache holds them now) and moves folding on.
    pub(super) fn write(
        &mut self,
        tx: &Connection,
        rows: &RowCache,
        changed: &[(String, bucket::State)],
    ) -> Result<(), StoreError> {
        if self.folded_in_open_tx {
            // The log is empty now, and so it stays if this transaction commits.
            self.forget_log();
            self.known = true;
            self.folded_in_open_tx = false;
        }
        if !changed.is_empty() {
            tx.prepare_cached("INSERT INTO bucket_log (states) VALUES (?1)")?
                .execute(params![encode(changed)])?;
            self.last_seq = tx.last_insert_rowid();
            for (name, _) in changed {
                if !self.logged.contains(name) {
                    self.logged.insert(name.clone());
                }
            }
            self.rows += 1;
        }
        if let Some(epoch) = &mut self.epoch {
            if epoch.pending.is_empty() {
                // Oldest first: whatever is left of the epoch's rows still ends with each
                // bucket's newest entry among them, which its `buckets` row now equals.
                let deleted = tx
                    .prepare_cached(
                        "DELETE FROM bucket_log WHERE seq IN
                         (SELECT seq FROM bucket_log WHERE seq <= ?1 ORDER BY seq LIMIT ?2)",
                    )?
                    .execute(params![epoch.upto, self.fold_chunk as i64])?;
                if deleted < self.fold_chunk {
                    self.epoch = None;
                }
                return Ok(());
            }
            let from = epoch.pending.len().saturating_sub(self.fold_chunk);
            for name in &epoch.pending[from..] {
                // Never missing while `known`; if it were, only a fold from SQL can say.
                let Some(Some(state)) = rows.bucket(name) else {
                    self.known = false;
                    return Ok(());
                };
                upsert(tx, name, state)?;
            }
            epoch.pending.truncate(from);
        } else if self.rows >= self.fold_at {
            self.epoch = Some(Epoch {
                upto: self.last_seq,
                pending: self.logged.drain().collect(),
            });
            self.rows = 0;
        }
        Ok(())
    }

    /// The transaction rolled back: a fold from SQL it made is undone with it.
    pub(super) fn rolled_back(&mut self) {
        self.folded_in_open_tx = false;
    }

    /// The row cache was emptied, or a commit failed: the next transaction folds from SQL.
    pub(super) fn forget(&mut self) {
        self.known = false;
        self.folded_in_open_tx = false;
        self.forget_log();
    }

    fn forget_log(&mut self) {
        self.logged.clear();
        self.rows = 0;
        self.epoch = None;
    }
}

/// Writes the newest logged state of every bucket into `buckets` and empties the log.
fn fold_from_sql(tx: &Connection) -> Result<(), StoreError> {
    let mut newest: HashMap<String, bucket::State> = HashMap::default();
    {
        let mut st = tx.prepare_cached("SELECT seq, states FROM bucket_log ORDER BY seq")?;
        let mut found = st.query([])?;
        while let Some(row) = found.next()? {
            let seq: i64 = row.get(0)?;
            let blob: Vec<u8> = row.get(1)?;
            decode(&blob, |name, state| {
                newest.insert(name.to_string(), state);
            })
            .map_err(|what| StoreError::Schema(format!("bucket log row {seq}: {what}")))?;
        }
    }
    if newest.is_empty() {
        return Ok(());
    }
    for (name, state) in &newest {
        upsert(tx, name, *state)?;
    }
    tx.prepare_cached("DELETE FROM bucket_log")?.execute([])?;
    Ok(())
}

fn upsert(tx: &Connection, name: &str, s: bucket::State) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO buckets (name, balance_micro, updated_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET balance_micro = ?2, updated_ms = ?3",
    )?
    .execute(params![name, s.balance_micro, s.updated_ms])?;
    Ok(())
}

/// One log row: for each bucket, its name's length (u32), the name (UTF-8), the balance
/// and the refill time (i64 each), all little-endian.
fn encode(changed: &[(String, bucket::State)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(changed.iter().map(|(n, _)| n.len() + 20).sum());
    for (name, s) in changed {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&s.balance_micro.to_le_bytes());
        out.extend_from_slice(&s.updated_ms.to_le_bytes());
    }
    out
}

/// Calls `each` for every bucket in a log row, in order; what is wrong with it otherwise.
fn decode(mut blob: &[u8], mut each: impl FnMut(&str, bucket::State)) -> Result<(), String> {
    fn take<'a>(blob: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if blob.len() < n {
            return Err("cut short".into());
        }
        let (head, rest) = blob.split_at(n);
        *blob = rest;
        Ok(head)
    }
    fn int<const N: usize>(blob: &mut &[u8]) -> Result<[u8; N], String> {
        Ok(take(blob, N)?.try_into().expect("take returns N bytes"))
    }
    while !blob.is_empty() {
        let len = u32::from_le_bytes(int(&mut blob)?) as usize;
        let name = std::str::from_utf8(take(&mut blob, len)?)
            .map_err(|_| "a bucket name is not UTF-8".to_string())?;
        let state = bucket::State {
            balance_micro: i64::from_le_bytes(int(&mut blob)?),
            updated_ms: i64::from_le_bytes(int(&mut blob)?),
        };
        each(name, state);
    }
    Ok(())
}

/// A bucket's state as a host would find it (its newest log entry, else its row), read
/// without folding.
#[cfg(test)]
pub(super) fn state_in_sql(
    conn: &Connection,
    name: &str,
) -> Result<Option<bucket::State>, StoreError> {
    use rusqlite::OptionalExtension;
    let mut found = conn
        .query_row(
            "SELECT balance_micro, updated_ms FROM buckets WHERE name = ?1",
            [name],
            |r| {
                Ok(bucket::State {
                    balance_micro: r.get(0)?,
                    updated_ms: r.get(1)?,
                })
            },
        )
        .optional()?;
    let mut st = conn.prepare("SELECT states FROM bucket_log ORDER BY seq")?;
    let mut rows = st.query([])?;
    while let Some(row) = rows.next()? {
        let blob: Vec<u8> = row.get(0)?;
        decode(&blob, |n, s| {
            if n == name {
                found = Some(s);
            }
        })
        .map_err(StoreError::Schema)?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(balance_micro: i64) -> bucket::State {
        bucket::State {
            balance_micro,
            updated_ms: 3,
        }
    }

    #[test]
    fn a_log_row_reads_back_as_written_and_a_damaged_one_is_refused() {
        let changed = vec![
            ("bucket:a:requests".to_string(), state(5)),
            ("bucket:é:tokens".to_string(), state(-1)),
        ];
        let blob = encode(&changed);
        let mut back = Vec::new();
        decode(&blob, |n, s| back.push((n.to_string(), s))).unwrap();
        assert_eq!(back, changed);
        let first = 4 + changed[0].0.len() + 16;
        for cut in (1..blob.len()).filter(|&c| c != first) {
            assert!(decode(&blob[..cut], |_, _| {}).is_err(), "cut at {cut}");
        }
        let mut huge = blob.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge, |_, _| {}).is_err());
    }
}
