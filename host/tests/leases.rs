//! Leases between engines that share one store: two holders admitting against the budgets
//! tenants share never admit more than those budgets hold, a slot taken through one holder
//! and released through the other is back, and what a holder leaves in its leases returns
//! within a lease's life (docs/design.md, "Leases for shared budgets").

mod common;

use common::{engine_on, request};
use serde_json::json;
use tollgate::engine::Completion;
use tollgate::reason::Outcome;
use tollgate::store::SqliteStore;
use tollgate::Engine;

const TENANTS: usize = 10;

fn config(global: serde_json::Value, concurrency: u32) -> serde_json::Value {
    let tenants: serde_json::Map<String, serde_json::Value> =
        (0..TENANTS).map(|t| (format!("t{t}"), json!({}))).collect();
    json!({
        "global": {"requests": global, "concurrency": concurrency},
        "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 1e9},
                            "tokens": {"capacity": 1e12, "refill_per_s": 1e12}},
        "models": {"m": {"requests": {"capacity": 40, "refill_per_s": 0}}},
        "tenants": tenants,
    })
}

/// Two engines on one store file, each a holder of leases, both seeing the other live.
fn two_holders(
    config: serde_json::Value,
    dir: &std::path::Path,
) -> (Engine<SqliteStore>, Engine<SqliteStore>) {
    let path = dir.join("shared.db");
    let a = engine_on(
        config.clone(),
        SqliteStore::open(&path).unwrap(),
        "standard",
    );
    let b = engine_on(config, SqliteStore::open(&path).unwrap(), "standard");
    a.hold_leases("a");
    b.hold_leases("b");
    a.keep_leases(0).unwrap();
    let kept = b.keep_leases(0).unwrap().unwrap();
    assert_eq!(kept.live_holders, 2);
    assert_eq!(a.keep_leases(0).unwrap().unwrap().live_holders, 2);
    (a, b)
}

fn admit(engine: &Engine<SqliteStore>, n: usize, model: Option<&str>, now: i64) -> bool {
    let mut r = request(
        &format!("t{}", n % TENANTS),
        &format!("k{n}"),
        "interactive",
        10,
        i64::MAX,
    );
    if let Some(m) = model {
        r["model"] = json!(m);
    }
    engine.admit(&r, now).unwrap().outcome == Outcome::Accepted
}

#[test]
fn two_holders_never_admit_more_than_a_hard_budget_and_lose_none_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(
        config(json!({"capacity": 100, "refill_per_s": 0}), 1000),
        dir.path(),
    );
    // Uneven demand: `a` admits three times as often as `b`.
    let mut admitted = Vec::new();
    for n in 0..400 {
        let engine = if n % 4 == 3 { &b } else { &a };
        if admit(engine, n, None, 10 + n as i64) {
            admitted.push(n);
        }
        if n == 20 {
            // While the budget is plentiful, both holders admit from leases.
            let seen = a.inspect(10 + n as i64).unwrap();
            assert!(
                seen.leased.contains_key("global.requests"),
                "{:?}",
                seen.leased
            );
            assert!(
                seen.leased.contains_key("slots:global"),
                "{:?}",
                seen.leased
            );
        }
    }
    assert!(admitted.len() <= 100, "admitted {} of 100", admitted.len());

    // Every slot taken through one holder is released through the other.
    for &n in &admitted {
        let engine = if n % 4 == 3 { &a } else { &b };
        let done = engine
            .complete(
                &Completion::succeeded(&format!("t{}", n % TENANTS), &format!("k{n}")),
                1_000,
            )
            .unwrap();
        assert!(done.ok);
    }

    // A lease's life later, the keeper returns every lease: nothing was lost.
    let later = 1_000 + tollgate::lease::LIFE_MS + 1;
    let kept = a.keep_leases(later).unwrap().unwrap();
    assert!(kept.returned > 0);
    let seen = a.inspect(later).unwrap();
    assert!(seen.leased.is_empty(), "still leased: {:?}", seen.leased);
    assert_eq!(seen.buckets["global.requests"] + admitted.len() as i64, 100);
    assert_eq!(seen.slots["global"], 0, "slots still held");

    // And what was left is there for either holder to admit.
    let more = (400..600)
        .filter(|&n| admit(if n % 2 == 0 { &a } else { &b }, n, None, later + 1))
        .count();
    assert_eq!(more + admitted.len(), 100);
}

