//! Dispatch (docs/contract.md section 5): expire what can no longer meet its deadline, then claim
//! queued jobs for a worker, visiting tenants in name order by weighted round robin (by job
//! count) or deficit round robin (by reserved tokens). The position persists in the store.
//!
//! Each step reads only the next backlogged tenant (an index seek) and its ready head, so the
//! cost of a claim does not grow with the number of queued jobs.

use super::budgets::{Budgets, Needs};
use super::{downstream_available, job_ref, Engine};
use crate::config::Discipline;
use crate::model::{JobRef, OpState, Priority};
use crate::store::{QueuedJob, Store, StoreError, Tx};
use serde::Serialize;
use std::collections::BTreeMap;

/// Why a dispatch claimed fewer jobs than asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchReason {
    /// The downstream is marked unavailable.
    DownstreamUnavailable,
    /// The worker holds `max_claims_per_worker` unfinished claims.
    WorkerAtCapacity,
    /// Ready jobs exist, but none could reserve its tokens and a slot.
    NoCapacity,
    /// No job is ready.
    Empty,
}

/// One claimed job: what the worker needs to make the call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Claim {
    /// The job's tenant.
    pub tenant: String,
    /// The job's operation key.
    pub key: String,
    /// Where the job's body is (tollgate never holds bodies).
    pub body_ref: Option<String>,
    /// The deadline stored at admission.
    pub deadline_ms: i64,
    /// Tokens reserved for the call.
    pub reserved_tokens: u64,
    /// The output limit the call must use.
    pub max_output_tokens: u64,
    /// The attempt this claim is, from 1.
    pub attempt: u32,
    /// The W3C `traceparent` of the job's admission, when it was traced: a worker may send
    /// it on to continue the trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// The answer to one dispatch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DispatchAnswer {
    /// The jobs claimed, in claim order.
    pub claimed: Vec<Claim>,
    /// The jobs this call expired.
    pub expired: Vec<JobRef>,
    /// Why fewer than asked were claimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<DispatchReason>,
}

impl DispatchAnswer {
    /// Claims per tenant, for fairness checks.
    pub fn claimed_by_tenant(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for c in &self.claimed {
            *out.entry(c.tenant.clone()).or_insert(0) += 1;
        }
        out
    }
}

/// Where the round robin stands between calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Position {
    /// The tenant whose turn it is (or was last).
    tenant: Option<String>,
    /// Whether that tenant's turn is still going on.
    in_turn: bool,
    /// Jobs taken in the current turn (`wrr`).
    taken: u32,
}

const POSITION: &str = "scheduler_position";

/// Where a band's position is kept: the standard band's where it always was, so a store
/// written before bands existed goes on from its position.
fn position_name(band: Priority) -> String {
    match band {
        Priority::Standard => POSITION.to_string(),
        other => format!("{POSITION}.{}", other.as_str()),
    }
}

/// A tenant's DRR credit in one band: the standard band's in the tenant's queue row, as
/// before bands existed, the others' beside the positions.
fn deficit(tx: &mut dyn Tx, band: Priority, tenant: &str) -> Result<u64, StoreError> {
    match band {
        Priority::Standard => tx.deficit(tenant),
        other => Ok(tx
            .meta(&format!("drr_deficit.{}.{tenant}", other.as_str()))?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)),
    }
}

fn set_deficit(
    tx: &mut dyn Tx,
    band: Priority,
    tenant: &str,
    value: u64,
) -> Result<(), StoreError> {
    match band {
        Priority::Standard => tx.set_deficit(tenant, value),
        other => tx.set_meta(
            &format!("drr_deficit.{}.{tenant}", other.as_str()),
            &value.to_string(),
        ),
    }
}

impl Position {
    fn load(tx: &mut dyn Tx, band: Priority) -> Result<Self, StoreError> {
        let Some(raw) = tx.meta(&position_name(band))? else {
            return Ok(Position::default());
        };
        let v: serde_json::Value = serde_json::from_str(&raw)?;
        Ok(Position {
            tenant: v["tenant"].as_str().map(str::to_string),
            in_turn: v["in_turn"].as_bool().unwrap_or(false),
            taken: v["taken"].as_u64().unwrap_or(0) as u32,
        })
    }

    fn save(&self, tx: &mut dyn Tx, band: Priority) -> Result<(), StoreError> {
        let v = serde_json::json!({"tenant": self.tenant, "in_turn": self.in_turn, "taken": self.taken});
        tx.set_meta(&position_name(band), &v.to_string())
    }
}

/// How a tenant's turn ended without a claim.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blocked {
    /// No ready job (empty, or waiting for `not_before`).
    NotReady,
    /// The head job could not reserve tokens and a slot.
    Capacity,
    /// The head job needs more deficit than the tenant has (`drr_tokens`).
    Deficit {
        head_tokens: u64,
        deficit: u64,
        quantum: u64,
    },
}

