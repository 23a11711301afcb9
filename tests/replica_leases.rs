//! Leases between real replicas: three `tollgate serve` processes on one PostgreSQL
//! database admit against a global budget that never refills. Together they never admit
//! more than it holds, a replica killed with its leases out loses nothing (they expire and
//! return), and once the leases are back every credit is there to admit
//! (docs/design.md, "Leases for shared budgets"). The same within one process: `serve
//! --writers 4`, killed with `kill -9` under load, keeps every admission it acknowledged
//! and loses no credit, on PostgreSQL (its shards leasing) and on a SQLite file (its shards
//! taking turns on one connection).
//!
//! The PostgreSQL tests need a server: `.ci/run` runs them with `TOLLGATE_TEST_POSTGRES`
//! set (`cargo test --release --test replica_leases -- --ignored`).

mod common;

use common::pg::Database;
use common::server::{now_ms, post, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const ADMIN: &str = "admin-key";
const BUDGET: u64 = 300;
const CALLERS: usize = 6;

fn replica(dir: &Path, n: usize, db: &str) -> Server {
    replica_with(dir, n, db, &[])
}

fn replica_with(dir: &Path, n: usize, db: &str, extra: &[&str]) -> Server {
    let config = replica_config();
    Server::start_on(dir, &format!("replica-{n}"), &config, db, extra)
}

/// A replica whose gateway model `m` has deployments `a` and `b` (`DEPLOYED`: their
/// request budgets, never refilling; `b` also at most `B_IN_FLIGHT` calls in flight), and
/// a global budget that does not bind.
fn gateway_replica(dir: &Path, n: usize, db: &str) -> Server {
    let mut config = replica_config();
    config["global"]["requests"]["capacity"] = json!(1e6);
    config["gateway"] = json!({
        "upstreams": {"one": {"base_url": "http://127.0.0.1:1/v1"}},
        "models": {"m": {"deployments": [
            {"name": "a", "upstream": "one",
             "requests": {"capacity": DEPLOYED[0], "refill_per_s": 0}},
            {"name": "b", "upstream": "one", "max_concurrency": B_IN_FLIGHT,
             "requests": {"capacity": DEPLOYED[1], "refill_per_s": 0}},
        ]}},
    });
    Server::start_on(dir, &format!("replica-{n}"), &config, db, &[])
}

const DEPLOYED: [u64; 2] = [100, 60];
const B_IN_FLIGHT: u64 = 40;

fn replica_config() -> Value {
    let callers: serde_json::Map<String, Value> = (0..CALLERS)
        .map(|c| (format!("key-{c}"), json!(format!("t{c}"))))
        .collect();
    let tenants: serde_json::Map<String, Value> =
        (0..CALLERS).map(|c| (format!("t{c}"), json!({}))).collect();
    json!({
        "auth": {"callers": callers, "admins": [ADMIN]},
        "global": {"requests": {"capacity": BUDGET, "refill_per_s": 0}, "concurrency": 10000},
        "tenant_defaults": {"requests": {"capacity": 1e6, "refill_per_s": 0},
                            "tokens": {"capacity": 1e9, "refill_per_s": 0}},
        "tenants": tenants,
    })
}

fn admit(base: &str, caller: usize, op: &str, model: Option<&str>) -> u16 {
    let mut body = json!({"key": op, "route": "interactive", "input_tokens": 10,
                          "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    post(base, "/v1/admit", &format!("key-{caller}"), &body).0
}

fn inspect(base: &str) -> Value {
    let text = ureq::get(&format!("{base}/v1/admin/inspect"))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `inspect` of `base` once every lease is back: a lease lives 2 s past its last use, and
/// the sweep runs twice a second.
fn inspect_once_leases_are_back(base: &str) -> Value {
    std::thread::sleep(Duration::from_millis(3_500));
    let view = inspect(base);
    assert!(
        view.get("leased").is_none(),
        "still leased: {}",
        view["leased"]
    );
    view
}

/// Admissions from every caller, spread over `bases`, `per_caller` each; how many were
/// accepted (200).
fn load(bases: &[String], per_caller: usize, round: &str) -> usize {
    load_model(bases, per_caller, round, None)
}

/// As [`load`], each call for `model` where one is named.
fn load_model(bases: &[String], per_caller: usize, round: &str, model: Option<&str>) -> usize {
    let threads: Vec<_> = (0..CALLERS)
        .map(|c| {
            let base = bases[c % bases.len()].clone();
            let round = round.to_string();
            let model = model.map(str::to_string);
            std::thread::spawn(move || {
                (0..per_caller)
                    .filter(|i| {
                        admit(&base, c, &format!("{round}-{c}-{i}"), model.as_deref()) == 200
                    })
                    .count()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn replicas_leasing_a_budget_never_overshoot_it_and_a_killed_one_loses_nothing() {
    let db = Database::create("leases");
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<Server> = (1..=3).map(|n| replica(dir.path(), n, &db.url())).collect();
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    // Every replica renews twice a second: after a second each has seen the others.
    std::thread::sleep(Duration::from_millis(1_200));

    let first = load(&bases, 20, "a");
    assert_eq!(first, 120, "the budget holds 300: all 120 fit");
    let view = inspect(&bases[0]);
    assert!(
        view["leased"]["global.requests"].as_i64().unwrap_or(0) > 0,
        "no lease out while three replicas admit: {}",
        view["leased"]
    );

    // Kill the third replica with its leases out: what it holds is stranded for a while,
    // never lost and never admitted twice.
    let mut third = replicas.pop().unwrap();
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    let survivors = &bases[..2];
    let second = load(survivors, 100, "b");
    assert!(
        first + second <= BUDGET as usize,
        "admitted {} of {BUDGET}",
        first + second
    );

    let view = inspect_once_leases_are_back(&bases[1]);
    let left = view["buckets"]["global.requests"].as_u64().unwrap();
    assert_eq!(
        left + (first + second) as u64,
        BUDGET,
        "credits lost: {left} left"
    );

    // Every credit is there to admit again, and no more.
    let third_round = load(survivors, 60, "c");
    assert_eq!(third_round as u64, left);
    assert_eq!((first + second + third_round) as u64, BUDGET);
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn replicas_leasing_deployments_never_send_one_more_than_it_can_take_and_lose_nothing() {
    let db = Database::create("deployment_leases");
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<Server> = (1..=3)
        .map(|n| gateway_replica(dir.path(), n, &db.url()))
        .collect();
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    std::thread::sleep(Duration::from_millis(1_200));

    let first = load_model(&bases, 20, "a", Some("m"));
    let view = inspect(&bases[0]);
    let leased = view["leased"].as_object().cloned().unwrap_or_default();
    assert!(
        leased.keys().any(|k| k.contains("deployment.m.")),
        "no deployment lease out while three replicas admit: {leased:?}"
    );

    // Kill the third replica with its leases out; the others admit past every limit.
    let mut third = replicas.pop().unwrap();
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    let survivors = &bases[..2];
    let second = load_model(survivors, 40, "b", Some("m"));
    let admitted = (first + second) as u64;
    // Nothing completes: b takes at most its concurrency, a at most its budget.
    assert!(
        admitted <= DEPLOYED[0] + B_IN_FLIGHT,
        "admitted {admitted}, more than a's {} and b's {B_IN_FLIGHT} in flight",
        DEPLOYED[0]
    );

    // Once every lease is back, each call is counted once, on the deployment it went to.
    let view = inspect_once_leases_are_back(&bases[1]);
    let sent = |d: usize, name: &str| {
        let left = view["buckets"][format!("deployment.m.{name}.requests")]
            .as_u64()
            .unwrap();
        let in_flight = view["deployments"][format!("deployment.m.{name}")]["in_flight"]
            .as_u64()
            .unwrap();
        assert_eq!(left + in_flight, DEPLOYED[d], "{name}: {view}");
        in_flight
    };
    let (on_a, on_b) = (sent(0, "a"), sent(1, "b"));
    assert_eq!(on_a + on_b, admitted, "{view}");
    assert!(on_b <= B_IN_FLIGHT, "{on_b} in flight on b");
}

/// Every operation the store holds, by key (paging through the admin listing).
fn stored_keys(base: &str) -> std::collections::BTreeSet<String> {
    let mut keys = std::collections::BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/admin/operations?limit=1000");
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page: Value = serde_json::from_str(
            &ureq::get(&url)
                .set("Authorization", &format!("Bearer {ADMIN}"))
                .call()
                .unwrap()
                .into_string()
                .unwrap(),
        )
        .unwrap();
        for op in page["operations"].as_array().unwrap() {
            keys.insert(op["key"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return keys,
        }
    }
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn writer_shards_lease_killed_under_load_keep_every_acknowledged_admission() {
    let db = Database::create("shards");
    let dir = tempfile::tempdir().unwrap();
    shards_killed_under_load(dir.path(), &db.url(), true);
}

#[test]
fn writer_shards_on_sqlite_killed_under_load_keep_every_acknowledged_admission() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shards.db");
    shards_killed_under_load(dir.path(), db.to_str().unwrap(), false);
}

/// One `serve --writers 4` process on `db`, its policies making instances ahead: six
/// tenants admit, tenants made through the admin API admit at once, and killed with
/// `kill -9` under load it keeps every admission it acknowledged and loses no credit.
/// `leasing`: whether the shards lease the global budget (on PostgreSQL; on SQLite they
/// take turns on one connection).
fn shards_killed_under_load(dir: &Path, db: &str, leasing: bool) {
    let shards = ["--writers", "4", "--policy-instances-ahead", "8"];
    let server = replica_with(dir, 1, db, &shards);
    let base = server.base.clone();
    std::thread::sleep(Duration::from_millis(1_200));
    // Six tenants over four shards: every admission fits.
    let first = load(std::slice::from_ref(&base), 20, "a");
    assert_eq!(first, 120, "the budget holds 300: all 120 fit");
    let view = inspect(&base);
    assert_eq!(
        view["leased"]["global.requests"].as_i64().unwrap_or(0) > 0,
        leasing,
        "leases while four shards admit: {view}"
    );
    // Whole budgets in `inspect`: what is unspent in leases counts as available.
    assert_eq!(view["buckets"]["global.requests"], BUDGET - 120, "{view}");

    // A tenant and its key made through the admin API admit at once, whichever shard
    // their name picks.
    for n in 0..8 {
        let tenant = format!("new{n}");
        let (status, _, answer) = server.call(
            "PUT",
            &format!("/v1/admin/tenants/{tenant}"),
            Some(ADMIN),
            Some("{}"),
        );
        assert_eq!(status, 200, "{answer}");
        let (status, _, made) = server.call(
            "POST",
            "/v1/admin/keys",
            Some(ADMIN),
            Some(&json!({"role": "caller", "tenant": tenant}).to_string()),
        );
        assert_eq!(status, 200, "{made}");
        let body = json!({"key": format!("first-{n}"), "route": "interactive", "input_tokens": 10,
                          "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000});
        let (status, answer) = post(&base, "/v1/admit", made["key"].as_str().unwrap(), &body);
        assert_eq!(status, 200, "{tenant}: {answer}");
    }
    let first = first + 8;

    // Killed under load: each caller records the admissions acknowledged to it.
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (base, acknowledged) = (base.clone(), acknowledged.clone());
            std::thread::spawn(move || {
                for i in 0..1000 {
                    let op = format!("b-{c}-{i}");
                    let body = json!({"key": op, "route": "interactive", "input_tokens": 10,
                                      "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000});
                    let sent = ureq::post(&format!("{base}/v1/admit"))
                        .set("Authorization", &format!("Bearer key-{c}"))
                        .set("Content-Type", "application/json")
                        .send_string(&body.to_string());
                    match sent {
                        Ok(r) if r.status() == 200 => acknowledged.lock().unwrap().push(op),
                        Ok(_) | Err(ureq::Error::Status(..)) => {}
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    for c in callers {
        c.join().unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(!acknowledged.is_empty(), "nothing admitted before the kill");

    // Started again on the same store: every acknowledged admission is there.
    let again = replica_with(dir, 2, db, &shards);
    let stored = stored_keys(&again.base);
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|k| !stored.contains(*k))
        .collect();
    assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    // Once the dead process's leases are back, no credit is lost: the budget is what the
    // stored admissions left, and they never exceed it.
    if leasing {
        std::thread::sleep(Duration::from_millis(3_500));
    }
    let view = inspect(&again.base);
    assert!(view.get("leased").is_none(), "still leased: {view}");
    let left = view["buckets"]["global.requests"].as_u64().unwrap();
    assert!(stored.len() as u64 <= BUDGET, "{} admitted", stored.len());
    assert!(stored.len() >= first + acknowledged.len());
    assert_eq!(
        left + stored.len() as u64,
        BUDGET,
        "credits lost: {left} left"
    );
}
