//! One configuration format for every command (`docs/configuration.md`). [`Config`] is
//! the engine's part, which scenario files carry too: every field has the documented
//! default, merged field by field; unknown fields are errors, never silently ignored.
//! [`ConfigFile`] is a whole file: the engine's part plus `auth`, `policy` and the server's
//! limits.

mod budget;
mod file;
mod gateway;
mod groups;
mod input;
mod price;
mod telemetry;
mod waiting;
pub use budget::{BucketConfig, DEFAULT_TIMEZONE};
pub use file::{bare_worker_name, ConfigFile, ConfigFileError, Role, DEFAULT_MAX_CONNECTIONS};
pub use gateway::{
    Concurrency, Deployment, GatewayConfig, GatewayModel, Routing, Upstream, UpstreamKind,
    MAX_DEPLOYMENTS, TOKENIZERS,
};
pub use groups::{GroupConfig, MAX_GROUP_DEPTH};
pub use input::ModelConfig;
pub(crate) use input::{ConfigInput, TenantOverlay};
pub use price::Price;
pub use telemetry::TelemetryConfig;
pub use waiting::{WaitingConfig, MAX_WAITERS, MAX_WAIT_MS};

use budget::BucketOverlay;

use crate::alerts::AlertRule;
use crate::model::names;
use crate::runtime::{PolicyLimits, MAX_POLICY_MEMORY};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A configuration error, with the field it concerns.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

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
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    /// The tenant's own token budget per model.
    pub models: BTreeMap<String, BucketConfig>,
    /// The tenant's money budget in micro-dollars (`None`: no money limit).
    pub cost_microusd: Option<BucketConfig>,
    /// The tenant's group, whose budgets and its ancestors' its calls draw on too.
    pub group: Option<String>,
    /// Most calls of the tenant waiting at once (`None`: `waiting.per_tenant`).
    pub waiting_per_tenant: Option<u32>,
}

/// The effective configuration, every default applied and every value checked.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seeds the policy's deterministic draw.
    pub seed: u64,
    /// Whether reported usage refunds unused tokens.
    pub refund_unused_tokens: bool,
    /// Whether the admin API may change the tenants and keys the file owns (until the
    /// next start applies the file again); otherwise such a change is refused.
    pub api_may_change_file_entries: bool,
    /// The global request bucket.
    pub global_requests: BucketConfig,
    /// Calls in flight across all tenants.
    pub global_concurrency: u32,
    /// The tenants by name, each with the defaults applied.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The groups by name: budgets that every tenant of the group, and of the groups under
    /// it, draws on.
    pub groups: BTreeMap<String, GroupConfig>,
    /// The alert rules: budgets to watch and the fractions of their limit to tell of.
    pub alerts: Arc<Vec<AlertRule>>,
    /// Largest admission (`size_bytes`) and HTTP body.
    pub max_request_bytes: u64,
    /// Largest policy component accepted.
    pub max_policy_bytes: u64,
    /// Linear memory one guest call of the policy may grow to.
    pub policy_memory_bytes: u64,
    /// Fuel for one guest call of the policy.
    pub policy_fuel: u64,
    /// How long a call may stay `active` before the service calls it abandoned and makes
    /// it `unknown` (its slot still held, listed for reconciliation).
    pub max_call_ms: u64,
    /// How long finished operations are kept (`None`: for ever); their keys are then new.
    pub retention_ms: Option<u64>,
    /// How long the spend ledger's hours are kept (`None`: for ever).
    pub spend_retention_ms: Option<u64>,
    /// How long the record of who made a stored object (a stored response) is kept
    /// (`None`: for ever); past it, the object is no longer handed back through the gateway.
    pub owned_objects_retention_ms: Option<u64>,
    /// The most bytes of saved answers the store keeps in all (the soonest to expire go
    /// first when over).
    pub saved_answers_max_bytes: u64,
    /// How dispatch shares claims between tenants.
    pub discipline: Discipline,
    /// The waiting room of interactive calls.
    pub waiting: WaitingConfig,
    /// Tokens a `drr_tokens` turn adds, times the tenant's weight.
    pub quantum_tokens: u64,
    /// Unfinished claims one worker may hold.
    pub max_claims_per_worker: u32,
    /// Policy parameters as numbers (booleans as 0 and 1), defaults included.
    pub policy_params: BTreeMap<String, f64>,
    /// Policy parameters given as strings.
    pub policy_strings: BTreeMap<String, String>,
    /// The `models` section (`None`: requests may name any model, and no model has limits).
    pub models: Option<BTreeMap<String, ModelConfig>>,
    /// The gateway's models by name, with their deployments and fallbacks (empty without a
    /// gateway): an admission naming one reserves one of its deployments too.
    pub routing: BTreeMap<String, Routing>,
    /// The configuration as written, from which a change of tenants is rebuilt.
    written: ConfigInput,
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
    ("shed_sheddable_at_slot_fraction", 1.0),
];