impl<S: Store> Engine<S> {
    /// Expires infeasible jobs, then claims up to `count` jobs for `worker`.
    ///
    /// # Errors
    /// Only the store's own failure: nothing was claimed or expired.
    pub fn dispatch(
        &self,
        worker: &str,
        count: u32,
        now_ms: i64,
    ) -> Result<DispatchAnswer, StoreError> {
        self.transaction(|tx| self.dispatch_in(tx, worker, count, now_ms))
    }

    pub(super) fn dispatch_in(
        &self,
        tx: &mut dyn Tx,
        worker: &str,
        count: u32,
        now_ms: i64,
    ) -> Result<DispatchAnswer, StoreError> {
        let expired = expire(tx, now_ms)?;
        let mut answer = DispatchAnswer {
            claimed: Vec::new(),
            expired,
            reason: None,
        };
        if count == 0 {
            return Ok(answer);
        }
        if !downstream_available(tx)? {
            answer.reason = Some(DispatchReason::DownstreamUnavailable);
            return Ok(answer);
        }
        let held = tx.unfinished_claims(worker)?;
        let room = self.config().max_claims_per_worker.saturating_sub(held);
        let want = count.min(room);

        // Bands strictly in order: a band is served only once the ones before it have no
        // job that can be claimed now. Each band keeps its own round-robin position.
        let mut stops = Vec::new();
        for band in Priority::BANDS {
            if (answer.claimed.len() as u32) >= want {
                break;
            }
            stops.push(self.dispatch_band(tx, band, worker, want, &mut answer.claimed, now_ms)?);
        }
        if (answer.claimed.len() as u32) < count {
            answer.reason = Some(if (answer.claimed.len() as u32) == want && want < count {
                DispatchReason::WorkerAtCapacity
            } else if stops.contains(&DispatchReason::NoCapacity) {
                DispatchReason::NoCapacity
            } else {
                DispatchReason::Empty
            });
        }
        Ok(answer)
    }

    /// Claims from one band until `claimed` holds `want` jobs or the band has nothing more
    /// to give, and says why it stopped.
    fn dispatch_band(
        &self,
        tx: &mut dyn Tx,
        band: Priority,
        worker: &str,
        want: u32,
        claimed: &mut Vec<Claim>,
        now_ms: i64,
    ) -> Result<DispatchReason, StoreError> {
        let mut pos = Position::load(tx, band)?;
        // The turns since the last claim; meeting any of their tenants again means every
        // backlogged tenant has had a turn without a claim.
        let mut stalled: Vec<(String, Blocked)> = Vec::new();
        let mut stop = DispatchReason::Empty;
        while (claimed.len() as u32) < want {
            // Whose turn: the current one if it is still going on, else the next backlogged.
            let tenant = match (&pos.tenant, pos.in_turn) {
                (Some(t), true) => t.clone(),
                (current, _) => {
                    let next = match tx.next_backlogged(band, current.as_deref())? {
                        Some(t) => Some(t),
                        None => tx.next_backlogged(band, None)?,
                    };
                    let Some(next) = next else {
                        break;
                    };
                    if stalled.iter().any(|(t, _)| *t == next) {
                        // A whole cycle without a claim.
                        if !self.fast_forward(tx, band, &stalled)? {
                            if stalled.iter().any(|(_, b)| *b == Blocked::Capacity) {
                                stop = DispatchReason::NoCapacity;
                            }
                            break;
                        }
                        stalled.clear();
                    }
                    pos = Position {
                        tenant: Some(next.clone()),
                        in_turn: true,
                        taken: 0,
                    };
                    if self.config().discipline == Discipline::DrrTokens {
                        let d = deficit(tx, band, &next)?;
                        set_deficit(tx, band, &next, d.saturating_add(self.quantum(&next)))?;
                    }
                    next
                }
            };
            match self.take_turn_step(tx, band, &tenant, worker, &mut pos, now_ms)? {
                Ok(claim) => {
                    claimed.push(claim);
                    stalled.clear();
                }
                Err(blocked) => {
                    pos.in_turn = false;
                    stalled.push((tenant, blocked));
                }
            }
        }
        pos.save(tx, band)?;
        Ok(stop)
    }

    fn quantum(&self, tenant: &str) -> u64 {
        let weight = self.config().tenant(tenant).map_or(1, |t| t.weight);
        self.config()
            .quantum_tokens
            .saturating_mul(u64::from(weight))
    }