#[test]
fn a_nearly_spent_model_budget_is_shared_without_overshoot_and_every_holder_admits() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(
        config(json!({"capacity": 1e9, "refill_per_s": 1e9}), 1000),
        dir.path(),
    );
    let (mut by_a, mut by_b) = (0, 0);
    for n in 0..200 {
        if n % 2 == 0 {
            by_a += usize::from(admit(&a, n, Some("m"), 10 + n as i64));
        } else {
            by_b += usize::from(admit(&b, n, Some("m"), 10 + n as i64));
        }
    }
    assert!(by_a + by_b <= 40, "admitted {} of 40", by_a + by_b);
    assert!(by_a > 0 && by_b > 0, "a holder starved: {by_a} and {by_b}");
    // Slices shrink as the budget runs low, so little is stranded in a lease.
    assert!(by_a + by_b >= 30, "only {} of 40 admitted", by_a + by_b);
}

#[test]
fn a_refilling_budget_never_gives_two_holders_more_than_its_capacity_and_refill() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(
        config(json!({"capacity": 50, "refill_per_s": 10}), 100_000),
        dir.path(),
    );
    let mut admitted = 0;
    let mut now = 10;
    let mut n = 0;
    // Ten seconds of demand well above the refill, the keeper running twice a second.
    while now < 10_010 {
        for engine in [&a, &b] {
            admitted += usize::from(admit(engine, n, None, now));
            n += 1;
        }
        if now % 500 == 0 {
            a.keep_leases(now).unwrap();
            b.keep_leases(now).unwrap();
        }
        now += 5;
    }
    // At most the capacity and ten seconds' refill.
    assert!(admitted <= 50 + 10 * 10, "admitted {admitted}");
    assert!(admitted >= 100, "admitted only {admitted}");
}

#[test]
fn a_holder_alone_reserves_from_the_shared_rows_as_an_engine_of_its_own_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alone.db");
    let a = engine_on(
        config(json!({"capacity": 5, "refill_per_s": 0}), 1000),
        SqliteStore::open(&path).unwrap(),
        "standard",
    );
    a.hold_leases("a");
    assert_eq!(a.keep_leases(0).unwrap().unwrap().live_holders, 1);
    let admitted = (0..10).filter(|&n| admit(&a, n, None, 10)).count();
    assert_eq!(admitted, 5);
    let seen = a.inspect(10).unwrap();
    assert_eq!(seen.buckets["global.requests"], 0);
    assert!(seen.leased.is_empty());
    assert_eq!(seen.slots["global"], 5);
}

#[test]
fn an_alert_on_a_leased_budget_never_comes_early() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(json!({"capacity": 1e9, "refill_per_s": 1e9}), 10_000);
    config["models"]["m"]["requests"]["capacity"] = json!(1000);
    config["alerts"] =
        json!([{"budget": "model.m.requests", "at": [0.5], "webhook": "http://127.0.0.1:9/"}]);
    let (a, b) = two_holders(config, dir.path());
    // 150 of 1,000 admitted (15%) within a second, so the leases grow with the demand and
    // much of the budget sits in them (each holder's first reservations, before it is busy
    // enough to lease, come from the row): no threshold is crossed.
    for n in 0..150 {
        assert!(admit(
            if n % 2 == 0 { &a } else { &b },
            n,
            Some("m"),
            10 + n as i64
        ));
    }
    let leased = a.inspect(200).unwrap().leased["model.m.requests"];
    assert!(leased >= 80, "only {leased} leased");
    assert_eq!(a.pending_alerts().unwrap(), 0, "an alert at 15% spent");
    // Spent to the end, the half is crossed once.
    for n in 150..1200 {
        admit(
            if n % 2 == 0 { &a } else { &b },
            n,
            Some("m"),
            200 + n as i64,
        );
    }
    assert_eq!(a.pending_alerts().unwrap(), 1);
}

#[test]
fn holders_that_admit_seldom_reserve_from_the_row_and_its_refill_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_holders(
        config(json!({"capacity": 100, "refill_per_s": 50}), 10_000),
        dir.path(),
    );
    // A few admissions a second: below a busy holder's rate, so no lease is taken.
    for n in 0..3 {
        assert!(admit(if n % 2 == 0 { &a } else { &b }, n, None, 10));
    }
    let seen = a.inspect(10).unwrap();
    assert!(seen.leased.is_empty(), "leased: {:?}", seen.leased);
    assert_eq!(seen.buckets["global.requests"], 97);
    // A second later the refill has made it whole, as for one engine alone.
    a.keep_leases(1_010).unwrap();
    b.keep_leases(1_010).unwrap();
    assert!(admit(&b, 3, None, 1_010));
    assert_eq!(a.inspect(1_010).unwrap().buckets["global.requests"], 99);
    // A busy holder leases: past the threshold within a second, a lease is out.
    for n in 4..(4 + tollgate::lease::LEASE_FROM_RESERVATIONS as usize) {
        assert!(admit(&a, n, None, 1_020));
    }
    let seen = a.inspect(1_020).unwrap();
    assert!(
        seen.leased.contains_key("global.requests"),
        "no lease while busy: {:?}",
        seen.leased
    );
}
