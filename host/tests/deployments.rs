//! Deployments in the engine, with no HTTP: a gateway model's deployments are budgets
//! reserved in the admission's transaction, chosen by weight and headroom, released and
//! refunded as the others are, paused by a provider's 429, ejected after failures and
//! probed, lowered by what the provider reports, and stood in for by fallback models.

use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::ConfigFile;
use tollgate::engine::{Completion, Decision, HealthState, ProviderLimits};
use tollgate::model::{CallResult, Usage};
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::SqliteStore;
use tollgate::Engine;

fn engine(models: Value) -> Engine<SqliteStore> {
    let file = ConfigFile::from_json(&json!({
        "refund_unused_tokens": true,
        "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 1000},
        "tenant_defaults": {"requests": {"capacity": 100000, "refill_per_s": 0},
                            "tokens": {"capacity": 100000000, "refill_per_s": 0}},
        "tenants": {"acme": {}},
        "gateway": {
            "upstreams": {"one": {"base_url": "http://127.0.0.1:1/v1"},
                          "two": {"base_url": "http://127.0.0.1:2/v1"}},
            "models": models,
        },
    }))
    .unwrap();
    engine_on(file, SqliteStore::in_memory().unwrap())
}

/// An engine of `file`'s configuration with the standard policy, on `store`.
fn engine_on(file: ConfigFile, store: SqliteStore) -> Engine<SqliteStore> {
    let runtime = Runtime::new().unwrap();
    let policy = runtime
        .load(
            builtin::get("standard").unwrap(),
            file.engine.policy_limits(),
        )
        .unwrap();
    Engine::new(file.engine, store, runtime, Arc::new(policy))
}

fn call(key: &str, model: &str) -> Value {
    json!({"tenant": "acme", "key": key, "route": "interactive", "input_tokens": 50,
           "max_output_tokens": 50, "deadline_ms": 10_000_000, "model": model})
}

fn admit(e: &Engine<SqliteStore>, req: &Value, now: i64) -> Decision {
    e.admit(req, now).unwrap()
}

fn end(e: &Engine<SqliteStore>, key: &str, result: CallResult, f: impl FnOnce(&mut Completion)) {
    let mut c = Completion {
        result,
        ..Completion::succeeded("acme", key)
    };
    f(&mut c);
    assert!(e.complete(&c, 1_000).unwrap().ok);
}

/// Model `m` with deployments `a` (upstream one) and `b` (upstream two), each with the
/// fields given.
fn pair(mut a: Value, mut b: Value) -> Value {
    a["name"] = json!("a");
    a["upstream"] = json!("one");
    b["name"] = json!("b");
    b["upstream"] = json!("two");
    json!({"m": {"deployments": [a, b]}})
}

#[test]
fn calls_spread_by_headroom_and_none_past_either_deployment() {
    let e = engine(pair(
        json!({"requests": {"capacity": 60, "refill_per_s": 1}}),
        json!({"requests": {"capacity": 30, "refill_per_s": 0.5}}),
    ));
    let mut on = std::collections::BTreeMap::new();
    for i in 0..90 {
        let d = admit(&e, &call(&format!("k{i}"), "m"), 1_000);
        assert!(d.authorises_call(), "{i}: {d:?}");
        *on.entry(d.deployment.unwrap()).or_insert(0) += 1;
    }
    assert_eq!((on["a"], on["b"]), (60, 30));
    let refused = admit(&e, &call("k90", "m"), 1_000);
    assert_eq!(refused.reason.unwrap().as_str(), "deployment_capacity");
    assert_eq!(refused.http, 429);
    // The earliest refill: a's one request a second.
    assert_eq!(refused.retry_after_ms, Some(1_000));
    assert!(
        refused.message.unwrap().contains("deployment.m."),
        "message"
    );
    let i = e.inspect(1_000).unwrap();
    assert_eq!(i.buckets["deployment.m.a.requests"], 0);
    assert_eq!(i.slots["deployment.m.a.slots"], 60);
    // Completions release the deployments' slots.
    for k in 0..90 {
        end(&e, &format!("k{k}"), CallResult::Succeeded, |_| {});
    }
    assert_eq!(e.inspect(1_000).unwrap().slots["deployment.m.b.slots"], 0);
}

