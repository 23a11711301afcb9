//! The `gateway` section: OpenAI-compatible upstreams and the models served through them,
//! each by one or more deployments (`docs/gateway.md`). Validated strictly at start: an
//! unknown field, a model naming an unknown upstream or tokenizer, two deployments of one
//! name, a fallback cycle is an error naming the field.

use super::BucketConfig;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The tokenizers the gateway counts prompts with (tiktoken's BPE encodings).
pub const TOKENIZERS: &[&str] = &["o200k_base", "cl100k_base"];

/// The gateway's configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// OpenAI-compatible APIs by name.
    pub upstreams: BTreeMap<String, Upstream>,
    /// The models callers may name, each served by one upstream.
    pub models: BTreeMap<String, GatewayModel>,
    /// A call's deadline when the caller gives no `x-tollgate-timeout-ms`.
    #[serde(default = "default_timeout_ms")]
    pub default_timeout_ms: u64,
    /// The most attempts the gateway makes of one call, whatever the policy allows.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Whether a call with an `Idempotency-Key` keeps its answer, given back to a repeat.
    #[serde(default = "default_replay")]
    pub replay: bool,
    /// How long a kept answer is given back, in seconds.
    #[serde(default = "default_replay_ttl_s")]
    pub replay_ttl_s: u64,
    /// The largest answer kept (a plain body, or a stream's events); a larger one is not.
    #[serde(default = "default_replay_max_answer_bytes")]
    pub replay_max_answer_bytes: u64,
}

fn default_replay() -> bool {
    true
}

fn default_replay_ttl_s() -> u64 {
    86_400
}

fn default_replay_max_answer_bytes() -> u64 {
    1 << 20
}

/// The longest `replay_ttl_s`: 30 days.
pub const MAX_REPLAY_TTL_S: u64 = 30 * 86_400;
/// The largest `replay_max_answer_bytes`: 64 MiB.
pub const MAX_REPLAY_ANSWER_BYTES: u64 = 64 << 20;

/// One provider API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Which API it speaks: OpenAI's (the default) or Anthropic's.
    #[serde(default)]
    pub kind: UpstreamKind,
    /// Its base URL: for OpenAI up to and including the version
    /// (`https://api.openai.com/v1`), for Anthropic its host (`https://api.anthropic.com`,
    /// `/v1/messages` follows).
    pub base_url: String,
    /// The environment variable holding its API key (none: no key is sent).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

/// The API an upstream speaks: a route goes only to upstreams of its own kind.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    /// OpenAI's: chat completions, Responses, embeddings; the key as `Authorization: Bearer`.
    #[default]
    Openai,
    /// Anthropic's Messages; the key as `x-api-key`, with `anthropic-version`.
    Anthropic,
}

impl UpstreamKind {
    /// Its name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamKind::Openai => "openai",
            UpstreamKind::Anthropic => "anthropic",
        }
    }
}

impl GatewayConfig {
    /// The kind of the upstreams that serve `model` (all of its deployments are of one kind,
    /// checked at start); `None` for a model that is not a gateway model.
    pub fn kind_of(&self, model: &str) -> Option<UpstreamKind> {
        let m = self.models.get(model)?;
        let first = m.deployments().into_iter().next()?;
        self.upstreams.get(&first.upstream).map(|u| u.kind)
    }
}

/// One model as callers name it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayModel {
    /// The upstream that serves it, in the one-deployment form (`deployments` absent).
    #[serde(default)]
    pub upstream: Option<String>,
    /// The deployments that serve it, each with its own limits; absent: one, named after
    /// `upstream`.
    #[serde(default)]
    pub deployments: Option<Vec<Deployment>>,
    /// Other models that serve a call no deployment of this one can take, in order.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// The tokenizer its prompts are counted with; none: a conservative estimate.
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// The output limit when the request sets none.
    #[serde(default = "default_max_output_tokens")]
    pub default_max_output_tokens: u64,
    /// The model's name upstream, when it differs.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Without a tokenizer, prompts are estimated at this many UTF-8 bytes per token
    /// (rounded up), plus 4 tokens per message: conservative for the usual BPE vocabularies.
    #[serde(default = "default_bytes_per_token")]
    pub estimate_bytes_per_token: f64,
}

