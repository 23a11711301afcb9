//! Shadow mode compares plans, not only outcomes: a shadow that would admit the same
//! request with another output cap disagrees, and the disagreement shows both plans.

use serde_json::json;
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::engine::NoVerifier;
use tollgate::runtime::{builtin, Runtime};
use tollgate::scenario::{default_fixtures, resolve_policy};
use tollgate::store::SqliteStore;
use tollgate::Engine;

#[test]
fn a_shadow_that_degrades_where_the_active_policy_does_not_disagrees() {
    let config = Config::from_json(&json!({"tenants": {"acme": {}}})).unwrap();
    let runtime = Runtime::new().unwrap();
    let standard = runtime
        .load(builtin::get("standard").unwrap(), config.policy_limits())
        .unwrap();
    let e = Engine::new(
        config,
        SqliteStore::in_memory().unwrap(),
        runtime,
        Arc::new(standard),
    );
    // shed-model caps free-tier output at 100 tokens; the standard rules do not.
    let shadow = resolve_policy("shed-model", None, &default_fixtures()).unwrap();
    e.install_shadow(&shadow, &NoVerifier, 1.0).unwrap();
    let ask = |key: &str, labels: serde_json::Value| {
        let req = json!({"tenant": "acme", "key": key, "route": "interactive",
                         "input_tokens": 10, "max_output_tokens": 200,
                         "deadline_ms": 600_000, "labels": labels});
        e.admit(&req, 0).unwrap()
    };
    // Both admit a paid request as asked: agreement.
    assert!(ask("paid", json!({"tier": "paid"})).authorises_call());
    // Both admit a free one, but the shadow would cut it to 100 tokens: a disagreement.
    let live = ask("free", json!({"tier": "free"}));
    assert_eq!(live.max_output_tokens, Some(200));
    let report = e.shadow_report().unwrap();
    assert_eq!((report.decisions, report.agreements), (2, 1));
    let pairs: Vec<(&str, &str, u64)> = report
        .by_outcome
        .iter()
        .map(|p| (p.active.as_str(), p.shadow.as_str(), p.count))
        .collect();
    assert!(pairs.contains(&("accepted", "accepted", 1)), "{pairs:?}");
    assert!(
        pairs.contains(&("accepted", "accepted:degraded", 1)),
        "{pairs:?}"
    );
    let d = &report.recent_disagreements[0];
    assert_eq!(d.key, "free");
    let (active, shadow) = (d.active_plan.unwrap(), d.shadow_plan.unwrap());
    assert_eq!((active.max_output_tokens, active.degraded), (200, false));
    assert_eq!((shadow.max_output_tokens, shadow.degraded), (100, true));
}
