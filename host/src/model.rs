//! The engine's vocabulary: requests, operations and the answers the engine gives, and
//! the bounds on what a request may hold.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest operation key, in characters.
pub const MAX_KEY_CHARS: usize = 255;
/// Longest `body_ref` or `fingerprint`, in bytes: they are references, not bodies.
pub const MAX_REF_BYTES: usize = 4096;
/// Longest model name, in bytes.
pub const MAX_MODEL_BYTES: usize = 128;
/// Most labels on one request.
pub const MAX_LABELS: usize = 16;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY_BYTES: usize = 64;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 256;

/// How a request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Accepted now or refused now.
    Interactive,
    /// Queued, then claimed by a worker through dispatch.
    Durable,
}

/// How important a call is. Durable dispatch serves the bands strictly in this order; the
/// standard policy sheds `sheddable` interactive work first and never degrades `critical`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Served before everything else.
    Critical,
    /// What a request without a priority is.
    #[default]
    Standard,
    /// Shed first under pressure.
    Sheddable,
}

impl Priority {
    /// Every band, in the order dispatch serves them.
    pub const BANDS: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }

    /// The band's rank as stored with a queued job (0 is served first).
    pub fn rank(self) -> i64 {
        match self {
            Priority::Critical => 0,
            Priority::Standard => 1,
            Priority::Sheddable => 2,
        }
    }

    /// From a stored rank; anything unknown reads as standard.
    pub fn from_rank(rank: i64) -> Self {
        match rank {
            0 => Priority::Critical,
            2 => Priority::Sheddable,
            _ => Priority::Standard,
        }
    }

    /// Whether this is the default (left out of records and fingerprints).
    pub fn is_standard(&self) -> bool {
        *self == Priority::Standard
    }
}

/// A validated admission request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The tenant, configured.
    pub tenant: String,
    /// The operation key, 1 to 255 characters.
    pub key: String,
    /// Interactive (now or never) or durable (queued).
    pub route: Route,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Context tokens the policy may drop under pressure.
    pub optional_context_tokens: u64,
    /// Most output tokens the call may generate.
    pub max_output_tokens: u64,
    /// The absolute deadline, carried through every hop.
    pub deadline_ms: i64,
    /// The request body's size, checked against `max_request_bytes`.
    pub size_bytes: u64,
    /// Where a durable job's body is.
    pub body_ref: Option<String>,
    /// The caller's own fingerprint, replacing the computed one.
    pub fingerprint: Option<String>,
    /// The model the call is for (a name of the `models` section when there is one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How important the call is.
    #[serde(default, skip_serializing_if = "Priority::is_standard")]
    pub priority: Priority,
    /// The caller's labels, for policies to key rules on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Whether a gateway model's fallbacks may serve the call when none of its own
    /// deployments can (the caller's `x-tollgate-fallback: none` says no).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub fallback: bool,
    /// The W3C `traceparent` of the trace the admission is part of, kept with a durable job
    /// so that its dispatch continues that trace. Set by the service from its own span,
    /// never read from a caller's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Where an operation is in its life (docs/contract.md section 2). A `failed` completion
/// never rests: it moves the operation on at once, to `retry_pending`, `queued` or
/// `failed_final`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Waiting in its tenant's queue.
    Queued,
    /// Reserved; the call is authorised.
    Active,
    /// Ended well.
    Succeeded,
    /// The call may have reached the provider: its slot is held until reconciled.
    Unknown,
    /// Failed, and the policy will let it retry after `not_before_ms`.
    RetryPending,
    /// Failed for good.
    FailedFinal,
    /// Its deadline passed while queued.
    Expired,
}

impl OpState {
    /// The state a wire name names.
    pub fn from_word(word: &str) -> Option<OpState> {
        [
            OpState::Queued,
            OpState::Active,
            OpState::Succeeded,
            OpState::Unknown,
            OpState::RetryPending,
            OpState::FailedFinal,
            OpState::Expired,
        ]
        .into_iter()
        .find(|s| s.as_str() == word)
    }