impl Config {
    /// Parses a configuration object strictly and applies the defaults.
    ///
    /// ```
    /// let config = tollgate::config::Config::from_json(&serde_json::json!({
    ///     "tenant_defaults": {"requests": {"capacity": 100, "refill_per_s": 50}},
    ///     "tenants": {"acme": {"weight": 2}}
    /// }))
    /// .unwrap();
    /// assert_eq!(config.tenant("acme").unwrap().weight, 2);
    /// // A field that does not exist is an error, never ignored.
    /// assert!(tollgate::config::Config::from_json(&serde_json::json!({"tenantz": {}})).is_err());
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`], naming the field and what is wrong with it.
    pub fn from_json(value: &serde_json::Value) -> Result<Config, ConfigError> {
        let input: ConfigInput =
            serde_json::from_value(value.clone()).map_err(|e| ConfigError(e.to_string()))?;
        // New names follow the rule; names a store kept from an earlier release come in
        // through `with_written`, which takes them as they are (their rows stay their own).
        for name in input.tenants.keys() {
            crate::model::names::check(&format!("tenants.{name}"), name).map_err(ConfigError)?;
        }
        for name in input.groups.keys() {
            crate::model::names::check(&format!("groups.{name}"), name).map_err(ConfigError)?;
        }
        Config::from_input(input)
    }

    pub(crate) fn from_input(input: ConfigInput) -> Result<Config, ConfigError> {
        let base_tenant = TenantConfig {
            requests: BucketConfig::refilling(10.0, 5.0),
            tokens: BucketConfig::refilling(20000.0, 1000.0),
            concurrency: None,
            queue_limit: 8,
            weight: 1,
            models: BTreeMap::new(),
            cost_microusd: None,
            group: None,
            waiting_per_tenant: None,
        };
        let defaults = overlay(&base_tenant, &input.tenant_defaults, "tenant_defaults")?;
        let mut tenants = BTreeMap::new();
        for (name, entry) in &input.tenants {
            if name.is_empty() || name.len() > 255 {
                return Err(ConfigError(format!(
                    "tenant name {name:?} must be 1 to 255 bytes"
                )));
            }
            let field = format!("tenants.{name}");
            tenants.insert(name.clone(), overlay(&defaults, entry, &field)?);
        }
        let mut policy_params: BTreeMap<String, f64> = DEFAULT_POLICY_PARAMS
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let mut policy_strings = BTreeMap::new();
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
                // The documented parameters are numbers: "3" there is a mistake, not a string.
                serde_json::Value::String(text)
                    if !DEFAULT_POLICY_PARAMS.iter().any(|(n, _)| n == name) =>
                {
                    if text.len() > MAX_STRING_PARAM_BYTES {
                        return Err(ConfigError(format!(
                            "policy_params.{name} is over {MAX_STRING_PARAM_BYTES} bytes"
                        )));
                    }
                    policy_strings.insert(name.clone(), text.clone());
                    continue;
                }
                _ => {
                    return Err(ConfigError(format!(
                        "policy_params.{name} must be a number or a boolean{}",
                        if DEFAULT_POLICY_PARAMS.iter().any(|(n, _)| n == name) {
                            ""
                        } else {
                            " or a string"
                        }
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
            api_may_change_file_entries: input.api_may_change_file_entries.unwrap_or(false),
            global_requests: input
                .global
                .requests
                .over(BucketConfig::refilling(100.0, 50.0), "global.requests")?,
            global_concurrency: input.global.concurrency.unwrap_or(8),
            tenants,
            groups: groups::effective(&input.groups)?,
            alerts: Arc::new(input.alerts.clone()),
            max_request_bytes: input.limits.max_request_bytes.unwrap_or(65536),
            max_policy_bytes: input
                .limits
                .max_policy_bytes
                .unwrap_or(PolicyLimits::DEFAULT.max_bytes),
            policy_memory_bytes: input
                .limits
                .policy_memory_bytes
                .unwrap_or(PolicyLimits::DEFAULT.memory_bytes),
            policy_fuel: input
                .limits
                .policy_fuel
                .unwrap_or(PolicyLimits::DEFAULT.fuel),
            max_call_ms: input.limits.max_call_ms.unwrap_or(DEFAULT_MAX_CALL_MS),
            saved_answers_max_bytes: match input.retention.saved_answers_max_bytes {
                None => 256 << 20,
                Some(n) if n <= 1 << 40 => n,
                Some(_) => {
                    return Err(ConfigError(
                        "retention.saved_answers_max_bytes must be at most 1 TiB".into(),
                    ))
                }
            },
            retention_ms: days(
                input.retention.operations_days,
                DEFAULT_RETENTION_DAYS,
                "retention.operations_days",
            )?,
            spend_retention_ms: days(
                input.retention.spend_days,
                DEFAULT_SPEND_RETENTION_DAYS,
                "retention.spend_days",
            )?,
            owned_objects_retention_ms: days(
                input.retention.owned_objects_days,
                DEFAULT_OWNED_OBJECTS_RETENTION_DAYS,
                "retention.owned_objects_days",
            )?,
            discipline: input.scheduler.discipline.unwrap_or(Discipline::Wrr),
            waiting: waiting::of(&input.waiting)?,
            quantum_tokens: input.scheduler.quantum_tokens.unwrap_or(1000),
            max_claims_per_worker: input.scheduler.max_claims_per_worker.unwrap_or(4),
            policy_params,
            policy_strings,
            models: input.models.clone(),
            routing: BTreeMap::new(),
            written: input,
        };
        config.check()?;
        Ok(config)
    }

    /// What the policy may use: its size, and per guest call its memory and fuel.
    pub fn policy_limits(&self) -> PolicyLimits {
        PolicyLimits {
            max_bytes: self.max_policy_bytes,
            memory_bytes: self.policy_memory_bytes,
            fuel: self.policy_fuel,
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        if !(1 << 20..=MAX_POLICY_MEMORY).contains(&self.policy_memory_bytes) {
            return Err(ConfigError(format!(
                "limits.policy_memory_bytes must be from 1048576 (1 MiB) to {MAX_POLICY_MEMORY} (1 GiB)"
            )));
        }
        if !(MIN_POLICY_FUEL..=MAX_POLICY_FUEL).contains(&self.policy_fuel) {
            return Err(ConfigError(format!(
                "limits.policy_fuel must be from {MIN_POLICY_FUEL} to {MAX_POLICY_FUEL}"
            )));
        }
        let mut buckets = vec![(names::GLOBAL_REQUESTS.to_string(), self.global_requests)];
        for (model, m) in self.models.iter().flatten() {
            if model.is_empty() || model.len() > crate::model::MAX_MODEL_BYTES {
                return Err(ConfigError(format!(
                    "model name {model:?} must be 1 to {} bytes",
                    crate::model::MAX_MODEL_BYTES
                )));
            }
            buckets.extend(m.requests.map(|b| (names::model_requests(model), b)));
            buckets.extend(m.tokens.map(|b| (names::model_tokens(model), b)));
            if let Some(p) = m.price_microusd_per_token {
                let ok = |x: f64| x.is_finite() && (0.0..=1e6).contains(&x);
                if !p.all().all(ok) {
                    return Err(ConfigError(format!(
                        "models.{model}.price_microusd_per_token: input, output, cached_input and cache_write must be numbers from 0 to 1e6"
                    )));
                }
            }
        }
        for (name, t) in &self.tenants {
            buckets.push((names::tenant_requests(name), t.requests));
            buckets.push((names::tenant_tokens(name), t.tokens));
            for (model, b) in &t.models {
                if !self
                    .models
                    .as_ref()
                    .is_some_and(|ms| ms.contains_key(model))
                {
                    return Err(ConfigError(format!(
                        "tenants.{name}.models.{model}: not a model of the `models` section"
                    )));
                }
                buckets.push((names::tenant_model_tokens(name, model), *b));
            }
            buckets.extend(t.cost_microusd.map(|b| (names::tenant_cost(name), b)));
            if let Some(g) = &t.group {
                if !self.groups.contains_key(g) {
                    return Err(ConfigError(format!(
                        "tenants.{name}.group: {g:?} is not a group of the `groups` section"
                    )));
                }
            }
            if t.weight == 0 {
                return Err(ConfigError(format!(
                    "tenants.{name}.weight must be at least 1"
                )));
            }
        }
        if self.alerts.len() > crate::alerts::MAX_RULES {
            return Err(ConfigError(format!(
                "alerts: at most {} rules",
                crate::alerts::MAX_RULES
            )));
        }
        for (i, rule) in self.alerts.iter().enumerate() {
            rule.check(i)?;
        }
        for (name, g) in &self.groups {
            buckets.extend(g.buckets(name).map(|(n, b)| (n, *b)));
        }
        for (name, b) in buckets {
            b.check(&name)?;
        }
        if self.max_call_ms == 0 {
            return Err(ConfigError("limits.max_call_ms must be at least 1".into()));
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

    /// This configuration with `tenants` (each as written, JSON) in place of its own, checked
    /// as a file's would be.
    pub fn with_written_tenants(
        &self,
        tenants: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Config, ConfigError> {
        self.with_written(tenants, &self.written_groups())
    }

    /// This configuration with `tenants` and `groups` (each as written, JSON) in place of its
    /// own, checked as a file's would be.
    pub fn with_written(
        &self,
        tenants: &BTreeMap<String, serde_json::Value>,
        groups: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Config, ConfigError> {
        fn parse<T: serde::de::DeserializeOwned>(
            section: &str,
            entries: &BTreeMap<String, serde_json::Value>,
        ) -> Result<BTreeMap<String, T>, ConfigError> {
            entries
                .iter()
                .map(|(name, written)| {
                    serde_json::from_value(written.clone())
                        .map(|t| (name.clone(), t))
                        .map_err(|e| ConfigError(format!("{section}.{name}: {e}")))
                })
                .collect()
        }
        let mut input = self.written.clone();
        input.tenants = parse("tenants", tenants)?;
        input.groups = parse("groups", groups)?;
        let mut config = Config::from_input(input)?;
        config.routing = self.routing.clone();
        Ok(config)
    }

    /// Every group as written (JSON).
    pub fn written_groups(&self) -> BTreeMap<String, serde_json::Value> {
        self.written
            .groups
            .iter()
            .map(|(name, g)| (name.clone(), serde_json::to_value(g).unwrap_or_default()))
            .collect()
    }

    /// Every tenant as written (JSON), fields left to the defaults absent.
    pub fn written_tenants(&self) -> BTreeMap<String, serde_json::Value> {
        self.written
            .tenants
            .iter()
            .map(|(name, t)| (name.clone(), serde_json::to_value(t).unwrap_or_default()))
            .collect()
    }

    /// A configured tenant, or `None` (`unknown_tenant`).
    pub fn tenant(&self, name: &str) -> Option<&TenantConfig> {
        self.tenants.get(name)
    }

    /// The tenant's group and its ancestors, nearest first (empty: no group).
    pub fn group_chain(&self, tenant: &str) -> Vec<&str> {
        self.group_chain_of(self.tenant(tenant).and_then(|t| t.group.as_deref()))
    }

    /// A group and its ancestors, nearest first (empty: no group).
    pub fn group_chain_of<'a>(&'a self, group: Option<&'a str>) -> Vec<&'a str> {
        match group {
            Some(g) => groups::chain_of(&self.groups, g),
            None => Vec::new(),
        }
    }

    /// A model of the `models` section.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.as_ref()?.get(name)
    }

    /// A `policy_params` value (booleans read as 1 or 0).
    pub fn param(&self, name: &str) -> Option<f64> {
        self.policy_params.get(name).copied()
    }
}

fn overlay(
    base: &TenantConfig,
    o: &TenantOverlay,
    field: &str,
) -> Result<TenantConfig, ConfigError> {
    let bucket = |o: &Option<BucketOverlay>, base: BucketConfig, name: &str| match o {
        Some(b) => b.over(base, &format!("{field}.{name}")),
        None => Ok(base),
    };
    Ok(TenantConfig {
        requests: bucket(&o.requests, base.requests, "requests")?,
        tokens: bucket(&o.tokens, base.tokens, "tokens")?,
        group: o.group.clone().or_else(|| base.group.clone()),
        concurrency: o.concurrency.unwrap_or(base.concurrency),
        queue_limit: o.queue_limit.unwrap_or(base.queue_limit),
        weight: o.weight.unwrap_or(base.weight),
        models: match &o.models {
            Some(ms) => ms
                .iter()
                .filter_map(|(m, b)| b.tokens.map(|t| (m.clone(), t)))
                .collect(),
            None => base.models.clone(),
        },
        cost_microusd: o.cost_microusd.or(base.cost_microusd),
        waiting_per_tenant: match o.waiting.and_then(|w| w.per_tenant) {
            Some(n) if n > MAX_WAITERS => {
                return Err(ConfigError(format!(
                    "{field}.waiting.per_tenant must be at most {MAX_WAITERS}"
                )))
            }
            Some(n) => Some(n),
            None => base.waiting_per_tenant,
        },
    })
}

/// `limits.max_call_ms` when not given: ten minutes, longer than any provider lets a
/// single generation run.
pub const DEFAULT_MAX_CALL_MS: u64 = 600_000;
/// A retention in days as written (`0`: for ever), in milliseconds.
fn days(written: Option<f64>, default: u64, field: &str) -> Result<Option<u64>, ConfigError> {
    match written {
        None => Ok(Some(default * DAY_MS)),
        Some(0.0) => Ok(None),
        Some(d) if d.is_finite() && d > 0.0 && d <= 36_500.0 => {
            Ok(Some((d * DAY_MS as f64).round() as u64))
        }
        Some(_) => Err(ConfigError(format!(
            "{field} must be a number of days from 0 (keep for ever) to 36500"
        ))),
    }
}

/// `retention.operations_days` when not given: a day, as long as a key's answer is replayed
/// by default (`gateway.replay_ttl_s`); what was spent is kept in the spend ledger.
pub const DEFAULT_RETENTION_DAYS: u64 = 1;
/// `retention.spend_days` when not given: a year and a month of spend, for a year's reports.
pub const DEFAULT_SPEND_RETENTION_DAYS: u64 = 400;
/// `retention.owned_objects_days` when not given: as long as OpenAI keeps a stored response.
pub const DEFAULT_OWNED_OBJECTS_RETENTION_DAYS: u64 = 30;
/// Least fuel a configuration may give a guest call: a Rust decision uses a few thousand
/// units (the policy's self-check runs under the same bound); a Python one needs more.
pub const MIN_POLICY_FUEL: u64 = 10_000;
/// Most fuel a configuration may give a guest call: about ten seconds of guest work.
pub const MAX_POLICY_FUEL: u64 = 100_000_000_000;
const DAY_MS: u64 = 86_400_000;

/// Longest string `policy_params` value, in bytes.
pub const MAX_STRING_PARAM_BYTES: usize = 4096;

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
        assert_eq!(a.tokens, BucketConfig::refilling(1000.0, 3.0));
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
        // Strings are string parameters, except for the documented numeric ones.
        let c = with(json!({"tier": "gold"})).unwrap();
        assert_eq!(c.policy_strings["tier"], "gold");
        assert!(with(json!({"max_attempts": "2"})).is_err());
        assert!(with(json!({"k": "x".repeat(MAX_STRING_PARAM_BYTES + 1)})).is_err());
        assert!(with(json!({"k": ["a"]})).is_err());
        let longest = "n".repeat(crate::runtime::MAX_PARAM_NAME_BYTES);
        assert!(with(json!({ longest.clone(): 1 })).is_ok());
        let err = with(json!({ format!("{longest}n"): 1 })).unwrap_err();
        assert!(err.to_string().contains("at most 256 bytes"), "{err}");
    }

    #[test]
    fn models_and_money_budgets_are_checked() {
        let c = Config::from_json(&json!({
            "models": {"gpt-4o": {"requests": {"capacity": 10, "refill_per_s": 1},
                                   "price_microusd_per_token": {"input": 2.5, "output": 10}},
                       "small": {}},
            "tenant_defaults": {"cost_microusd": {"capacity": 1000000, "refill_per_s": 0}},
            "tenants": {"acme": {"models": {"gpt-4o": {"tokens": {"capacity": 500, "refill_per_s": 5}}}},
                        "b": {}}
        }))
        .unwrap();
        assert_eq!(c.model("small"), Some(&ModelConfig::default()));
        assert_eq!(c.tenant("acme").unwrap().models["gpt-4o"].capacity, 500.0);
        assert!(c.tenant("b").unwrap().models.is_empty());
        assert_eq!(c.tenant("b").unwrap().cost_microusd.unwrap().capacity, 1e6);
        let price = c.model("gpt-4o").unwrap().price_microusd_per_token.unwrap();
        assert_eq!(price.cost(3, 1), 18);
        // By class: cached input at its own price, cache writes at the input price when none.
        let classes: Price = serde_json::from_value(
            json!({"input": 10, "output": 20, "cached_input": 1, "cache_write": 12.5}),
        )
        .unwrap();
        let used = crate::model::Usage {
            cached_input_tokens: 4,
            cache_write_tokens: 2,
            ..crate::model::Usage::new(8, 4)
        };
        assert_eq!(classes.cost_of(&used), 2 * 10 + 4 + 25 + 4 * 20);
        // A reservation prices every input token at the dearest input class.
        assert_eq!(classes.cost(8, 4), 100 + 80);
        assert_eq!(price.cost_of(&crate::model::Usage::new(3, 1)), 18);
        assert_eq!(
            Price {
                input: 0.15,
                output: 0.6,
                cached_input: None,
                cache_write: None,
            }
            .cost(10, 1),
            3
        );
        for bad in [
            json!({"tenants": {"a": {"models": {"nope": {"tokens": {"capacity": 1, "refill_per_s": 1}}}}}}),
            json!({"models": {"m": {"tokens": {"capacity": -1, "refill_per_s": 1}}}}),
            json!({"models": {"m": {"price_microusd_per_token": {"input": -1, "output": 1}}}}),
            json!({"models": {"m": {"rpm": 3}}}),
            json!({"models": {"": {}}}),
        ] {
            assert!(Config::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_fields_are_errors() {
        assert!(Config::from_json(&json!({"tenants": {"a": {"wieght": 2}}})).is_err());
        // Names that could alias another's rows, refused with the field and the rule.
        for (bad, field) in [
            (
                json!({"tenants": {"acme.model.mc": {}}}),
                "tenants.acme.model.mc",
            ),
            (json!({"tenants": {"a:b": {}}}), "tenants.a:b"),
            (json!({"tenants": {"a/b": {}}}), "tenants.a/b"),
            (json!({"tenants": {"a b": {}}}), "tenants.a b"),
            (json!({"groups": {"org.x": {}}}), "groups.org.x"),
        ] {
            let e = Config::from_json(&bad).unwrap_err().0;
            assert!(e.starts_with(field) && e.contains("A-Z, a-z, 0-9"), "{e}");
        }
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
