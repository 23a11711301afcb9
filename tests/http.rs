//! The HTTP service, tested as a client sees it: a real `tollgate serve` process on a
//! loopback port, a real HTTP client, real time.

mod common;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const CALLER: &str = "acme-key";
const OTHER_CALLER: &str = "globex-key";
const WORKER: &str = "worker-key";
const ADMIN: &str = "admin-key";

struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(dir: &Path, config: &Value) -> Server {
        Server::start_with(dir, config, &[])
    }

    fn start_with(dir: &Path, config: &Value, extra: &[&str]) -> Server {
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let (child, base) = common::spawn_serve(
            &[
                ["--config", config_path.to_str().unwrap(), "--db"].as_slice(),
                &[dir.join("state.db").to_str().unwrap()],
                extra,
            ]
            .concat(),
        );
        Server { child, base }
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "server did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Option<String>, Value) {
        let mut req = ureq::request(method, &format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let result = match body {
            Some(b) => req.send_string(b),
            None => req.call(),
        };
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = response.status();
        let retry_after = response.header("Retry-After").map(str::to_string);
        let text = response.into_string().unwrap();
        (
            status,
            retry_after,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn admit(&self, key: &str, body: Value) -> (u16, Option<String>, Value) {
        self.call("POST", "/v1/admit", Some(key), Some(&body.to_string()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn config() -> Value {
    json!({
        "auth": {"callers": {CALLER: "acme", OTHER_CALLER: "globex"}, "workers": [WORKER], "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 2},
        "tenant_defaults": {"requests": {"capacity": 100, "refill_per_s": 0},
                            "tokens": {"capacity": 10000, "refill_per_s": 1}, "queue_limit": 2},
        "tenants": {"acme": {}, "globex": {"requests": {"capacity": 1, "refill_per_s": 0.5}}},
        "limits": {"max_request_bytes": 2048},
        "policy_params": {"busy_retry_after_ms": 1500}
    })
}

fn request(key: &str, route: &str, tokens: u64) -> Value {
    json!({"key": key, "route": route, "input_tokens": tokens, "max_output_tokens": tokens,
           "deadline_ms": now_ms() + 600_000})
}

#[test]
fn statuses_retry_after_and_auth() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());

    // Auth: missing or unknown key 401, wrong role 403, a tenant that is not the key's 403.
    assert_eq!(s.call("POST", "/v1/admit", None, Some("{}")).0, 401);
    assert_eq!(s.call("POST", "/v1/admit", Some("nope"), Some("{}")).0, 401);
    assert_eq!(s.call("POST", "/v1/admit", Some(WORKER), Some("{}")).0, 403);
    assert_eq!(
        s.call("GET", "/v1/admin/inspect", Some(CALLER), None).0,
        403
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/dispatch",
            Some(CALLER),
            Some(r#"{"count": 1}"#)
        )
        .0,
        403
    );
    let mut foreign = request("k0", "interactive", 10);
    foreign["tenant"] = json!("globex");
    assert_eq!(s.admit(CALLER, foreign).0, 403);
    // One Authorization header, its scheme in any case: two are 401 whichever comes first
    // (a proxy in front might have checked the other one).
    let inspect = |auth: &str| {
        raw_exchange(
            &s.base,
            &format!("GET /v1/admin/inspect HTTP/1.1\r\nHost: x\r\n{auth}\r\n"),
        )
        .0
    };
    assert_eq!(inspect(&format!("Authorization: bearer {ADMIN}\r\n")), 200);
    assert_eq!(
        inspect(&format!("Authorization: BEARER  {ADMIN} \r\n")),
        200
    );
    assert_eq!(inspect(&format!("Authorization: Basic {ADMIN}\r\n")), 401);
    for (first, second) in [(ADMIN, "nope"), ("nope", ADMIN), (ADMIN, ADMIN)] {
        let two = format!("Authorization: Bearer {first}\r\nAuthorization: Bearer {second}\r\n");
        assert_eq!(inspect(&two), 401, "{first} then {second}");
    }
    // A request head over 64 KiB is refused (431, by the HTTP stack) before any handler runs.
    for (size, status) in [(60_000, 200), (70_000, 431), (1_000_000, 431)] {
        let padding = format!("X-Padding: {}\r\n", "p".repeat(size));
        let head = format!("Authorization: Bearer {ADMIN}\r\n{padding}");
        assert_eq!(inspect(&head), status, "{size} bytes of padding");
    }

    // Accepted 200, duplicate 409, conflict 422, invalid 400, too large 413.
    let (status, retry, body) = s.admit(CALLER, request("k1", "interactive", 10));
    assert_eq!(
        (status, retry, body["outcome"].clone()),
        (200, None, json!("accepted"))
    );
    assert_eq!(s.admit(CALLER, request("k1", "interactive", 10)).0, 409);
    assert_eq!(s.admit(CALLER, request("k1", "interactive", 11)).0, 422);
    assert_eq!(
        s.admit(CALLER, json!({"key": "k", "route": "interactive"}))
            .0,
        400
    );
    assert_eq!(
        s.call("POST", "/v1/admit", Some(CALLER), Some("{not json"))
            .0,
        400
    );
    let mut big = request("kb", "interactive", 10);
    big["size_bytes"] = json!(1_000_000);
    assert_eq!(s.admit(CALLER, big).0, 413);
    assert_eq!(
        s.admit(CALLER, request("kt", "interactive", 6000)).0,
        413,
        "never fits the token bucket"
    );
    // The server answers without reading the body and closes the connection, so the
    // request goes out in one write (a client still sending then would get a reset).
    let huge_body = format!(r#"{{"key": "x", "pad": "{}"}}"#, "x".repeat(10_000));
    let (status, body) = raw_exchange(
        &s.base,
        &format!(
            "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CALLER}\r\n\
             Content-Length: {}\r\n\r\n{huge_body}",
            huge_body.len()
        ),
    );
    assert_eq!((status, body["reason"].clone()), (413, json!("too_large")));

    // A deadline that cannot be met: 504, nothing spent.
    let mut late = request("kd", "interactive", 10);
    late["deadline_ms"] = json!(now_ms() - 1);
    let (status, retry, body) = s.admit(CALLER, late);
    assert_eq!(
        (status, retry, body["reason"].clone()),
        (504, None, json!("deadline_exceeded"))
    );

    // Global concurrency 503 with the busy estimate; Retry-After rounds up to seconds.
    assert_eq!(
        s.admit(OTHER_CALLER, request("g1", "interactive", 10)).0,
        200
    );
    let (status, retry, body) = s.admit(CALLER, request("k2", "interactive", 10));
    assert_eq!(
        (status, body["reason"].clone()),
        (503, json!("global_concurrency"))
    );
    assert_eq!(
        (retry.as_deref(), body["retry_after_ms"].clone()),
        (Some("2"), json!(1500))
    );

    // Tenant rate 429 with the exact wait (1 credit at 0.5/s: up to 2 s).
    let (status, retry, body) = s.admit(OTHER_CALLER, request("g2", "interactive", 10));
    assert_eq!(
        (status, body["reason"].clone()),
        (429, json!("tenant_rate"))
    );
    assert_eq!(retry.as_deref(), Some("2"));
    assert!(body["retry_after_ms"].as_u64().unwrap() <= 2000);

    // Completion: the key's tenant only; wrong state 409; unknown 404; bad result 400.
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/k1/complete",
            Some(OTHER_CALLER),
            Some(r#"{"result": "succeeded"}"#)
        )
        .0,
        404
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/k1/complete",
            Some(CALLER),
            Some(r#"{"result": "maybe"}"#)
        )
        .0,
        400
    );
    let (status, _, body) = s.call(
        "POST",
        "/v1/operations/k1/complete",
        Some(CALLER),
        Some(r#"{"result": "unknown"}"#),
    );
    assert_eq!(
        (status, body["retry"]["reason"].clone()),
        (200, json!("unknown_outcome"))
    );
    assert_eq!(
        s.admit(CALLER, request("k1", "interactive", 10)).0,
        409,
        "unknown_outcome_pending"
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/k1/complete",
            Some(CALLER),
            Some(r#"{"result": "failed"}"#)
        )
        .0,
        409
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/k1/reconcile",
            Some(CALLER),
            Some(r#"{"resolution": "succeeded"}"#)
        )
        .0,
        200
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/k1/reconcile",
            Some(CALLER),
            Some(r#"{"resolution": "succeeded"}"#)
        )
        .0,
        409
    );
    let (status, _, body) = s.call("GET", "/v1/operations/k1", Some(CALLER), None);
    assert_eq!((status, body["state"].clone()), (200, json!("succeeded")));
    assert_eq!(
        s.call("GET", "/v1/operations/k1", Some(OTHER_CALLER), None)
            .0,
        404
    );
    assert_eq!(
        s.call("GET", "/v1/operations/a%2Fb", Some(CALLER), None).0,
        404
    );
    // A key whose percent-decoding is not UTF-8: the key is checked first, and every error
    // answer is JSON, unknown paths and methods included.
    let refused = |status: u16, reason: &str| (status, json!(reason));
    let answer = |(status, _, body): (u16, Option<String>, Value)| (status, body["reason"].clone());
    let bad_key = "/v1/operations/%FF%FE";
    assert_eq!(
        answer(s.call("GET", bad_key, None, None)),
        refused(401, "unauthorized")
    );
    assert_eq!(
        answer(s.call("GET", bad_key, Some(CALLER), None)),
        refused(400, "invalid_request")
    );
    assert_eq!(
        answer(s.call(
            "POST",
            &format!("{bad_key}/complete"),
            Some(CALLER),
            Some("{\"result\": \"succeeded\"}")
        )),
        refused(400, "invalid_request")
    );
    assert_eq!(
        answer(s.call("GET", "/v1/nothing", None, None)),
        refused(404, "not_found")
    );
    assert_eq!(
        answer(s.call("GET", "/v1/admit", Some(CALLER), None)),
        refused(405, "method_not_allowed")
    );

    // Durable: 202, queue bound 429, dispatch by a worker, complete by the claiming worker.
    assert_eq!(s.admit(CALLER, request("d/1", "durable", 10)).0, 202);
    assert_eq!(s.admit(CALLER, request("d2", "durable", 10)).0, 202);
    let (status, retry, body) = s.admit(CALLER, request("d3", "durable", 10));
    assert_eq!(
        (status, body["reason"].clone(), retry.as_deref()),
        (429, json!("queue_full"), Some("2"))
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/dispatch",
            Some(WORKER),
            Some(r#"{"worker": "someone-else", "count": 1}"#)
        )
        .0,
        403
    );
    let (status, _, body) = s.call(
        "POST",
        "/v1/dispatch",
        Some(WORKER),
        Some(r#"{"count": 5}"#),
    );
    assert_eq!(status, 200);
    assert_eq!(body["claimed"][0]["key"], "d/1");
    assert_eq!(body["claimed"][0]["attempt"], 1);
    let done = json!({"tenant": "acme", "result": "succeeded"}).to_string();
    assert_eq!(
        s.call(
            "POST",
            "/v1/operations/d%2F1/complete",
            Some(WORKER),
            Some(&done)
        )
        .0,
        200
    );

    // Downstream unavailable: interactive 503, durable still queued.
    assert_eq!(
        s.call(
            "POST",
            "/v1/admin/downstream",
            Some(ADMIN),
            Some(r#"{"available": false}"#)
        )
        .0,
        200
    );
    let (status, _, body) = s.admit(OTHER_CALLER, request("g3", "interactive", 10));
    assert!(status == 503 || body["reason"] == "tenant_rate", "{body}");
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(inspect["downstream_available"], false);

    // Metrics.
    let (status, _, metrics) = s.call("GET", "/metrics", None, None);
    let metrics = metrics.as_str().unwrap().to_string();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("tollgate_decisions_total{outcome=\"accepted\",reason=\"\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("reason=\"global_concurrency\""));
    assert!(metrics.contains("tollgate_policy_info{name=\"standard\""));
    assert!(metrics.contains("tollgate_policy_call_seconds_bucket"));
    let batches = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_writer_batch_jobs_count "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(batches > 0, "{metrics}");
    assert!(metrics.contains("tollgate_writer_batch_seconds_bucket"));
    assert!(metrics.contains("tollgate_wal_restart_seconds_count 0"));
    assert!(metrics.contains("tollgate_http_responses_total{status=\"413\"}"));
    // Gauges read from the store: the same level as the admin view (no refill there).
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let credits = "tollgate_bucket_credits{bucket=\"tenant.acme.requests\"} ";
    assert_eq!(
        value(&metrics, credits),
        inspect["buckets"]["tenant.acme.requests"].as_f64(),
        "{metrics}"
    );
    // `/metrics` needs no key: asked for in a loop, it answers with the text it made (for
    // a second) instead of giving the writer a job each time.
    let read = || {
        s.call("GET", "/metrics", None, None)
            .2
            .as_str()
            .unwrap()
            .to_string()
    };
    let jobs = |text: &str| value(text, "tollgate_writer_batch_jobs_sum ").unwrap();
    let started = Instant::now();
    let before = jobs(&metrics);
    for _ in 0..50 {
        read();
    }
    let seconds = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(1100));
    // One reading at most per second of the loop, and this last one.
    let jobs_run = jobs(&read()) - before;
    assert!(
        jobs_run <= 1.0 + seconds.ceil(),
        "{jobs_run} writer jobs for 50 readings in {seconds:.2} s"
    );
    assert!(s.stop().success());
}

#[test]
fn slow_bodies_are_cut_off_and_spend_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    let addr = s.base.trim_start_matches("http://").to_string();
    // Promise a body and never send it: a 408 after the body timeout, nothing spent.
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(stream, "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CALLER}\r\nContent-Length: 100\r\n\r\n{{\"key\"").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(inspect["buckets"]["tenant.acme.requests"], 100);
    assert!(s.stop().success());
}

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
        .send_bytes(tollgate::runtime::builtin::get(name).unwrap());
    let Err(ureq::Error::Status(422, r)) = answer else {
        panic!("policy {name} was not refused")
    };
    r.into_string().unwrap()
}

fn policy_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, tollgate::runtime::builtin::get(name).unwrap()).unwrap();
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

#[test]
fn the_load_benchmark_drives_a_real_server_and_counts_every_answer() {
    // `tollgate bench http` starts `tollgate serve` as a process and must see every one of
    // its admissions answered 200 (a generator that misreads responses fails here).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "http", "--tenants", "5", "--connections", "4"])
        .args(["--requests", "400", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap();
    let figures: Value = serde_json::from_str(line).unwrap();
    assert_eq!(figures["requests"], 400, "{figures}");
    assert_eq!(figures["errors"], 0, "{figures}");
    assert!(figures["admissions_per_s"].as_f64().unwrap() > 0.0);
    let ms = |p: &str| figures[p].as_f64().unwrap();
    assert!(ms("p50_ms") <= ms("p90_ms") && ms("p90_ms") <= ms("p99_ms"));
    assert!(ms("p99_ms") <= ms("p999_ms"));
    // CPU per admission, from `/proc`: the writer thread's share of the process's (read a
    // moment later, so within one clock tick spread over the 400 admissions).
    let server = figures["server_cpu_us_per_admission"].as_f64().unwrap();
    let writer = figures["writer_cpu_us_per_admission"].as_f64().unwrap();
    let tick_per_admission_us = 1e6 / 100.0 / 400.0;
    assert!(server > 0.0, "{figures}");
    assert!(
        (0.0..=server + tick_per_admission_us).contains(&writer),
        "{figures}"
    );
    // The machine's shares over the same interval, from `/proc/stat`.
    let share = |k: &str| figures["machine"][k].as_f64().unwrap();
    for k in ["steal_percent", "idle_percent"] {
        assert!((0.0..=100.0).contains(&share(k)), "{figures}");
    }
    assert!(
        share("steal_percent") + share("idle_percent") < 100.0,
        "{figures}"
    );
}

/// Sends `request` in one write on a connection of its own and reads one answer: its
/// status and JSON body.
fn raw_exchange(base: &str, request: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    read_answer(&mut stream)
}

/// Reads one HTTP answer from `stream`: its status and JSON body.
fn read_answer(stream: &mut TcpStream) -> (u16, Value) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(0usize);
            if body.len() >= length {
                let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                return (status, serde_json::from_str(body).unwrap_or(Value::Null));
            }
        }
        match stream.read(&mut chunk) {
            Ok(n @ 1..) => answer.extend_from_slice(&chunk[..n]),
            other => panic!("the answer ended early ({other:?}): {text}"),
        }
    }
}

#[test]
fn a_client_still_sending_a_refused_body_sees_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    let addr = s.base.trim_start_matches("http://").to_string();
    let head = |extra: &str, length: usize| {
        format!(
            "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CALLER}\r\n\
             {extra}Content-Length: {length}\r\n\r\n"
        )
    };
    // The body follows the headers after a pause (as from a client streaming a file): the
    // server reads and throws it away, then answers, instead of resetting the connection
    // under a client that has not finished writing.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.write_all(head("", 5_000_000).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stream.write_all(&vec![b'x'; 5_000_000]).unwrap();
    assert_eq!(read_answer(&mut stream).0, 413);
    // A client that waits for `100 Continue` is answered 413 without sending the body.
    let mut stream = TcpStream::connect(&addr).unwrap();
    let waiting = head("Expect: 100-continue\r\n", 300_000);
    stream.write_all(waiting.as_bytes()).unwrap();
    let (status, body) = read_answer(&mut stream);
    assert_eq!((status, body["reason"].clone()), (413, json!("too_large")));
    // A chunked body over the limit is cut off: the answer comes, and the connection ends
    // long before the client could send all it had.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .write_all(
            head("Transfer-Encoding: chunked\r\n", 0)
                .replace("Content-Length: 0\r\n", "")
                .as_bytes(),
        )
        .unwrap();
    let mut sender = stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
        let mut sent = 0usize;
        while sent < 256 << 20 && sender.write_all(chunk.as_bytes()).is_ok() {
            sent += 0x10000;
        }
        sent
    });
    let (status, body) = read_answer(&mut stream);
    assert_eq!((status, body["reason"].clone()), (413, json!("too_large")));
    let sent = sending.join().unwrap();
    assert!(sent < 256 << 20, "the server read all {sent} bytes");
    // So is a body refused before it is read at all: an unknown key, a key of the wrong
    // role, an unknown path.
    for (request, status) in [
        (
            "POST /v1/admit HTTP/1.1\r\nAuthorization: Bearer nobody\r\n",
            401,
        ),
        (
            &format!("PUT /v1/admin/policy HTTP/1.1\r\nAuthorization: Bearer {CALLER}\r\n"),
            403,
        ),
        ("POST /v1/nowhere HTTP/1.1\r\n", 404),
    ] {
        let mut stream = TcpStream::connect(&addr).unwrap();
        let head = format!("{request}Host: x\r\nContent-Length: 5000000\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stream.write_all(&vec![b'x'; 5_000_000]).unwrap();
        assert_eq!(read_answer(&mut stream).0, status, "{request}");
    }
    // A client waiting for `100 Continue` is refused without being asked for the body.
    let mut stream = TcpStream::connect(&addr).unwrap();
    let waiting = "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nobody\r\n\
                   Expect: 100-continue\r\nContent-Length: 5000000\r\n\r\n";
    stream.write_all(waiting.as_bytes()).unwrap();
    assert_eq!(read_answer(&mut stream).0, 401);
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(inspect["buckets"]["tenant.acme.requests"], 100);
    assert!(s.stop().success());
}

