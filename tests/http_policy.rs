//! Policies on a running server: swaps under load, refused modules, the watched file,
//! verification against scenario files, and `tollgate policy check`.

mod common;

use common::http::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn swap_under_load_and_restart_keeps_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config["global"] =
        json!({"requests": {"capacity": 1e9, "refill_per_s": 0}, "concurrency": 1000000});
    config["tenant_defaults"]["requests"] = json!({"capacity": 1e9, "refill_per_s": 0});
    config["tenant_defaults"]["tokens"] = json!({"capacity": 1e12, "refill_per_s": 0});
    let s = Server::start(dir.path(), &config);
    let deny_all = policy_file(dir.path(), "deny-all");
    let standard = policy_file(dir.path(), "standard");

    let base = s.base.clone();
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let base = base.clone();
            std::thread::spawn(move || {
                let mut counts = (0, 0);
                for i in 0..150 {
                    let body = request(&format!("c{c}-{i}"), "interactive", 1).to_string();
                    let r = ureq::post(&format!("{base}/v1/admit"))
                        .set("Authorization", &format!("Bearer {CALLER}"))
                        .send_string(&body);
                    match r {
                        Ok(r) => {
                            assert_eq!(r.status(), 200);
                            counts.0 += 1;
                        }
                        Err(ureq::Error::Status(503, r)) => {
                            let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
                            assert_eq!(v["reason"], "overloaded", "only deny-all refuses: {v}");
                            counts.1 += 1;
                        }
                        Err(e) => panic!("request failed during swaps: {e}"),
                    }
                }
                counts
            })
        })
        .collect();
    for i in 0..20 {
        let file = if i % 2 == 0 { &deny_all } else { &standard };
        let swap = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "policy",
                "swap",
                file.to_str().unwrap(),
                "--server",
                &s.base,
                "--key",
                ADMIN,
            ])
            .output()
            .unwrap();
        assert!(
            swap.status.success(),
            "{}",
            String::from_utf8_lossy(&swap.stdout)
        );
    }
    let mut accepted = 0;
    for c in clients {
        accepted += c.join().unwrap().0;
    }
    // A refused module: 422, the old policy stays.
    let body: Value = serde_json::from_str(&refused_policy(&s, "broken")).unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("tollgate:policy/decide"),
        "{body}"
    );
    // A module whose self-check fails with 4 MiB of text: refused, and the answer
    // carries only the first KiB of it.
    let text = refused_policy(&s, "verbose");
    assert!(text.len() < 2048, "{} bytes", text.len());
    assert!(text.contains("self-check failed"), "{text}");
    assert_eq!(
        s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2["name"],
        "standard"
    );

    let before = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert!(s.stop().success());
    let s = Server::start(dir.path(), &config);
    let after = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(after["operations"].as_array().unwrap().len(), accepted);
    assert_eq!(before["operations"], after["operations"]);
    assert_eq!(
        before["buckets"]["tenant.acme.requests"],
        after["buckets"]["tenant.acme.requests"]
    );
    assert_eq!(
        s.admit(CALLER, request("c0-0", "interactive", 1)).0,
        409,
        "duplicate after restart"
    );
    assert!(s.stop().success());
}