    /// One claim attempt within `tenant`'s turn. On a claim the turn goes on unless its
    /// share is used up; otherwise the turn ends with why.
    fn take_turn_step(
        &self,
        tx: &mut dyn Tx,
        band: Priority,
        tenant: &str,
        worker: &str,
        pos: &mut Position,
        now_ms: i64,
    ) -> Result<Result<Claim, Blocked>, StoreError> {
        let Some(head) = tx.ready_head(tenant, band, now_ms)? else {
            if self.config().discipline == Discipline::DrrTokens
                && !tx.band_has_jobs(tenant, band)?
            {
                set_deficit(tx, band, tenant, 0)?;
            }
            return Ok(Err(Blocked::NotReady));
        };
        let drr = self.config().discipline == Discipline::DrrTokens;
        let deficit = if drr { deficit(tx, band, tenant)? } else { 0 };
        if drr && head.tokens > deficit {
            return Ok(Err(Blocked::Deficit {
                head_tokens: head.tokens,
                deficit,
                quantum: self.quantum(tenant),
            }));
        }
        let Some(claim) = self.claim(tx, &head, worker, now_ms)? else {
            if drr {
                // A blocked tenant does not bank credit beyond one turn's worth.
                let kept = deficit.min(self.quantum(tenant).max(head.tokens));
                set_deficit(tx, band, tenant, kept)?;
            }
            return Ok(Err(Blocked::Capacity));
        };
        if drr {
            let left = deficit - head.tokens;
            let empty = !tx.band_has_jobs(tenant, band)?;
            set_deficit(tx, band, tenant, if empty { 0 } else { left })?;
            if empty {
                pos.in_turn = false;
            }
        } else {
            pos.taken += 1;
            let weight = self.config().tenant(tenant).map_or(1, |t| t.weight);
            if pos.taken >= weight {
                pos.in_turn = false;
            }
        }
        Ok(Ok(claim))
    }

    /// After a cycle with no claim, gives deficit-blocked tenants the turns they would need
    /// all at once, so that a job larger than the quantum does not take many empty cycles.
    /// Returns whether another cycle can claim anything.
    fn fast_forward(
        &self,
        tx: &mut dyn Tx,
        band: Priority,
        stalled: &[(String, Blocked)],
    ) -> Result<bool, StoreError> {
        let waiting: Vec<(&String, u64, u64, u64)> = stalled
            .iter()
            .filter_map(|(t, b)| match *b {
                Blocked::Deficit {
                    head_tokens,
                    deficit,
                    quantum,
                } => Some((t, head_tokens, deficit, quantum)),
                _ => None,
            })
            .collect();
        let Some(rounds) = waiting
            .iter()
            .map(|(_, head, deficit, quantum)| (head - deficit).div_ceil((*quantum).max(1)))
            .min()
        else {
            return Ok(false);
        };
        // The next turn adds one quantum itself; add the turns before it here.
        let extra = rounds.saturating_sub(1);
        for (tenant, _, deficit, quantum) in waiting {
            let more = deficit.saturating_add(extra.saturating_mul(quantum));
            set_deficit(tx, band, tenant, more)?;
        }
        Ok(true)
    }

    /// Reserves tokens and slots for a queued job and hands it to `worker`, all or nothing.
    fn claim(
        &self,
        tx: &mut dyn Tx,
        job: &QueuedJob,
        worker: &str,
        now_ms: i64,
    ) -> Result<Option<Claim>, StoreError> {
        let Some(mut op) = tx.operation(&job.tenant, &job.key)? else {
            // A queue entry without its operation cannot be dispatched; drop it.
            tx.dequeue(&job.tenant, &job.key)?;
            return Ok(None);
        };
        let config = self.config();
        let Some(tenant) = config.tenant(&job.tenant) else {
            return Ok(None);
        };
        let budgets = Budgets::for_request(&config, &job.tenant, tenant, op.model.as_deref())
            .held_by(self.holder());
        let cost = budgets.cost(
            op.input_tokens + op.optional_context_tokens,
            op.max_output_tokens,
        );
        let needs = Needs {
            requests: false,
            tokens: job.tokens,
            cost_microusd: cost,
            slots: true,
            busy_retry_after_ms: None,
        };
        let taken = match budgets.reserve(tx, now_ms, &needs)? {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        tx.dequeue(&job.tenant, &job.key)?;
        if op.last_result.is_some() {
            // A retried job: its attempt grows when it is claimed again.
            op.attempt += 1;
            op.last_result = None;
            op.last_retry = None;
        }
        op.state = OpState::Active;
        op.worker = Some(worker.to_string());
        op.holds_slot = taken.global_slot;
        op.holds_tenant_slot = taken.tenant_slot;
        op.tokens_reserved = true;
        op.reserved_cost_microusd = cost;
        op.not_before_ms = None;
        op.state_since_ms = Some(now_ms);
        tx.put_operation(&op)?;
        Ok(Some(Claim {
            tenant: op.tenant.clone(),
            key: op.key.clone(),
            body_ref: op.body_ref.clone(),
            deadline_ms: op.deadline_ms,
            reserved_tokens: op.reserved_tokens,
            max_output_tokens: op.max_output_tokens,
            attempt: op.attempt,
            traceparent: op.trace_context.clone(),
        }))
    }
}

/// Expires every queued job that can no longer meet its deadline at `now_ms`.
fn expire(tx: &mut dyn Tx, now_ms: i64) -> Result<Vec<JobRef>, StoreError> {
    let mut expired = Vec::new();
    for job in tx.infeasible(now_ms)? {
        tx.dequeue(&job.tenant, &job.key)?;
        if let Some(mut op) = tx.operation(&job.tenant, &job.key)? {
            op.state = OpState::Expired;
            op.not_before_ms = None;
            op.state_since_ms = Some(now_ms);
            tx.put_operation(&op)?;
        }
        expired.push(job_ref(&job.tenant, &job.key));
    }
    Ok(expired)
}
