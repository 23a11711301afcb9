//! The wall clock steps under a running server (libfaketime, its offset read from a file
//! at every call): back an hour, then forward to now, then forward an hour, while another
//! tenant's admissions go on. Stepped back, nothing refills and no balance goes below
//! zero (the service's clock never goes back, and a bucket never refills before its last
//! update); back at now, nothing was refilled twice; stepped forward an hour, a bucket
//! refills to its capacity and no further. No request fails meanwhile.
//!
//! It needs Debian's `faketime` (libfaketime): `.ci/run` installs it and runs
//! `cargo test --release --test clock_jumps -- --ignored`.

mod common;

use common::server::{now_ms, Server};
use serde_json::{json, Value};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CALLER: &str = "acme-key";
const BUSY: &str = "busy-key";
const ADMIN: &str = "admin-key";
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
#[ignore = "needs libfaketime (Debian's faketime): .ci/run runs it with --ignored"]
fn a_stepped_wall_clock_never_refills_twice_or_past_capacity() {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} missing: apt-get install faketime"
    );
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("offset");
    let step = |to: &str| {
        std::fs::write(&offset, to).unwrap();
        // libfaketime reads the file at every call: the next request sees the new time.
        std::thread::sleep(Duration::from_millis(50));
    };
    step("+0");
    // acme: 10 requests, one more every 100 s; busy: plenty, to keep the writer at work.
    let config = json!({
        "auth": {"callers": {CALLER: "acme", BUSY: "busy"}, "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1000000, "refill_per_s": 0}, "concurrency": 1000000},
        "tenant_defaults": {"tokens": {"capacity": 1000000000, "refill_per_s": 0}},
        "tenants": {"acme": {"requests": {"capacity": 10, "refill_per_s": 0.01}},
                    "busy": {"requests": {"capacity": 1000000, "refill_per_s": 0}}},
    });
    let db = dir.path().join("state.db");
    let server = Server::start_via(dir.path(), &config, &db, |program| {
        let mut command = Command::new(program);
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", &offset)
            .env("FAKETIME_NO_CACHE", "1")
            // Timers (tokio's) keep the real monotonic clock; only the wall clock steps.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    });
    let server = Arc::new(server);
    // The deadline is far in every clock this test sets.
    let admit = |s: &Server, key: &str, caller: &str| -> (u16, Value) {
        let body = json!({"key": key, "route": "interactive", "input_tokens": 1,
                          "max_output_tokens": 1, "deadline_ms": now_ms() + 86_400_000});
        let (status, _, answer) = s.admit(caller, body);
        (status, answer)
    };
    let level = |s: &Server| -> i64 {
        let (status, _, i) = s.call("GET", "/v1/admin/inspect?limit=1", Some(ADMIN), None);
        assert_eq!(status, 200, "{i}");
        i["buckets"]["tenant.acme.requests"].as_i64().unwrap()
    };
    // Load from another tenant all along: no request fails whatever the clock does.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let load = {
        let (server, stop, served) = (server.clone(), stop.clone(), served.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (status, answer) = admit(&server, &format!("busy-{i}"), BUSY);
                assert_eq!(status, 200, "{answer}");
                served.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };
    for i in 0..10 {
        assert_eq!(admit(&server, &format!("a{i}"), CALLER).0, 200);
    }
    let (status, refused) = admit(&server, "a10", CALLER);
    assert_eq!(status, 429, "{refused}");
    assert_eq!(level(&server), 0);
    // An hour back: nothing refills, nothing goes negative.
    step("-1h");
    assert_eq!(admit(&server, "back", CALLER).0, 429);
    assert_eq!(level(&server), 0);
    // Back to now: the hour that was lived twice refills nothing.
    step("+0");
    assert_eq!(admit(&server, "now", CALLER).0, 429);
    assert_eq!(level(&server), 0);
    // An hour forward: 36 requests' worth of refill, held to the capacity of 10.
    step("+1h");
    assert_eq!(level(&server), 10);
    for i in 0..10 {
        assert_eq!(admit(&server, &format!("f{i}"), CALLER).0, 200, "f{i}");
    }
    assert_eq!(admit(&server, "f10", CALLER).0, 429);
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert!(served.load(Ordering::Relaxed) > 10, "the load ran");
    step("+0");
}
