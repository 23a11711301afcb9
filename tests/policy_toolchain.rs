//! The policy author's loop from an empty folder outside the repository: `policy new`,
//! `policy build`, `policy test`, the SDK's mock host under plain `cargo test`, and a swap
//! into a running server. And a component built for world 0.1.0 before 0.2.0 existed.

mod common;

use common::output_text as text;

use common::http::{config, ADMIN, CALLER};
use common::server::{now_ms, Server};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output};

fn tollgate(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn new_build_test_and_swap_from_an_empty_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();

    let new = tollgate(root, &["policy", "new", "quiet", "--lang", "rust"]);
    assert!(new.status.success(), "{}", text(&new));
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "scenarios/quiet.json",
        "README.md",
        "sdk/src/lib.rs",
        "wit/0.3.0/policy.wit",
    ] {
        assert!(root.join("quiet").join(file).is_file(), "{file}");
    }
    // A second `new` into the same folder changes nothing.
    let again = tollgate(root, &["policy", "new", "quiet"]);
    assert!(!again.status.success());
    assert!(text(&again).contains("not empty"), "{}", text(&again));
    let bad = tollgate(root, &["policy", "new", "Bad Name"]);
    assert!(!bad.status.success(), "{}", text(&bad));

    let build = tollgate(root, &["policy", "build", "quiet"]);
    assert!(build.status.success(), "{}", text(&build));
    let out = String::from_utf8_lossy(&build.stdout).to_string();
    let wasm = root.join("quiet/target/quiet.wasm");
    assert!(out.starts_with("quiet/target/quiet.wasm\n"), "{out}");
    let bytes = std::fs::read(&wasm).unwrap();
    assert!(
        out.contains(&format!("size\t{} bytes", bytes.len())),
        "{out}"
    );
    assert!(out.contains("world\ttollgate:policy@0.3.0"), "{out}");
    let digest = tollgate::runtime::PolicyDigest::of(&bytes).to_string();
    assert!(out.contains(&format!("sha256\t{digest}")), "{out}");
    // `-o` writes elsewhere.
    let other = root.join("elsewhere.wasm");
    let built = tollgate(
        root,
        &["policy", "build", "quiet", "-o", other.to_str().unwrap()],
    );
    assert!(built.status.success(), "{}", text(&built));
    assert_eq!(std::fs::read(&other).unwrap(), bytes);
    // Built again from nothing: the same sources give the same bytes.
    std::fs::remove_dir_all(root.join("quiet/target")).unwrap();
    let rebuilt = tollgate(root, &["policy", "build", "quiet"]);
    assert!(rebuilt.status.success(), "{}", text(&rebuilt));
    assert_eq!(
        std::fs::read(&wasm).unwrap(),
        bytes,
        "a Rust build is reproducible"
    );

    let test = tollgate(root, &["policy", "test", "quiet"]);
    assert!(test.status.success(), "{}", text(&test));
    assert!(
        String::from_utf8_lossy(&test.stdout).ends_with("2 passed, 0 failed\n"),
        "{}",
        text(&test)
    );
    // A scenario the policy fails is counted as failed, and the exit says so.
    let failing = root.join("failing.json");
    let mut scenario: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("quiet/scenarios/quiet.json")).unwrap(),
    )
    .unwrap();
    scenario["steps"][0]["expect"]["outcome"] = json!("accepted");
    std::fs::write(&failing, scenario.to_string()).unwrap();
    let test = tollgate(
        root,
        &[
            "policy",
            "test",
            wasm.to_str().unwrap(),
            failing.to_str().unwrap(),
        ],
    );
    assert!(!test.status.success());
    assert!(
        String::from_utf8_lossy(&test.stdout).ends_with("1 passed, 1 failed\n"),
        "{}",
        text(&test)
    );

    // The native harness: the project's unit tests and the SDK's own, with plain cargo test.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for args in [&["test"][..], &["test", "-p", "tollgate-guest"]] {
        let unit = Command::new(&cargo)
            .current_dir(root.join("quiet"))
            .args(args)
            .output()
            .unwrap();
        assert!(unit.status.success(), "{}", text(&unit));
        // Tests ran and passed: the project's two, the SDK's mock-host test.
        assert!(
            text(&unit).contains("sheddable_work_waits_out_the_quiet_second ... ok")
                || text(&unit).contains("the_standard_rules_run_against_the_mock_host ... ok"),
            "{}",
            text(&unit)
        );
    }

    // Into a running server.
    let server = Server::start(root, &config());
    let swap = tollgate(
        root,
        &[
            "policy",
            "swap",
            wasm.to_str().unwrap(),
            "--server",
            &server.base,
            "--key",
            ADMIN,
        ],
    );
    assert!(swap.status.success(), "{}", text(&swap));
    let (status, _, active) = server.call("GET", "/v1/admin/policy", Some(ADMIN), None);
    assert_eq!(status, 200);
    assert_eq!(
        (active["name"].as_str(), active["world"].as_str()),
        (Some("quiet"), Some("0.3.0"))
    );
    assert_eq!(active["sha256"], json!(digest));
    // Model, priority and labels reach it over HTTP, validated like every field.
    let body = json!({"key": "k1", "route": "interactive", "input_tokens": 10, "max_output_tokens": 10,
                      "deadline_ms": now_ms() + 600_000, "model": "gpt-4o", "priority": "critical",
                      "labels": {"team": "search"}});
    let (status, _, answer) = server.admit(CALLER, body.clone());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["policy"], json!(digest));
    let mut bad = body;
    bad["key"] = json!("k2");
    bad["priority"] = json!("urgent");
    let (status, _, answer) = server.admit(CALLER, bad);
    assert_eq!(
        (status, answer["reason"].as_str()),
        (400, Some("invalid_request"))
    );
}

