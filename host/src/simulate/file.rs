//! Simulation files (docs/simulation.md): the configuration and its variants, the load per
//! tenant, the provider, the workers and the callers. Read strictly, like scenario files: an
//! unknown field anywhere is an error, and every number is checked before anything runs.

use crate::model::{Priority, Route};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The longest simulated time: one week.
pub const MOST_DURATION_MS: u64 = 7 * 24 * 3600 * 1000;
/// The most arrivals one simulation may generate (memory stays bounded: about 64 bytes
/// each, per run in flight).
pub const MOST_ARRIVALS: usize = 5_000_000;
/// The most points of all the per-tenant series of one run (tenants × samples).
pub const MOST_SERIES_POINTS: u64 = 20_000_000;
/// The most samples one run records.
pub const MOST_SAMPLES: u64 = 100_000;
/// The largest token count a load may name.
const MOST_TOKENS: u64 = 10_000_000;

/// A simulation file, checked.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// Where the file is (its folder resolves policies and traces).
    pub path: PathBuf,
    /// What the simulation shows, for the report.
    pub description: Option<String>,
    /// Simulated time, from 0.
    pub duration_ms: u64,
    /// Seeds every draw: arrivals, sizes, the provider.
    pub seed: u64,
    /// How often the time series are sampled.
    pub sample_ms: u64,
    /// The configuration as `serve` reads it.
    pub config: Value,
    /// Variants of the configuration run on the same arrivals (none: the configuration alone).
    pub variants: Vec<Variant>,
    /// Generated load, per tenant.
    pub tenants: BTreeMap<String, TenantLoad>,
    /// The `tenants` load as written, which variants patch.
    tenants_written: Value,
    /// Recorded load, JSON lines (resolved against the file's folder).
    pub trace: Option<PathBuf>,
    /// The provider behind tollgate.
    pub provider: Provider,
    /// The workers that claim durable work.
    pub workers: Workers,
    /// How callers behave on a refusal, unless their tenant says otherwise.
    pub callers: Callers,
}

/// One variant of the configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The variant's name in the report.
    pub name: String,
    /// Merged over the base configuration (JSON merge patch: objects merge, `null` removes).
    #[serde(default)]
    pub config: Value,
    /// Merged over the file's `tenants` load the same way (a deadline added, say); the
    /// arrival times stay those of the same seed.
    #[serde(default)]
    pub tenants: Value,
}

/// The load one tenant offers.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLoad {
    /// When requests arrive.
    pub arrivals: Arrivals,
    /// Interactive (now or never) or durable (queued for workers).
    #[serde(default = "interactive")]
    pub route: Route,
    /// Prompt tokens of each request.
    pub input_tokens: Amount,
    /// Output limit of each request.
    pub max_output_tokens: Amount,
    /// Each request's deadline after its arrival (absent: none within the simulation).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// The model requests name.
    #[serde(default)]
    pub model: Option<String>,
    /// The requests' priority.
    #[serde(default)]
    pub priority: Priority,
    /// This tenant's callers, instead of the file's.
    #[serde(default)]
    pub callers: Option<Callers>,
}

fn interactive() -> Route {
    Route::Interactive
}

/// An arrival process.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Arrivals {
    /// Evenly spaced, `per_s` a second.
    Constant {
        /// Arrivals per second.
        per_s: f64,
    },
    /// A Poisson process of mean rate `per_s`.
    Poisson {
        /// Mean arrivals per second.
        per_s: f64,
    },
    /// Poisson at `per_s` for `on_ms`, then silent for `off_ms`, repeated.
    Bursts {
        /// Mean arrivals per second while on.
        per_s: f64,
        /// How long a burst lasts.
        on_ms: u64,
        /// The silence between bursts.
        off_ms: u64,
    },
}

/// A token count: fixed, or drawn uniformly from `min..=max`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    /// Always this many.
    Fixed(u64),
    /// Uniform between the two, both included.
    Uniform {
        /// The least.
        min: u64,
        /// The most.
        max: u64,
    },
}

impl Amount {
    fn check(&self, what: &str) -> Result<(), String> {
        let (lo, hi) = match *self {
            Amount::Fixed(n) => (n, n),
            Amount::Uniform { min, max } => (min, max),
        };
        if lo > hi || hi > MOST_TOKENS {
            return Err(format!(
                "{what}: needs min <= max <= {MOST_TOKENS} (got {lo}..{hi})"
            ));
        }
        Ok(())
    }
}

/// How long a provider call takes around its mean.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Exactly the mean.
    #[default]
    Fixed,
    /// Exponential with that mean.
    Exponential,
    /// Uniform between half and one and a half times the mean.
    Uniform,
}

