//! The waiting room: an interactive call refused only by shared capacity that frees by
//! itself (a deployment's slots, buckets or pause; a model's shared budgets; global
//! concurrency and requests; a group's request or token budget) waits for it instead of
//! being refused, as long as its deadline still fits, and is admitted in a fair order
//! (`room`).
//!
//! This module says which refusals a call waits for, when it gives up and what it is then
//! answered: the terms every owner of a room (a writer shard, the scenario runner, the
//! simulator) applies alike. Its owner admits the room's
//! [`WaitingRoom::candidates`] when something may have freed, takes out the admitted ones,
//! and refuses those whose time is up ([`WaitingRoom::due`]).

mod room;

pub use room::WaitingRoom;

use super::Decision;
use crate::config::Config;
use crate::model::{Priority, Request};
use crate::reason::{Outcome, Reason};

/// Whether a refusal is by shared capacity that frees by itself, so that the call may wait
/// for it. A tenant's own limits (its rate, tokens, concurrency and money) and money budgets
/// refill only with time the caller should not spend waiting: those are refused at once.
pub fn waits_for(d: &Decision) -> bool {
    if d.outcome != Outcome::Rejected {
        return false;
    }
    let limit = d.shortfall.as_ref().map(|s| s.limit.as_str());
    match d.reason {
        Some(
            Reason::DeploymentCapacity
            | Reason::GlobalConcurrency
            | Reason::GlobalRate
            | Reason::ModelRate,
        ) => true,
        // The model's shared bucket, not the tenant's own for the model.
        Some(Reason::ModelTokenBudget) => limit.is_some_and(|l| l.starts_with("model.")),
        Some(Reason::GroupBudget) => limit.is_some_and(|l| !l.ends_with(".cost_microusd")),
        _ => false,
    }
}