#[test]
fn calls_are_drawn_in_proportion_to_weight_where_nothing_limits() {
    let e = engine(pair(json!({"weight": 3}), json!({"weight": 1})));
    let on_a = (0..2000)
        .filter(|i| {
            let key = format!("k{i}");
            let d = admit(&e, &call(&key, "m"), 1_000);
            end(&e, &key, CallResult::Succeeded, |_| {});
            d.deployment.as_deref() == Some("a")
        })
        .count();
    assert!((1400..1600).contains(&on_a), "{on_a} of 2000 on a");
    // The same call draws the same way: a replay, a simulation and a test choose alike.
    let again = engine(pair(json!({"weight": 3}), json!({"weight": 1})));
    for i in 0..20 {
        let key = format!("r{i}");
        assert_eq!(
            admit(&e, &call(&key, "m"), 1_000).deployment,
            admit(&again, &call(&key, "m"), 1_000).deployment
        );
    }
}

#[test]
fn weights_lean_and_a_weight_of_zero_is_the_last_resort() {
    let e = engine(pair(
        json!({"weight": 3}),
        json!({"weight": 0, "max_concurrency": 5}),
    ));
    let ds: Vec<String> = (0..4)
        .map(|i| {
            admit(&e, &call(&format!("k{i}"), "m"), 1_000)
                .deployment
                .unwrap()
        })
        .collect();
    assert_eq!(ds, ["a", "a", "a", "a"]);
    let e = engine(pair(
        json!({"max_concurrency": 1}),
        json!({"weight": 0, "max_concurrency": 1}),
    ));
    let first = admit(&e, &call("k1", "m"), 1_000).deployment.unwrap();
    let second = admit(&e, &call("k2", "m"), 1_000).deployment.unwrap();
    assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
    let third = admit(&e, &call("k3", "m"), 1_000);
    assert_eq!(third.reason.unwrap().as_str(), "deployment_capacity");
}

#[test]
fn unused_tokens_return_to_the_deployment_that_reserved_them() {
    let e = engine(pair(
        json!({"tokens": {"capacity": 1000, "refill_per_s": 0}}),
        json!({"tokens": {"capacity": 10, "refill_per_s": 0}}),
    ));
    let d = admit(&e, &call("k", "m"), 1_000);
    assert_eq!(d.deployment.as_deref(), Some("a"));
    assert_eq!(
        e.inspect(1_000).unwrap().buckets["deployment.m.a.tokens"],
        900
    );
    end(&e, "k", CallResult::Succeeded, |c| {
        c.usage = Some(Usage::new(50, 10))
    });
    assert_eq!(
        e.inspect(1_000).unwrap().buckets["deployment.m.a.tokens"],
        940
    );
}

#[test]
fn a_429_pauses_its_deployment_and_the_retry_moves_without_waiting() {
    let e = engine(pair(json!({}), json!({"weight": 0})));
    assert_eq!(
        admit(&e, &call("k", "m"), 1_000).deployment.as_deref(),
        Some("a")
    );
    let mut verdict = None;
    let mut c = Completion {
        result: CallResult::Failed,
        failure: Some("rate_limited".into()),
        provider_retry_after_ms: Some(30_000),
        ..Completion::succeeded("acme", "k")
    };
    c.attempt = Some(1);
    let answer = e.complete(&c, 1_000).unwrap();
    if let Some(r) = answer.retry {
        verdict = r.not_before_ms;
    }
    // The retry-after pauses the deployment, not the call: the policy's backoff only.
    let not_before = verdict.expect("retried");
    assert!(not_before < 1_000 + 30_000, "{not_before}");
    let retry = admit(&e, &call("k", "m"), not_before);
    assert_eq!(retry.attempt, Some(2));
    assert_eq!(retry.deployment.as_deref(), Some("b"));
    let health = &e.inspect(not_before).unwrap().deployments["deployment.m.a"];
    assert_eq!(health.state, HealthState::Paused);
    assert_eq!(health.until_ms, Some(31_000));
    // After the pause, a takes calls again.
    assert_eq!(
        admit(&e, &call("k2", "m"), 31_000).deployment.as_deref(),
        Some("a")
    );
}

#[test]
fn a_lone_deployment_paused_by_a_429_refuses_until_its_retry_after() {
    let e = engine(json!({"m": {"upstream": "one"}}));
    assert_eq!(
        admit(&e, &call("k", "m"), 1_000).deployment.as_deref(),
        Some("one")
    );
    end(&e, "k", CallResult::Failed, |c| {
        c.failure = Some("rate_limited".into());
        c.provider_retry_after_ms = Some(5_000);
    });
    let refused = admit(&e, &call("k2", "m"), 2_000);
    assert_eq!(refused.reason.unwrap().as_str(), "deployment_capacity");
    assert_eq!(refused.retry_after_ms, Some(4_000));
    assert!(admit(&e, &call("k3", "m"), 6_000).authorises_call());
}