/// Writes a built-in policy to a file, as a policy author's build would produce it.
/// PUTs the built-in module `name` as the policy, which must be refused (422): the answer.
fn refused_policy(s: &Server, name: &str) -> String {
    let answer = ureq::put(&format!("{}/v1/admin/policy", s.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .send_bytes(&common::policy_bytes(name));
    let Err(ureq::Error::Status(422, r)) = answer else {
        panic!("policy {name} was not refused")
    };
    r.into_string().unwrap()
}

fn policy_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, common::policy_bytes(name)).unwrap();
    path
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn wait_for_policy(s: &Server, name: &str) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        if s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2["name"] == name {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_watched_policy_is_activated_and_verification_can_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let watched = dir.path().join("policies");
    std::fs::create_dir(&watched).unwrap();
    let s = Server::start_with(
        dir.path(),
        &config(),
        &["--watch-policy", watched.to_str().unwrap()],
    );
    // Puts a built-in module in the watched folder as `file`; true once it is active.
    let place = |name: &str, file: &str| {
        std::fs::copy(policy_file(dir.path(), name), watched.join(file)).unwrap();
        wait_for_policy(&s, name)
    };
    assert!(
        place("deny-all", "candidate.wasm"),
        "the watched module was not activated"
    );
    assert_eq!(
        s.admit(CALLER, request("w1", "interactive", 10)).2["reason"],
        "overloaded"
    );
    // A file far over limits.max_policy_bytes (64 GiB, sparse) is refused without being
    // read, and the next module is activated as usual.
    std::thread::sleep(Duration::from_millis(50));
    std::fs::File::create(watched.join("huge.wasm"))
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        place("standard", "later.wasm"),
        "the watcher did not go on after a file over the limit"
    );
    assert!(s.stop().success());

    // With --verify-with, a module that fails the project's scenarios is refused.
    let dir2 = tempfile::tempdir().unwrap();
    let watched = dir2.path().join("policies");
    std::fs::create_dir(&watched).unwrap();
    let scenarios = repo().join("tests/scenarios");
    let s = Server::start_with(
        dir2.path(),
        &config(),
        &[
            "--watch-policy",
            watched.to_str().unwrap(),
            "--verify-with",
            scenarios.to_str().unwrap(),
        ],
    );
    std::fs::copy(
        policy_file(dir2.path(), "deny-all"),
        watched.join("candidate.wasm"),
    )
    .unwrap();
    assert!(
        !wait_for_policy(&s, "deny-all"),
        "an unverified module was activated"
    );
    assert!(refused_policy(&s, "deny-all").contains("verification"));
    assert_eq!(
        s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2["name"],
        "standard"
    );
    assert!(s.stop().success());
}

#[test]
fn policy_check_verifies_against_scenarios() {
    let scenarios = repo().join("tests/scenarios");
    let check = |policy: &str| {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "policy",
                "check",
                policy,
                "--verify-with",
                scenarios.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    };
    let ok = check("standard");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let refused = check("deny-all");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stdout).contains("failed against the candidate"));
}

