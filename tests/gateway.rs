//! The gateway with the official OpenAI Python SDK as the client (tests/gateway/), in front
//! of OpenAI-compatible stub upstreams that answer, stream, refuse, stall and drop
//! connections as a real provider does, and enforce their own limits with OpenAI's 429. The SDK is installed into a virtual environment
//! under `target/` the first time (from PyPI, pinned in tests/gateway/requirements.txt).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The virtual environment's Python, with the pinned SDK installed.
fn python() -> PathBuf {
    let venv = repo().join("target/gateway-venv");
    let python = venv.join("bin/python");
    let requirements = repo().join("tests/gateway/requirements.txt");
    let stamp = venv.join("requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).unwrap();
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return python;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 runs");
    assert!(made.success(), "python3 -m venv failed");
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(&requirements)
        .status()
        .unwrap();
    assert!(installed.success(), "installing the OpenAI SDK failed");
    std::fs::write(&stamp, wanted).unwrap();
    python
}

/// Runs one suite of tests/gateway/ and checks that all `tests` of it ran and passed.
fn suite(file: &str, tests: usize) {
    suite_with(file, tests, &[]);
}

/// As [`suite`], with `env` added to the suite's environment.
fn suite_with(file: &str, tests: usize, env: &[(&str, &str)]) {
    let out = Command::new(python())
        .envs(env.iter().copied())
        .arg(repo().join("tests/gateway").join(file))
        .env("TOLLGATE_BIN", env!("CARGO_BIN_EXE_tollgate"))
        .env(
            "TOLLGATE_SHED_MODEL_POLICY",
            tollgate::scenario::default_fixtures().join("shed-model.wasm"),
        )
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    assert!(out.status.success(), "{report}");
    // Every check ran (a suite that found nothing to run would also exit 0).
    let plural = if tests == 1 { "" } else { "s" };
    assert!(
        report.contains(&format!("Ran {tests} test{plural} in")),
        "{report}"
    );
}

#[test]
fn the_openai_sdk_through_the_gateway() {
    suite("test_gateway.py", 22);
}

#[test]
fn contended_calls_wait_their_turn_fairly_through_the_openai_sdk() {
    suite("test_waiting.py", 2);
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run sets TOLLGATE_TEST_POSTGRES and runs it with --ignored"]
fn contended_calls_wait_their_turn_on_two_replicas() {
    let database = common::pg::Database::create("waiting");
    let url = database.url();
    suite_with(
        "test_waiting_replicas.py",
        1,
        &[("TOLLGATE_WAITING_DB", &url)],
    );
}

#[test]
fn deployments_reserved_ejected_learned_and_fallen_back_on() {
    suite("test_deployments.py", 5);
}

#[test]
fn the_anthropic_sdk_through_the_gateway() {
    suite("test_anthropic.py", 11);
}

#[test]
fn groups_period_budgets_and_the_spend_ledger_through_the_gateway() {
    suite("test_billing.py", 4);
}

#[test]
fn traces_reach_an_otlp_receiver_built_on_the_official_protocol_package() {
    suite("test_traces.py", 6);
}