/// The provider behind tollgate.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    /// Calls it serves at once; a call beyond them is refused at once with `rate_limited`.
    pub concurrency: u32,
    /// Mean time of a call, before output.
    pub base_ms: f64,
    /// Mean time per output token.
    #[serde(default)]
    pub per_output_token_ms: f64,
    /// How a call's time spreads around its mean.
    #[serde(default)]
    pub distribution: Distribution,
    /// Output tokens it reports, as a fraction of the call's output limit.
    #[serde(default = "one")]
    pub output_fraction: f64,
    /// How calls fail.
    #[serde(default)]
    pub failures: Failures,
    /// When an `unknown` call is reconciled (as succeeded) after it ended.
    #[serde(default = "thirty_seconds")]
    pub reconcile_after_ms: u64,
    /// Deployments with limits of their own, by the name a gateway model's deployment has
    /// in the configuration: a call the engine reserved on one is sent there, and that
    /// deployment refuses it with 429 past its own limits, reporting what it has left as a
    /// provider's rate-limit headers do.
    #[serde(default)]
    pub deployments: BTreeMap<String, ProviderDeployment>,
}

/// One deployment as the provider enforces it: a window of requests and of tokens a
/// minute (refilled continuously, as a token bucket of a minute's worth), calls at once,
/// and failures of its own.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderDeployment {
    /// Requests it takes a minute (none: unlimited).
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Tokens it takes a minute, a call counting its prompt and its output limit (none:
    /// unlimited).
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Calls it serves at once (none: only the provider's `concurrency` bounds it).
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// How its calls fail, instead of the provider's `failures`.
    #[serde(default)]
    pub failures: Option<Failures>,
    /// Whether its answers say what is left (`x-ratelimit-remaining-*` and
    /// `x-ratelimit-reset-*`, read by tollgate as a real provider's are).
    #[serde(default = "yes")]
    pub reports_limits: bool,
}

fn yes() -> bool {
    true
}

/// The most a per-minute limit of a simulated deployment may be.
const MOST_PER_MINUTE: u64 = 1_000_000_000;

fn one() -> f64 {
    1.0
}

fn thirty_seconds() -> u64 {
    30_000
}

/// How provider calls fail, as fractions of all calls.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Failures {
    /// Refused with 429 and `rate_limited_retry_after_ms`.
    pub rate_limited: f64,
    /// The 429's retry-after.
    pub rate_limited_retry_after_ms: u64,
    /// Refused with 5xx (`unavailable`).
    pub unavailable: f64,
    /// Lost after the request was sent: the outcome is unknown.
    pub unknown: f64,
    /// How long a refusal takes to arrive.
    pub fail_after_ms: u64,
}

impl Failures {
    /// Each fraction 0 to 1, their sum at most 1.
    fn check(&self, at: &str) -> Result<(), String> {
        let fractions = [self.rate_limited, self.unavailable, self.unknown];
        if fractions
            .iter()
            .any(|x| !(x.is_finite() && (0.0..=1.0).contains(x)))
            || fractions.iter().sum::<f64>() > 1.0
        {
            return Err(format!("{at}: each fraction 0 to 1, their sum at most 1"));
        }
        Ok(())
    }
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            rate_limited: 0.0,
            rate_limited_retry_after_ms: 1000,
            unavailable: 0.0,
            unknown: 0.0,
            fail_after_ms: 50,
        }
    }
}

/// The workers claiming durable work.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workers {
    /// How many.
    pub count: u32,
    /// Calls one worker runs at once; it claims up to its free places at each poll.
    pub claim_batch: u32,
    /// How often an idle worker asks for work.
    pub poll_ms: u64,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            count: 1,
            claim_batch: 8,
            poll_ms: 100,
        }
    }
}

/// What a caller does with a refusal.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnRefusal {
    /// Gives up at once.
    #[default]
    GiveUp,
    /// Asks again with the same key after the answer's `Retry-After` (`retry_ms` when the
    /// answer has none).
    RetryAfter,
    /// Asks again with the same key every `retry_ms`, whatever the answer said.
    RetryFixed,
}

/// How callers behave on a refusal.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Callers {
    /// Give up or retry.
    pub on_refusal: OnRefusal,
    /// The retry interval (`retry_fixed`), or the wait when no `Retry-After` came.
    pub retry_ms: u64,
    /// The most times one caller asks again.
    pub max_retries: u32,
    /// When set, a call refused only by shared capacity that frees by itself waits for it
    /// in the engine's waiting room, this long at most, as a gateway call does; `None`:
    /// refused at once, as `POST /v1/admit` without `max_wait_ms` answers.
    pub max_wait_ms: Option<u64>,
}

