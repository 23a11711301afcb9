//! Runs every scenario file of `tests/scenarios` and, when present, the public conformance
//! scenarios in `../shared/scenarios`, each against a fresh in-memory SQLite store.

use std::path::{Path, PathBuf};
use tollgate::runtime::Runtime;
use tollgate::scenario::{collect, Runner, Scenario};

fn run_folder(folder: &Path) -> usize {
    let files = collect(&[folder.to_path_buf()]).expect("scenario folder readable");
    assert!(
        !files.is_empty(),
        "no scenario files in {}",
        folder.display()
    );
    let runner = Runner::new(Runtime::new().unwrap());
    let mut failures = Vec::new();
    for file in &files {
        match Scenario::load(file).and_then(|s| runner.run(&s)) {
            Ok(m) if m.is_empty() => {}
            Ok(m) => failures.extend(m.iter().map(|m| format!("{}: {m}", file.display()))),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    files.len()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn project_scenarios_pass() {
    let n = run_folder(&root().join("tests/scenarios"));
    assert!(
        n >= 20,
        "expected the project's scenario set, found {n} files"
    );
}

#[test]
fn public_scenarios_pass() {
    let shared = root().join("../shared/scenarios");
    if shared.is_dir() {
        run_folder(&shared);
    } else {
        eprintln!(
            "{} not present; the project scenarios still ran",
            shared.display()
        );
    }
}

#[test]
fn a_wrong_expectation_is_reported() {
    // The runner must be able to fail: change one expected value and it must say so.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wrong.json");
    std::fs::write(
        &path,
        r#"{"name": "wrong", "description": "", "config": {"tenants": {"acme": {}}},
            "steps": [{"at_ms": 0, "op": "admit", "request": {"tenant": "acme", "key": "k",
              "route": "interactive", "input_tokens": 1, "max_output_tokens": 1, "deadline_ms": 10},
              "expect": {"outcome": "rejected"}}]}"#,
    )
    .unwrap();
    let runner = Runner::new(Runtime::new().unwrap());
    let mismatches = runner.run(&Scenario::load(&path).unwrap()).unwrap();
    assert_eq!(mismatches.len(), 1);
    assert_eq!(mismatches[0].actual["outcome"], "accepted");
}

#[test]
fn unknown_fields_make_the_file_invalid() {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("top", r#"{"name": "x", "steps": [], "extra": 1}"#),
        (
            "step",
            r#"{"name": "x", "steps": [{"at_ms": 0, "op": "inspect", "colour": 1}]}"#,
        ),
        (
            "expect",
            r#"{"name": "x", "steps": [{"at_ms": 0, "op": "inspect", "expect": {"bukets": {}}}]}"#,
        ),
        (
            "config",
            r#"{"name": "x", "config": {"tenant": {}}, "steps": []}"#,
        ),
        (
            "op",
            r#"{"name": "x", "steps": [{"at_ms": 0, "op": "teleport"}]}"#,
        ),
    ] {
        let path = dir.path().join(format!("{name}.json"));
        std::fs::write(&path, body).unwrap();
        assert!(Scenario::load(&path).is_err(), "{name} should be refused");
    }
}