/// One deployment of a model: an upstream (a key, a region, a provider) with its own limits.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    /// Its name, unique within the model (`deployment.<model>.<name>.*` in the store).
    pub name: String,
    /// The upstream that serves it.
    pub upstream: String,
    /// The model's name at this upstream, when it differs from the model's.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Its share when several deployments have room (default 1; 0: used only when no
    /// other can take the call).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Its request bucket, when the provider limits requests.
    #[serde(default)]
    pub requests: Option<BucketConfig>,
    /// Its token bucket, when the provider limits tokens.
    #[serde(default)]
    pub tokens: Option<BucketConfig>,
    /// Calls in flight at once: a number, or `"adaptive"` to learn it.
    #[serde(default)]
    pub max_concurrency: Option<Concurrency>,
}

/// A deployment's concurrency limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Concurrency {
    /// At most this many calls in flight.
    Fixed(u32),
    /// Learned from the provider's answers (AIMD, `docs/gateway.md`).
    Adaptive,
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) if s == "adaptive" => Ok(Concurrency::Adaptive),
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(v) if (1..=u64::from(u32::MAX)).contains(&v) => {
                    Ok(Concurrency::Fixed(v as u32))
                }
                _ => Err(serde::de::Error::custom(
                    "max_concurrency must be a whole number of calls from 1, or \"adaptive\"",
                )),
            },
            _ => Err(serde::de::Error::custom(
                "max_concurrency must be a whole number of calls from 1, or \"adaptive\"",
            )),
        }
    }
}

fn default_weight() -> f64 {
    1.0
}

/// The most deployments one model may have.
pub const MAX_DEPLOYMENTS: usize = 64;
/// The most fallbacks one model may name.
pub const MAX_FALLBACKS: usize = 8;

/// How the engine routes calls for one gateway model: its deployments and fallbacks.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// The deployments, in the configuration's order (at least one).
    pub deployments: Vec<Deployment>,
    /// The models tried, in order, when no deployment can take a call.
    pub fallbacks: Vec<String>,
}

impl GatewayModel {
    /// Its deployments: the list given, or the one-upstream form as one deployment named
    /// after its upstream.
    pub fn deployments(&self) -> Vec<Deployment> {
        match (&self.deployments, &self.upstream) {
            (Some(list), _) => list.clone(),
            (None, Some(upstream)) => vec![Deployment {
                name: upstream.clone(),
                upstream: upstream.clone(),
                upstream_model: self.upstream_model.clone(),
                weight: 1.0,
                requests: None,
                tokens: None,
                max_concurrency: None,
            }],
            (None, None) => Vec::new(),
        }
    }
}

fn default_bytes_per_token() -> f64 {
    3.0
}

fn default_timeout_ms() -> u64 {
    60_000
}

fn default_max_attempts() -> u32 {
    3
}

fn default_max_output_tokens() -> u64 {
    1024
}

impl GatewayConfig {
    /// Parses and checks the section.
    pub fn from_json(value: serde_json::Value) -> Result<GatewayConfig, String> {
        let g: GatewayConfig =
            serde_json::from_value(value).map_err(|e| format!("gateway: {e}"))?;
        for (name, u) in &g.upstreams {
            if !is_http_url(&u.base_url) {
                return Err(format!(
                    "gateway.upstreams.{name}.base_url must be an http:// or https:// URL, not {:?}",
                    u.base_url
                ));
            }
        }
        for (name, m) in &g.models {
            if name.is_empty() || name.len() > 128 {
                return Err(format!("gateway.models: {name:?} must be 1 to 128 bytes"));
            }
            check_deployments(&g, name, m)?;
            if let Some(t) = &m.tokenizer {
                if !TOKENIZERS.contains(&t.as_str()) {
                    return Err(format!(
                        "gateway.models.{name}.tokenizer: unknown tokenizer {t:?} (known: {})",
                        TOKENIZERS.join(", ")
                    ));
                }
            }
            if !(m.estimate_bytes_per_token >= 1.0 && m.estimate_bytes_per_token <= 16.0) {
                return Err(format!(
                    "gateway.models.{name}.estimate_bytes_per_token must be from 1 to 16"
                ));
            }
            if m.default_max_output_tokens == 0 {
                return Err(format!(
                    "gateway.models.{name}.default_max_output_tokens must be at least 1"
                ));
            }
        }
        check_fallbacks(&g)?;
        if g.default_timeout_ms == 0 || g.max_attempts == 0 {
            return Err("gateway: default_timeout_ms and max_attempts must be at least 1".into());
        }
        if !(1..=MAX_REPLAY_TTL_S).contains(&g.replay_ttl_s) {
            return Err(format!(
                "gateway.replay_ttl_s must be 1 to {MAX_REPLAY_TTL_S} seconds"
            ));
        }
        if !(1..=MAX_REPLAY_ANSWER_BYTES).contains(&g.replay_max_answer_bytes) {
            return Err(format!(
                "gateway.replay_max_answer_bytes must be 1 to {MAX_REPLAY_ANSWER_BYTES}"
            ));
        }
        Ok(g)
    }

