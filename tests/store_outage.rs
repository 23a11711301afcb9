//! The store goes away and comes back: PostgreSQL restarted under load. While it is down
//! every admission answers 503 `store_unavailable` with a Retry-After (never 500, never a
//! dropped connection); within a few seconds of it answering again admissions are accepted
//! again, by the same process; and every admission acknowledged is in the store.
//!
//! It restarts the database server, so it runs alone: `.ci/run` sets
//! `TOLLGATE_TEST_POSTGRES` and `TOLLGATE_TEST_POSTGRES_RESTART` (a shell command that
//! restarts the server) and runs `cargo test --release --test store_outage -- --ignored`.

mod common;

use common::server::{now_ms, Server};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CALLER: &str = "acme-key";
const ADMIN: &str = "admin-key";

#[test]
#[ignore = "restarts PostgreSQL: .ci/run runs it alone with --ignored"]
fn a_postgres_restart_under_load_answers_503_then_recovers_with_every_answer_kept() {
    let url = std::env::var("TOLLGATE_TEST_POSTGRES").expect("TOLLGATE_TEST_POSTGRES");
    let restart =
        std::env::var("TOLLGATE_TEST_POSTGRES_RESTART").expect("TOLLGATE_TEST_POSTGRES_RESTART");
    let name = format!("tollgate_outage_{}", std::process::id());
    {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    }
    let db = format!("{}/{name}", url.rsplit_once('/').unwrap().0);
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "auth": {"callers": {CALLER: "acme"}, "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1e9, "refill_per_s": 0}, "concurrency": 1000000},
        "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 0},
                            "tokens": {"capacity": 1e12, "refill_per_s": 0}},
        "tenants": {"acme": {}}
    });
    let s = Server::start_on(dir.path(), "config", &config, &db, &[]);
    let base = s.base.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (base, stop) = (base.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen: Vec<(String, u16, Option<String>, Instant)> = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("c{c}-{i}");
                    let body = json!({"key": key, "route": "interactive", "input_tokens": 1,
                                      "max_output_tokens": 1, "deadline_ms": now_ms() + 600_000});
                    let r = ureq::post(&format!("{base}/v1/admit"))
                        .set("Authorization", &format!("Bearer {CALLER}"))
                        .timeout(Duration::from_secs(20))
                        .send_string(&body.to_string());
                    let (status, retry_after) = match r {
                        Ok(r) => (r.status(), None),
                        Err(ureq::Error::Status(code, r)) => {
                            let retry = r.header("Retry-After").map(str::to_string);
                            let text = r.into_string().unwrap_or_default();
                            if code == 503 {
                                let v: Value = serde_json::from_str(&text).unwrap();
                                assert_eq!(v["reason"], "store_unavailable", "{v}");
                            }
                            (code, retry)
                        }
                        Err(e) => panic!("{key}: the connection failed: {e}"),
                    };
                    seen.push((key, status, retry_after, Instant::now()));
                    std::thread::sleep(Duration::from_millis(5));
                }
                seen
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(1500));
    let restarted = std::process::Command::new("sh")
        .args(["-c", &restart])
        .status()
        .unwrap();
    assert!(restarted.success(), "{restart} failed");
    let back = Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<_> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();

    let refused: Vec<_> = seen.iter().filter(|s| s.1 != 200).collect();
    assert!(
        refused.iter().all(|s| s.1 == 503 && s.2.is_some()),
        "only 503 with a Retry-After while the store is away: {:?}",
        refused
            .iter()
            .map(|s| (&s.0, s.1, &s.2))
            .take(10)
            .collect::<Vec<_>>()
    );
    eprintln!(
        "{} admissions, {} answered 503 during the restart",
        seen.len(),
        refused.len()
    );
    // Recovered: accepted again within a few seconds of the server being back.
    let first_after = seen
        .iter()
        .filter(|s| s.1 == 200 && s.3 > back)
        .map(|s| s.3)
        .min()
        .expect("admissions were accepted again after the restart");
    assert!(
        first_after.duration_since(back) < Duration::from_secs(5),
        "recovered {:?} after the database was back",
        first_after.duration_since(back)
    );
    assert!(
        seen.iter()
            .filter(|s| s.3 > back + Duration::from_secs(5))
            .all(|s| s.1 == 200),
        "every admission after recovery is accepted"
    );

    // Every acknowledged admission is in the store (read page by page).
    let mut stored = std::collections::HashSet::new();
    let mut after = String::new();
    loop {
        let r = ureq::get(&format!("{base}/v1/admin/operations?limit=1000{after}"))
            .set("Authorization", &format!("Bearer {ADMIN}"))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200);
        let page: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
        for o in page["operations"].as_array().unwrap() {
            stored.insert(o["key"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    for (key, status, _, _) in &seen {
        if *status == 200 {
            assert!(
                stored.contains(key.as_str()),
                "{key} was acknowledged but is not stored"
            );
        }
    }
    assert!(s.stop().success());
    if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
        let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}
