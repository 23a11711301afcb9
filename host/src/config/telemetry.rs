//! The `telemetry` section of a configuration file: where the service sends its traces
//! (OTLP over HTTP) and what share of them it keeps. It belongs to the service, not the
//! engine: scenario files have no such section.

use serde::Deserialize;

/// Traces: exported when an endpoint is given here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP receiver's base address (`http://collector:4318`); spans are posted to
    /// its `/v1/traces`. `None`: the environment's, or no export at all.
    pub otlp_endpoint: Option<String>,
    /// The share of new traces kept, 0 to 1 (default 1). A request that arrives with a
    /// `traceparent` follows its parent's choice.
    pub sample_ratio: f64,
    /// The `service.name` the spans carry (default `tollgate`).
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "tollgate".into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetryInput {
    otlp_endpoint: Option<String>,
    sample_ratio: Option<f64>,
    service_name: Option<String>,
}

impl TelemetryConfig {
    /// Reads and checks the section.
    ///
    /// # Errors
    /// The field that is wrong and why.
    pub fn from_json(value: serde_json::Value) -> Result<TelemetryConfig, String> {
        let input: TelemetryInput =
            serde_json::from_value(value).map_err(|e| format!("telemetry: {e}"))?;
        let defaults = TelemetryConfig::default();
        if let Some(e) = &input.otlp_endpoint {
            let scheme_ok = e.starts_with("http://") || e.starts_with("https://");
            if !scheme_ok || e.len() > 2048 || e.chars().any(char::is_whitespace) {
                return Err(format!(
                    "telemetry.otlp_endpoint: {e:?} is not an http:// or https:// address"
                ));
            }
        }
        let sample_ratio = input.sample_ratio.unwrap_or(defaults.sample_ratio);
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(format!(
                "telemetry.sample_ratio: {sample_ratio} is not between 0 and 1"
            ));
        }
        let service_name = input.service_name.unwrap_or(defaults.service_name);
        if service_name.is_empty() || service_name.len() > 128 {
            return Err("telemetry.service_name: must be 1 to 128 bytes".into());
        }
        Ok(TelemetryConfig {
            otlp_endpoint: input.otlp_endpoint.filter(|e| !e.is_empty()),
            sample_ratio,
            service_name,
        })
    }

    /// The receiver's address for spans: this section's endpoint with `/v1/traces`, else
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given, else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces` (OpenTelemetry's rules for its variables); `None` exports nothing.
    pub fn traces_endpoint(&self, env: impl Fn(&str) -> Option<String>) -> Option<String> {
        let with_path = |base: &str| format!("{}/v1/traces", base.trim_end_matches('/'));
        if let Some(e) = &self.otlp_endpoint {
            return Some(with_path(e));
        }
        if let Some(e) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|e| !e.is_empty()) {
            return Some(e);
        }
        env("OTEL_EXPORTER_OTLP_ENDPOINT")
            .filter(|e| !e.is_empty())
            .map(|e| with_path(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn endpoints_follow_the_section_then_the_environment() {
        let none = |_: &str| None;
        let t = TelemetryConfig::from_json(json!({"otlp_endpoint": "http://c:4318/"})).unwrap();
        assert_eq!(
            t.traces_endpoint(none).as_deref(),
            Some("http://c:4318/v1/traces")
        );
        let d = TelemetryConfig::default();
        assert_eq!(d.traces_endpoint(none), None);
        let base = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://e:4318".into());
        assert_eq!(
            d.traces_endpoint(base).as_deref(),
            Some("http://e:4318/v1/traces")
        );
        let own =
            |k: &str| (k == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://t/x".into());
        assert_eq!(d.traces_endpoint(own).as_deref(), Some("http://t/x"));
    }

    #[test]
    fn bad_fields_are_named() {
        for (bad, field) in [
            (json!({"otlp_endpoint": "ftp://x"}), "otlp_endpoint"),
            (json!({"sample_ratio": 1.5}), "sample_ratio"),
            (json!({"sample_ratio": -0.1}), "sample_ratio"),
            (json!({"service_name": ""}), "service_name"),
            (json!({"exporter": "x"}), "exporter"),
        ] {
            let e = TelemetryConfig::from_json(bad).unwrap_err();
            assert!(e.contains(field), "{e}");
        }
    }
}
