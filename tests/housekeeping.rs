//! Housekeeping: calls abandoned by their callers become `unknown` (their slot held until
//! reconciled), finished operations past retention are deleted, records from before either
//! existed start their clock at the upgrade, and listings come in pages. Through the engine,
//! and on a running server through `/v1/admin/operations` and `/metrics`.

mod common;

use common::http::{Server, ADMIN, CALLER};
use serde_json::{json, Value};
use std::collections::HashSet;
use tollgate::engine::{Completion, CompletionError, Page, Reconciliation};
use tollgate::model::{CallResult, OpState};
use tollgate::store::{SqliteStore, Store};

const DAY_MS: i64 = 86_400_000;

fn config() -> Value {
    json!({
        "tenants": {"acme": {"requests": {"capacity": 100, "refill_per_s": 0}}},
        "global": {"requests": {"capacity": 100, "refill_per_s": 0}, "concurrency": 4},
        "limits": {"max_call_ms": 1000},
        "retention": {"operations_days": 1}
    })
}

fn admit(engine: &tollgate::Engine<SqliteStore>, key: &str, now_ms: i64) {
    let d = engine
        .admit(
            &common::request("acme", key, "interactive", 10, now_ms + 600_000),
            now_ms,
        )
        .unwrap();
    assert_eq!(d.outcome, tollgate::reason::Outcome::Accepted, "{d:?}");
}

#[test]
fn an_abandoned_call_becomes_unknown_keeps_its_slot_and_is_deleted_after_retention() {
    let engine = common::engine_on(config(), SqliteStore::in_memory().unwrap(), "standard");
    admit(&engine, "k1", 0);
    let sweep = engine.sweep(999).unwrap();
    assert!(sweep.abandoned.is_empty());
    assert_eq!(engine.inspect(999).unwrap().slots["global"], 1);

    let sweep = engine.sweep(1000).unwrap();
    assert_eq!(sweep.abandoned, [("acme".to_string(), "k1".to_string())]);
    assert_eq!(sweep.unknown, 1);
    let op = engine.operation("acme", "k1").unwrap().unwrap();
    assert_eq!(op.state, OpState::Unknown);
    // Termination is still not known: the slot stays held.
    assert_eq!(engine.inspect(1000).unwrap().slots["global"], 1);
    let unknown = engine
        .operations_page(
            Some(OpState::Unknown),
            &Page {
                after: None,
                limit: 10,
            },
        )
        .unwrap();
    assert_eq!(unknown.operations.len(), 1);
    // A late report is not a completion of an active call; reconciling ends it.
    let late = engine
        .complete(&Completion::succeeded("acme", "k1"), 1500)
        .unwrap();
    assert_eq!(late.error, Some(CompletionError::NotActive));
    let r = Reconciliation {
        tenant: "acme".into(),
        key: "k1".into(),
        resolution: CallResult::Succeeded,
        usage: None,
        result_ref: None,
        worker: None,
        attempt: None,
    };
    assert!(engine.reconcile(&r, 2000).unwrap().ok);
    assert_eq!(engine.inspect(2000).unwrap().slots["global"], 0);
    assert_eq!(engine.sweep(2000).unwrap().unknown, 0);

    // Retention counts from the end: kept a day, then deleted, and the key is new again.
    assert_eq!(engine.sweep(2000 + DAY_MS - 1).unwrap().deleted, 0);
    assert!(engine.operation("acme", "k1").unwrap().is_some());
    assert_eq!(engine.sweep(2000 + DAY_MS).unwrap().deleted, 1);
    assert!(engine.operation("acme", "k1").unwrap().is_none());
    admit(&engine, "k1", 3000 + DAY_MS);
}

#[test]
fn records_written_before_the_clock_existed_start_it_at_the_first_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let engine = common::engine_on(config(), SqliteStore::open(&path).unwrap(), "standard");
        admit(&engine, "old", 0);
    }
    // As an earlier release wrote it: JSON, without `state_since_ms`.
    let mut op = SqliteStore::open(&path)
        .unwrap()
        .transaction(|tx| tx.operation("acme", "old"))
        .unwrap()
        .unwrap();
    assert!(op.state_since_ms.is_some());
    op.state_since_ms = None;
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n = conn
        .execute(
            "UPDATE operations SET record = ?1",
            [serde_json::to_string(&op).unwrap()],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    let engine = common::engine_on(config(), SqliteStore::open(&path).unwrap(), "standard");
    let far = 10 * DAY_MS;
    assert!(
        engine.sweep(far).unwrap().abandoned.is_empty(),
        "stamped, not abandoned"
    );
    assert_eq!(engine.sweep(far + 1000).unwrap().abandoned.len(), 1);
}

