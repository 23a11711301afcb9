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

/// Where an operation is in its life (docs/contract.md section 2). A `failed` completion
/// never rests: it moves the operation on at once, to `retry_pending`, `queued` or
/// `failed_final`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    Queued,
    Active,
    Succeeded,
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

impl Operation {
    /// Reads a stored record; `tenant` and `key` come from their columns.
    pub fn from_record(tenant: String, key: String, record: &str) -> serde_json::Result<Self> {
        let mut op: Operation = serde_json::from_str(record)?;
        (op.tenant, op.key) = (tenant, key);
        Ok(op)
    }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl<'de> Deserialize<'de> for Usage {
    /// From `{"input_tokens", "output_tokens"}` only: not from an array of the two.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            input_tokens: u64,
            output_tokens: u64,
        }
        let Fields {
            input_tokens,
            output_tokens,
        } = crate::validate::from_object(d)?;
        Ok(Usage {
            input_tokens,
            output_tokens,
        })
    }
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
///
/// Stored as a JSON record beside `tenant` and `key` columns: the record leaves out those
/// two and every absent optional field (records from before that still read).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    #[serde(default, skip_serializing)]
    pub tenant: String,
    #[serde(default, skip_serializing)]
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_ref: Option<String>,
    /// Whether the operation holds a global slot (and, with `holds_tenant_slot`, a tenant slot).
    pub holds_slot: bool,
    pub holds_tenant_slot: bool,
    /// Whether the token reservation of the current attempt is still outstanding.
    pub tokens_reserved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ref: Option<String>,
    /// The worker that claimed the current attempt (durable only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The result of the `complete` that ended the latest attempt, to make repeats no-ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<CallResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"{"tenant":"acme","key":"op-1","fingerprint":"sha256:ab","route":"interactive","state":"active","attempt":1,"deadline_ms":99,"input_tokens":200,"max_output_tokens":300,"optional_context_tokens":0,"reserved_tokens":500,"estimated_exec_ms":0,"degraded":false,"body_ref":null,"holds_slot":true,"holds_tenant_slot":false,"tokens_reserved":true,"not_before_ms":null,"result_ref":null,"worker":null,"last_result":null,"last_retry":null,"policy_digest":"5f08"}"#;

    #[test]
    fn records_leave_out_the_key_columns_and_absent_fields_and_still_read_full_ones() {
        let old = Operation::from_record("acme".into(), "op-1".into(), FULL).unwrap();
        let compact = serde_json::to_string(&old).unwrap();
        for absent in [
            "\"tenant\"",
            "\"key\"",
            "body_ref",
            "worker",
            "last_retry",
            "null",
        ] {
            assert!(!compact.contains(absent), "{absent} in {compact}");
        }
        let again = Operation::from_record("acme".into(), "op-1".into(), &compact).unwrap();
        assert_eq!(again, old);
        assert_eq!(
            (again.tenant.as_str(), again.key.as_str()),
            ("acme", "op-1")
        );
        let mut full = old.clone();
        full.worker = Some("w1".into());
        full.last_result = Some(CallResult::Unknown);
        let back = serde_json::to_string(&full).unwrap();
        assert_eq!(
            Operation::from_record("acme".into(), "op-1".into(), &back).unwrap(),
            full
        );
    }
}

/// The names of buckets and slot scopes, as the store keeps them and `inspect` shows them.
pub mod names {
    /// The global request bucket.
    pub const GLOBAL_REQUESTS: &str = "global.requests";
    /// The global concurrency scope.
    pub const GLOBAL_SLOTS: &str = "global";

    /// A tenant's request bucket.
    pub fn tenant_requests(tenant: &str) -> String {
        format!("tenant.{tenant}.requests")
    }

    /// A tenant's token bucket.
    pub fn tenant_tokens(tenant: &str) -> String {
        format!("tenant.{tenant}.tokens")
    }

    /// A tenant's concurrency scope.
    pub fn tenant_slots(tenant: &str) -> String {
        format!("tenant.{tenant}")
    }
}