/// Opens `n` connections to `addr` that never send a request.
fn idle_connections(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

#[test]
fn connections_past_the_bound_wait_for_a_free_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config["limits"]["max_connections"] = json!(4);
    let s = Server::start(dir.path(), &config);
    let addr = s.base.trim_start_matches("http://").to_string();
    let held = idle_connections(&addr, 4);
    // A fifth connection is not served while the four are open...
    let waiting = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(500))
        .build()
        .get(&format!("{}/healthz", s.base))
        .call();
    assert!(waiting.is_err(), "served past the bound: {waiting:?}");
    // ...and is once they close.
    drop(held);
    let (status, _, metrics) = s.call("GET", "/metrics", None, None);
    assert_eq!(status, 200);
    let open = metrics.as_str().unwrap().lines().find_map(|l| {
        l.strip_prefix("tollgate_http_connections ")
            .map(|v| v.parse::<i64>().unwrap())
    });
    assert!(matches!(open, Some(1..=4)), "{open:?}");
    assert!(s.stop().success());
}

#[test]
fn running_out_of_file_descriptors_pauses_accepting_without_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config().to_string()).unwrap();
    let log = dir.path().join("serve.log");
    // The server may open 48 files; the connection bound (1,000 by default) is far above.
    let (child, base) = common::spawn_serve_via(
        &[
            "--config",
            config_path.to_str().unwrap(),
            "--db",
            dir.path().join("state.db").to_str().unwrap(),
        ],
        |program| {
            let mut command = Command::new("sh");
            command
                .args(["-c", "ulimit -n 48 && exec \"$0\" \"$@\"", program])
                .stderr(std::fs::File::create(&log).unwrap());
            command
        },
    );
    let s = Server { child, base };
    let addr = s.base.trim_start_matches("http://").to_string();
    // More connections than the server has descriptors left: the rest wait in the backlog.
    let held = idle_connections(&addr, 80);
    std::thread::sleep(Duration::from_millis(300));
    let cpu_ticks = |pid| tollgate::bench::cpu_ticks(pid, None).unwrap();
    let before = cpu_ticks(s.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(s.child.id()) - before;
    // Retrying accept at once would keep both cores busy (~400 ticks in 2 s).
    assert!(
        used < 50,
        "{used} ticks of CPU in 2 s while out of descriptors"
    );
    let failures = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count();
    assert!(
        (1..=5).contains(&failures),
        "{failures} accept failures logged"
    );
    // Once the connections close, the server serves again.
    drop(held);
    let started = Instant::now();
    while ureq::get(&format!("{}/healthz", s.base)).call().is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "no recovery");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.stop().success());
}

