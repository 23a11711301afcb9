//! Every refusal explains itself: a message that says what was asked, what was available
//! and when to retry, and the same facts as fields (`limit`, `requested`, `available`,
//! `retry_after_ms`), for each reason the engine decides.

use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::engine::Completion;
use tollgate::model::CallResult;
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::SqliteStore;
use tollgate::Engine;

fn engine(config: Value, policy: &str) -> Engine<SqliteStore> {
    let config = Config::from_json(&config).unwrap();
    let runtime = Runtime::new().unwrap();
    let policy = runtime
        .load(builtin::get(policy).unwrap(), config.policy_limits())
        .unwrap();
    Engine::new(
        config,
        SqliteStore::in_memory().unwrap(),
        runtime,
        Arc::new(policy),
    )
}

fn request(tenant: &str, key: &str, input: u64, output: u64) -> Value {
    json!({"tenant": tenant, "key": key, "route": "interactive", "input_tokens": input,
           "max_output_tokens": output, "deadline_ms": 600_000})
}

/// The decision as the service sends it.
fn admit(e: &Engine<SqliteStore>, req: &Value, now: i64) -> Value {
    serde_json::to_value(e.admit(req, now).unwrap()).unwrap()
}

fn assert_refusal(
    answer: &Value,
    reason: &str,
    limit: Option<&str>,
    requested: Option<u64>,
    available: Option<u64>,
    message: &str,
) {
    assert_eq!(answer["outcome"], "rejected", "{answer}");
    assert_eq!(answer["reason"], reason, "{answer}");
    assert_eq!(answer["limit"].as_str(), limit, "{answer}");
    assert_eq!(answer["requested"].as_u64(), requested, "{answer}");
    assert_eq!(answer["available"].as_u64(), available, "{answer}");
    assert_eq!(answer["message"], message, "{answer}");
}

#[test]
fn budget_refusals_name_the_budget_what_was_asked_and_what_was_there() {
    let e = engine(
        json!({
            "global": {"requests": {"capacity": 100, "refill_per_s": 0}, "concurrency": 50},
            "tenant_defaults": {"tokens": {"capacity": 2000, "refill_per_s": 20}},
            "tenants": {
                "acme": {},
                "slow": {"requests": {"capacity": 1, "refill_per_s": 0.5}},
                "busy": {"concurrency": 1},
                "broke": {"cost_microusd": {"capacity": 100, "refill_per_s": 0}},
            },
            "models": {
                "gpt": {"requests": {"capacity": 1, "refill_per_s": 0.1},
                        "tokens": {"capacity": 5000, "refill_per_s": 0},
                        "price_microusd_per_token": {"input": 1, "output": 2}},
            }
        }),
        "standard",
    );
    // Tokens: 1,000 left after the first call; the second needs 1,509.
    assert_eq!(
        admit(&e, &request("acme", "t1", 500, 500), 0)["outcome"],
        "accepted"
    );
    let short = admit(&e, &request("acme", "t2", 509, 1_000), 0);
    assert_refusal(
        &short,
        "token_budget",
        Some("tenant.acme.tokens"),
        Some(1_509),
        Some(1_000),
        "token_budget: needs 1,509 tokens, 1,000 available in tenant.acme.tokens; retry in 26 s",
    );
    assert_eq!(short["retry_after_ms"], 25_450);
    assert_eq!(short["unit"], "tokens");
    assert_eq!(short["http"], 429);

    // Requests: one credit, refilled at 0.5/s.
    assert_eq!(
        admit(&e, &request("slow", "r1", 1, 1), 0)["outcome"],
        "accepted"
    );
    assert_refusal(
        &admit(&e, &request("slow", "r2", 1, 1), 0),
        "tenant_rate",
        Some("tenant.slow.requests"),
        Some(1),
        Some(0),
        "tenant_rate: needs 1 request, 0 available in tenant.slow.requests; retry in 2.0 s",
    );

    // Concurrency: the policy's busy retry-after (the standard default, 1 s).
    assert_eq!(
        admit(&e, &request("busy", "c1", 1, 1), 0)["outcome"],
        "accepted"
    );
    assert_refusal(
        &admit(&e, &request("busy", "c2", 1, 1), 0),
        "tenant_concurrency",
        Some("tenant.busy"),
        Some(1),
        Some(0),
        "tenant_concurrency: needs 1 slot, 0 free in tenant.busy; retry in 1.0 s",
    );

    // A model's shared request bucket.
    let gpt = |tenant: &str, key: &str, input: u64, output: u64| {
        let mut r = request(tenant, key, input, output);
        r["model"] = json!("gpt");
        r
    };
    assert_eq!(
        admit(&e, &gpt("acme", "m1", 1, 1), 0)["outcome"],
        "accepted"
    );
    assert_refusal(
        &admit(&e, &gpt("acme", "m2", 1, 1), 0),
        "model_rate",
        Some("model.gpt.requests"),
        Some(1),
        Some(0),
        "model_rate: needs 1 request, 0 available in model.gpt.requests; retry in 10 s",
    );
    // Money that never refills: waiting cannot cure it.
    assert_refusal(
        &admit(&e, &gpt("broke", "b1", 50, 50), 20_000),
        "cost_budget",
        Some("tenant.broke.cost_microusd"),
        Some(150),
        Some(100),
        "cost_budget: needs 150 micro-dollars, 100 available in tenant.broke.cost_microusd; the budget does not refill, waiting cannot cure it",
    );
    // More than the model's bucket can ever hold.
    assert_refusal(
        &admit(&e, &gpt("acme", "m3", 1_000, 5_000), 40_000),
        "too_large",
        Some("tenant.acme.tokens"),
        Some(6_000),
        Some(2_000),
        "too_large: needs 6,000 tokens, tenant.acme.tokens holds at most 2,000 tokens; reduce the request, waiting cannot cure it",
    );
}

