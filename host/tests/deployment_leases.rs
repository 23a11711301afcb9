//! A gateway model's deployments between engines that share one store: two holders never
//! send a deployment more than its budgets and concurrency, lose none of them when one
//! dies, see a pause the other wrote once they renew, and each keep what providers say in
//! the answers to their own calls (docs/design.md, "Leases for shared budgets").

mod common;

use common::policy_bytes;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tollgate::config::ConfigFile;
use tollgate::engine::{Completion, ProviderLimits};
use tollgate::model::CallResult;
use tollgate::reason::Outcome;
use tollgate::runtime::Runtime;
use tollgate::store::SqliteStore;
use tollgate::Engine;

const TENANTS: usize = 8;

/// Plentiful global and tenant budgets, and gateway model `m` with deployments `a` and `b`
/// of the fields given.
fn config(mut a: Value, mut b: Value) -> ConfigFile {
    let tenants: serde_json::Map<String, Value> =
        (0..TENANTS).map(|t| (format!("t{t}"), json!({}))).collect();
    a["name"] = json!("a");
    a["upstream"] = json!("one");
    b["name"] = json!("b");
    b["upstream"] = json!("two");
    ConfigFile::from_json(&json!({
        "global": {"requests": {"capacity": 1e9, "refill_per_s": 1e9}, "concurrency": 100000},
        "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 1e9},
                            "tokens": {"capacity": 1e12, "refill_per_s": 1e12}},
        "tenants": tenants,
        "gateway": {
            "upstreams": {"one": {"base_url": "http://127.0.0.1:1/v1"},
                          "two": {"base_url": "http://127.0.0.1:2/v1"}},
            "models": {"m": {"deployments": [a, b]}},
        },
    }))
    .unwrap()
}

fn engine_at(file: &ConfigFile, path: &std::path::Path) -> Engine<SqliteStore> {
    let runtime = Runtime::new().unwrap();
    let policy = runtime
        .load(&policy_bytes("standard"), file.engine.policy_limits())
        .unwrap();
    Engine::new(
        file.engine.clone(),
        SqliteStore::open(path).unwrap(),
        runtime,
        Arc::new(policy),
    )
}

/// Two engines on one store file, each a holder of leases, both seeing the other live.
fn two_holders(
    file: ConfigFile,
    dir: &std::path::Path,
) -> (Engine<SqliteStore>, Engine<SqliteStore>) {
    let path = dir.join("shared.db");
    let a = engine_at(&file, &path);
    let b = engine_at(&file, &path);
    a.hold_leases("a");
    b.hold_leases("b");
    a.keep_leases(0).unwrap();
    assert_eq!(b.keep_leases(0).unwrap().unwrap().live_holders, 2);
    assert_eq!(a.keep_leases(0).unwrap().unwrap().live_holders, 2);
    (a, b)
}

fn call(n: usize) -> Value {
    json!({"tenant": format!("t{}", n % TENANTS), "key": format!("k{n}"),
           "route": "interactive", "input_tokens": 10, "max_output_tokens": 10,
           "deadline_ms": i64::MAX, "model": "m"})
}

/// The deployment call `n` was sent to, if admitted.
fn admit(engine: &Engine<SqliteStore>, n: usize, now: i64) -> Option<String> {
    let d = engine.admit(&call(n), now).unwrap();
    (d.outcome == Outcome::Accepted).then(|| d.deployment.expect("a deployment"))
}

/// The first of calls 0.. that `engine` sends to deployment a (at time 10).
fn first_to_a(engine: &Engine<SqliteStore>) -> usize {
    (0..100)
        .find(|&n| admit(engine, n, 10).as_deref() == Some("a"))
        .expect("a call drawn to a")
}

fn complete(engine: &Engine<SqliteStore>, n: usize, now: i64, f: impl FnOnce(&mut Completion)) {
    let mut c = Completion::succeeded(&format!("t{}", n % TENANTS), &format!("k{n}"));
    f(&mut c);
    assert!(engine.complete(&c, now).unwrap().ok);
}

