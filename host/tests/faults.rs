//! A hostile policy cannot spend, hang or exhaust the host: traps, endless loops, memory
//! hogs and runaway recursion fail closed as `policy_error`, and the engine goes on deciding.

mod common;

use serde_json::json;
use std::time::Instant;
use tollgate::reason::{Outcome, Reason};

#[test]
fn spin_is_stopped_and_the_engine_keeps_deciding() {
    let engine = common::engine(json!({"tenants": {"acme": {}}}), "faulty");
    for kind in ["spin", "hog", "trap", "deep", "loud", "chatty"] {
        let started = Instant::now();
        let d = engine
            .admit(
                &common::request("acme", &format!("{kind}-1"), "interactive", 10, 60_000),
                0,
            )
            .unwrap();
        let took = started.elapsed();
        assert_eq!(d.reason, Some(Reason::PolicyError), "{kind}");
        assert_eq!(d.http, 503);
        // Reported, not asserted tightly: machines are shared. The bound is fuel, not time.
        eprintln!("{kind}: stopped after {took:?}");
        assert!(took.as_secs() < 30, "{kind} took {took:?}");
    }
    let after = engine.inspect(0).unwrap();
    assert_eq!(after.buckets["tenant.acme.requests"], 10);
    assert_eq!(after.slots["global"], 0);
    assert!(after.operations.is_empty());
    // The same key may be admitted afresh later, and ordinary keys decide normally.
    for i in 0..20 {
        let d = engine
            .admit(
                &common::request("acme", &format!("ok-{i}"), "interactive", 10, 60_000),
                1,
            )
            .unwrap();
        assert!(
            matches!(d.outcome, Outcome::Accepted) || d.reason == Some(Reason::GlobalConcurrency),
            "{d:?}"
        );
    }
}

#[test]
fn no_decision_sees_another_decisions_guest_memory() {
    // `hog` fills guest memory before it faults; the next decision starts from a fresh
    // instance and decides exactly as an untouched engine does.
    let dirty = common::engine(json!({"tenants": {"acme": {}}}), "faulty");
    let clean = common::engine(json!({"tenants": {"acme": {}}}), "faulty");
    let _ = dirty
        .admit(
            &common::request("acme", "hog-x", "interactive", 10, 60_000),
            0,
        )
        .unwrap();
    let a = dirty
        .admit(&common::request("acme", "k", "interactive", 10, 60_000), 0)
        .unwrap();
    let b = clean
        .admit(&common::request("acme", "k", "interactive", 10, 60_000), 0)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_policy_may_use_memory_beyond_its_initial_pages() {
    // `big` allocates most of a MiB through the SDK's call arena (growing memory past the
    // 64 KiB the module starts with), checks every byte, and then decides as `standard`.
    let engine = common::engine(json!({"tenants": {"acme": {}}}), "faulty");
    for i in 0..3 {
        let d = engine
            .admit(
                &common::request("acme", &format!("big-{i}"), "interactive", 10, 60_000),
                0,
            )
            .unwrap();
        assert!(matches!(d.outcome, Outcome::Accepted), "{d:?}");
        let small = engine
            .admit(
                &common::request("acme", &format!("small-{i}"), "interactive", 10, 60_000),
                0,
            )
            .unwrap();
        assert!(matches!(small.outcome, Outcome::Accepted), "{small:?}");
    }
}
