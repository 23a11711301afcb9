//! Budgets the way people bill: period budgets that are full again at each boundary of their
//! calendar period (month ends, leap years, daylight saving) and groups of tenants whose
//! budgets every member's call reserves in, all or nothing, refunded at every level.

use chrono::DateTime;
use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::engine::Completion;
use tollgate::model::Usage;
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::SqliteStore;
use tollgate::Engine;

fn engine(config: Value) -> Engine<SqliteStore> {
    let config = Config::from_json(&config).unwrap();
    let runtime = Runtime::new().unwrap();
    let policy = runtime
        .load(builtin::get("standard").unwrap(), config.policy_limits())
        .unwrap();
    Engine::new(
        config,
        SqliteStore::in_memory().unwrap(),
        runtime,
        Arc::new(policy),
    )
}

fn ms(text: &str) -> i64 {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

fn admit(e: &Engine<SqliteStore>, tenant: &str, key: &str, model: Option<&str>, now: i64) -> Value {
    let mut req = json!({"tenant": tenant, "key": key, "route": "interactive", "input_tokens": 10,
                         "max_output_tokens": 10, "deadline_ms": now + 600_000});
    if let Some(m) = model {
        req["model"] = json!(m);
    }
    serde_json::to_value(e.admit(&req, now).unwrap()).unwrap()
}

fn level(e: &Engine<SqliteStore>, bucket: &str, now: i64) -> i64 {
    e.inspect(now).unwrap().buckets[bucket]
}

#[test]
fn a_monthly_budget_resets_on_the_first_and_not_before() {
    let e = engine(json!({
        "global": {"requests": {"capacity": 1000, "refill_per_s": 100}},
        "tenants": {"acme": {"requests": {"limit": 2, "period": "month"}}}
    }));
    let jan31 = ms("2027-01-31T23:59:00Z");
    assert_eq!(admit(&e, "acme", "a", None, jan31)["outcome"], "accepted");
    assert_eq!(admit(&e, "acme", "b", None, jan31)["outcome"], "accepted");
    let refused = admit(&e, "acme", "c", None, jan31);
    assert_eq!(refused["reason"], "tenant_rate", "{refused}");
    // The retry-after is the reset: one minute to February.
    assert_eq!(refused["retry_after_ms"], 60_000, "{refused}");
    let inspection = e.inspect(jan31).unwrap();
    assert_eq!(
        inspection.resets_at["tenant.acme.requests"],
        ms("2027-02-01T00:00:00Z")
    );
    assert_eq!(
        admit(&e, "acme", "c", None, ms("2027-01-31T23:59:59.999Z"))["outcome"],
        "rejected"
    );
    assert_eq!(
        admit(&e, "acme", "c", None, ms("2027-02-01T00:00:00Z"))["outcome"],
        "accepted"
    );
    // Nothing carries over: one more this month, then refused until March.
    assert_eq!(
        admit(&e, "acme", "d", None, ms("2027-02-28T12:00:00Z"))["outcome"],
        "accepted"
    );
    let refused = admit(&e, "acme", "e", None, ms("2027-02-28T23:00:00Z"));
    assert_eq!(refused["retry_after_ms"], 3_600_000, "{refused}");
}

#[test]
fn a_leap_day_belongs_to_february() {
    let e = engine(json!({
        "tenants": {"acme": {"requests": {"limit": 1, "period": "month"}}}
    }));
    assert_eq!(
        admit(&e, "acme", "a", None, ms("2028-02-29T10:00:00Z"))["outcome"],
        "accepted"
    );
    let refused = admit(&e, "acme", "b", None, ms("2028-02-29T23:00:00Z"));
    assert_eq!(refused["retry_after_ms"], 3_600_000, "{refused}");
    assert_eq!(
        admit(&e, "acme", "b", None, ms("2028-03-01T00:00:00Z"))["outcome"],
        "accepted"
    );
}

#[test]
fn a_daily_budget_follows_local_midnight_across_daylight_saving() {
    let e = engine(json!({
        "tenants": {"acme": {"requests": {"limit": 1, "period": "day", "timezone": "America/New_York"}}}
    }));
    // 2027-03-14: New York springs forward at 02:00; that day has 23 hours.
    let before = ms("2027-03-14T00:30:00-05:00");
    assert_eq!(admit(&e, "acme", "a", None, before)["outcome"], "accepted");
    let refused = admit(&e, "acme", "b", None, before);
    let midnight = ms("2027-03-15T00:00:00-04:00");
    assert_eq!(refused["retry_after_ms"], midnight - before, "{refused}");
    assert_eq!(midnight - before, 22 * 3_600_000 + 30 * 60_000);
    assert_eq!(
        admit(&e, "acme", "b", None, midnight - 1)["outcome"],
        "rejected"
    );
    assert_eq!(
        admit(&e, "acme", "b", None, midnight)["outcome"],
        "accepted"
    );
}

#[test]
fn groups_reserve_with_the_tenant_all_or_nothing_and_refund_at_every_level() {
    let e = engine(json!({
        "refund_unused_tokens": true,
        "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 100},
        "models": {"m": {"price_microusd_per_token": {"input": 10, "output": 10}}},
        "groups": {
            "org": {"budgets": {"cost_microusd": {"limit": 1000, "period": "month"}}},
            "team": {"parent": "org", "budgets": {"requests": {"limit": 3, "period": "day"}}}
        },
        "tenant_defaults": {"cost_microusd": {"capacity": 10000, "refill_per_s": 0}},
        "tenants": {"a": {"group": "team"}, "b": {"group": "team"}, "solo": {}}
    }));
    let t0 = ms("2027-05-10T12:00:00Z");
    // Each call reserves 20 tokens at 10 µ$: 200 µ$ from the tenant, the org and nothing else.
    assert_eq!(admit(&e, "a", "1", Some("m"), t0)["outcome"], "accepted");
    assert_eq!(level(&e, "group.org.cost_microusd", t0), 800);
    assert_eq!(level(&e, "tenant.a.cost_microusd", t0), 9800);
    assert_eq!(level(&e, "group.team.requests", t0), 2);
    assert_eq!(admit(&e, "b", "1", Some("m"), t0)["outcome"], "accepted");
    assert_eq!(admit(&e, "a", "2", Some("m"), t0)["outcome"], "accepted");
    // The team's three calls a day are spent: refused by the group, nothing spent anywhere.
    let refused = admit(&e, "b", "2", Some("m"), t0);
    assert_eq!(refused["reason"], "group_budget", "{refused}");
    assert_eq!(refused["limit"], "group.team.requests", "{refused}");
    assert_eq!(refused["retry_after_ms"], 12 * 3_600_000, "{refused}");
    assert_eq!(level(&e, "tenant.b.cost_microusd", t0), 9800);
    assert_eq!(level(&e, "group.org.cost_microusd", t0), 400);
    // A tenant outside the group is not touched by it.
    assert_eq!(admit(&e, "solo", "1", Some("m"), t0)["outcome"], "accepted");
    assert_eq!(level(&e, "group.org.cost_microusd", t0), 400);
    // Usage refunds every level: 2 tokens used of 20 reserved.
    let done = Completion {
        usage: Some(Usage::new(1, 1)),
        ..Completion::succeeded("a", "1")
    };
    assert!(e.complete(&done, t0 + 1).unwrap().ok);
    assert_eq!(level(&e, "group.org.cost_microusd", t0 + 1), 580);
    // Tenant a made two calls (400 µ$), and has 180 back.
    assert_eq!(level(&e, "tenant.a.cost_microusd", t0 + 1), 9600 + 180);
    // The next day the team may call again; the org's money is the month's.
    let t1 = ms("2027-05-11T00:00:00Z");
    assert_eq!(admit(&e, "b", "2", Some("m"), t1)["outcome"], "accepted");
    assert_eq!(level(&e, "group.org.cost_microusd", t1), 380);
    // The org runs dry: the refusal names its budget; it never goes below zero.
    for k in 3..10 {
        admit(&e, "a", &k.to_string(), Some("m"), t1 + k);
    }
    let refused = admit(&e, "a", "x", Some("m"), ms("2027-05-12T00:00:00Z"));
    assert_eq!(refused["reason"], "group_budget", "{refused}");
    assert_eq!(refused["limit"], "group.org.cost_microusd", "{refused}");
    assert_eq!(
        refused["retry_after_ms"],
        ms("2027-06-01T00:00:00Z") - ms("2027-05-12T00:00:00Z")
    );
    assert!(level(&e, "group.org.cost_microusd", t1) >= 0);
    let inspection = e.inspect(t1).unwrap();
    assert_eq!(
        inspection.resets_at["group.org.cost_microusd"],
        ms("2027-06-01T00:00:00Z")
    );
}

#[test]
fn a_reset_under_load_grants_exactly_one_limit_on_each_side_of_the_boundary() {
    let e = Arc::new(engine(json!({
        "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 100000},
        "groups": {"team": {"budgets": {"requests": {"limit": 50, "period": "day",
                                                      "timezone": "Asia/Tokyo"}}}},
        "tenant_defaults": {"requests": {"capacity": 100000, "refill_per_s": 0}, "group": "team"},
        "tenants": {"a": {}, "b": {}, "c": {}, "d": {}}
    })));
    // Tokyo's midnight; eight callers ask 320 times in the 320 ms around it. The clock moves
    // forward with each decision, as the writer's does (one time per transaction).
    let midnight = ms("2027-04-01T00:00:00+09:00");
    let clock = Arc::new(std::sync::Mutex::new(midnight - 160));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (e, clock) = (e.clone(), clock.clone());
            std::thread::spawn(move || {
                let mut admitted = (0, 0);
                for i in 0..40 {
                    let tenant = ["a", "b", "c", "d"][t % 4];
                    let mut now = clock.lock().unwrap();
                    *now += 1;
                    let answer = admit(&e, tenant, &format!("{t}-{i}"), None, *now);
                    if answer["outcome"] == "accepted" {
                        if *now < midnight {
                            admitted.0 += 1;
                        } else {
                            admitted.1 += 1;
                        }
                    }
                }
                admitted
            })
        })
        .collect();
    let (before, after) = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // 160 asks on each side, 50 fit each day: never more, and all of them are used.
    assert_eq!((before, after), (50, 50));
}
