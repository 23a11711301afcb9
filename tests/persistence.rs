//! State survives the process: operations, balances, slots and queues are in the SQLite
//! file, and a new process (the `tollgate` binary, started afresh each time) sees them.

mod common;

use serde_json::{json, Value};
use std::process::Command;

fn tollgate(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "tollgate {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn decisions_survive_a_restart_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"tenants": {"acme": {"requests": {"capacity": 2, "refill_per_s": 0}}}}).to_string(),
    )
    .unwrap();
    let (db, config) = (db.to_str().unwrap(), config.to_str().unwrap());
    let decide = |key: &str| -> Value {
        let req = common::request("acme", key, "interactive", 10, 60_000).to_string();
        serde_json::from_str(&tollgate(
            &["decide", "--db", db, "--config", config, "--now", "0"],
            Some(&req),
        ))
        .unwrap()
    };
    // Each call is a new process on the same file.
    assert_eq!(decide("k1")["outcome"], "accepted");
    assert_eq!(decide("k1")["outcome"], "duplicate_active");
    assert_eq!(decide("k2")["outcome"], "accepted");
    let third = decide("k3");
    assert_eq!(
        third["reason"], "tenant_rate",
        "the bucket spent by earlier processes stays spent"
    );
    let ops = tollgate(&["ops", "--db", db, "--config", config], None);
    assert!(ops.contains("acme\tk1\tactive\t1"), "{ops}");
    assert!(ops.contains("acme\tk2\tactive\t1"), "{ops}");
    assert!(!ops.contains("k3"), "a refusal records no operation: {ops}");
}

#[test]
fn queue_survives_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let config = json!({"tenants": {"a": {}, "b": {}}, "global": {"concurrency": 10}});
    {
        let engine = common::engine_on(
            config.clone(),
            tollgate::store::SqliteStore::open(&path).unwrap(),
            "standard",
        );
        for (t, k) in [("a", "1"), ("a", "2"), ("b", "1")] {
            let d = engine
                .admit(&common::request(t, k, "durable", 10, 60_000), 0)
                .unwrap();
            assert_eq!(d.outcome, tollgate::reason::Outcome::Queued);
        }
        let first = engine.dispatch("w", 1, 1).unwrap();
        assert_eq!(first.claimed[0].key, "1");
        assert_eq!(first.claimed[0].tenant, "a");
        // Dropped without any shutdown step: only committed transactions count.
    }
    let engine = common::engine_on(
        config,
        tollgate::store::SqliteStore::open(&path).unwrap(),
        "standard",
    );
    assert_eq!(
        engine.queue_depths().unwrap(),
        [("a".to_string(), 1), ("b".to_string(), 1)].into()
    );
    // The round-robin position survived too: b's turn comes next.
    let next = engine.dispatch("w", 2, 2).unwrap();
    let keys: Vec<(String, String)> = next
        .claimed
        .iter()
        .map(|c| (c.tenant.clone(), c.key.clone()))
        .collect();
    assert_eq!(
        keys,
        vec![("b".into(), "1".into()), ("a".into(), "2".into())]
    );
    let inspection = engine.inspect(2).unwrap();
    assert_eq!(inspection.slots["global"], 3);
}

#[test]
fn killed_process_leaves_a_consistent_store() {
    // A process killed with SIGKILL in the middle of admissions: every committed admission is
    // whole (operation, bucket spend and slot together), and nothing half-written remains.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("killed.db");
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"global": {"concurrency": 100000, "requests": {"capacity": 100000, "refill_per_s": 0}},
               "tenants": {"acme": {"requests": {"capacity": 100000, "refill_per_s": 0},
                                     "tokens": {"capacity": 100000000, "refill_per_s": 0}}}})
        .to_string(),
    )
    .unwrap();
    let requests: String = (0..200_000)
        .map(|i| {
            common::request("acme", &format!("k{i}"), "interactive", 10, 60_000).to_string() + "\n"
        })
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "decide",
            "--lines",
            "--now",
            "0",
            "--db",
            db.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(requests.as_bytes());
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = writer.join();

    let engine = common::engine_on(
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap(),
        tollgate::store::SqliteStore::open(&db).unwrap(),
        "standard",
    );
    let view = engine.inspect(0).unwrap();
    let admitted = view.operations.len() as i64;
    assert!(
        admitted > 0,
        "the child admitted nothing before it was killed"
    );
    assert!(
        admitted < 200_000,
        "the child finished before it was killed"
    );
    assert_eq!(view.buckets["tenant.acme.requests"], 100_000 - admitted);
    assert_eq!(view.buckets["global.requests"], 100_000 - admitted);
    assert_eq!(
        view.buckets["tenant.acme.tokens"],
        100_000_000 - 20 * admitted
    );
    assert_eq!(i64::from(view.slots["global"]), admitted);
}

#[test]
fn a_failing_job_in_a_batch_rolls_back_alone_and_the_others_apply_exactly_once() {
    use tollgate::store::{SqliteStore, Store};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let (answers, calls) = common::batch_with_a_failing_job(&mut store);
    // Run together up to the failure (rolled back), then job by job.
    assert_eq!(calls, 3 + 4);
    assert_eq!(answers, vec![Some(0), Some(1), None, Some(2)]);
    // What another connection finds, and the row cache the store reads through.
    let in_sql = SqliteStore::open(&path)
        .unwrap()
        .transaction(|tx| tx.bucket("n"))
        .unwrap()
        .map(|s| s.balance_micro);
    assert_eq!(in_sql, Some(3));
    let (n, jobs) = common::batch_left(&mut store);
    assert_eq!(n, Some(3));
    let done = Some("done".to_string());
    assert_eq!(jobs, vec![done.clone(), done.clone(), None, done]);
    // A batch where every job succeeds runs once.
    let mut calls = 0;
    let answers = store
        .transaction_many(3, |_, tx| {
            calls += 1;
            tx.set_meta("again", "yes")
        })
        .unwrap();
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(calls, 3);
}