#[test]
fn failures_eject_a_deployment_then_one_probe_decides() {
    let e = engine(pair(json!({}), json!({"weight": 0})));
    let mut now = 1_000;
    for i in 0..3 {
        let key = format!("f{i}");
        let d = admit(&e, &call(&key, "m"), now);
        assert_eq!(d.deployment.as_deref(), Some("a"), "{i}");
        let c = Completion {
            result: CallResult::Failed,
            failure: Some("unavailable".into()),
            ..Completion::succeeded("acme", &key)
        };
        e.complete(&c, now).unwrap();
        now += 10;
    }
    let health = e.inspect(now).unwrap().deployments["deployment.m.a"].clone();
    assert_eq!(health.state, HealthState::Ejected);
    assert_eq!(health.failures, 3);
    assert_eq!(
        admit(&e, &call("x", "m"), now).deployment.as_deref(),
        Some("b")
    );
    // The cool-down over: one probe goes to a, the next call does not wait on it.
    let after = health.until_ms.unwrap();
    assert_eq!(
        e.inspect(after).unwrap().deployments["deployment.m.a"].state,
        HealthState::Probing
    );
    assert_eq!(
        admit(&e, &call("probe", "m"), after).deployment.as_deref(),
        Some("a")
    );
    assert_eq!(
        admit(&e, &call("y", "m"), after).deployment.as_deref(),
        Some("b")
    );
    // The probe fails: ejected again, for twice as long.
    let c = Completion {
        result: CallResult::Failed,
        failure: Some("connect_failed".into()),
        ..Completion::succeeded("acme", "probe")
    };
    e.complete(&c, after).unwrap();
    let again = e.inspect(after).unwrap().deployments["deployment.m.a"].clone();
    assert_eq!(again.state, HealthState::Ejected);
    assert_eq!(again.until_ms.unwrap() - after, 2 * (after - (now - 10)));
    // A probe that succeeds makes it healthy at once.
    let later = again.until_ms.unwrap();
    assert_eq!(
        admit(&e, &call("probe2", "m"), later).deployment.as_deref(),
        Some("a")
    );
    let c = Completion::succeeded("acme", "probe2");
    e.complete(&c, later).unwrap();
    let healthy = &e.inspect(later).unwrap().deployments["deployment.m.a"];
    assert_eq!((healthy.state, healthy.failures), (HealthState::Healthy, 0));
}

#[test]
fn what_the_provider_reports_lowers_a_balance_and_never_raises_it() {
    let e = engine(pair(
        json!({"tokens": {"capacity": 10000, "refill_per_s": 0}}),
        json!({"weight": 0}),
    ));
    assert_eq!(
        admit(&e, &call("k", "m"), 1_000).deployment.as_deref(),
        Some("a")
    );
    end(&e, "k", CallResult::Succeeded, |c| {
        c.provider_limits = Some(ProviderLimits {
            remaining_tokens: Some(60),
            remaining_requests: Some(1_000_000),
            ..ProviderLimits::default()
        })
    });
    let i = e.inspect(1_000).unwrap();
    assert_eq!(i.buckets["deployment.m.a.tokens"], 60);
    // 100 tokens do not fit in a's 60: the call goes to b, before any 429.
    assert_eq!(
        admit(&e, &call("k2", "m"), 1_000).deployment.as_deref(),
        Some("b")
    );
}

#[test]
fn an_unlimited_deployment_holds_what_the_provider_said_until_its_reset() {
    let e = engine(pair(json!({}), json!({"weight": 0})));
    assert_eq!(
        admit(&e, &call("k", "m"), 1_000).deployment.as_deref(),
        Some("a")
    );
    end(&e, "k", CallResult::Succeeded, |c| {
        c.provider_limits = Some(ProviderLimits {
            remaining_requests: Some(0),
            reset_requests_ms: Some(2_000),
            ..ProviderLimits::default()
        })
    });
    assert_eq!(
        admit(&e, &call("k2", "m"), 2_000).deployment.as_deref(),
        Some("b")
    );
    assert_eq!(
        admit(&e, &call("k3", "m"), 3_001).deployment.as_deref(),
        Some("a")
    );
}