    /// The state's wire name.
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
    /// The call ended well.
    Succeeded,
    /// The call failed before the provider did the work.
    Failed,
    /// A timeout after the request was sent: the provider may still be working.
    Unknown,
}

/// How an `unknown` outcome turned out, once the caller knows (`reconcile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// The unknown call turned out to have succeeded.
    Succeeded,
    /// The unknown call failed; it is not retried.
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

/// Tokens a provider reports as used. `input_tokens` is every prompt token the provider
/// processed, the cached ones included; the classes beside it are parts of it (and of
/// `output_tokens`, for reasoning), so token budgets spend input + output whatever the
/// classes, and a price per class charges each part at its own rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens the provider counted.
    pub input_tokens: u64,
    /// Output tokens the provider counted.
    pub output_tokens: u64,
    /// Of the input, those read from the provider's prompt cache (OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`).
    #[serde(skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Of the input, those written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`).
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Of the output, reasoning tokens (OpenAI's `reasoning_tokens`).
    #[serde(skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// A usage of `input_tokens` and `output_tokens`, with no classes.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        }
    }
}

impl<'de> Deserialize<'de> for Usage {
    /// From `{"input_tokens", "output_tokens"}` and the optional classes only (not from an
    /// array); a class larger than the total it is part of is an error.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            input_tokens: u64,
            output_tokens: u64,
            #[serde(default)]
            cached_input_tokens: u64,
            #[serde(default)]
            cache_write_tokens: u64,
            #[serde(default)]
            reasoning_tokens: u64,
        }
        let f: Fields = crate::shape::from_object(d)?;
        if f.cached_input_tokens.saturating_add(f.cache_write_tokens) > f.input_tokens {
            return Err(serde::de::Error::custom(
                "cached_input_tokens + cache_write_tokens must not exceed input_tokens",
            ));
        }
        if f.reasoning_tokens > f.output_tokens {
            return Err(serde::de::Error::custom(
                "reasoning_tokens must not exceed output_tokens",
            ));
        }
        Ok(Usage {
            input_tokens: f.input_tokens,
            output_tokens: f.output_tokens,
            cached_input_tokens: f.cached_input_tokens,
            cache_write_tokens: f.cache_write_tokens,
            reasoning_tokens: f.reasoning_tokens,
        })
    }
}

/// The retry verdict given for a completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryVerdict {
    /// Whether the operation will be retried.
    pub eligible: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The earliest time of the retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
}

