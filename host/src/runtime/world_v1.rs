//! The first world, `tollgate:policy@0.1.0`, and its adapter: components built for it keep
//! working unchanged. The host decides with the newest world's types; this module turns
//! them into 0.1.0's records (dropping what 0.1.0 cannot express: model, priority, labels)
//! and 0.1.0's answers back. A world version added later gets a module like this one.

use super::host::HostState;
use super::{
    Admission, BucketKind, FailureReport, GiveUpReason, Plan, PolicyInfo, Refusal, RefusalReason,
    Request, RetryDecision, Route,
};

#[allow(missing_docs)]
pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/0.1.0",
        world: "policy",
        imports: { default: trappable },
    });
}

use bindings::tollgate::policy::types as v1;
pub(super) use bindings::{Policy, PolicyPre};

/// The interface a 0.1.0 policy exports.
pub(super) const DECIDE_EXPORT: &str = "tollgate:policy/decide@0.1.0";

fn route(r: Route) -> v1::Route {
    match r {
        Route::Interactive => v1::Route::Interactive,
        Route::Durable => v1::Route::Durable,
    }
}

pub(super) fn request(r: &Request) -> v1::Request {
    v1::Request {
        tenant: r.tenant.clone(),
        key: r.key.clone(),
        route: route(r.route),
        input_tokens: r.input_tokens,
        optional_context_tokens: r.optional_context_tokens,
        max_output_tokens: r.max_output_tokens,
        deadline_ms: r.deadline_ms,
        size_bytes: r.size_bytes,
        attempt: r.attempt,
    }
}

pub(super) fn failure_report(r: &FailureReport) -> v1::FailureReport {
    use super::Failure as F;
    v1::FailureReport {
        tenant: r.tenant.clone(),
        key: r.key.clone(),
        route: route(r.route),
        attempt: r.attempt,
        failure: r.failure.as_ref().map(|f| match f {
            F::RateLimited => v1::Failure::RateLimited,
            F::Unavailable => v1::Failure::Unavailable,
            F::ConnectFailed => v1::Failure::ConnectFailed,
            F::BadRequest => v1::Failure::BadRequest,
            F::AuthFailed => v1::Failure::AuthFailed,
            F::ContentFiltered => v1::Failure::ContentFiltered,
            F::Other(s) => v1::Failure::Other(s.clone()),
        }),
        provider_retry_after_ms: r.provider_retry_after_ms,
        deadline_ms: r.deadline_ms,
        max_output_tokens: r.max_output_tokens,
        optional_context_tokens: r.optional_context_tokens,
        input_tokens: r.input_tokens,
    }
}

pub(super) fn admission(a: v1::Admission) -> Admission {
    match a {
        v1::Admission::Admit(p) => Admission::Admit(Plan {
            max_output_tokens: p.max_output_tokens,
            optional_context_tokens: p.optional_context_tokens,
            estimated_exec_ms: p.estimated_exec_ms,
            busy_retry_after_ms: p.busy_retry_after_ms,
        }),
        v1::Admission::Refuse(r) => {
            use v1::RefusalReason as R;
            let reason = match r.reason {
                R::Overloaded => RefusalReason::Overloaded,
                R::TooLarge => RefusalReason::TooLarge,
                R::DeadlineExceeded => RefusalReason::DeadlineExceeded,
                R::TokenBudget => RefusalReason::TokenBudget,
                R::TenantRate => RefusalReason::TenantRate,
                R::GlobalRate => RefusalReason::GlobalRate,
                R::TenantConcurrency => RefusalReason::TenantConcurrency,
                R::GlobalConcurrency => RefusalReason::GlobalConcurrency,
                R::QueueFull => RefusalReason::QueueFull,
                R::DownstreamUnavailable => RefusalReason::DownstreamUnavailable,
            };
            Admission::Refuse(Refusal {
                reason,
                retry_after_ms: r.retry_after_ms,
            })
        }
    }
}

pub(super) fn retry_decision(d: v1::RetryDecision) -> RetryDecision {
    match d {
        v1::RetryDecision::Retry(at) => RetryDecision::Retry(at),
        v1::RetryDecision::GiveUp(g) => RetryDecision::GiveUp(match g {
            v1::GiveUpReason::UnknownOutcome => GiveUpReason::UnknownOutcome,
            v1::GiveUpReason::NotRetryable => GiveUpReason::NotRetryable,
            v1::GiveUpReason::AttemptsExhausted => GiveUpReason::AttemptsExhausted,
            v1::GiveUpReason::DeadlineExceeded => GiveUpReason::DeadlineExceeded,
        }),
    }
}

pub(super) fn info(i: v1::PolicyInfo) -> PolicyInfo {
    PolicyInfo {
        name: i.name,
        version: i.version,
    }
}

impl v1::Host for HostState {}

/// The 0.1.0 imports are the newest world's, narrowed.
impl bindings::tollgate::policy::host::Host for HostState {
    fn now_ms(&mut self) -> wasmtime::Result<i64> {
        super::bindings::tollgate::policy::host::Host::now_ms(self)
    }

    fn param(&mut self, name: String) -> wasmtime::Result<Option<f64>> {
        super::bindings::tollgate::policy::host::Host::param(self, name)
    }

    fn tenant_weight(&mut self) -> wasmtime::Result<u32> {
        super::bindings::tollgate::policy::host::Host::tenant_weight(self)
    }

    fn bucket(&mut self, kind: v1::BucketKind) -> wasmtime::Result<Option<v1::BucketLevel>> {
        let kind = match kind {
            v1::BucketKind::GlobalRequests => BucketKind::GlobalRequests,
            v1::BucketKind::TenantRequests => BucketKind::TenantRequests,
            v1::BucketKind::TenantTokens => BucketKind::TenantTokens,
        };
        let level = super::bindings::tollgate::policy::host::Host::bucket(self, kind)?;
        Ok(level.map(|l| v1::BucketLevel {
            available: l.available,
            capacity: l.capacity,
            refill_per_s: l.refill_per_s,
        }))
    }

    fn slots(&mut self, scope: v1::SlotScope) -> wasmtime::Result<Option<v1::SlotLevel>> {
        let scope = match scope {
            v1::SlotScope::Global => super::SlotScope::Global,
            v1::SlotScope::Tenant => super::SlotScope::Tenant,
        };
        let level = super::bindings::tollgate::policy::host::Host::slots(self, scope)?;
        Ok(level.map(|l| v1::SlotLevel {
            in_use: l.in_use,
            limit: l.limit,
        }))
    }

    fn random(&mut self, upper: u64) -> wasmtime::Result<u64> {
        super::bindings::tollgate::policy::host::Host::random(self, upper)
    }
}
