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

/// The parameters the standard rules read, with the defaults of docs/configuration.md.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub max_attempts: f64,
    pub backoff_base_ms: f64,
    pub backoff_cap_ms: f64,
    pub exec_base_ms: f64,
    pub exec_ms_per_output_token: f64,
    pub degrade_at_slot_fraction: f64,
    pub degrade_on_token_shortage: bool,
    pub degraded_max_output_tokens: f64,
    pub busy_retry_after_ms: f64,
    pub shed_sheddable_at_slot_fraction: f64,
}

impl Params {
    /// Reads every parameter through `host::param`.
    pub fn read() -> Self {
        Params {
            max_attempts: param_or("max_attempts", 3.0),
            backoff_base_ms: param_or("backoff_base_ms", 100.0),
            backoff_cap_ms: param_or("backoff_cap_ms", 2000.0),
            exec_base_ms: param_or("exec_base_ms", 0.0),
            exec_ms_per_output_token: param_or("exec_ms_per_output_token", 0.0),
            degrade_at_slot_fraction: param_or("degrade_at_slot_fraction", 1.0),
            degrade_on_token_shortage: param_or("degrade_on_token_shortage", 0.0) != 0.0,
            degraded_max_output_tokens: param_or("degraded_max_output_tokens", 256.0),
            busy_retry_after_ms: param_or("busy_retry_after_ms", 1000.0),
            shed_sheddable_at_slot_fraction: param_or("shed_sheddable_at_slot_fraction", 1.0),
        }
    }

    /// `exec_base_ms + max_output_tokens * exec_ms_per_output_token`, rounded up.
    pub fn estimated_exec_ms(&self, max_output_tokens: u64) -> u64 {
        let ms = self.exec_base_ms + max_output_tokens as f64 * self.exec_ms_per_output_token;
        to_u64(libm_ceil(ms))
    }
}

/// Checks that the parameters make sense before the policy is activated.
pub fn self_check() -> Result<(), String> {
    let p = Params::read();
    let fields = [
        ("max_attempts", p.max_attempts),
        ("backoff_base_ms", p.backoff_base_ms),
        ("backoff_cap_ms", p.backoff_cap_ms),
        ("exec_base_ms", p.exec_base_ms),
        ("exec_ms_per_output_token", p.exec_ms_per_output_token),
        ("degrade_at_slot_fraction", p.degrade_at_slot_fraction),
        ("degraded_max_output_tokens", p.degraded_max_output_tokens),
        ("busy_retry_after_ms", p.busy_retry_after_ms),
        (
            "shed_sheddable_at_slot_fraction",
            p.shed_sheddable_at_slot_fraction,
        ),
    ];
    for (name, value) in fields {
        if !value.is_finite() || value < 0.0 {
            return Err(alloc::format!(
                "policy_params.{name} must be a finite number >= 0"
            ));
        }
    }
    if p.max_attempts < 1.0 {
        return Err("policy_params.max_attempts must be at least 1".into());
    }
    if p.degraded_max_output_tokens < 1.0 {
        return Err("policy_params.degraded_max_output_tokens must be at least 1".into());
    }
    Ok(())
}

/// The standard admission: shed `sheddable` interactive work when global slots in use
/// reach `shed_sheddable_at_slot_fraction` (below 1), degrade other interactive requests
/// (never `critical` ones) under slot pressure or (when enabled) token shortage, and
/// estimate the execution time of what is planned.
pub fn admit(req: &Request) -> Admission {
    let p = Params::read();
    if req.route == Route::Interactive
        && req.priority == Priority::Sheddable
        && p.shed_sheddable_at_slot_fraction < 1.0
        && slots_reach(p.shed_sheddable_at_slot_fraction)
    {
        return Admission::Refuse(Refusal {
            reason: RefusalReason::Overloaded,
            retry_after_ms: Some(to_u64(p.busy_retry_after_ms)),
        });
    }
    let reduced = reduce(req, &p);
    let plan_fields = if req.route == Route::Interactive
        && req.priority != Priority::Critical
        && (slots_reach(p.degrade_at_slot_fraction)
            || (p.degrade_on_token_shortage && token_shortage_cured(req, reduced)))
    {
        reduced
    } else {
        (req.max_output_tokens, req.optional_context_tokens)
    };
    Admission::Admit(Plan {
        max_output_tokens: plan_fields.0,
        optional_context_tokens: plan_fields.1,
        estimated_exec_ms: p.estimated_exec_ms(plan_fields.0),
        busy_retry_after_ms: Some(to_u64(p.busy_retry_after_ms)),
    })
}

/// The degraded form of a request: output capped, optional context dropped.
fn reduce(req: &Request, p: &Params) -> (u64, u64) {
    let cap = to_u64(p.degraded_max_output_tokens).max(1);
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
    let p = Params::read();
    let retryable = matches!(
        report.failure,
        Some(Failure::RateLimited | Failure::Unavailable | Failure::ConnectFailed)
    );
    if !retryable {
        return RetryDecision::GiveUp(GiveUpReason::NotRetryable);
    }
    if f64::from(report.attempt) >= p.max_attempts {
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
    let ceiling = to_u64(p.backoff_base_ms)
        .saturating_mul(1u64 << exponent)
        .min(to_u64(p.backoff_cap_ms));
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
