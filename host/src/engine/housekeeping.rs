//! Housekeeping, off the hot path: calls `active` for longer than `limits.max_call_ms` are
//! abandoned (their caller vanished) and become `unknown`, keeping their slot until someone
//! reconciles them, since termination is still not known; finished operations older than
//! `retention.operations_days` are deleted. Each sweep reads a bounded stretch of the table
//! in key order in one transaction and the next resumes after it, so a large table never
//! stalls the writer and the hot path keeps no index on the state (one cost a third of the
//! store's throughput). Listings of operations are pages in (tenant, key) order.

use super::{Engine, OperationView};
use crate::model::{OpState, Operation};
use crate::store::{Store, StoreError, Tx};
use serde::Serialize;
use std::sync::Mutex;

/// Rows one sweep looks at (about a millisecond of the writer's time).
pub const SWEEP_ROWS: u32 = 1024;
/// Rows a listing filtered by a state other than `unknown` looks at per page.
const SCAN_ROWS: u32 = 10_000;
/// The most operations one page lists.
pub const MOST_PER_PAGE: u32 = 1000;

/// The finished states retention deletes from.
const FINISHED: [OpState; 3] = [OpState::Succeeded, OpState::FailedFinal, OpState::Expired];

/// Where a listing starts: after an operation (exclusive), at most `limit` of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    /// The tenant and key of the last operation of the previous page.
    pub after: Option<(String, String)>,
    /// At most this many (capped at [`MOST_PER_PAGE`] over HTTP).
    pub limit: u32,
}

impl Page {
    /// Every operation at once (the library's and the scenarios' `inspect`).
    pub fn all() -> Page {
        Page {
            after: None,
            limit: u32::MAX,
        }
    }

    /// The opaque cursor naming the operation a next page starts after.
    pub fn cursor(tenant: &str, key: &str) -> String {
        let text = format!("{}:{tenant}{key}", tenant.len());
        text.bytes().map(|b| format!("{b:02x}")).collect()
    }

    /// The tenant and key a cursor names; `None` when it is not one.
    pub fn parse_cursor(cursor: &str) -> Option<(String, String)> {
        if !cursor.len().is_multiple_of(2) || cursor.len() > 4 * 1024 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..cursor.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
            .collect();
        let text = String::from_utf8(bytes?).ok()?;
        let (len, rest) = text.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let tenant = rest.get(..len)?;
        Some((tenant.to_string(), rest[len..].to_string()))
    }

    fn after(&self) -> Option<(&str, &str)> {
        self.after.as_ref().map(|(t, k)| (t.as_str(), k.as_str()))
    }
}

/// One page of operations, and the cursor of the next when there may be more.
#[derive(Clone, Debug, Serialize)]
pub struct OperationsPage {
    /// The operations, ordered by tenant and key.
    pub operations: Vec<OperationView>,
    /// Pass as `after` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Reads one page of operations (in `state`, when given). `unknown` ones come from their
/// own index; another state is a filtered scan of at most [`SCAN_ROWS`] rows, so a page may
/// hold fewer than `limit` and still have a `next`.
pub(super) fn page_in(
    tx: &mut dyn Tx,
    state: Option<OpState>,
    page: &Page,
) -> Result<OperationsPage, StoreError> {
    let (operations, last) = match state {
        None => {
            let ops = tx.operations_after(page.after(), page.limit)?;
            let last = full_page_end(&ops, page.limit);
            (ops, last)
        }
        Some(OpState::Unknown) => {
            let ops = tx.unknown_operations_after(page.after(), page.limit)?;
            let last = full_page_end(&ops, page.limit);
            (ops, last)
        }
        Some(state) => {
            let scanned = tx.operations_after(page.after(), SCAN_ROWS)?;
            let last = full_page_end(&scanned, SCAN_ROWS);
            let mut kept = Vec::new();
            let mut end = last;
            for op in scanned {
                if op.state != state {
                    continue;
                }
                if kept.len() as u32 == page.limit {
                    // Full: the next page starts after the last one kept.
                    end = kept
                        .last()
                        .map(|o: &Operation| (o.tenant.clone(), o.key.clone()));
                    break;
                }
                kept.push(op);
            }
            (kept, end)
        }
    };
    Ok(OperationsPage {
        operations: operations.iter().map(OperationView::of).collect(),
        next: last.map(|(t, k)| Page::cursor(&t, &k)),
    })
}

/// The last operation of a page that came back full (there may be more after it).
fn full_page_end(ops: &[Operation], limit: u32) -> Option<(String, String)> {
    match ops.last() {
        Some(last) if ops.len() as u64 == u64::from(limit) => {
            Some((last.tenant.clone(), last.key.clone()))
        }
        _ => None,
    }
}

/// How long sent alerts are kept: longer than the longest period (a month).
const SENT_ALERTS_KEPT_MS: i64 = 62 * 86_400_000;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Calls found abandoned, now `unknown`.
    pub abandoned: Vec<(String, String)>,
    /// Finished operations deleted for retention.
    pub deleted: u64,
    /// Operations `unknown` now (abandoned or reported so), awaiting reconciliation.
    pub unknown: u64,
    /// Saved answers deleted: expired, or the soonest to expire while over the bound.
    pub answers_deleted: u64,
    /// Hours of the spend ledger deleted for retention (rows).
    pub spend_deleted: u64,
    /// Records of owned objects (stored responses) deleted for retention.
    pub owned_objects_deleted: u64,
    /// Whether the sweep stopped at the end of a full stretch: the table goes on, and
    /// another sweep at once would carry on from there.
    pub more: bool,
    /// Operations looked at (at most [`SWEEP_ROWS`]).
    pub walked: u64,
    /// Operations from before `state_since_ms` existed, stamped with the sweep's time.
    pub stamped: u64,
}