    /// Every model's deployments and fallbacks, as the engine routes them.
    pub fn routing(&self) -> BTreeMap<String, Routing> {
        self.models
            .iter()
            .map(|(name, m)| {
                let routing = Routing {
                    deployments: m.deployments(),
                    fallbacks: m.fallbacks.clone(),
                };
                (name.clone(), routing)
            })
            .collect()
    }
}

/// A model's deployments: given in one form only, each named once, of a known upstream,
/// with a finite weight of 0 or more and valid buckets.
fn check_deployments(g: &GatewayConfig, name: &str, m: &GatewayModel) -> Result<(), String> {
    let at = format!("gateway.models.{name}");
    match (&m.upstream, &m.deployments) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: give either upstream or deployments, not both"
            ))
        }
        (None, None) => return Err(format!("{at}: missing field `upstream` (or `deployments`)")),
        (None, Some(list)) if list.is_empty() || list.len() > MAX_DEPLOYMENTS => {
            return Err(format!(
                "{at}.deployments must list 1 to {MAX_DEPLOYMENTS} deployments"
            ))
        }
        (None, Some(_)) if m.upstream_model.is_some() => {
            return Err(format!(
                "{at}.upstream_model: with deployments, each deployment names its upstream_model"
            ))
        }
        _ => {}
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, d) in m.deployments().iter().enumerate() {
        let at = match &m.deployments {
            Some(_) => format!("{at}.deployments[{i}]"),
            None => at.clone(),
        };
        if !valid_name(&d.name) {
            return Err(format!(
                "{at}.name must be 1 to 64 bytes of letters, digits, '-', '_' or '.', not {:?}",
                d.name
            ));
        }
        if !seen.insert(d.name.as_str()) {
            return Err(format!(
                "{at}.name: deployment {:?} is listed twice",
                d.name
            ));
        }
        let Some(upstream) = g.upstreams.get(&d.upstream) else {
            return Err(format!("{at}.upstream: no upstream named {:?}", d.upstream));
        };
        // A call of one dialect must be servable by whichever deployment is reserved.
        let first = m.deployments().into_iter().next().map(|f| f.upstream);
        let kind_of_first = first.and_then(|f| g.upstreams.get(&f)).map(|u| u.kind);
        if kind_of_first.is_some_and(|k| k != upstream.kind) {
            return Err(format!(
                "{at}.upstream: {:?} is an {} upstream, and the model's first deployment's is not: one model's deployments speak one API",
                d.upstream,
                upstream.kind.as_str()
            ));
        }
        if !(d.weight.is_finite() && (0.0..=1e6).contains(&d.weight)) {
            return Err(format!(
                "{at}.weight must be a number from 0 to 1000000, not {}",
                d.weight
            ));
        }
        for (field, b) in [("requests", &d.requests), ("tokens", &d.tokens)] {
            if let Some(b) = b {
                b.check(&format!("{at}.{field}")).map_err(|e| e.0)?;
            }
        }
    }
    Ok(())
}

