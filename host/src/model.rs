//! The engine's vocabulary: requests, operations and the answers the engine gives.

use serde::{Deserialize, Serialize};

/// How a request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Accepted now or refused now.
    Interactive,
    /// Queued, then claimed by a worker through dispatch.
    Durable,
}

/// A validated admission request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub tenant: String,
    pub key: String,
    pub route: Route,
    pub input_tokens: u64,
    pub optional_context_tokens: u64,
    pub max_output_tokens: u64,
    pub deadline_ms: i64,
    pub size_bytes: u64,
    pub body_ref: Option<String>,
    pub fingerprint: Option<String>,
}

/// Where an operation is in its life (SPEC.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    Queued,
    Active,
    Succeeded,
    Failed,
    Unknown,
    RetryPending,
    FailedFinal,
    Expired,
}

impl OpState {
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Queued => "queued",
            OpState::Active => "active",
            OpState::Succeeded => "succeeded",
            OpState::Failed => "failed",
            OpState::Unknown => "unknown",
            OpState::RetryPending => "retry_pending",
            OpState::FailedFinal => "failed_final",
            OpState::Expired => "expired",
        }
    }
}

/// A call's result as the caller reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallResult {
    Succeeded,
    Failed,
    /// A timeout after the request was sent: the provider may still be working.
    Unknown,
}

/// How an `unknown` outcome turned out, once the caller knows (`reconcile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    Succeeded,
    Failed,
}

impl From<Resolution> for CallResult {
    fn from(r: Resolution) -> Self {
        match r {
            Resolution::Succeeded => CallResult::Succeeded,
            Resolution::Failed => CallResult::Failed,
        }
    }
}

/// Tokens a provider reports as used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The retry verdict given for a completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryVerdict {
    pub eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
}

/// Everything the store keeps about one operation `(tenant, key)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    pub tenant: String,
    pub key: String,
    pub fingerprint: String,
    pub route: Route,
    pub state: OpState,
    /// Attempts count from 1.
    pub attempt: u32,
    /// The deadline stored at first admission; it wins for the operation's whole life.
    pub deadline_ms: i64,
    pub input_tokens: u64,
    /// The plan: what is (or will be) reserved.
    pub max_output_tokens: u64,
    pub optional_context_tokens: u64,
    pub reserved_tokens: u64,
    pub estimated_exec_ms: u64,
    pub degraded: bool,
    pub body_ref: Option<String>,
    /// Whether the operation holds a global slot (and, with `holds_tenant_slot`, a tenant slot).
    pub holds_slot: bool,
    pub holds_tenant_slot: bool,
    /// Whether the token reservation of the current attempt is still outstanding.
    pub tokens_reserved: bool,
    pub not_before_ms: Option<i64>,
    pub result_ref: Option<String>,
    /// The worker that claimed the current attempt (durable only).
    pub worker: Option<String>,
    /// The result of the `complete` that ended the latest attempt, to make repeats no-ops.
    pub last_result: Option<CallResult>,
    pub last_retry: Option<RetryVerdict>,
    /// Content hash of the policy that made the latest decision.
    pub policy_digest: String,
}

/// A `{tenant, key}` pair in dispatch answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
pub struct JobRef {
    pub tenant: String,
    pub key: String,
}