impl Sweep {
    /// Whether the sweep changed an operation (abandoned, deleted or stamped one): while
    /// sweeps do, the next may well too.
    pub fn changed_any(&self) -> bool {
        !self.abandoned.is_empty() || self.deleted > 0 || self.stamped > 0
    }
}

/// Where the next sweep resumes: the last operation the previous one looked at.
#[derive(Default)]
pub(super) struct SweepCursor(Option<(String, String)>);

impl<S: Store> Engine<S> {
    /// One bounded sweep at `now_ms`: abandoned calls become `unknown`, finished operations
    /// past retention are deleted. Records from before `state_since_ms` existed are stamped
    /// with `now_ms`, so their clock starts at the upgrade.
    pub fn sweep(&self, now_ms: i64) -> Result<Sweep, StoreError> {
        let config = self.config();
        let mut cursor = self.sweep_cursor.lock().unwrap_or_else(|e| e.into_inner());
        let cursor = &mut cursor.0;
        let max_call = i64::try_from(config.max_call_ms).unwrap_or(i64::MAX);
        let keep = config
            .retention_ms
            .map(|k| i64::try_from(k).unwrap_or(i64::MAX));
        self.transaction(|tx| {
            let mut sweep = Sweep::default();
            // The table in key order, a bounded stretch per sweep: no index on the state
            // for the hot path to keep up.
            let after = cursor.as_ref().map(|(t, k)| (t.as_str(), k.as_str()));
            let ops = tx.operations_after(after, SWEEP_ROWS)?;
            *cursor = full_page_end(&ops, SWEEP_ROWS);
            sweep.more = cursor.is_some();
            sweep.walked = ops.len() as u64;
            for mut op in ops {
                let finished = FINISHED.contains(&op.state);
                if op.state != OpState::Active && !(finished && keep.is_some()) {
                    continue;
                }
                let Some(since) = op.state_since_ms else {
                    op.state_since_ms = Some(now_ms);
                    tx.put_operation(&op)?;
                    sweep.stamped += 1;
                    continue;
                };
                let age = now_ms.saturating_sub(since);
                if op.state == OpState::Active && age >= max_call {
                    // The slot and the reservation stay held: the call may still be
                    // running at the provider.
                    op.state = OpState::Unknown;
                    op.state_since_ms = Some(now_ms);
                    tx.put_operation(&op)?;
                    sweep.abandoned.push((op.tenant, op.key));
                } else if finished && keep.is_some_and(|keep| age >= keep) {
                    tx.delete_operation(&op.tenant, &op.key)?;
                    sweep.deleted += 1;
                }
            }
            sweep.unknown = tx.count_unknown()?;
            // Saved answers past their time, then the soonest to expire while over the bound.
            sweep.answers_deleted = tx.delete_answers(now_ms, SWEEP_ROWS)?;
            let mut rounds = 0;
            while rounds < 16 && tx.answer_bytes()? > config.saved_answers_max_bytes {
                sweep.answers_deleted += tx.delete_answers(i64::MAX, 64)?;
                rounds += 1;
            }
            if let Some(keep) = config.spend_retention_ms {
                let before = now_ms.saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX));
                sweep.spend_deleted = tx.delete_spend(before, SWEEP_ROWS)?;
            }
            if let Some(keep) = config.owned_objects_retention_ms {
                let before = now_ms.saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX));
                sweep.owned_objects_deleted = tx.delete_owned_objects(before, SWEEP_ROWS)?;
            }
            // A sent alert's id keeps a second crossing in its period from being written:
            // kept longer than any period.
            tx.delete_sent_alerts(now_ms.saturating_sub(SENT_ALERTS_KEPT_MS), SWEEP_ROWS)?;
            Ok(sweep)
        })
    }

    /// One page of operations, in `state` when given.
    pub fn operations_page(
        &self,
        state: Option<OpState>,
        page: &Page,
    ) -> Result<OperationsPage, StoreError> {
        self.transaction(|tx| page_in(tx, state, page))
    }
}

/// The sweep's resume point, for [`Engine`].
pub(super) type Cursor = Mutex<SweepCursor>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_name_a_tenant_and_key_and_nothing_else() {
        for (t, k) in [("acme", "op-1"), ("a:b", "1:2"), ("t", ""), ("ü", "k/ey")] {
            assert_eq!(
                Page::parse_cursor(&Page::cursor(t, k)),
                Some((t.to_string(), k.to_string()))
            );
        }
        for bad in ["", "zz", "3", "0a", &"00".repeat(3000)] {
            assert_eq!(Page::parse_cursor(bad), None, "{bad}");
        }
    }
}
