//! One configuration format for every command (`docs/configuration.md`). [`Config`] is
//! the engine's part, which scenario files carry too: every field has the documented
//! default, merged field by field; unknown fields are errors, never silently ignored.
//! [`ConfigFile`] is a whole file: the engine's part plus `auth`, `policy` and the server's
//! limits.

mod file;
mod gateway;
pub use file::{ConfigFile, Role, DEFAULT_MAX_CONNECTIONS};
pub use gateway::{GatewayConfig, GatewayModel, Upstream, TOKENIZERS};

use crate::bucket::Limits;
use crate::model::names;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A configuration error, with the field it concerns.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// A bucket's capacity and refill rate, in credits.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Most credits the bucket holds; it starts full.
    pub capacity: f64,
    /// Credits added per second (0: a hard budget).
    pub refill_per_s: f64,
}

impl BucketConfig {
    /// The exact integer limits the bucket arithmetic runs on.
    pub fn limits(&self) -> Limits {
        Limits::from_credits(self.capacity, self.refill_per_s)
    }
}

/// A bucket given field by field over another.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BucketOverlay {
    pub(crate) capacity: Option<f64>,
    pub(crate) refill_per_s: Option<f64>,
}

impl BucketOverlay {
    fn over(&self, base: BucketConfig) -> BucketConfig {
        BucketConfig {
            capacity: self.capacity.unwrap_or(base.capacity),
            refill_per_s: self.refill_per_s.unwrap_or(base.refill_per_s),
        }
    }
}

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
    #[serde(default)]
    pub(crate) requests: Option<BucketOverlay>,
    #[serde(default)]
    pub(crate) tokens: Option<BucketOverlay>,
    /// `null` means "no tenant concurrency limit"; absent means "as the defaults".
    #[serde(default, deserialize_with = "explicit_option")]
    pub(crate) concurrency: Option<Option<u32>>,
    #[serde(default)]
    pub(crate) queue_limit: Option<u32>,
    #[serde(default)]
    pub(crate) weight: Option<u32>,
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
    pub(crate) global: GlobalConfigInput,
    pub(crate) tenant_defaults: TenantOverlay,
    pub(crate) tenants: BTreeMap<String, TenantOverlay>,
    pub(crate) limits: LimitsInput,
    pub(crate) scheduler: SchedulerInput,
    pub(crate) policy_params: BTreeMap<String, serde_json::Value>,
}

/// How dispatch shares claims between tenants.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Discipline {
    /// Weighted round robin by job count.
    Wrr,
    /// Deficit round robin over reserved tokens.
    DrrTokens,
}

/// One tenant's effective settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    /// The tenant's request bucket.
    pub requests: BucketConfig,
    /// The tenant's token bucket.
    pub tokens: BucketConfig,
    /// Calls in flight the tenant may have (`None`: no tenant limit).
    pub concurrency: Option<u32>,
    /// Durable jobs the tenant may have queued.
    pub queue_limit: u32,
    /// The tenant's share in dispatch.
    pub weight: u32,
}

/// The effective configuration, every default applied and every value checked.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seeds the policy's deterministic draw.
    pub seed: u64,
    /// Whether reported usage refunds unused tokens.
    pub refund_unused_tokens: bool,
    /// The global request bucket.
    pub global_requests: BucketConfig,
    /// Calls in flight across all tenants.
    pub global_concurrency: u32,
    /// The tenants by name, each with the defaults applied.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Largest admission (`size_bytes`) and HTTP body.
    pub max_request_bytes: u64,
    /// Largest policy component accepted.
    pub max_policy_bytes: u64,
    /// How dispatch shares claims between tenants.
    pub discipline: Discipline,
    /// Tokens a `drr_tokens` turn adds, times the tenant's weight.
    pub quantum_tokens: u64,
    /// Unfinished claims one worker may hold.
    pub max_claims_per_worker: u32,
    /// Policy parameters as numbers (booleans as 0 and 1), defaults included.
    pub policy_params: BTreeMap<String, f64>,
}