/// Every way this test knows to spoil a valid JSON body: each proper prefix, each field
/// removed, each field given values of the wrong type or out of range, unknown and
/// duplicated fields, other top-level values, bytes that are not UTF-8, and nesting
/// deeper than any parser should follow. `keep` lists the optional fields, whose removal
/// leaves the body valid.
fn spoiled(valid: &Value, keep: &[&str]) -> Vec<Vec<u8>> {
    let text = valid.to_string();
    let mut out: Vec<Vec<u8>> = (0..text.len())
        .filter(|&cut| text.is_char_boundary(cut))
        .map(|cut| text.as_bytes()[..cut].to_vec())
        .collect();
    let wrong = [
        json!(null),
        json!(true),
        json!(-1),
        json!(1.5),
        json!("7"),
        json!([]),
        json!({}),
        json!([1, 2]),
        json!({"nested": {"deeper": 1}}),
    ];
    let fields = valid.as_object().unwrap();
    for (name, value) in fields {
        if !keep.contains(&name.as_str()) {
            let mut without = valid.clone();
            without.as_object_mut().unwrap().remove(name);
            out.push(without.to_string().into_bytes());
        }
        for w in &wrong {
            // A value of the field's own kind may be valid, and so is null for an optional
            // field (read as absent): neither is sent. Counts hold non-negative integers,
            // so -1 and 1.5 are another kind for them (-1 is sent as a deadline too:
            // well-formed, and refused 504 below).
            let same_kind = std::mem::discriminant(w) == std::mem::discriminant(value)
                && !(value.is_u64() && (w.is_f64() || w.as_i64().is_some_and(|n| n < 0)));
            let optional_null = w.is_null() && keep.contains(&name.as_str());
            if !(same_kind || optional_null) {
                let mut changed = valid.clone();
                changed[name.as_str()] = w.clone();
                out.push(changed.to_string().into_bytes());
            }
        }
        // Numbers past what the field can hold.
        if value.is_number() {
            for big in ["18446744073709551616", "1e400", "-9223372036854775809"] {
                let mut changed = valid.clone();
                changed[name.as_str()] = json!("BIG");
                out.push(changed.to_string().replace("\"BIG\"", big).into_bytes());
            }
        }
        // The same name twice: which value would win is the parser's guess.
        let inner = text.trim_start_matches('{');
        out.push(format!("{{\"{name}\":{value},{inner}").into_bytes());
    }
    let mut unknown = valid.clone();
    unknown["surprise"] = json!(1);
    out.push(unknown.to_string().into_bytes());
    for other in ["[]", "\"x\"", "1", "null", "true", "", " ", "{}"] {
        out.push(other.as_bytes().to_vec());
    }
    let mut not_utf8 = text.clone().into_bytes();
    not_utf8.insert(2, 0xff);
    out.push(not_utf8);
    let mut bom = vec![0xef, 0xbb, 0xbf];
    bom.extend_from_slice(text.as_bytes());
    out.push(bom);
    out.push(format!("{}{}", "[".repeat(600), "]".repeat(600)).into_bytes());
    out.push(format!("{text}{text}").into_bytes());
    out
}

