//! Outcomes and refusal reasons, with their HTTP mapping (docs/contract.md section 3).

use serde::{Deserialize, Serialize};

/// What an admission answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A fresh acceptance: the one answer that authorises a provider call.
    Accepted,
    /// Durable acceptance into the tenant's queue (not completion).
    Queued,
    /// The key was seen with the same request and has ended: the saved answer.
    DuplicateCompleted,
    /// The key was seen with the same request and is still queued or running.
    DuplicateActive,
    /// The key was seen with another request.
    Conflict,
    /// Refused, with a reason.
    Rejected,
}

impl Outcome {
    /// The outcome's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Queued => "queued",
            Outcome::DuplicateCompleted => "duplicate_completed",
            Outcome::DuplicateActive => "duplicate_active",
            Outcome::Conflict => "conflict",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Why an admission was refused. A bounded set: policies choose from it, never free text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Malformed: a field missing, of the wrong type or out of range.
    InvalidRequest,
    /// The tenant is not configured.
    UnknownTenant,
    /// Over `max_request_bytes`, or a reservation no bucket could ever hold.
    TooLarge,
    /// The tenant's request bucket is short.
    TenantRate,
    /// The tenant's token bucket is short.
    TokenBudget,
    /// The tenant's concurrency limit is reached.
    TenantConcurrency,
    /// The tenant's durable queue is full.
    QueueFull,
    /// A retry before its `not_before_ms`.
    RetryTooEarly,
    /// The global request bucket is short.
    GlobalRate,
    /// The global concurrency limit is reached.
    GlobalConcurrency,
    /// The policy refused under load.
    Overloaded,
    /// The downstream is marked unavailable.
    DownstreamUnavailable,
    /// The policy faulted or broke its contract (fails closed).
    PolicyError,
    /// The call cannot finish before the deadline.
    DeadlineExceeded,
    /// The key's last call has an unknown outcome, not yet reconciled.
    UnknownOutcomePending,
    /// The request's model's shared request bucket is short.
    ModelRate,
    /// The request's model's shared token bucket, or the tenant's own for that model, is short.
    ModelTokenBudget,
    /// The tenant's money budget is short.
    CostBudget,
    /// No deployment of the gateway model (nor of its fallbacks) can take the call now:
    /// each is short, paused by the provider's retry-after, or ejected.
    DeploymentCapacity,
    /// A budget of the tenant's group, or of a group above it, is short
    /// (`group.<g>.<budget>`).
    GroupBudget,
}

impl Reason {
    /// The reason's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidRequest => "invalid_request",
            Reason::UnknownTenant => "unknown_tenant",
            Reason::TooLarge => "too_large",
            Reason::TenantRate => "tenant_rate",
            Reason::TokenBudget => "token_budget",
            Reason::TenantConcurrency => "tenant_concurrency",
            Reason::QueueFull => "queue_full",
            Reason::RetryTooEarly => "retry_too_early",
            Reason::GlobalRate => "global_rate",
            Reason::GlobalConcurrency => "global_concurrency",
            Reason::Overloaded => "overloaded",
            Reason::DownstreamUnavailable => "downstream_unavailable",
            Reason::PolicyError => "policy_error",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::UnknownOutcomePending => "unknown_outcome_pending",
            Reason::ModelRate => "model_rate",
            Reason::ModelTokenBudget => "model_token_budget",
            Reason::CostBudget => "cost_budget",
            Reason::DeploymentCapacity => "deployment_capacity",
            Reason::GroupBudget => "group_budget",
        }
    }

    /// The HTTP status of a refusal for this reason.
    pub fn http(self) -> u16 {
        match self {
            Reason::InvalidRequest => 400,
            Reason::UnknownTenant => 401,
            Reason::TooLarge => 413,
            Reason::TenantRate
            | Reason::TokenBudget
            | Reason::TenantConcurrency
            | Reason::QueueFull
            | Reason::RetryTooEarly
            | Reason::ModelRate
            | Reason::ModelTokenBudget
            | Reason::CostBudget
            | Reason::DeploymentCapacity
            | Reason::GroupBudget => 429,
            Reason::GlobalRate
            | Reason::GlobalConcurrency
            | Reason::Overloaded
            | Reason::DownstreamUnavailable
            | Reason::PolicyError => 503,
            Reason::DeadlineExceeded => 504,
            Reason::UnknownOutcomePending => 409,
        }
    }
}

/// The HTTP status of a non-refusal outcome.
pub fn outcome_http(outcome: Outcome) -> u16 {
    match outcome {
        Outcome::Accepted | Outcome::DuplicateCompleted => 200,
        Outcome::Queued => 202,
        Outcome::DuplicateActive => 409,
        Outcome::Conflict => 422,
        Outcome::Rejected => 400,
    }
}