/// When a call refused by `d` can next be admitted, where that is known: the refill of the
/// bucket that was short. A slot count frees when a call ends, which no clock tells: `None`
/// (and so for a deployment, whose refusal may be its slots).
pub fn frees_at(d: &Decision, now_ms: i64) -> Option<i64> {
    let bucket = matches!(
        d.reason,
        Some(
            Reason::GlobalRate | Reason::ModelRate | Reason::ModelTokenBudget | Reason::GroupBudget
        )
    );
    let ms = d.retry_after_ms.filter(|_| bucket)?;
    Some(now_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
}

/// What a call's execution is estimated to take: the standard rules' `exec_base_ms` plus
/// `exec_ms_per_output_token` for each output token.
pub fn estimated_exec_ms(config: &Config, max_output_tokens: u64) -> u64 {
    let base = config.param("exec_base_ms").unwrap_or(0.0).max(0.0);
    let per = config
        .param("exec_ms_per_output_token")
        .unwrap_or(0.0)
        .max(0.0);
    (base + per * max_output_tokens as f64)
        .ceil()
        .min(u64::MAX as f64) as u64
}

/// When a call that starts waiting at `now_ms` gives up, and whether it is its deadline
/// (less its estimated execution) rather than the longest wait that ends it.
pub fn give_up_at(now_ms: i64, deadline_ms: i64, exec_ms: u64, max_wait_ms: u64) -> (i64, bool) {
    let by_deadline = super::admission::expire_at(deadline_ms, exec_ms);
    let by_wait = now_ms.saturating_add(i64::try_from(max_wait_ms).unwrap_or(i64::MAX));
    if by_deadline <= by_wait {
        (by_deadline, true)
    } else {
        (by_wait, false)
    }
}

/// A call `request` refused with `last` at `now_ms`, about to wait at most `max_wait_ms`
/// (and `waiting.max_wait_ms`), its deadline `deadline_ms` on the room's clock: the waiter
/// to let in, or, with the payload back, the answer to give at once: `deadline_exceeded`
/// when its deadline less its estimated execution has come, its refusal when the bucket
/// that refused it refills only after it would give up.
#[allow(clippy::result_large_err)]
pub fn waiter_for<T>(
    config: &Config,
    request: &Request,
    last: Decision,
    (now_ms, deadline_ms): (i64, i64),
    max_wait_ms: u64,
    payload: T,
) -> Result<Waiter<T>, (T, Decision)> {
    let wait = max_wait_ms.min(config.waiting.max_wait_ms);
    let exec = estimated_exec_ms(config, request.max_output_tokens);
    let (give_up, by_deadline) = give_up_at(now_ms, deadline_ms, exec, wait);
    let retry_at = frees_at(&last, now_ms);
    if give_up <= now_ms || retry_at.is_some_and(|at| at > give_up) {
        let d = if by_deadline {
            deadline_refusal(&last, 0, exec)
        } else {
            last
        };
        return Err((payload, d));
    }
    Ok(Waiter {
        id: 0,
        tenant: request.tenant.clone(),
        band: request.priority,
        model: request.model.clone(),
        tokens: request
            .input_tokens
            .saturating_add(request.optional_context_tokens)
            .saturating_add(request.max_output_tokens),
        weight: config.tenant(&request.tenant).map_or(1, |t| t.weight),
        entered_ms: now_ms,
        give_up_ms: give_up,
        by_deadline,
        exec_ms: exec,
        retry_at_ms: retry_at,
        last,
        payload,
    })
}

/// The room's bounds for `tenant` in a room that holds `1 / shares` of `waiting.total`:
/// `(per_tenant, total)`.
pub fn bounds(config: &Config, tenant: &str, shares: usize) -> (u32, u32) {
    let per_tenant = config.waiting.per_tenant_of(config.tenant(tenant));
    let total = config.waiting.total.div_ceil(shares.max(1) as u32).max(1);
    (per_tenant, total)
}

/// The answer to a waiter whose give-up time has come at `now_ms`, and how it left
/// (`deadline` or `max_wait`).
pub fn given_up<T>(w: &Waiter<T>, now_ms: i64) -> (Decision, &'static str) {
    let waited = (now_ms - w.entered_ms).max(0) as u64;
    if w.by_deadline {
        (deadline_refusal(&w.last, waited, w.exec_ms), "deadline")
    } else {
        (gave_up(&w.last, waited), "max_wait")
    }
}

/// The refusal of a call whose deadline, less its estimated execution, has come while it
/// waited (or would come before what refused it frees).
fn deadline_refusal(last: &Decision, waited_ms: u64, exec_ms: u64) -> Decision {
    let mut d = Decision::rejected(Reason::DeadlineExceeded, None);
    let why = last.reason.map_or("capacity", |r| r.as_str());
    d.message = Some(format!(
        "deadline_exceeded: waited {waited_ms} ms for {why}; the call's deadline less its estimated execution ({exec_ms} ms) has come, so it would not finish in time"
    ));
    d.waited_ms = Some(waited_ms);
    d
}

/// The latest refusal of a call that waited the longest wait, saying so.
fn gave_up(last: &Decision, waited_ms: u64) -> Decision {
    let mut d = last.clone();
    let before = d.message.take().unwrap_or_default();
    d.message = Some(format!(
        "{before} (waited {waited_ms} ms, the longest wait: waiting.max_wait_ms)"
    ));
    d.waited_ms = Some(waited_ms);
    d
}

/// One waiting call.
#[derive(Debug)]
pub struct Waiter<T> {
    /// Its number in the room, given by [`WaitingRoom::enter`].
    pub id: u64,
    /// Its tenant.
    pub tenant: String,
    /// Its band.
    pub band: Priority,
    /// The model it is for, if any: a later call for the same model does not pass it.
    pub model: Option<String>,
    /// The tokens it would reserve (what admitting it charges its tenant's counter).
    pub tokens: u64,
    /// The tenant's weight.
    pub weight: u32,
    /// When it started waiting.
    pub entered_ms: i64,
    /// When it gives up.
    pub give_up_ms: i64,
    /// Whether that is its deadline (`deadline_exceeded`) rather than the longest wait.
    pub by_deadline: bool,
    /// Its estimated execution, which its deadline must leave room for.
    pub exec_ms: u64,
    /// Not tried again before this time (a bucket's refill, a pause's end); `None`: at the
    /// next event that frees something.
    pub retry_at_ms: Option<i64>,
    /// Its latest refusal.
    pub last: Decision,
    /// What its owner keeps with it (the writer: the job and where its answer goes).
    pub payload: T,
}

/// Why a call cannot wait: the room's bounds, with their numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The tenant already has `bound` calls waiting.
    Tenant {
        /// `waiting.per_tenant`, or the tenant's own.
        bound: u32,
    },
    /// The room holds `bound` calls in all.
    Total {
        /// `waiting.total` (this room's share of it).
        bound: u32,
    },
}

impl Full {
    /// One sentence saying which bound is reached.
    pub fn message(self, tenant: &str) -> String {
        match self {
            Full::Tenant { bound } => format!(
                "queue_full: tenant {tenant} already has {bound} calls waiting (waiting.per_tenant {bound}); retry when one has been served"
            ),
            Full::Total { bound } => format!(
                "queue_full: {bound} calls are waiting, the most the waiting room holds (waiting.total); retry shortly"
            ),
        }
    }
}