/// Everything the store keeps about one operation `(tenant, key)`.
///
/// Stored as a JSON record beside `tenant` and `key` columns: the record leaves out those
/// two, every absent optional field and every zero or false that is the default (records
/// from before that still read).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// The tenant it belongs to.
    #[serde(default, skip_serializing)]
    pub tenant: String,
    /// The caller's key.
    #[serde(default, skip_serializing)]
    pub key: String,
    /// What makes a repeated admission the same request.
    pub fingerprint: String,
    /// Interactive or durable.
    pub route: Route,
    /// Where it is in its life.
    pub state: OpState,
    /// Attempts count from 1.
    pub attempt: u32,
    /// The deadline stored at first admission; it wins for the operation's whole life.
    pub deadline_ms: i64,
    /// Prompt tokens, as admitted.
    pub input_tokens: u64,
    /// The plan: what is (or will be) reserved.
    pub max_output_tokens: u64,
    /// Optional context tokens, as planned.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub optional_context_tokens: u64,
    /// Tokens the current attempt reserved.
    pub reserved_tokens: u64,
    /// The policy's estimate of the call's duration.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub estimated_exec_ms: u64,
    /// Whether the policy reduced the request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub degraded: bool,
    /// Where a durable job's body is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_ref: Option<String>,
    /// Whether the operation holds a global slot (and, with `holds_tenant_slot`, a tenant slot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_slot: bool,
    /// Whether it holds a slot of its tenant's scope.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_tenant_slot: bool,
    /// Whether the token reservation of the current attempt is still outstanding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tokens_reserved: bool,
    /// The earliest time of the next attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
    /// The caller's reference to the saved answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ref: Option<String>,
    /// The worker that claimed the current attempt (durable only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The result of the `complete` that ended the latest attempt, to make repeats no-ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<CallResult>,
    /// The retry verdict of the last failure, replayed to a repeated report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_retry: Option<RetryVerdict>,
    /// Content hash of the policy that made the latest decision.
    pub policy_digest: String,
    /// The model the call is for, whose buckets the reservation touches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The dispatch band of a durable job.
    #[serde(default, skip_serializing_if = "Priority::is_standard")]
    pub priority: Priority,
    /// Micro-dollars the current attempt reserved from the tenant's money budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_cost_microusd: u64,
    /// When the operation entered its state: abandoned calls and retention are measured
    /// from it. Records written before it existed are stamped by the first sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_since_ms: Option<i64>,
    /// What the provider reported as used by the attempt that ended, by class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The deployment (of `model`) the current attempt reserved and was sent to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Whether the attempt holds a slot of its deployment's scope.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_deployment_slot: bool,
    /// The model the caller named, when a fallback model (in `model`) serves the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_model: Option<String>,
    /// A durable job's `traceparent` from its admission (see [`Request::trace_context`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A `{tenant, key}` pair in dispatch answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
pub struct JobRef {
    /// The job's tenant.
    pub tenant: String,
    /// The job's key.
    pub key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"{"tenant":"acme","key":"op-1","fingerprint":"sha256:ab","route":"interactive","state":"active","attempt":1,"deadline_ms":99,"input_tokens":200,"max_output_tokens":300,"optional_context_tokens":0,"reserved_tokens":500,"estimated_exec_ms":0,"degraded":false,"body_ref":null,"holds_slot":true,"holds_tenant_slot":false,"tokens_reserved":true,"not_before_ms":null,"result_ref":null,"worker":null,"last_result":null,"last_retry":null,"policy_digest":"5f08"}"#;

    #[test]
    fn usage_reads_its_classes_and_refuses_a_class_above_its_total() {
        let u: Usage = serde_json::from_str(
            r#"{"input_tokens": 10, "output_tokens": 4, "cached_input_tokens": 6, "cache_write_tokens": 2, "reasoning_tokens": 3}"#,
        )
        .unwrap();
        assert_eq!(
            (
                u.cached_input_tokens,
                u.cache_write_tokens,
                u.reasoning_tokens
            ),
            (6, 2, 3)
        );
        // Without classes, as earlier releases wrote it; written back without them.
        let old: Usage =
            serde_json::from_str(r#"{"input_tokens": 10, "output_tokens": 4}"#).unwrap();
        assert_eq!(old, Usage::new(10, 4));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"input_tokens":10,"output_tokens":4}"#
        );
        for bad in [
            r#"{"input_tokens": 10, "output_tokens": 4, "cached_input_tokens": 9, "cache_write_tokens": 2}"#,
            r#"{"input_tokens": 10, "output_tokens": 4, "reasoning_tokens": 5}"#,
            r#"{"input_tokens": 10, "output_tokens": 4, "audio_tokens": 1}"#,
        ] {
            assert!(serde_json::from_str::<Usage>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn records_leave_out_the_key_columns_and_absent_fields_and_still_read_full_ones() {
        let old = Operation::from_record("acme".into(), "op-1".into(), FULL).unwrap();
        // Written before deployments: none held, none to release.
        assert_eq!(
            (old.deployment.as_ref(), old.holds_deployment_slot),
            (None, false)
        );
        assert_eq!(old.asked_model, None);
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

/// The names of buckets and slot scopes, and the names tenants, groups, models and
/// deployments may have.
pub mod names;