/// PUTs `bytes` as the shadow policy (with `query`): the status and the answer.
fn put_shadow(s: &Server, query: &str, bytes: &[u8]) -> (u16, Value) {
    let answer = ureq::put(&format!("{}/v1/admin/policy/shadow{query}", s.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .send_bytes(bytes);
    let r = match answer {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (
        r.status(),
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

#[test]
fn a_shadow_policy_is_counted_on_live_traffic_and_never_changes_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    let (status, _, none) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(
        (status, none["reason"].as_str()),
        (404, Some("no_shadow_policy"))
    );
    // Refused candidates change nothing, as for a swap; a caller may not install one.
    let (status, _) = put_shadow(&s, "", &common::policy_bytes("broken"));
    assert_eq!(status, 422);
    let (status, _) = put_shadow(&s, "?sample=2", &common::policy_bytes("deny-all"));
    assert_eq!(status, 422);
    let (status, _) = put_shadow(&s, "?smaple=1", &common::policy_bytes("deny-all"));
    assert_eq!(status, 400);
    let (status, _, _) = s.call("DELETE", "/v1/admin/policy/shadow", Some(CALLER), None);
    assert_eq!(status, 403);

    let (status, installed) = put_shadow(&s, "", &common::policy_bytes("deny-all"));
    assert_eq!(status, 200, "{installed}");
    assert_eq!(installed["shadow"]["name"], "deny-all");
    for i in 0..5 {
        let (status, _, answer) = s.admit(CALLER, request(&format!("k{i}"), "interactive", 10));
        assert_eq!(
            (status, answer["outcome"].as_str()),
            (200, Some("accepted")),
            "{answer}"
        );
        let path = format!("/v1/operations/k{i}/complete");
        let (status, _, _) = s.call(
            "POST",
            &path,
            Some(CALLER),
            Some(r#"{"result": "succeeded"}"#),
        );
        assert_eq!(status, 200);
    }
    // A duplicate asks no policy, live or shadow.
    let (status, _, _) = s.admit(CALLER, request("k0", "interactive", 10));
    assert_eq!(status, 200);
    let (_, _, report) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(report["decisions"], 5, "{report}");
    assert_eq!(
        (
            report["agreements"].as_u64(),
            report["disagreements"].as_u64()
        ),
        (Some(0), Some(5))
    );
    assert_eq!(
        report["by_outcome"],
        json!([{"active": "accepted", "shadow": "rejected:overloaded", "count": 5}])
    );
    let recent = report["recent_disagreements"].as_array().unwrap();
    assert_eq!(recent.len(), 5);
    assert_eq!(
        (recent[4]["key"].as_str(), recent[4]["tenant"].as_str()),
        (Some("k4"), Some("acme"))
    );
    // Only the live decisions spent: five requests from acme's bucket of 100.
    let (_, _, inspect) = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None);
    assert_eq!(inspect["buckets"]["tenant.acme.requests"], 95, "{inspect}");
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains(
            "tollgate_shadow_decisions{active=\"accepted\",shadow=\"rejected:overloaded\"} 5"
        ),
        "{metrics}"
    );

    // A shadow that traps: counted as a policy error, the live answer untouched.
    let (status, _) = put_shadow(&s, "?sample=1", &common::policy_bytes("faulty"));
    assert_eq!(status, 200);
    let (status, _, answer) = s.admit(CALLER, request("trap-1", "interactive", 10));
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (200, Some("accepted")),
        "{answer}"
    );
    let (_, _, report) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(
        report["by_outcome"],
        json!([{"active": "accepted", "shadow": "rejected:policy_error", "count": 1}]),
        "{report}"
    );
    let (status, _, removed) = s.call("DELETE", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(
        (status, removed["removed"]["name"].as_str()),
        (200, Some("faulty"))
    );
    let (status, _, _) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(status, 404);
}

/// The policy state is the store's: a swapped policy and a shadow outlive a restart whose
/// configuration is unchanged, and rollback goes back to the one before the swap; a
/// configuration whose policy file changed installs it at the next start.
#[test]
fn a_swapped_policy_and_its_shadow_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    let swapped = ureq::put(&format!("{}/v1/admin/policy", s.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .send_bytes(&common::policy_bytes("deny-all"))
        .unwrap();
    assert_eq!(swapped.status(), 200);
    let (status, _) = put_shadow(&s, "?sample=0.5", &common::policy_bytes("standard"));
    assert_eq!(status, 200);
    assert!(s.stop().success());

    // The configuration still names the standard policy: the store's wins.
    let s = Server::start(dir.path(), &config());
    let policy = s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2;
    assert_eq!(policy["name"], "deny-all", "{policy}");
    let (status, _, shadow) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(status, 200, "{shadow}");
    assert_eq!(
        (shadow["policy"]["name"].as_str(), shadow["sample"].as_f64()),
        (Some("standard"), Some(0.5)),
        "{shadow}"
    );
    assert_eq!(
        s.admit(CALLER, request("r1", "interactive", 10)).2["reason"],
        "overloaded"
    );
    let (status, _, back) = s.call("POST", "/v1/admin/policy/rollback", Some(ADMIN), None);
    assert_eq!((status, back["name"].as_str()), (200, Some("standard")));
    let (status, _, _) = s.call("DELETE", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(status, 200);
    assert!(s.stop().success());

    let s = Server::start(dir.path(), &config());
    assert_eq!(
        s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2["name"],
        "standard"
    );
    let (status, _, _) = s.call("GET", "/v1/admin/policy/shadow", Some(ADMIN), None);
    assert_eq!(status, 404, "the removed shadow stays removed");
    let (status, _, answer) = s.admit(CALLER, request("r2", "interactive", 10));
    assert_eq!(status, 200, "{answer}");
    assert!(s.stop().success());

    // The file now names other bytes: they are installed as the new version at the start,
    // and rollback returns to the policy they replaced.
    let mut changed = config();
    changed["policy"] = json!(policy_file(dir.path(), "deny-all").to_str().unwrap());
    let s = Server::start(dir.path(), &changed);
    let policy = s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2;
    assert_eq!(policy["name"], "deny-all", "{policy}");
    let (status, _, back) = s.call("POST", "/v1/admin/policy/rollback", Some(ADMIN), None);
    assert_eq!((status, back["name"].as_str()), (200, Some("standard")));
    assert!(s.stop().success());
    // The same file again: unchanged since the last start, so the rollback stays in force.
    let s = Server::start(dir.path(), &changed);
    assert_eq!(
        s.call("GET", "/v1/admin/policy", Some(ADMIN), None).2["name"],
        "standard"
    );
    assert!(s.stop().success());
}