#[test]
fn a_fallback_model_serves_when_no_deployment_can_unless_forbidden() {
    let e = engine(json!({
        "m": {"deployments": [{"name": "a", "upstream": "one",
                               "requests": {"capacity": 1, "refill_per_s": 0}}],
              "fallbacks": ["spare"]},
        "spare": {"upstream": "two"},
    }));
    let first = admit(&e, &call("k1", "m"), 1_000);
    assert_eq!(
        (first.deployment.as_deref(), first.served_model),
        (Some("a"), None)
    );
    let mut forbidden = call("k2", "m");
    forbidden["fallback"] = json!(false);
    let refused = admit(&e, &forbidden, 1_000);
    assert_eq!(refused.reason.unwrap().as_str(), "deployment_capacity");
    // Without a refill, waiting cannot cure it.
    assert_eq!(refused.retry_after_ms, None);
    let served = admit(&e, &call("k3", "m"), 1_000);
    assert_eq!(served.served_model.as_deref(), Some("spare"));
    assert_eq!(served.deployment.as_deref(), Some("two"));
    assert_eq!(
        e.inspect(1_000).unwrap().slots["deployment.spare.two.slots"],
        1
    );
    end(&e, "k3", CallResult::Succeeded, |_| {});
    assert_eq!(
        e.inspect(1_000).unwrap().slots["deployment.spare.two.slots"],
        0
    );
    // A repeat of the key tells which model served it.
    let again = admit(&e, &call("k3", "m"), 1_000);
    assert_eq!(again.served_model.as_deref(), Some("spare"));
}

#[test]
fn a_call_admitted_before_deployments_completes_after_them_and_holds_none() {
    let dir = std::env::temp_dir().join(format!("tollgate-deployments-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    let _ = std::fs::remove_file(&path);
    let start = |gateway: Option<Value>| {
        let mut config = json!({
            "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 10},
            "tenant_defaults": {"requests": {"capacity": 1000, "refill_per_s": 0},
                                "tokens": {"capacity": 1000000, "refill_per_s": 0}},
            "tenants": {"acme": {}},
        });
        if let Some(g) = gateway {
            config["gateway"] = g;
        }
        let file = ConfigFile::from_json(&config).unwrap();
        engine_on(file, SqliteStore::open(&path).unwrap())
    };
    // As the release before deployments admitted it: the model has no deployment.
    let before = start(None);
    let old = admit(&before, &call("old", "m"), 1_000);
    assert_eq!(old.deployment, None);
    assert_eq!(before.inspect(1_000).unwrap().slots["global"], 1);
    drop(before);
    // The same store under the one-upstream form, which now means one deployment.
    let after = start(Some(json!({
        "upstreams": {"one": {"base_url": "http://127.0.0.1:1/v1"}},
        "models": {"m": {"upstream": "one"}},
    })));
    end(&after, "old", CallResult::Succeeded, |_| {});
    let i = after.inspect(1_000).unwrap();
    assert_eq!(i.slots["global"], 0);
    assert_eq!(i.deployments["deployment.m.one"].in_flight, 0);
    // A new call reserves the deployment and releases it when it ends.
    let new = admit(&after, &call("new", "m"), 1_000);
    assert_eq!(new.deployment.as_deref(), Some("one"));
    assert_eq!(
        after.inspect(1_000).unwrap().deployments["deployment.m.one"].in_flight,
        1
    );
    end(&after, "new", CallResult::Succeeded, |_| {});
    assert_eq!(
        after.inspect(1_000).unwrap().deployments["deployment.m.one"].in_flight,
        0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_deployment_budget_crossing_a_threshold_writes_its_alert() {
    let file = ConfigFile::from_json(&json!({
        "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 1000},
        "tenant_defaults": {"requests": {"capacity": 100000, "refill_per_s": 0},
                            "tokens": {"capacity": 100000000, "refill_per_s": 0}},
        "tenants": {"acme": {}},
        "alerts": [{"budget": "deployment.m.*", "at": [0.5, 1.0],
                    "webhook": "http://127.0.0.1:9/hook"}],
        "gateway": {
            "upstreams": {"one": {"base_url": "http://127.0.0.1:1/v1"}},
            "models": {"m": {"deployments": [{"name": "a", "upstream": "one",
                "requests": {"capacity": 4, "refill_per_s": 0}}]}},
        },
    }))
    .unwrap();
    let e = engine_on(file, SqliteStore::in_memory().unwrap());
    let admitted = |key: &str| admit(&e, &call(key, "m"), 1_000).http;
    assert_eq!(admitted("k1"), 200);
    assert_eq!(e.pending_alerts().unwrap(), 0);
    // Half of the deployment's requests spent: one alert; all of them: another.
    assert_eq!(admitted("k2"), 200);
    assert_eq!(e.pending_alerts().unwrap(), 1);
    assert_eq!(admitted("k3"), 200);
    assert_eq!(admitted("k4"), 200);
    assert_eq!(e.pending_alerts().unwrap(), 2);
    // Refused: nothing spent, nothing crossed.
    assert_ne!(admitted("k5"), 200);
    assert_eq!(e.pending_alerts().unwrap(), 2);
}
