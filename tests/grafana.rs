//! The Grafana dashboard (`examples/grafana/tollgate.json`) queries only what tollgate
//! exposes: every series its panels and its tenant variable name exists in `/metrics` of a
//! server that has admitted calls and served gateway calls (plain and streamed), with
//! every label the queries select, group or template by.

mod common;

use common::server::Server;
use common::stub::Stub;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const CALLER: &str = "acme-key";
const ADMIN: &str = "admin-key";
const MODEL: &str = "gpt-4o-mini";

/// Every series of a text exposition, by name, with the label names it carries.
fn series(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if line[end..].starts_with('{') {
            // name="value",...: names end at '=', values are quoted (with \" escapes).
            let mut rest = &line[end + 1..];
            while let Some(eq) = rest.find('=') {
                labels.insert(rest[..eq].trim_start_matches(',').to_string());
                let mut chars = rest[eq + 2..].char_indices();
                let mut close = 0;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            close = eq + 2 + i;
                            break;
                        }
                        _ => {}
                    }
                }
                rest = &rest[close + 1..];
                if rest.starts_with('}') {
                    break;
                }
            }
        }
    }
    out
}

/// The metric names a PromQL expression reads.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The label names an expression selects on (`{name=...}`), groups by (`by (a, b)`) or
/// names in `label_values(metric, name)` and legends (`{{name}}`).
fn labels_in(expr: &str, legend: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
        for matcher in rest[open + 1..close].split(',') {
            if let Some(op) = matcher.find(['=', '!']) {
                out.insert(matcher[..op].trim().to_string());
            }
        }
        rest = &rest[close..];
        if rest.is_empty() {
            break;
        }
        rest = &rest[1..];
    }
    let mut rest = expr;
    while let Some(by) = rest.find("by (") {
        let close = rest[by..].find(')').unwrap() + by;
        out.extend(rest[by + 4..close].split(',').map(|l| l.trim().to_string()));
        rest = &rest[close..];
    }
    if let Some(inner) = expr.strip_prefix("label_values(") {
        out.insert(
            inner
                .trim_end_matches(')')
                .rsplit(',')
                .next()
                .unwrap()
                .trim()
                .into(),
        );
    }
    let mut rest = legend;
    while let Some(open) = rest.find("{{") {
        let close = rest[open..].find("}}").unwrap() + open;
        out.insert(rest[open + 2..close].trim().to_string());
        rest = &rest[close + 2..];
    }
    out.remove("le");
    out
}

#[test]
fn every_series_and_label_the_dashboard_queries_is_in_metrics() {
    let path = format!(
        "{}/../examples/grafana/tollgate.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let stub = Stub::start();
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "auth": {"callers": {CALLER: "acme"}, "admins": [ADMIN]},
        "tenant_defaults": {"requests": {"capacity": 1000, "refill_per_s": 0},
                            "tokens": {"capacity": 100000, "refill_per_s": 0},
                            "cost_microusd": {"limit": 1000000, "period": "month"}},
        "groups": {"org": {"budgets": {"cost_microusd": {"limit": 1000000, "period": "month"}}}},
        "tenants": {"acme": {"group": "org"}},
        "models": {MODEL: {"price_microusd_per_token": {"input": 1, "output": 1}}},
        "gateway": {
            "upstreams": {"stub": {"base_url": stub.base_url()}},
            "models": {MODEL: {"upstream": "stub", "tokenizer": "o200k_base"}},
        }
    });
    let server = Server::start(dir.path(), &config);
    // Traffic: an admission, and a plain and a streamed gateway call.
    let body = json!({"key": "k1", "route": "durable", "input_tokens": 5,
                      "max_output_tokens": 5, "deadline_ms": common::server::now_ms() + 60_000});
    assert_eq!(server.admit(CALLER, body).0, 202);
    for stream in [false, true] {
        let call = json!({"model": MODEL, "stream": stream,
                          "messages": [{"role": "user", "content": "hello"}]});
        let answer = ureq::post(&format!("{}/v1/chat/completions", server.base))
            .set("Authorization", &format!("Bearer {CALLER}"))
            .send_string(&call.to_string())
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.into_string().unwrap();
    }
    let text = ureq::get(&format!("{}/metrics", server.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let exposed = series(&text);
    // Every query: the panels' targets and the template variables' definitions.
    let mut queries: Vec<(String, String)> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let legend = target["legendFormat"].as_str().unwrap_or("").to_string();
            queries.push((target["expr"].as_str().unwrap().to_string(), legend));
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(d) = var["definition"].as_str() {
            queries.push((d.to_string(), String::new()));
        }
    }
    assert!(queries.len() >= 15, "{} queries", queries.len());
    let mut read = BTreeSet::new();
    for (expr, legend) in &queries {
        let metrics = metrics_in(expr);
        assert!(!metrics.is_empty(), "{expr} reads no tollgate series");
        let mut labels = BTreeSet::new();
        for m in &metrics {
            let have = exposed
                .get(m)
                .unwrap_or_else(|| panic!("{m} (in {expr}) is not in /metrics:\n{text}"));
            labels.extend(have.iter().cloned());
            read.insert(m.clone());
        }
        for l in labels_in(expr, legend) {
            assert!(
                labels.contains(&l),
                "{expr}: label {l} is not on {metrics:?}"
            );
        }
    }
    // The dashboard covers what an operator watches.
    for m in [
        "tollgate_decisions_total",
        "tollgate_bucket_credits",
        "tollgate_slots_in_use",
        "tollgate_queue_depth",
        "tollgate_policy_call_seconds_bucket",
        "tollgate_gateway_upstream_seconds_bucket",
        "tollgate_gateway_calls_total",
    ] {
        assert!(read.contains(m), "the dashboard does not chart {m}");
    }
    assert!(server.stop().success());
}
