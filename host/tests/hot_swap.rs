//! Hot swap under load: threads decide continuously while another thread swaps between two
//! policies hundreds of times. No decision errors, and every decision is attributable to
//! exactly one of the two versions, consistently with what that version decides.

mod common;

use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tollgate::reason::{Outcome, Reason};
use tollgate::runtime::{builtin, PolicyDigest};

#[test]
fn decisions_during_hundreds_of_swaps_each_use_one_version() {
    let engine = Arc::new(common::engine(
        json!({
            "global": {"requests": {"capacity": 1e9, "refill_per_s": 0}, "concurrency": 1000000},
            "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 0},
                                "tokens": {"capacity": 1e12, "refill_per_s": 0}},
            "tenants": {"t0": {}, "t1": {}, "t2": {}}
        }),
        "standard",
    ));
    let standard = PolicyDigest::of(builtin::get("standard").unwrap()).to_string();
    let deny_all = PolicyDigest::of(builtin::get("deny-all").unwrap()).to_string();
    let stop = Arc::new(AtomicBool::new(false));

    let deciders: Vec<_> = (0..3)
        .map(|t| {
            let (engine, stop) = (engine.clone(), stop.clone());
            let (standard, deny_all) = (standard.clone(), deny_all.clone());
            std::thread::spawn(move || {
                let mut seen = [0u32; 2];
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n < 50 {
                    n += 1;
                    let req = common::request(
                        &format!("t{t}"),
                        &format!("k{n}"),
                        "interactive",
                        1,
                        i64::MAX,
                    );
                    let d = engine.admit(&req, 0).expect("no decision errors");
                    let digest = d.policy.clone().expect("every decision names its policy");
                    // The outcome must be the one that version gives: no mixed decisions.
                    if digest == standard {
                        assert_eq!(d.outcome, Outcome::Accepted, "{d:?}");
                        seen[0] += 1;
                    } else if digest == deny_all {
                        assert_eq!(d.reason, Some(Reason::Overloaded), "{d:?}");
                        seen[1] += 1;
                    } else {
                        panic!("decision by an unknown policy {digest}");
                    }
                    if d.outcome == Outcome::Accepted {
                        let op = engine
                            .operation(&format!("t{t}"), &format!("k{n}"))
                            .unwrap()
                            .unwrap();
                        assert_eq!(
                            op.policy, digest,
                            "the operation records the deciding version"
                        );
                    }
                }
                seen
            })
        })
        .collect();

    let swaps = 300;
    for i in 0..swaps {
        let name = if i % 2 == 0 { "deny-all" } else { "standard" };
        let identity = engine
            .swap_policy(&common::policy_bytes(name))
            .expect("swap succeeds");
        assert_eq!(identity.name, name);
    }
    stop.store(true, Ordering::Relaxed);
    let mut totals = [0u32; 2];
    for d in deciders {
        let seen = d.join().expect("decider did not panic");
        totals[0] += seen[0];
        totals[1] += seen[1];
    }
    eprintln!(
        "decisions by standard: {}, by deny-all: {}",
        totals[0], totals[1]
    );
    assert!(
        totals[0] > 0 && totals[1] > 0,
        "both versions decided: {totals:?}"
    );
    assert_eq!(engine.policy_identity().name, "standard");
}

#[test]
fn rollback_returns_to_the_previous_version() {
    let engine = common::engine(json!({"tenants": {"acme": {}}}), "standard");
    assert!(engine.rollback().is_err(), "nothing to roll back to yet");
    engine
        .swap_policy(builtin::get("deny-all").unwrap())
        .unwrap();
    let d = engine
        .admit(&common::request("acme", "k1", "interactive", 1, 60_000), 0)
        .unwrap();
    assert_eq!(d.reason, Some(Reason::Overloaded));
    assert_eq!(engine.rollback().unwrap().name, "standard");
    let d = engine
        .admit(&common::request("acme", "k1", "interactive", 1, 60_000), 0)
        .unwrap();
    assert_eq!(d.outcome, Outcome::Accepted);
    // Rolling back again goes forward to the version rolled back from.
    assert_eq!(engine.rollback().unwrap().name, "deny-all");
}

#[test]
fn refused_candidates_leave_the_active_policy() {
    let engine = common::engine(json!({"tenants": {"acme": {}}}), "standard");
    let before = engine.policy_identity();
    for bad in [
        common::policy_bytes("broken"),
        b"not wasm".to_vec(),
        Vec::new(),
    ] {
        assert!(engine.swap_policy(&bad).is_err());
        assert_eq!(engine.policy_identity(), before);
    }
    // A policy whose self-check fails under this configuration is refused with its message.
    let strict = common::engine(
        json!({"tenants": {"acme": {}}, "policy_params": {"max_attempts": 0}}),
        "deny-all",
    );
    let err = strict
        .swap_policy(builtin::get("standard").unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_attempts"), "{err}");
    assert_eq!(strict.policy_identity().name, "deny-all");
}
