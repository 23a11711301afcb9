//! The standard rules of docs/contract.md (degradation, deadline estimate, retry eligibility),
//! written against the host imports so that other policies can reuse them.
//!
//! This file names its parent module (`super`), not the crate: the host also compiles it
//! natively, beside an implementation of the same imports, to measure the cost of the
//! sandbox against the very same rules.

use super::{
    host, Admission, BucketKind, Failure, FailureReport, GiveUpReason, Plan, Priority, Refusal,
    RefusalReason, Request, RetryDecision, Route, SlotScope,
};
use alloc::string::String;
use core::cell::Cell;

/// A policy parameter as a number, or `default` when the configuration does not set it.
pub fn param_or(name: &str, default: f64) -> f64 {
    host::param(name).unwrap_or(default)
}

/// The tokens a request reserves: input, optional context and the output cap.
pub fn reservation(input: u64, optional_context: u64, max_output: u64) -> u64 {
    input
        .saturating_add(optional_context)
        .saturating_add(max_output)
}

/// A parameter the standard rules read, with its default of docs/configuration.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    MaxAttempts,
    BackoffBaseMs,
    BackoffCapMs,
    ExecBaseMs,
    ExecMsPerOutputToken,
    DegradeAtSlotFraction,
    DegradeOnTokenShortage,
    DegradedMaxOutputTokens,
    BusyRetryAfterMs,
    ShedSheddableAtSlotFraction,
}

impl Param {
    /// Every parameter, in the order `self_check` reports them.
    pub const ALL: [Param; 10] = [
        Param::MaxAttempts,
        Param::BackoffBaseMs,
        Param::BackoffCapMs,
        Param::ExecBaseMs,
        Param::ExecMsPerOutputToken,
        Param::DegradeAtSlotFraction,
        Param::DegradeOnTokenShortage,
        Param::DegradedMaxOutputTokens,
        Param::BusyRetryAfterMs,
        Param::ShedSheddableAtSlotFraction,
    ];

    /// Its name under `policy_params` and its default.
    pub const fn spec(self) -> (&'static str, f64) {
        match self {
            Param::MaxAttempts => ("max_attempts", 3.0),
            Param::BackoffBaseMs => ("backoff_base_ms", 100.0),
            Param::BackoffCapMs => ("backoff_cap_ms", 2000.0),
            Param::ExecBaseMs => ("exec_base_ms", 0.0),
            Param::ExecMsPerOutputToken => ("exec_ms_per_output_token", 0.0),
            Param::DegradeAtSlotFraction => ("degrade_at_slot_fraction", 1.0),
            Param::DegradeOnTokenShortage => ("degrade_on_token_shortage", 0.0),
            Param::DegradedMaxOutputTokens => ("degraded_max_output_tokens", 256.0),
            Param::BusyRetryAfterMs => ("busy_retry_after_ms", 1000.0),
            Param::ShedSheddableAtSlotFraction => ("shed_sheddable_at_slot_fraction", 1.0),
        }
    }
}

/// The parameters of one decision, each read through `host::param` the first time a rule
/// needs it: a host call costs more than the rule that uses its answer, and most decisions
/// need only a few (an interactive admission six calls in all, a durable one three).
#[derive(Debug, Default)]
pub struct Params {
    read: [Cell<Option<f64>>; Param::ALL.len()],
}

impl Params {
    /// Nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The parameter's value, read from the host once per decision.
    pub fn get(&self, param: Param) -> f64 {
        let cell = &self.read[param as usize];
        if let Some(value) = cell.get() {
            return value;
        }
        let (name, default) = param.spec();
        let value = param_or(name, default);
        cell.set(Some(value));
        value
    }

