//! The configuration as written: the JSON shapes the engine's part is read from, every field
//! optional, before [`super::Config`] fills in the defaults and checks the whole.

use super::budget::{BucketConfig, BucketOverlay};
use super::price::Price;
use super::{groups, Discipline};
use crate::alerts::AlertRule;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct GlobalConfigInput {
    pub(crate) requests: BucketOverlay,
    pub(crate) concurrency: Option<u32>,
}

/// A tenant's settings as written: every field optional, laid over `tenant_defaults`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantOverlay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) requests: Option<BucketOverlay>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tokens: Option<BucketOverlay>,
    /// `null` means "no tenant concurrency limit"; absent means "as the defaults".
    #[serde(
        default,
        deserialize_with = "explicit_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) concurrency: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queue_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight: Option<u32>,
    /// The tenant's own token budgets per model (names of the `models` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) models: Option<BTreeMap<String, TenantModelInput>>,
    /// The tenant's money budget, in micro-dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cost_microusd: Option<BucketConfig>,
    /// The group (of the `groups` section) whose budgets the tenant's calls draw on too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    /// The tenant's own bound on its waiting calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waiting: Option<TenantWaitingInput>,
}

/// A tenant's `waiting` section.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantWaitingInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) per_tenant: Option<u32>,
}

/// The top-level `waiting` section: the waiting room of interactive calls.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct WaitingInput {
    pub(crate) enabled: Option<bool>,
    pub(crate) max_wait_ms: Option<u64>,
    pub(crate) per_tenant: Option<u32>,
    pub(crate) total: Option<u32>,
}

/// A tenant's budget for one model.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantModelInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tokens: Option<BucketConfig>,
}

/// One entry of the `models` section: a provider's limits for one model, and its price.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The model's shared request bucket (a provider's requests per minute, say).
    #[serde(default)]
    pub requests: Option<BucketConfig>,
    /// The model's shared token bucket (a provider's tokens per minute, say).
    #[serde(default)]
    pub tokens: Option<BucketConfig>,
    /// Micro-dollars per token, for the tenants' money budgets.
    #[serde(default)]
    pub price_microusd_per_token: Option<Price>,
}

fn explicit_option<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<u32>>, D::Error> {
    Option::<u32>::deserialize(d).map(Some)
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LimitsInput {
    pub(crate) max_request_bytes: Option<u64>,
    pub(crate) max_policy_bytes: Option<u64>,
    pub(crate) policy_memory_bytes: Option<u64>,
    pub(crate) policy_fuel: Option<u64>,
    pub(crate) max_call_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RetentionInput {
    pub(crate) operations_days: Option<f64>,
    pub(crate) spend_days: Option<f64>,
    pub(crate) saved_answers_max_bytes: Option<u64>,
    pub(crate) owned_objects_days: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SchedulerInput {
    pub(crate) discipline: Option<Discipline>,
    pub(crate) quantum_tokens: Option<u64>,
    pub(crate) max_claims_per_worker: Option<u32>,
}

/// The configuration as written in a file: everything optional.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ConfigInput {
    pub(crate) seed: Option<u64>,
    pub(crate) refund_unused_tokens: Option<bool>,
    pub(crate) api_may_change_file_entries: Option<bool>,
    pub(crate) global: GlobalConfigInput,
    pub(crate) tenant_defaults: TenantOverlay,
    pub(crate) tenants: BTreeMap<String, TenantOverlay>,
    pub(crate) limits: LimitsInput,
    pub(crate) retention: RetentionInput,
    pub(crate) scheduler: SchedulerInput,
    pub(crate) waiting: WaitingInput,
    pub(crate) policy_params: BTreeMap<String, serde_json::Value>,
    pub(crate) models: Option<BTreeMap<String, ModelConfig>>,
    pub(crate) groups: BTreeMap<String, groups::GroupInput>,
    pub(crate) alerts: Vec<AlertRule>,
}