#[test]
fn two_holders_never_send_a_deployment_more_than_it_can_take_and_a_dead_one_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(
        config(
            json!({"requests": {"capacity": 30, "refill_per_s": 0}, "max_concurrency": 12}),
            json!({"tokens": {"capacity": 400, "refill_per_s": 0}}),
        ),
        dir.path(),
    );
    // Uneven demand: `a` admits three times as often as `b`, past every limit.
    let mut sent: BTreeMap<usize, (String, bool)> = BTreeMap::new();
    let mut ever_leased = std::collections::BTreeSet::new();
    for n in 0..200 {
        let by_b = n % 4 == 3;
        if let Some(d) = admit(if by_b { &b } else { &a }, n, 10 + n as i64) {
            sent.insert(n, (d, by_b));
        }
        ever_leased.extend(a.inspect(10 + n as i64).unwrap().leased.into_keys());
    }
    for budget in [
        "deployment.m.a.requests",
        "slots:deployment.m.a.slots",
        "deployment.m.b.tokens",
        "slots:deployment.m.b.slots",
    ] {
        assert!(
            ever_leased.contains(budget),
            "{budget} never leased: {ever_leased:?}"
        );
    }
    let on = |d: &str| sent.values().filter(|(to, _)| to == d).count();
    assert!(on("a") <= 12, "{} calls in flight on a, limit 12", on("a"));
    assert!(on("b") <= 20, "{} calls of 20 tokens on b's 400", on("b"));
    assert!(on("a") > 0 && on("b") > 0, "a {} b {}", on("a"), on("b"));
    let seen = a.inspect(300).unwrap();
    assert_eq!(
        seen.deployments["deployment.m.a"].in_flight as usize,
        on("a"),
        "a slot free in a lease shows as free"
    );

    // `b` dies with its leases out; `a` completes every call, `b`'s too.
    drop(b);
    for &n in sent.keys() {
        complete(&a, n, 400, |_| {});
    }
    let later = 400 + tollgate::engine::HOLDER_LIFE_MS + tollgate::lease::LIFE_MS + 1;
    let kept = a.keep_leases(later).unwrap().unwrap();
    assert_eq!(kept.live_holders, 1);
    let seen = a.inspect(later).unwrap();
    assert!(seen.leased.is_empty(), "still leased: {:?}", seen.leased);
    assert_eq!(seen.slots["deployment.m.a.slots"], 0, "slots still held");
    assert_eq!(
        seen.buckets["deployment.m.a.requests"] as usize + on("a"),
        30
    );
    // Each call reserved 20 tokens; a completion without usage refunds none.
    assert_eq!(
        seen.buckets["deployment.m.b.tokens"] as usize + 20 * on("b"),
        400
    );

    // What is left is whole: the rest of a's requests, and none past them.
    let more: Vec<String> = (200..300).filter_map(|n| admit(&a, n, later + 1)).collect();
    let on_a = more.iter().filter(|d| *d == "a").count();
    assert_eq!(on_a.min(12), (30 - on("a")).min(12));
}

#[test]
fn a_pause_written_by_one_holder_is_seen_by_the_other_once_it_renews() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(config(json!({}), json!({})), dir.path());
    let n = first_to_a(&a);
    complete(&a, n, 20, |c| {
        c.result = CallResult::Failed;
        c.failure = Some("rate_limited".into());
        c.provider_retry_after_ms = Some(5_000);
    });
    // Its writer sees the pause at once.
    for n in 100..140 {
        assert_eq!(admit(&a, n, 30).as_deref(), Some("b"));
    }
    b.keep_leases(40).unwrap();
    for n in 200..240 {
        assert_eq!(admit(&b, n, 50).as_deref(), Some("b"));
    }
    // After the retry-after, both send to a again.
    a.keep_leases(5_030).unwrap();
    b.keep_leases(5_030).unwrap();
    for (i, engine) in [&a, &b].into_iter().enumerate() {
        let keys = 1_000 + 100 * i..1_060 + 100 * i;
        let to: Vec<String> = keys.filter_map(|n| admit(engine, n, 5_040)).collect();
        assert!(to.iter().any(|d| d == "a"), "{to:?}");
    }
}