/// Sends `body` as raw bytes and reads the answer.
fn send_bytes(base: &str, method: &str, path: &str, key: &str, body: &[u8]) -> (u16, Value) {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).unwrap();
    read_answer(&mut stream)
}

#[test]
fn spoiled_bodies_are_refused_with_a_bounded_reason_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg["tenant_defaults"]["tokens"]["refill_per_s"] = json!(0);
    cfg["global"]["concurrency"] = json!(100);
    let s = Server::start(dir.path(), &cfg);
    // One operation to complete and reconcile, and one queued job a worker could claim.
    assert_eq!(s.admit(CALLER, request("live", "interactive", 10)).0, 200);
    assert_eq!(s.admit(CALLER, request("queued", "durable", 10)).0, 202);
    let state = || s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    let before = state();

    let mut admit = request("spoiled", "durable", 10);
    admit["optional_context_tokens"] = json!(5);
    admit["size_bytes"] = json!(100);
    admit["body_ref"] = json!("s3://bucket/b");
    admit["fingerprint"] = json!("f");
    let endpoints: [(&str, &str, Value, &[&str]); 5] = [
        (
            "/v1/admit",
            CALLER,
            admit,
            &[
                "optional_context_tokens",
                "size_bytes",
                "body_ref",
                "fingerprint",
            ],
        ),
        (
            "/v1/operations/live/complete",
            CALLER,
            json!({"result": "succeeded", "usage": {"input_tokens": 1, "output_tokens": 1},
                   "result_ref": "r"}),
            &["usage", "result_ref"],
        ),
        (
            "/v1/operations/live/reconcile",
            CALLER,
            json!({"resolution": "succeeded", "result_ref": "r"}),
            &["result_ref"],
        ),
        ("/v1/dispatch", WORKER, json!({"count": 1}), &[]),
        (
            "/v1/admin/downstream",
            ADMIN,
            json!({"available": false}),
            &[],
        ),
    ];
    // Bodies that are each struct's fields in declaration order: a derived parser alone
    // takes them.
    let positional = [
        (
            "/v1/operations/live/complete",
            CALLER,
            r#"[null, "succeeded"]"#,
        ),
        (
            "/v1/operations/live/reconcile",
            CALLER,
            r#"[null, "succeeded"]"#,
        ),
        ("/v1/dispatch", WORKER, "[null, 1]"),
        ("/v1/admin/downstream", ADMIN, "[false]"),
    ];
    let mut sent = 0;
    for (path, key, valid, keep) in endpoints {
        let bodies = spoiled(&valid, keep).into_iter().chain(
            positional
                .iter()
                .filter(|p| p.0 == path)
                .map(|p| p.2.as_bytes().to_vec()),
        );
        for body in bodies {
            let (status, answer) = send_bytes(&s.base, "POST", path, key, &body);
            let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
            // The error answer of SPEC section 10, with a reason of a few words. A
            // deadline in the past is well-formed and refused 504 (nothing spent either).
            let reason = answer["reason"].as_str().unwrap_or("");
            assert!(
                ((400..500).contains(&status) || (status, reason) == (504, "deadline_exceeded"))
                    && answer["outcome"] == "rejected"
                    && (1..=40).contains(&reason.len())
                    && reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{path} {shown:?}: {status} {answer}"
            );
            sent += 1;
        }
    }
    assert!(sent > 400, "only {sent} bodies");
    // Nothing was spent, claimed, queued or marked, and the spoiled key does not exist.
    assert_eq!(state(), before);
    assert_eq!(
        s.call("GET", "/v1/operations/spoiled", Some(CALLER), None)
            .0,
        404
    );
    assert_eq!(
        s.call("GET", "/v1/operations/live", Some(CALLER), None).2["state"],
        "active"
    );
}