/// Fallbacks name other gateway models, without cycles.
fn check_fallbacks(g: &GatewayConfig) -> Result<(), String> {
    for (name, m) in &g.models {
        if m.fallbacks.len() > MAX_FALLBACKS {
            return Err(format!(
                "gateway.models.{name}.fallbacks: at most {MAX_FALLBACKS} models"
            ));
        }
        for f in &m.fallbacks {
            if f == name || !g.models.contains_key(f) {
                return Err(format!(
                    "gateway.models.{name}.fallbacks: {f:?} is not another gateway model"
                ));
            }
            if g.kind_of(f) != g.kind_of(name) {
                return Err(format!(
                    "gateway.models.{name}.fallbacks: {f:?} is served by another API's upstreams"
                ));
            }
        }
    }
    // A cycle: a path of fallbacks from a model back to itself (depth-first, three colours).
    fn visit<'a>(
        g: &'a GatewayConfig,
        m: &'a str,
        state: &mut BTreeMap<&'a str, bool>,
        path: &mut Vec<&'a str>,
    ) -> Result<(), String> {
        match state.get(m) {
            Some(true) => return Ok(()),
            Some(false) => {
                path.push(m);
                let from = path.iter().position(|p| *p == m).unwrap_or(0);
                return Err(format!(
                    "gateway.models.{}.fallbacks: a cycle ({})",
                    path[from],
                    path[from..].join(" -> ")
                ));
            }
            None => {}
        }
        state.insert(m, false);
        path.push(m);
        for f in &g.models[m].fallbacks {
            visit(g, f, state, path)?;
        }
        path.pop();
        state.insert(m, true);
        Ok(())
    }
    let mut state = BTreeMap::new();
    for name in g.models.keys() {
        visit(g, name, &mut state, &mut Vec::new())?;
    }
    Ok(())
}