impl Default for Callers {
    fn default() -> Self {
        Callers {
            on_refusal: OnRefusal::GiveUp,
            retry_ms: 1000,
            max_retries: 3,
            max_wait_ms: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    #[serde(default)]
    description: Option<String>,
    duration_ms: u64,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    sample_ms: Option<u64>,
    config: Value,
    #[serde(default)]
    variants: Vec<Variant>,
    #[serde(default)]
    tenants: Value,
    #[serde(default)]
    trace: Option<String>,
    provider: Provider,
    #[serde(default)]
    workers: Workers,
    #[serde(default)]
    callers: Callers,
}

impl Simulation {
    /// Reads and checks the file at `path`; errors name the file and the field.
    pub fn load(path: &Path) -> Result<Simulation, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Simulation::from_json(path, value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks a simulation given as JSON; `path` resolves the policies and traces it names.
    pub fn from_json(path: &Path, value: Value) -> Result<Simulation, String> {
        let input: Input = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if input.duration_ms == 0 || input.duration_ms > MOST_DURATION_MS {
            return Err(format!("duration_ms must be 1 to {MOST_DURATION_MS}"));
        }
        let sample_ms = input
            .sample_ms
            .unwrap_or_else(|| (input.duration_ms / 200).clamp(100, 60_000));
        if sample_ms == 0 || input.duration_ms / sample_ms > MOST_SAMPLES {
            return Err(format!(
                "sample_ms must be at least 1 and at least duration_ms / {MOST_SAMPLES}"
            ));
        }
        if !input.config.is_object() {
            return Err("config must be an object (the configuration as `serve` reads it)".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for v in &input.variants {
            if v.name.is_empty() || v.name.len() > 64 || !names.insert(v.name.clone()) {
                return Err(format!(
                    "variants: {:?}: a name must be 1 to 64 bytes and unique",
                    v.name
                ));
            }
            if !(v.config.is_object() || v.config.is_null()) {
                return Err(format!("variants.{}: config must be an object", v.name));
            }
            if !(v.tenants.is_object() || v.tenants.is_null()) {
                return Err(format!("variants.{}: tenants must be an object", v.name));
            }
        }
        let tenants = tenant_loads(&input.tenants)?;
        if tenants.is_empty() && input.trace.is_none() {
            return Err("no load: give `tenants` with arrivals, or a `trace`".into());
        }
        let p = &input.provider;
        p.failures.check("provider.failures")?;
        if p.concurrency == 0 || p.concurrency > 1_000_000 {
            return Err("provider.concurrency must be 1 to 1,000,000".into());
        }
        let finite_ms = |x: f64| x.is_finite() && (0.0..=MOST_DURATION_MS as f64).contains(&x);
        if !finite_ms(p.base_ms) || !finite_ms(p.per_output_token_ms) {
            return Err("provider: base_ms and per_output_token_ms must be 0 to a week".into());
        }
        if !(p.output_fraction.is_finite() && (0.0..=1.0).contains(&p.output_fraction)) {
            return Err("provider.output_fraction must be 0 to 1".into());
        }
        for (name, d) in &p.deployments {
            let at = format!("provider.deployments.{name}");
            if name.is_empty() || name.len() > 64 {
                return Err(format!("{at}: a name must be 1 to 64 bytes"));
            }
            for (field, v) in [
                ("requests_per_minute", d.requests_per_minute),
                ("tokens_per_minute", d.tokens_per_minute),
            ] {
                if v.is_some_and(|v| v == 0 || v > MOST_PER_MINUTE) {
                    return Err(format!("{at}.{field} must be 1 to {MOST_PER_MINUTE}"));
                }
            }
            if d.concurrency.is_some_and(|c| c == 0 || c > 1_000_000) {
                return Err(format!("{at}.concurrency must be 1 to 1,000,000"));
            }
            if let Some(f) = &d.failures {
                f.check(&format!("{at}.failures"))?;
            }
        }
        if input.workers.claim_batch == 0 || input.workers.poll_ms == 0 {
            return Err("workers: claim_batch and poll_ms must be positive".into());
        }
        if input.workers.count > 10_000 {
            return Err("workers.count must be at most 10,000".into());
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let sim = Simulation {
            path: path.to_path_buf(),
            description: input.description,
            duration_ms: input.duration_ms,
            seed: input.seed,
            sample_ms,
            config: input.config,
            variants: input.variants,
            tenants,
            tenants_written: input.tenants,
            trace: input.trace.map(|t| base.join(t)),
            provider: input.provider,
            workers: input.workers,
            callers: input.callers,
        };
        for v in &sim.variants {
            sim.with_variant(v)?;
        }
        Ok(sim)
    }

    /// The configuration of a variant: the base with the variant merged over it.
    pub fn config_of(&self, variant: Option<&Variant>) -> Value {
        let mut config = self.config.clone();
        if let Some(v) = variant {
            merge_patch(&mut config, &v.config);
        }
        config
    }

    /// The simulation as a variant makes it: its configuration and its load merged over
    /// the file's.
    pub fn with_variant(&self, variant: &Variant) -> Result<Simulation, String> {
        let mut out = self.clone();
        out.config = self.config_of(Some(variant));
        merge_patch(&mut out.tenants_written, &variant.tenants);
        out.tenants = tenant_loads(&out.tenants_written)
            .map_err(|e| format!("variants.{}: {e}", variant.name))?;
        out.variants = Vec::new();
        Ok(out)
    }
}

/// The `tenants` load, read strictly and checked.
fn tenant_loads(value: &Value) -> Result<BTreeMap<String, TenantLoad>, String> {
    let tenants: BTreeMap<String, TenantLoad> = match value {
        Value::Null => BTreeMap::new(),
        v => serde_json::from_value(v.clone()).map_err(|e| format!("tenants: {e}"))?,
    };
    for (name, load) in &tenants {
        let rate = match load.arrivals {
            Arrivals::Constant { per_s } | Arrivals::Poisson { per_s } => per_s,
            Arrivals::Bursts {
                per_s,
                on_ms,
                off_ms,
            } => {
                if on_ms == 0 || on_ms.saturating_add(off_ms) > MOST_DURATION_MS {
                    return Err(format!(
                        "tenants.{name}.arrivals: on_ms must be positive, on_ms + off_ms at most a week"
                    ));
                }
                per_s
            }
        };
        if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
            return Err(format!(
                "tenants.{name}.arrivals.per_s must be above 0 and at most 1,000,000"
            ));
        }
        load.input_tokens
            .check(&format!("tenants.{name}.input_tokens"))?;
        load.max_output_tokens
            .check(&format!("tenants.{name}.max_output_tokens"))?;
        if load
            .deadline_ms
            .is_some_and(|d| d == 0 || d > MOST_DURATION_MS)
        {
            return Err(format!(
                "tenants.{name}.deadline_ms must be 1 to {MOST_DURATION_MS}"
            ));
        }
    }
    Ok(tenants)
}

/// RFC 7396: objects merge key by key, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        if !patch.is_null() {
            *target = patch.clone();
        }
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let target = target.as_object_mut().expect("made an object above");
    for (k, v) in patch {
        if v.is_null() {
            target.remove(k);
        } else {
            merge_patch(target.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minimal() -> Value {
        json!({
            "duration_ms": 10000,
            "config": {"tenants": {"a": {}}},
            "tenants": {"a": {"arrivals": {"kind": "constant", "per_s": 10},
                              "input_tokens": 10, "max_output_tokens": 10}},
            "provider": {"concurrency": 2, "base_ms": 100}
        })
    }

    #[test]
    fn a_minimal_file_reads_with_its_defaults() {
        let s = Simulation::from_json(Path::new("x.json"), minimal()).unwrap();
        assert_eq!(s.sample_ms, 100);
        assert_eq!(s.workers.count, 1);
        assert_eq!(s.callers.on_refusal, OnRefusal::GiveUp);
        assert_eq!(s.tenants["a"].route, Route::Interactive);
    }

    #[test]
    fn unknown_fields_and_bad_numbers_are_errors() {
        let mut typo = minimal();
        typo["provider"]["concurency"] = json!(3);
        assert!(Simulation::from_json(Path::new("x"), typo)
            .unwrap_err()
            .contains("concurency"));
        let mut rate = minimal();
        rate["tenants"]["a"]["arrivals"]["per_s"] = json!(-1);
        assert!(Simulation::from_json(Path::new("x"), rate)
            .unwrap_err()
            .contains("per_s"));
        let mut fail = minimal();
        fail["provider"]["failures"] = json!({"unknown": 0.7, "unavailable": 0.5});
        assert!(Simulation::from_json(Path::new("x"), fail)
            .unwrap_err()
            .contains("sum"));
        let mut tokens = minimal();
        tokens["tenants"]["a"]["input_tokens"] = json!({"min": 5, "max": 2});
        assert!(Simulation::from_json(Path::new("x"), tokens).is_err());
    }

    #[test]
    fn a_variant_merges_over_the_configuration() {
        let mut v = minimal();
        v["variants"] =
            json!([{"name": "big", "config": {"tenant_defaults": {"queue_limit": 1200}}}]);
        let s = Simulation::from_json(Path::new("x"), v).unwrap();
        let c = s.config_of(s.variants.first());
        assert_eq!(c["tenant_defaults"]["queue_limit"], 1200);
        assert_eq!(c["tenants"], json!({"a": {}}));
    }
}
