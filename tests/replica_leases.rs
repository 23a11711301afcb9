//! Leases between real replicas: three `tollgate serve` processes on one PostgreSQL
//! database admit against a global budget that never refills. Together they never admit
//! more than it holds, a replica killed with its leases out loses nothing (they expire and
//! return), and once the leases are back every credit is there to admit
//! (docs/design.md, "Leases for shared budgets").
//!
//! Needs a PostgreSQL server: `.ci/run` runs it with `TOLLGATE_TEST_POSTGRES` set
//! (`cargo test --release --test replica_leases -- --ignored`).

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
    let callers: serde_json::Map<String, Value> = (0..CALLERS)
        .map(|c| (format!("key-{c}"), json!(format!("t{c}"))))
        .collect();
    let tenants: serde_json::Map<String, Value> =
        (0..CALLERS).map(|c| (format!("t{c}"), json!({}))).collect();
    let config = json!({
        "auth": {"callers": callers, "admins": [ADMIN]},
        "global": {"requests": {"capacity": BUDGET, "refill_per_s": 0}, "concurrency": 10000},
        "tenant_defaults": {"requests": {"capacity": 1e6, "refill_per_s": 0},
                            "tokens": {"capacity": 1e9, "refill_per_s": 0}},
        "tenants": tenants,
    });
    Server::start_on(dir, &format!("replica-{n}"), &config, db, &[])
}

fn admit(base: &str, caller: usize, op: &str) -> u16 {
    let body = json!({"key": op, "route": "interactive", "input_tokens": 10,
                      "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000});
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

/// Admissions from every caller, spread over `bases`, `per_caller` each; how many were
/// accepted (200).
fn load(bases: &[String], per_caller: usize, round: &str) -> usize {
    let threads: Vec<_> = (0..CALLERS)
        .map(|c| {
            let base = bases[c % bases.len()].clone();
            let round = round.to_string();
            std::thread::spawn(move || {
                (0..per_caller)
                    .filter(|i| admit(&base, c, &format!("{round}-{c}-{i}")) == 200)
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

    // A lease lives 2 s past its last use; the sweep runs twice a second.
    std::thread::sleep(Duration::from_millis(3_500));
    let view = inspect(&bases[1]);
    assert!(
        view.get("leased").is_none(),
        "still leased: {}",
        view["leased"]
    );
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
