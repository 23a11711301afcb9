//! Helpers shared by the integration tests.
#![allow(dead_code, unused_imports)]

use serde_json::{json, Value};
use std::sync::Arc;
use tollgate::config::Config;
use tollgate::runtime::{builtin, Runtime};
use tollgate::store::{SqliteStore, Store, StoreError, Tx};
use tollgate::Engine;

// The engine's helpers, shared with the library's own suites (host/tests).
#[path = "../../host/tests/common/mod.rs"]
mod engine_helpers;
pub use engine_helpers::{engine, engine_on, policy_bytes, request};

pub mod http;
pub mod pg;
pub mod server;
pub mod stub;

/// What a finished command printed: stdout, then stderr.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts `tollgate serve` with `args` on a free loopback port and waits until it answers
/// `/healthz`; returns the process and its base URL.
pub fn spawn_serve(args: &[&str]) -> (std::process::Child, String) {
    spawn_serve_via(args, |program| {
        let mut command = std::process::Command::new(program);
        command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    })
}

/// As [`spawn_serve`], started by the command `launch` makes from the executable's path
/// (a shell that lowers a limit first, say); the arguments are added to it.
pub fn spawn_serve_via(
    args: &[&str],
    launch: impl FnOnce(&str) -> std::process::Command,
) -> (std::process::Child, String) {
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = launch(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while ureq::get(&format!("{base}/healthz")).call().is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "tollgate serve {args:?} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, base)
}

/// A batch of four jobs on `store` where the third fails after writing. Each job bumps
/// bucket `n` (a read-modify-write) and writes meta `job{i}` (straight to the store), and
/// answers what it read. Returns the answers (`None` for the failed job) and how many times
/// a job ran.
pub fn batch_with_a_failing_job(store: &mut impl Store) -> (Vec<Option<i64>>, usize) {
    let mut calls = 0;
    let answers = store
        .transaction_many(4, |i, tx: &mut dyn Tx| {
            calls += 1;
            let n = tx.bucket("n")?.map_or(0, |s| s.balance_micro);
            tx.set_bucket(
                "n",
                tollgate::bucket::State {
                    balance_micro: n + 1,
                    updated_ms: 0,
                },
            )?;
            tx.set_meta(&format!("job{i}"), "done")?;
            if i == 2 {
                return Err(StoreError::Schema("no".into()));
            }
            Ok(n)
        })
        .unwrap();
    let answers = answers.iter().map(|a| a.as_ref().ok().copied()).collect();
    (answers, calls)
}

/// What [`batch_with_a_failing_job`] left: bucket `n` and meta `job0` to `job3`.
pub fn batch_left(store: &mut impl Store) -> (Option<i64>, Vec<Option<String>>) {
    store
        .transaction(|tx| {
            let n = tx.bucket("n")?.map(|s| s.balance_micro);
            let jobs = (0..4)
                .map(|i| tx.meta(&format!("job{i}")))
                .collect::<Result<_, _>>()?;
            Ok::<_, StoreError>((n, jobs))
        })
        .unwrap()
}