/// A deployment name: it is part of store row names and metric labels.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// An `http://` or `https://` URL with a host and no whitespace or control characters,
/// checked without a URL library.
fn is_http_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or("");
    !host.is_empty() && !url.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> serde_json::Value {
        json!({
            "upstreams": {"local": {"base_url": "http://127.0.0.1:9000/v1", "api_key_env": "K"}},
            "models": {"gpt-4o-mini": {"upstream": "local", "tokenizer": "o200k_base",
                                        "default_max_output_tokens": 1024}},
            "default_timeout_ms": 60000
        })
    }

    #[test]
    fn the_documented_section_is_accepted() {
        let g = GatewayConfig::from_json(config()).unwrap();
        assert_eq!(
            g.models["gpt-4o-mini"].tokenizer.as_deref(),
            Some("o200k_base")
        );
        assert_eq!(g.max_attempts, 3);
    }

    #[test]
    fn unknown_fields_upstreams_and_tokenizers_are_errors() {
        let mut c = config();
        c["models"]["gpt-4o-mini"]["tokenizer"] = json!("p99k");
        assert!(GatewayConfig::from_json(c).unwrap_err().contains("p99k"));
        let mut c = config();
        c["models"]["gpt-4o-mini"]["upstream"] = json!("elsewhere");
        assert!(GatewayConfig::from_json(c)
            .unwrap_err()
            .contains("elsewhere"));
        let mut c = config();
        c["upstreams"]["local"]["timeout"] = json!(1);
        assert!(GatewayConfig::from_json(c).unwrap_err().contains("timeout"));
        let mut c = config();
        c["upstreams"]["local"]["base_url"] = json!("ftp://x");
        assert!(GatewayConfig::from_json(c).is_err());
        let mut c = config();
        c["surprise"] = json!(true);
        assert!(GatewayConfig::from_json(c).is_err());
    }

    fn with_models(models: serde_json::Value) -> Result<GatewayConfig, String> {
        let mut c = config();
        c["upstreams"]["other"] = json!({"base_url": "http://127.0.0.1:9001/v1"});
        c["models"] = models;
        GatewayConfig::from_json(c)
    }

    #[test]
    fn the_one_upstream_form_is_one_deployment_named_after_its_upstream() {
        let g = GatewayConfig::from_json(config()).unwrap();
        let routing = g.routing();
        let d = &routing["gpt-4o-mini"].deployments;
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].name.as_str(), d[0].upstream.as_str()),
            ("local", "local")
        );
        assert_eq!(d[0].weight, 1.0);
        assert!(routing["gpt-4o-mini"].fallbacks.is_empty());
    }

    #[test]
    fn deployments_with_their_limits_and_fallbacks_are_accepted() {
        let g = with_models(json!({
            "a": {"deployments": [
                {"name": "east", "upstream": "local", "requests": {"capacity": 60, "refill_per_s": 1},
                 "tokens": {"capacity": 1000, "refill_per_s": 10}, "max_concurrency": 4, "weight": 2},
                {"name": "west", "upstream": "other", "upstream_model": "a-2024", "max_concurrency": "adaptive", "weight": 0}],
                  "fallbacks": ["b"]},
            "b": {"upstream": "other"}
        }))
        .unwrap();
        let r = g.routing();
        assert_eq!(
            r["a"].deployments[0].max_concurrency,
            Some(Concurrency::Fixed(4))
        );
        assert_eq!(
            r["a"].deployments[1].max_concurrency,
            Some(Concurrency::Adaptive)
        );
        assert_eq!(r["a"].fallbacks, vec!["b".to_string()]);
    }

    #[test]
    fn bad_deployments_and_fallbacks_are_refused_with_the_field_named() {
        let d = |name: &str, upstream: &str| json!({"name": name, "upstream": upstream});
        let cases = [
            (
                json!({"a": {"deployments": [d("x", "local"), d("x", "other")]}}),
                "gateway.models.a.deployments[1].name: deployment \"x\" is listed twice",
            ),
            (
                json!({"a": {"deployments": [d("x", "nowhere")]}}),
                "gateway.models.a.deployments[0].upstream: no upstream named \"nowhere\"",
            ),
            (
                json!({"a": {"deployments": [{"name": "x", "upstream": "local", "weight": -1}]}}),
                "gateway.models.a.deployments[0].weight",
            ),
            (
                json!({"a": {"deployments": [{"name": "x", "upstream": "local", "max_concurrency": 0}]}}),
                "max_concurrency",
            ),
            (
                json!({"a": {"deployments": [{"name": "x", "upstream": "local", "max_concurrency": "lots"}]}}),
                "max_concurrency",
            ),
            (
                json!({"a": {"deployments": [{"name": "x", "upstream": "local", "requests": {"capacity": -1, "refill_per_s": 0}}]}}),
                "gateway.models.a.deployments[0].requests",
            ),
            (
                json!({"a": {"deployments": [d("bad name", "local")]}}),
                "deployments[0].name",
            ),
            (
                json!({"a": {"deployments": []}}),
                "gateway.models.a.deployments must list",
            ),
            (
                json!({"a": {"upstream": "local", "deployments": [d("x", "local")]}}),
                "not both",
            ),
            (
                json!({"a": {}}),
                "gateway.models.a: missing field `upstream`",
            ),
            (
                json!({"a": {"upstream": "local", "fallbacks": ["ghost"]}}),
                "gateway.models.a.fallbacks: \"ghost\" is not another gateway model",
            ),
            (
                json!({"a": {"upstream": "local", "fallbacks": ["a"]}}),
                "gateway.models.a.fallbacks",
            ),
            (
                json!({"a": {"upstream": "local", "fallbacks": ["b"]},
                    "b": {"upstream": "other", "fallbacks": ["c"]},
                    "c": {"upstream": "other", "fallbacks": ["a"]}}),
                "a cycle (a -> b -> c -> a)",
            ),
        ];
        for (models, wanted) in cases {
            let e = with_models(models.clone()).unwrap_err();
            assert!(e.contains(wanted), "{models}: {e}");
        }
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;
    use serde_json::json;

    fn with(models: serde_json::Value) -> Result<GatewayConfig, String> {
        GatewayConfig::from_json(json!({
            "upstreams": {
                "openai": {"base_url": "https://api.openai.com/v1"},
                "claude": {"kind": "anthropic", "base_url": "https://api.anthropic.com"},
            },
            "models": models,
        }))
    }

    #[test]
    fn an_upstream_is_openai_unless_it_says_anthropic() {
        let g =
            with(json!({"gpt": {"upstream": "openai"}, "claude": {"upstream": "claude"}})).unwrap();
        assert_eq!(g.kind_of("gpt"), Some(UpstreamKind::Openai));
        assert_eq!(g.kind_of("claude"), Some(UpstreamKind::Anthropic));
        assert_eq!(g.kind_of("ghost"), None);
        let mut bad = json!({"upstreams": {"x": {"kind": "bedrock", "base_url": "https://x"}},
                             "models": {}});
        assert!(GatewayConfig::from_json(bad.take()).is_err());
    }

    #[test]
    fn one_models_deployments_and_fallbacks_speak_one_api() {
        let mixed = with(json!({"m": {"deployments": [
            {"name": "a", "upstream": "openai"}, {"name": "b", "upstream": "claude"}]}}));
        let e = mixed.unwrap_err();
        assert!(
            e.contains("gateway.models.m.deployments[1].upstream"),
            "{e}"
        );
        let fallback = with(
            json!({"gpt": {"upstream": "openai", "fallbacks": ["claude"]},
                                   "claude": {"upstream": "claude"}}),
        );
        let e = fallback.unwrap_err();
        assert!(e.contains("gateway.models.gpt.fallbacks"), "{e}");
    }
}