#[test]
fn components_built_for_worlds_0_1_0_and_0_2_0_are_checked_and_decide_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let old = repo.join("policies/fixtures/world-0.1.0/standard.wasm");
    let check = tollgate(dir.path(), &["policy", "check", old.to_str().unwrap()]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(text(&check).contains("\tworld 0.1.0\t"), "{}", text(&check));
    // Every public scenario, decided by the old component through the 0.1.0 adapter.
    let scenarios = repo.join("tests/scenarios");
    let conformance = |policy: &Path| {
        let args = [
            "conformance",
            "run",
            scenarios.to_str().unwrap(),
            "--policy",
        ];
        tollgate(
            dir.path(),
            &[&args[..], &[policy.to_str().unwrap()]].concat(),
        )
    };
    let run = conformance(&old);
    let out = text(&run);
    // Only the scenario of this release's priority shedding (a rule the old standard
    // rules do not have) may fail; every other decision is as before.
    let failed: std::collections::BTreeSet<&str> = out
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or(""))
        .collect();
    assert!(failed.iter().all(|n| *n == "priority-shedding"), "{out}");
    assert!(out.contains(" passed, "), "{out}");
    // A component built for world 0.2.0, before `explain`, decides every scenario as the
    // standard rules of this release do.
    let v2 = repo.join("policies/fixtures/world-0.2.0/standard.wasm");
    let check = tollgate(dir.path(), &["policy", "check", v2.to_str().unwrap()]);
    assert!(text(&check).contains("\tworld 0.2.0\t"), "{}", text(&check));
    let run = conformance(&v2);
    assert!(run.status.success(), "{}", text(&run));
    assert!(text(&run).contains(" passed, 0 failed"), "{}", text(&run));
    let list = tollgate(dir.path(), &["policy", "list"]);
    assert!(
        text(&list).contains("standard\t0.1.0\tworld 0.3.0\t"),
        "{}",
        text(&list)
    );
}