#[test]
fn deadline_queue_and_state_refusals_explain_themselves() {
    let e = engine(
        json!({
            "global": {"concurrency": 1},
            "tenant_defaults": {"queue_limit": 1},
            "tenants": {"acme": {}},
            "policy_params": {"exec_ms_per_output_token": 20, "exec_base_ms": 200}
        }),
        "standard",
    );
    // 2,950 output tokens at 20 ms each, plus 200 ms, do not fit 30 s.
    let mut slow = request("acme", "d1", 10, 2_950);
    slow["deadline_ms"] = json!(30_000);
    let answer = admit(&e, &slow, 0);
    assert_refusal(
        &answer,
        "deadline_exceeded",
        Some("deadline"),
        Some(59_200),
        Some(30_000),
        "deadline_exceeded: estimated 59.2 s for 2,950 output tokens, deadline in 30 s",
    );
    assert_eq!(answer["unit"], "ms");

    // Global concurrency.
    assert_eq!(
        admit(&e, &request("acme", "g1", 1, 1), 0)["outcome"],
        "accepted"
    );
    assert_refusal(
        &admit(&e, &request("acme", "g2", 1, 1), 0),
        "global_concurrency",
        Some("global"),
        Some(1),
        Some(0),
        "global_concurrency: needs 1 slot, 0 free in global; retry in 1.0 s",
    );

    // The queue bound.
    let durable = |key: &str| {
        let mut r = request("acme", key, 1, 1);
        r["route"] = json!("durable");
        r
    };
    assert_eq!(admit(&e, &durable("q1"), 0)["outcome"], "queued");
    assert_refusal(
        &admit(&e, &durable("q2"), 0),
        "queue_full",
        Some("queue.acme"),
        Some(1),
        Some(0),
        "queue_full: needs 1 job, 0 of room in queue.acme; retry in 1.0 s",
    );

    // An unknown outcome is held until reconciled.
    let report = Completion {
        result: CallResult::Unknown,
        ..Completion::succeeded("acme", "g1")
    };
    e.complete(&report, 10).unwrap();
    let again = admit(&e, &request("acme", "g1", 1, 1), 20);
    assert_eq!(again["reason"], "unknown_outcome_pending");
    assert_eq!(
        again["message"],
        "unknown_outcome_pending: the last call under this key has an unknown outcome; reconcile it first"
    );

    // Validation names the reason in words.
    let bad = admit(&e, &json!({"tenant": "acme", "key": "v"}), 0);
    assert_eq!(
        (bad["reason"].as_str(), bad["message"].as_str()),
        (
            Some("invalid_request"),
            Some("invalid_request: a field is missing, of the wrong type or out of range")
        )
    );
}

