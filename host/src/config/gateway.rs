//! The `gateway` section: OpenAI-compatible upstreams and the models served through them
//! (`docs/gateway.md`). Validated strictly at start: an unknown field, an upstream no model
//! may use, a model naming an unknown upstream or tokenizer is an error.

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

/// One OpenAI-compatible API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Its base URL, up to and including the version (`https://api.openai.com/v1`).
    pub base_url: String,
    /// The environment variable holding its API key (none: no key is sent).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

/// One model as callers name it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayModel {
    /// The upstream that serves it.
    pub upstream: String,
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
            if !g.upstreams.contains_key(&m.upstream) {
                return Err(format!(
                    "gateway.models.{name}.upstream: no upstream named {:?}",
                    m.upstream
                ));
            }
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
}