/// The `policy_params` of docs/configuration.md, which every configuration starts from.
pub const DEFAULT_POLICY_PARAMS: &[(&str, f64)] = &[
    ("max_attempts", 3.0),
    ("backoff_base_ms", 100.0),
    ("backoff_cap_ms", 2000.0),
    ("exec_base_ms", 0.0),
    ("exec_ms_per_output_token", 0.0),
    ("degrade_at_slot_fraction", 1.0),
    ("degrade_on_token_shortage", 0.0),
    ("degraded_max_output_tokens", 256.0),
    ("busy_retry_after_ms", 1000.0),
];

impl Config {
    /// Parses a configuration object strictly and applies the defaults.
    pub fn from_json(value: &serde_json::Value) -> Result<Config, ConfigError> {
        let input: ConfigInput =
            serde_json::from_value(value.clone()).map_err(|e| ConfigError(e.to_string()))?;
        Config::from_input(input)
    }

    pub(crate) fn from_input(input: ConfigInput) -> Result<Config, ConfigError> {
        let base_tenant = TenantConfig {
            requests: BucketConfig {
                capacity: 10.0,
                refill_per_s: 5.0,
            },
            tokens: BucketConfig {
                capacity: 20000.0,
                refill_per_s: 1000.0,
            },
            concurrency: None,
            queue_limit: 8,
            weight: 1,
        };
        let defaults = overlay(&base_tenant, &input.tenant_defaults);
        let mut tenants = BTreeMap::new();
        for (name, entry) in &input.tenants {
            if name.is_empty() || name.len() > 255 {
                return Err(ConfigError(format!(
                    "tenant name {name:?} must be 1 to 255 bytes"
                )));
            }
            tenants.insert(name.clone(), overlay(&defaults, entry));
        }
        let mut policy_params: BTreeMap<String, f64> = DEFAULT_POLICY_PARAMS
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        for (name, value) in &input.policy_params {
            if name.len() > crate::runtime::MAX_PARAM_NAME_BYTES {
                return Err(ConfigError(format!(
                    "policy_params names are at most {} bytes (a policy cannot ask for a longer one)",
                    crate::runtime::MAX_PARAM_NAME_BYTES
                )));
            }
            let number = match value {
                serde_json::Value::Bool(b) => f64::from(u8::from(*b)),
                serde_json::Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                _ => {
                    return Err(ConfigError(format!(
                        "policy_params.{name} must be a number or a boolean"
                    )))
                }
            };
            if !number.is_finite() {
                return Err(ConfigError(format!("policy_params.{name} must be finite")));
            }
            policy_params.insert(name.clone(), number);
        }
        let config = Config {
            seed: input.seed.unwrap_or(7),
            refund_unused_tokens: input.refund_unused_tokens.unwrap_or(false),
            global_requests: input.global.requests.over(BucketConfig {
                capacity: 100.0,
                refill_per_s: 50.0,
            }),
            global_concurrency: input.global.concurrency.unwrap_or(8),
            tenants,
            max_request_bytes: input.limits.max_request_bytes.unwrap_or(65536),
            max_policy_bytes: input.limits.max_policy_bytes.unwrap_or(16 * 1024 * 1024),
            discipline: input.scheduler.discipline.unwrap_or(Discipline::Wrr),
            quantum_tokens: input.scheduler.quantum_tokens.unwrap_or(1000),
            max_claims_per_worker: input.scheduler.max_claims_per_worker.unwrap_or(4),
            policy_params,
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let mut buckets = vec![(names::GLOBAL_REQUESTS.to_string(), self.global_requests)];
        for (name, t) in &self.tenants {
            buckets.push((names::tenant_requests(name), t.requests));
            buckets.push((names::tenant_tokens(name), t.tokens));
            if t.weight == 0 {
                return Err(ConfigError(format!(
                    "tenants.{name}.weight must be at least 1"
                )));
            }
        }
        for (name, b) in buckets {
            let ok = |x: f64| x.is_finite() && (0.0..=1e12).contains(&x);
            if !ok(b.capacity) || !ok(b.refill_per_s) {
                return Err(ConfigError(format!(
                    "{name}: capacity and refill_per_s must be numbers from 0 to 1e12"
                )));
            }
        }
        if self.quantum_tokens == 0 {
            return Err(ConfigError(
                "scheduler.quantum_tokens must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The default configuration with the given tenants (all on the tenant defaults).
    pub fn with_tenants(names: &[&str]) -> Config {
        let mut input = ConfigInput::default();
        for n in names {
            input
                .tenants
                .insert(n.to_string(), TenantOverlay::default());
        }
        Config::from_input(input).expect("the defaults are valid")
    }

    /// A configured tenant, or `None` (`unknown_tenant`).
    pub fn tenant(&self, name: &str) -> Option<&TenantConfig> {
        self.tenants.get(name)
    }

    /// A `policy_params` value (booleans read as 1 or 0).
    pub fn param(&self, name: &str) -> Option<f64> {
        self.policy_params.get(name).copied()
    }
}

fn overlay(base: &TenantConfig, o: &TenantOverlay) -> TenantConfig {
    TenantConfig {
        requests: o.requests.map_or(base.requests, |b| b.over(base.requests)),
        tokens: o.tokens.map_or(base.tokens, |b| b.over(base.tokens)),
        concurrency: o.concurrency.unwrap_or(base.concurrency),
        queue_limit: o.queue_limit.unwrap_or(base.queue_limit),
        weight: o.weight.unwrap_or(base.weight),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_merge_field_by_field() {
        let c = Config::from_json(&json!({
            "tenant_defaults": {"tokens": {"capacity": 1000}},
            "tenants": {"a": {"weight": 2, "tokens": {"refill_per_s": 3}}, "b": {}},
            "global": {"concurrency": 4}
        }))
        .unwrap();
        let a = c.tenant("a").unwrap();
        assert_eq!(
            a.tokens,
            BucketConfig {
                capacity: 1000.0,
                refill_per_s: 3.0
            }
        );
        assert_eq!(a.weight, 2);
        assert_eq!(c.tenant("b").unwrap().tokens.refill_per_s, 1000.0);
        assert_eq!(c.global_requests.capacity, 100.0);
        assert_eq!(c.global_concurrency, 4);
        assert_eq!(c.param("max_attempts"), Some(3.0));
    }

    #[test]
    fn policy_params_are_finite_numbers_or_booleans_with_names_a_policy_can_ask_for() {
        let with = |params| Config::from_json(&json!({ "policy_params": params }));
        let c = with(json!({"on": true, "k": 2.5})).unwrap();
        assert_eq!((c.param("on"), c.param("k")), (Some(1.0), Some(2.5)));
        assert!(with(json!({"k": "2"})).is_err());
        let longest = "n".repeat(crate::runtime::MAX_PARAM_NAME_BYTES);
        assert!(with(json!({ longest.clone(): 1 })).is_ok());
        let err = with(json!({ format!("{longest}n"): 1 })).unwrap_err();
        assert!(err.to_string().contains("at most 256 bytes"), "{err}");
    }

    #[test]
    fn unknown_fields_are_errors() {
        assert!(Config::from_json(&json!({"tenants": {"a": {"wieght": 2}}})).is_err());
        assert!(Config::from_json(&json!({"globl": {}})).is_err());
        assert!(Config::from_json(&json!({"global": {"requests": {"cap": 1}}})).is_err());
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(Config::from_json(&json!({"global": {"requests": {"capacity": -1}}})).is_err());
        assert!(Config::from_json(&json!({"tenants": {"a": {"weight": 0}}})).is_err());
        assert!(Config::from_json(&json!({"policy_params": {"max_attempts": "3"}})).is_err());
    }
}