    pub fn max_attempts(&self) -> f64 {
        self.get(Param::MaxAttempts)
    }
    pub fn backoff_base_ms(&self) -> f64 {
        self.get(Param::BackoffBaseMs)
    }
    pub fn backoff_cap_ms(&self) -> f64 {
        self.get(Param::BackoffCapMs)
    }
    pub fn degrade_at_slot_fraction(&self) -> f64 {
        self.get(Param::DegradeAtSlotFraction)
    }
    pub fn degrade_on_token_shortage(&self) -> bool {
        self.get(Param::DegradeOnTokenShortage) != 0.0
    }
    pub fn degraded_max_output_tokens(&self) -> f64 {
        self.get(Param::DegradedMaxOutputTokens)
    }
    pub fn busy_retry_after_ms(&self) -> f64 {
        self.get(Param::BusyRetryAfterMs)
    }
    pub fn shed_sheddable_at_slot_fraction(&self) -> f64 {
        self.get(Param::ShedSheddableAtSlotFraction)
    }

    /// `exec_base_ms + max_output_tokens * exec_ms_per_output_token`, rounded up.
    pub fn estimated_exec_ms(&self, max_output_tokens: u64) -> u64 {
        let ms = self.get(Param::ExecBaseMs)
            + max_output_tokens as f64 * self.get(Param::ExecMsPerOutputToken);
        to_u64(libm_ceil(ms))
    }
}

/// Checks that the parameters make sense before the policy is activated.
pub fn self_check() -> Result<(), String> {
    let p = Params::new();
    for param in Param::ALL {
        if param == Param::DegradeOnTokenShortage {
            continue;
        }
        let value = p.get(param);
        if !value.is_finite() || value < 0.0 {
            return Err(alloc::format!(
                "policy_params.{} must be a finite number >= 0",
                param.spec().0
            ));
        }
    }
    if p.max_attempts() < 1.0 {
        return Err("policy_params.max_attempts must be at least 1".into());
    }
    if p.degraded_max_output_tokens() < 1.0 {
        return Err("policy_params.degraded_max_output_tokens must be at least 1".into());
    }
    Ok(())
}

/// The standard admission: shed `sheddable` interactive work when global slots in use
/// reach `shed_sheddable_at_slot_fraction` (below 1), degrade other interactive requests
/// (never `critical` ones) under slot pressure or (when enabled) token shortage, and
/// estimate the execution time of what is planned.
pub fn admit(req: &Request) -> Admission {
    let p = Params::new();
    let interactive = req.route == Route::Interactive;
    if interactive
        && req.priority == Priority::Sheddable
        && p.shed_sheddable_at_slot_fraction() < 1.0
        && slots_reach(p.shed_sheddable_at_slot_fraction())
    {
        return Admission::Refuse(Refusal {
            reason: RefusalReason::Overloaded,
            retry_after_ms: Some(to_u64(p.busy_retry_after_ms())),
        });
    }
    let degrade = interactive
        && req.priority != Priority::Critical
        && (slots_reach(p.degrade_at_slot_fraction())
            || (p.degrade_on_token_shortage() && token_shortage_cured(req, reduce(req, &p))));
    let plan_fields = if degrade {
        reduce(req, &p)
    } else {
        (req.max_output_tokens, req.optional_context_tokens)
    };
    Admission::Admit(Plan {
        max_output_tokens: plan_fields.0,
        optional_context_tokens: plan_fields.1,
        estimated_exec_ms: p.estimated_exec_ms(plan_fields.0),
        busy_retry_after_ms: Some(to_u64(p.busy_retry_after_ms())),
    })
}

/// The plan that admits `req` as asked: its output cap and optional context, with the
/// standard execution estimate and busy retry-after. Start here, then [`degrade`] it.
pub fn plan(req: &Request) -> Plan {
    let p = Params::new();
    Plan {
        max_output_tokens: req.max_output_tokens,
        optional_context_tokens: req.optional_context_tokens,
        estimated_exec_ms: p.estimated_exec_ms(req.max_output_tokens),
        busy_retry_after_ms: Some(to_u64(p.busy_retry_after_ms())),
    }
}