#[test]
fn each_holder_keeps_what_the_provider_said_in_its_own_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(config(json!({}), json!({})), dir.path());
    let n = first_to_a(&a);
    complete(&a, n, 20, |c| {
        c.provider_limits = Some(ProviderLimits {
            remaining_requests: Some(0),
            reset_requests_ms: Some(2_000),
            ..ProviderLimits::default()
        })
    });
    // `a` heard that deployment a has nothing left until its reset: it sends to b.
    for n in 100..160 {
        assert_eq!(admit(&a, n, 30).as_deref(), Some("b"));
    }
    // No shared row was written for it: `b` goes on drawing a, until its own answers say.
    let to_b: Vec<String> = (200..260).filter_map(|n| admit(&b, n, 30)).collect();
    assert!(to_b.iter().any(|d| d == "a"), "{to_b:?}");
    // After the reset, `a` sends to a again.
    let after: Vec<String> = (300..360).filter_map(|n| admit(&a, n, 2_100)).collect();
    assert!(after.iter().any(|d| d == "a"), "{after:?}");
}

/// One step of a random run over two holders.
#[derive(Clone, Debug)]
enum Step {
    /// Holder 0 or 1 admits a call.
    Admit(usize),
    /// The oldest call in flight completes through holder 0 or 1.
    Complete(usize),
    /// Time passes (ms), and the live holders renew.
    Wait(i64),
    /// Holder 1 dies: it never renews, admits or completes again.
    Kill,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0..2usize).prop_map(Step::Admit),
        3 => (0..2usize).prop_map(Step::Complete),
        1 => (1..1_500i64).prop_map(Step::Wait),
        1 => Just(Step::Kill),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(40))]

    /// Whatever the holders do, and whenever one dies: no deployment ever has more calls in
    /// flight than its concurrency, or is sent more than its request budget; and a lease's
    /// life after the last holder's last step, every lease is back and every credit counted.
    #[test]
    fn random_holders_never_overshoot_a_deployment_and_every_lease_returns(
        requests in 5u64..60,
        in_flight in 1u32..15,
        steps in proptest::collection::vec(step(), 20..160),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_holders(
            config(
                json!({"requests": {"capacity": requests, "refill_per_s": 0},
                       "max_concurrency": in_flight}),
                json!({"weight": 0, "max_concurrency": 1}),
            ),
            dir.path(),
        );
        let mut holders = [Some(a), Some(b)];
        let mut now = 10i64;
        let mut flying: std::collections::VecDeque<(usize, String)> = Default::default();
        let mut sent_to_a = 0u64;
        for (n, s) in steps.into_iter().enumerate() {
            now += 1;
            match s {
                Step::Admit(h) => {
                    let Some(e) = &holders[h] else { continue };
                    if let Some(d) = admit(e, n, now) {
                        sent_to_a += u64::from(d == "a");
                        flying.push_back((n, d));
                    }
                }
                Step::Complete(h) => {
                    let Some(e) = holders[h].as_ref().or(holders[0].as_ref()) else { continue };
                    if let Some((k, _)) = flying.pop_front() {
                        complete(e, k, now, |_| {});
                    }
                }
                Step::Wait(ms) => {
                    now += ms;
                    for e in holders.iter().flatten() {
                        e.keep_leases(now).unwrap();
                    }
                }
                Step::Kill => holders[1] = None,
            }
            let on = |d: &str| flying.iter().filter(|(_, to)| to == d).count() as u32;
            proptest::prop_assert!(on("a") <= in_flight, "{} in flight on a", on("a"));
            proptest::prop_assert!(on("b") <= 1, "{} in flight on b", on("b"));
            proptest::prop_assert!(sent_to_a <= requests, "{sent_to_a} sent to a of {requests}");
        }
        let a = holders[0].as_ref().unwrap();
        for (k, _) in flying.drain(..) {
            complete(a, k, now, |_| {});
        }
        let later = now + tollgate::engine::HOLDER_LIFE_MS + tollgate::lease::LIFE_MS + 1;
        for e in holders.iter().flatten() {
            e.keep_leases(later).unwrap();
        }
        a.keep_leases(later + tollgate::engine::HOLDER_LIFE_MS + 1).unwrap();
        let seen = a.inspect(later).unwrap();
        proptest::prop_assert!(seen.leased.is_empty(), "still leased: {:?}", seen.leased);
        proptest::prop_assert_eq!(seen.slots["deployment.m.a.slots"], 0);
        proptest::prop_assert_eq!(seen.slots["deployment.m.b.slots"], 0);
        proptest::prop_assert_eq!(
            seen.buckets["deployment.m.a.requests"] as u64 + sent_to_a,
            requests
        );
    }
}