#[test]
fn pages_list_every_operation_once() {
    let engine = common::engine_on(
        json!({"tenants": {"acme": {}, "bravo": {}}, "global": {"concurrency": 100}}),
        SqliteStore::in_memory().unwrap(),
        "standard",
    );
    for tenant in ["acme", "bravo"] {
        for k in 0..3 {
            let d = engine
                .admit(
                    &common::request(tenant, &format!("k{k}"), "interactive", 1, 600_000),
                    0,
                )
                .unwrap();
            assert_eq!(d.outcome, tollgate::reason::Outcome::Accepted);
        }
    }
    let mut seen = Vec::new();
    let mut page = Page {
        after: None,
        limit: 4,
    };
    loop {
        let got = engine.operations_page(None, &page).unwrap();
        seen.extend(
            got.operations
                .iter()
                .map(|o| (o.tenant.clone(), o.key.clone())),
        );
        match got.next {
            Some(cursor) => page.after = Some(Page::parse_cursor(&cursor).unwrap()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), 6);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "ordered by tenant and key"
    );

    // Filtered by a state: the same operations, in pages of at most the limit.
    let first = engine
        .operations_page(
            Some(OpState::Active),
            &Page {
                after: None,
                limit: 4,
            },
        )
        .unwrap();
    assert_eq!(first.operations.len(), 4);
    let after = Page::parse_cursor(first.next.as_deref().unwrap()).unwrap();
    let second = engine
        .operations_page(
            Some(OpState::Active),
            &Page {
                after: Some(after),
                limit: 4,
            },
        )
        .unwrap();
    assert_eq!(second.operations.len(), 2);
    assert_eq!(second.next, None);
    let none = engine
        .operations_page(
            Some(OpState::Succeeded),
            &Page {
                after: None,
                limit: 4,
            },
        )
        .unwrap();
    assert!(none.operations.is_empty() && none.next.is_none());
}

#[test]
fn a_server_lists_abandoned_calls_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::http::config();
    config["limits"]["max_call_ms"] = json!(300);
    let s = Server::start(dir.path(), &config);
    let (status, _, _) = s.admit(CALLER, common::http::request("gone", "interactive", 5));
    assert_eq!(status, 200);
    let started = std::time::Instant::now();
    let listed = loop {
        let (status, _, page) = s.call(
            "GET",
            "/v1/admin/operations?state=unknown",
            Some(ADMIN),
            None,
        );
        assert_eq!(status, 200, "{page}");
        if !page["operations"].as_array().unwrap().is_empty() {
            break page;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the abandoned call was not listed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(listed["operations"][0]["key"], "gone");
    assert_eq!(listed["operations"][0]["state"], "unknown");
    let (_, _, metrics) = s.call("GET", "/metrics", Some(ADMIN), None);
    let text = metrics.as_str().unwrap().to_string();
    assert!(text.contains("tollgate_operations_unknown 1"), "{text}");
    assert!(text.contains("tollgate_abandoned_calls_total 1"), "{text}");

    // Pages and their refusals.
    for path in [
        "/v1/admin/operations?state=bogus",
        "/v1/admin/operations?limit=0",
        "/v1/admin/operations?limit=1001",
        "/v1/admin/operations?after=nothex",
        "/v1/admin/inspect?state=unknown",
        "/v1/admin/inspect?colour=red",
    ] {
        assert_eq!(s.call("GET", path, Some(ADMIN), None).0, 400, "{path}");
    }
    assert_eq!(
        s.call("GET", "/v1/admin/operations", Some(CALLER), None).0,
        403
    );
    let (status, _, answer) = s.admit(CALLER, common::http::request("second", "interactive", 5));
    assert_eq!(status, 200, "{answer}");
    let (_, _, first) = s.call("GET", "/v1/admin/inspect?limit=1", Some(ADMIN), None);
    assert_eq!(first["operations"].as_array().unwrap().len(), 1);
    let next = first["next"].as_str().expect("a next page").to_string();
    let (_, _, second) = s.call(
        "GET",
        &format!("/v1/admin/inspect?limit=1&after={next}"),
        Some(ADMIN),
        None,
    );
    assert_ne!(
        first["operations"][0]["key"],
        second["operations"][0]["key"]
    );
    assert!(s.stop().success());
}