/// `plan` reduced to at most `max_output_tokens` of output (at least 1) with its optional
/// context dropped, as the standard degradation does, and its execution estimate
/// recomputed for the new cap (`exec_base_ms + max_output_tokens * exec_ms_per_output_token`).
/// A plan is never raised: a cap above the plan's own keeps the plan's. To keep the context,
/// set `optional_context_tokens` back on the result.
pub fn degrade(plan: Plan, max_output_tokens: u64) -> Plan {
    let cap = max_output_tokens.max(1).min(plan.max_output_tokens);
    Plan {
        max_output_tokens: cap,
        optional_context_tokens: 0,
        estimated_exec_ms: Params::new().estimated_exec_ms(cap),
        ..plan
    }
}

/// The degraded form of a request: output capped, optional context dropped.
fn reduce(req: &Request, p: &Params) -> (u64, u64) {
    let cap = to_u64(p.degraded_max_output_tokens()).max(1);
    (req.max_output_tokens.min(cap), 0)
}

/// Global slots in use before this admission reach `fraction` of the limit.
fn slots_reach(fraction: f64) -> bool {
    match host::slots(SlotScope::Global) {
        Some(level) => f64::from(level.in_use) >= fraction * f64::from(level.limit),
        None => false,
    }
}

/// The token buckets a request draws on: the tenant's, and its model's shared and the
/// tenant's own for that model, where configured.
const TOKEN_BUCKETS: [BucketKind; 3] = [
    BucketKind::TenantTokens,
    BucketKind::ModelTokens,
    BucketKind::TenantModelTokens,
];

/// The full reservation does not fit some token bucket now, and the reduced one fits every
/// one: either now, or (for a request larger than a bucket can ever hold) once it refills.
fn token_shortage_cured(req: &Request, reduced: (u64, u64)) -> bool {
    let full = reservation(
        req.input_tokens,
        req.optional_context_tokens,
        req.max_output_tokens,
    );
    let small = reservation(req.input_tokens, reduced.1, reduced.0);
    if small >= full {
        return false;
    }
    let mut short = false;
    for kind in TOKEN_BUCKETS {
        let Some(bucket) = host::bucket(kind) else {
            continue;
        };
        if full <= bucket.available {
            continue;
        }
        short = true;
        let cured =
            small <= bucket.available || (full > bucket.capacity && small <= bucket.capacity);
        if !cured {
            return false;
        }
    }
    short
}

/// The standard retry eligibility of docs/contract.md section 6.
pub fn on_failure(report: &FailureReport) -> RetryDecision {
    let p = Params::new();
    let retryable = matches!(
        report.failure,
        Some(Failure::RateLimited | Failure::Unavailable | Failure::ConnectFailed)
    );
    if !retryable {
        return RetryDecision::GiveUp(GiveUpReason::NotRetryable);
    }
    if f64::from(report.attempt) >= p.max_attempts() {
        return RetryDecision::GiveUp(GiveUpReason::AttemptsExhausted);
    }
    let not_before = host::now_ms().saturating_add(backoff_delay_ms(report, &p) as i64);
    let estimate = p.estimated_exec_ms(report.max_output_tokens);
    if not_before.saturating_add(estimate as i64) >= report.deadline_ms {
        return RetryDecision::GiveUp(GiveUpReason::DeadlineExceeded);
    }
    RetryDecision::Retry(not_before)
}

/// Capped exponential backoff with full jitter; a provider's retry-after is a floor.
pub fn backoff_delay_ms(report: &FailureReport, p: &Params) -> u64 {
    let exponent = report.attempt.saturating_sub(1).min(62);
    let ceiling = to_u64(p.backoff_base_ms())
        .saturating_mul(1u64 << exponent)
        .min(to_u64(p.backoff_cap_ms()));
    let jitter = host::random(ceiling);
    jitter.max(report.provider_retry_after_ms.unwrap_or(0))
}

/// Saturating conversion of a non-negative float to whole units.
fn to_u64(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
    }
}

/// `ceil` without std.
fn libm_ceil(x: f64) -> f64 {
    let t = x as i64 as f64;
    if x > t {
        t + 1.0
    } else {
        t
    }
}