#[test]
fn every_other_reason_says_what_it_means() {
    let e = engine(
        json!({
            "global": {"requests": {"capacity": 1, "refill_per_s": 0.25}},
            "tenants": {"acme": {}},
            "models": {"gpt": {"tokens": {"capacity": 100, "refill_per_s": 0}}},
            "policy_params": {"backoff_base_ms": 4000, "backoff_cap_ms": 4000}
        }),
        "standard",
    );
    // The global request bucket.
    assert_eq!(
        admit(&e, &request("acme", "g1", 1, 1), 0)["outcome"],
        "accepted"
    );
    assert_refusal(
        &admit(&e, &request("acme", "g2", 1, 1), 0),
        "global_rate",
        Some("global.requests"),
        Some(1),
        Some(0),
        "global_rate: needs 1 request, 0 available in global.requests; retry in 4.0 s",
    );
    // A model's shared token bucket.
    let mut big = request("acme", "m1", 50, 60);
    big["model"] = json!("gpt");
    assert_refusal(
        &admit(&e, &big, 8_000),
        "too_large",
        Some("model.gpt.tokens"),
        Some(110),
        Some(100),
        "too_large: needs 110 tokens, model.gpt.tokens holds at most 100 tokens; reduce the request, waiting cannot cure it",
    );
    let mut first = request("acme", "m2", 30, 30);
    first["model"] = json!("gpt");
    assert_eq!(admit(&e, &first, 8_000)["outcome"], "accepted");
    let mut second = request("acme", "m3", 30, 30);
    second["model"] = json!("gpt");
    assert_refusal(
        &admit(&e, &second, 16_000),
        "model_token_budget",
        Some("model.gpt.tokens"),
        Some(60),
        Some(40),
        "model_token_budget: needs 60 tokens, 40 available in model.gpt.tokens; the budget does not refill, waiting cannot cure it",
    );
    // A retry asked for before its time.
    let failed = Completion {
        result: CallResult::Failed,
        failure: Some("unavailable".into()),
        ..Completion::succeeded("acme", "g1")
    };
    e.complete(&failed, 16_000).unwrap();
    let early = admit(&e, &request("acme", "g1", 1, 1), 16_000);
    assert_eq!(early["reason"], "retry_too_early", "{early}");
    let wait = early["retry_after_ms"].as_u64().unwrap();
    assert!(
        early["message"]
            .as_str()
            .unwrap()
            .starts_with("retry_too_early: the next attempt may not start yet; retry in "),
        "{early}"
    );
    assert!(wait <= 4_000, "{early}");
    // An unknown tenant, and the downstream marked unavailable.
    let ghost = admit(&e, &request("ghost", "x", 1, 1), 0);
    assert_eq!(
        ghost["message"],
        "unknown_tenant: the tenant is not configured"
    );
    e.set_downstream(false).unwrap();
    let down = admit(&e, &request("acme", "d1", 1, 1), 30_000);
    assert_eq!(down["reason"], "downstream_unavailable", "{down}");
    assert!(
        down["message"]
            .as_str()
            .unwrap()
            .starts_with("downstream_unavailable: the downstream is marked unavailable"),
        "{down}"
    );
}

#[test]
fn a_policy_refusal_says_so_with_its_retry() {
    let e = engine(json!({"tenants": {"acme": {}}}), "deny-all");
    let answer = admit(&e, &request("acme", "k", 1, 1), 0);
    assert_eq!(answer["reason"], "overloaded");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("overloaded: refused by the policy under load"),
        "{message}"
    );
    assert!(answer.get("limit").is_none(), "{answer}");
}

#[test]
fn a_request_made_in_code_is_checked_as_a_json_one_is() {
    use tollgate::model::{Request, Route};
    use tollgate::reason::Outcome;
    use tollgate::validate::RequestBuilder;
    let e = engine(json!({"tenants": {"acme": {}}}), "standard");
    let good = RequestBuilder::new("acme", "built-1", Route::Interactive)
        .input_tokens(10)
        .max_output_tokens(10)
        .deadline_ms(600_000)
        .build(&e.config())
        .unwrap();
    assert_eq!(
        e.admit_request(&good, 0).unwrap().outcome,
        Outcome::Accepted
    );
    // Hand-built past the builder: zero output tokens, an empty key, an unknown tenant.
    // Each is refused for what it is, never handed to the policy.
    let bad = |f: &dyn Fn(&mut Request)| {
        let mut r = good.clone();
        r.key = "built-2".into();
        f(&mut r);
        serde_json::to_value(e.admit_request(&r, 0).unwrap()).unwrap()
    };
    let zero = bad(&|r| r.max_output_tokens = 0);
    assert_eq!(zero["reason"], "invalid_request", "{zero}");
    let empty = bad(&|r| r.key.clear());
    assert_eq!(empty["reason"], "invalid_request", "{empty}");
    let stranger = bad(&|r| r.tenant = "globex".into());
    assert_eq!(stranger["reason"], "unknown_tenant", "{stranger}");
    // Nothing was written for them.
    assert!(e.operation("acme", "built-2").unwrap().is_none());
}
