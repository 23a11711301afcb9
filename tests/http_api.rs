//! The HTTP API as a client sees it, on a real `tollgate serve` process: statuses, auth,
//! retry-after, completions, dispatch and metrics.

mod common;

use common::http::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn auth_comes_first_and_one_bearer_header_counts() {
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
    assert!(s.stop().success());
}

#[test]
fn admissions_answer_with_the_contract_statuses_and_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());

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
    assert!(s.stop().success());
}

#[test]
fn completions_reconciliations_and_keys_in_paths() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    assert_eq!(s.admit(CALLER, request("k1", "interactive", 10)).0, 200);
    // A report naming another attempt is stale: 409, and k1 stays active.
    let (status, _, body) = s.call(
        "POST",
        "/v1/operations/k1/complete",
        Some(CALLER),
        Some(r#"{"result": "succeeded", "attempt": 7}"#),
    );
    assert_eq!(
        (status, body["error"].clone()),
        (409, json!("stale_attempt"))
    );

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
    // A request refused by validation names its field and what is wrong with it.
    let zero = r#"{"key": "z1", "route": "interactive", "input_tokens": 5,
        "max_output_tokens": 0, "deadline_ms": 99999999999999}"#;
    let (status, _, body) = s.call("POST", "/v1/admit", Some(CALLER), Some(zero));
    assert_eq!((status, &body["reason"]), (400, &json!("invalid_request")));
    assert_eq!(body["field"], "max_output_tokens", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("max_output_tokens: must be from 1"),
        "{message}"
    );
    assert!(s.stop().success());
}

#[test]
fn durable_work_dispatch_and_downstream() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());

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
    assert_eq!(
        (status, body["reason"].clone()),
        (503, json!("downstream_unavailable"))
    );
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(inspect["downstream_available"], false);
    assert!(s.stop().success());
}

#[test]
fn metrics_count_decisions_and_match_the_admin_view() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    // Decisions to count: two accepted (the global limit is 2), one refused for it, one
    // body too large.
    assert_eq!(s.admit(CALLER, request("k1", "interactive", 10)).0, 200);
    assert_eq!(
        s.admit(OTHER_CALLER, request("g1", "interactive", 10)).0,
        200
    );
    assert_eq!(s.admit(CALLER, request("k2", "interactive", 10)).0, 503);
    let mut big = request("kb", "interactive", 10);
    big["size_bytes"] = json!(1_000_000);
    assert_eq!(s.admit(CALLER, big).0, 413);
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;

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
    let global = "tollgate_bucket_credits{bucket=\"global.requests\"} ";
    assert_eq!(
        value(&metrics, global),
        inspect["buckets"]["global.requests"].as_f64(),
        "{metrics}"
    );
    // Without a key, totals only: no series names a tenant. The admin key sees them all.
    assert!(
        !metrics.contains("acme") && !metrics.contains("tenant."),
        "{metrics}"
    );
    let (status, _, full) = s.call("GET", "/metrics", Some(ADMIN), None);
    let full = full.as_str().unwrap().to_string();
    assert_eq!(status, 200);
    let credits = "tollgate_bucket_credits{bucket=\"tenant.acme.requests\"} ";
    assert_eq!(
        value(&full, credits),
        inspect["buckets"]["tenant.acme.requests"].as_f64(),
        "{full}"
    );
    assert!(
        full.contains("tollgate_queue_depth{tenant=\"acme\"}"),
        "{full}"
    );
    assert_eq!(s.call("GET", "/metrics", Some(CALLER), None).0, 403);
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

/// `--metrics-listen`: every series, per-tenant ones included, without a key on the
/// operators' address; the public `/metrics` keeps to totals.
#[test]
fn a_metrics_address_serves_every_series_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_at = format!("127.0.0.1:{port}");
    let s = Server::start_with(dir.path(), &config(), &["--metrics-listen", &metrics_at]);
    let (status, _, _) = s.admit(CALLER, request("m1", "interactive", 5));
    assert_eq!(status, 200);
    let series = "tollgate_bucket_credits{bucket=\"tenant.acme.requests\"}";
    let (_, _, public) = s.call("GET", "/metrics", None, None);
    assert!(!public.as_str().unwrap().contains(series));
    let private = ureq::get(&format!("http://{metrics_at}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(private.contains(series), "{private}");
    assert!(ureq::get(&format!("http://{metrics_at}/v1/admin/inspect"))
        .call()
        .is_err());
    assert!(
        s.stop().success(),
        "the metrics listener does not hold the shutdown"
    );
}

/// The value of the series named `name` (without labels) in a metrics text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/metrics` shows the fresh policy instances made ahead over every shard, and the calls
/// that found theirs ready; both stay 0 when none are made ahead.
#[test]
fn instances_made_ahead_and_calls_that_found_them_show_in_metrics() {
    for (ahead, made) in [("4", true), ("0", false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut roomy = config();
        roomy["global"]["concurrency"] = json!(100);
        let s = Server::start_with(
            dir.path(),
            &roomy,
            &["--policy-instances-ahead", ahead, "--writers", "2"],
        );
        for n in 0..12 {
            let (status, _, answer) = s.admit(CALLER, request(&format!("m{n}"), "interactive", 5));
            assert_eq!(status, 200, "{answer}");
        }
        let started = Instant::now();
        let (ready, found) = loop {
            let (_, _, text) = s.call("GET", "/metrics", None, None);
            let text = text.as_str().unwrap_or_default().to_string();
            let ready = series(&text, "tollgate_policy_instances_ready").expect("the series");
            let found = series(&text, "tollgate_policy_calls_found_ready").expect("the series");
            if !made || (ready > 0.0 && found > 0.0) || started.elapsed() > Duration::from_secs(10)
            {
                break (ready, found);
            }
            std::thread::sleep(Duration::from_millis(300));
        };
        if made {
            assert!(ready > 0.0 && found > 0.0, "ready {ready}, found {found}");
        } else {
            assert_eq!((ready, found), (0.0, 0.0));
        }
    }
}

/// `POST /v1/admit` asking to wait: its status, `x-tollgate-waited-ms`, its answer and how
/// long it took.
fn admit_waiting(base: &str, key: &str, body: &Value) -> (u16, Option<u64>, Value, Duration) {
    let started = Instant::now();
    let r = ureq::post(&format!("{base}/v1/admit"))
        .set("Authorization", &format!("Bearer {key}"))
        .timeout(Duration::from_secs(30))
        .send_string(&body.to_string());
    let r = match r {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = r.status();
    let waited = r
        .header("x-tollgate-waited-ms")
        .and_then(|v| v.parse().ok());
    let answer = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    (status, waited, answer, started.elapsed())
}

/// A call that asks to wait, for `max_wait_ms`, with a deadline `deadline_in_ms` away.
fn waiting(key: &str, max_wait_ms: u64, deadline_in_ms: i64) -> Value {
    json!({"key": key, "route": "interactive", "input_tokens": 5, "max_output_tokens": 5,
           "deadline_ms": now_ms() + deadline_in_ms, "max_wait_ms": max_wait_ms})
}

/// The calls waiting now, as `/metrics` (with the admin key) counts them in `band`.
fn waiting_now(s: &Server, band: &str) -> f64 {
    let (_, _, text) = s.call("GET", "/metrics", Some(ADMIN), None);
    let text = text.as_str().unwrap_or_default().to_string();
    series(&text, &format!("tollgate_waiting_calls{{band=\"{band}\"}}")).unwrap_or(-1.0)
}

/// Waits (up to 5 s) until `/metrics` counts `n` standard calls waiting.
fn until_waiting(s: &Server, n: f64) {
    let started = Instant::now();
    while waiting_now(s, "standard") != n {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never {n} waiting: {}",
            waiting_now(s, "standard")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The waiting room through `POST /v1/admit`: a call that asks to wait for a slot the
/// global concurrency holds is admitted when it frees (saying how long it waited); one
/// whose deadline comes first is refused then, `deadline_exceeded`; the bounds refuse with
/// `queue_full` and their numbers; a caller that hangs up leaves at once and spends nothing;
/// a call that does not ask, or with `waiting.enabled: false`, is answered at once as before.
#[test]
fn calls_that_ask_wait_their_turn_within_their_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config();
    c["global"]["concurrency"] = json!(1);
    c["tenants"]["globex"] = json!({});
    c["waiting"] = json!({"per_tenant": 2, "total": 3});
    let s = Server::start(dir.path(), &c);
    let base = s.base.clone();
    let complete_by = |key: &str, caller: &str| {
        let path = format!("/v1/operations/{key}/complete");
        let (status, _) =
            common::server::post(&base, &path, caller, &json!({"result": "succeeded"}));
        assert_eq!(status, 200);
    };
    let complete = |key: &str| complete_by(key, CALLER);
    assert_eq!(s.admit(CALLER, request("hold", "interactive", 5)).0, 200);
    // Without max_wait_ms: refused at once, as before.
    let (status, _, answer) = s.admit(CALLER, request("now", "interactive", 5));
    assert_eq!(
        (status, answer["reason"].as_str()),
        (503, Some("global_concurrency"))
    );

    // Admitted once the slot frees, after waiting.
    let b = base.clone();
    let first =
        std::thread::spawn(move || admit_waiting(&b, CALLER, &waiting("w1", 5_000, 600_000)));
    until_waiting(&s, 1.0);
    std::thread::sleep(Duration::from_millis(200));
    complete("hold");
    let (status, waited, answer, _) = first.join().unwrap();
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (200, Some("accepted")),
        "{answer}"
    );
    assert!(waited.unwrap() >= 150, "{waited:?}");
    assert_eq!(answer["waited_ms"].as_u64(), waited);

    // Its deadline comes first: refused at that moment, never admitted to fail.
    let (status, waited, answer, took) = admit_waiting(&base, CALLER, &waiting("w2", 5_000, 400));
    assert_eq!(
        answer["reason"].as_str(),
        Some("deadline_exceeded"),
        "{answer}"
    );
    assert_eq!(status, 504);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(waited.unwrap() >= 300, "{waited:?}");
    assert!(
        answer["message"].as_str().unwrap().contains("waited"),
        "{answer}"
    );
    // A deadline that cannot fit is refused at once.
    let (_, _, answer, took) = admit_waiting(&base, CALLER, &waiting("w2b", 5_000, -1));
    assert_eq!(
        answer["reason"].as_str(),
        Some("deadline_exceeded"),
        "{answer}"
    );
    assert!(took < Duration::from_millis(300), "{took:?}");

    // The bounds: two of acme's, one of globex's; then queue_full with the numbers.
    let spawn = |key: &'static str, caller: &'static str| {
        let b = base.clone();
        std::thread::spawn(move || admit_waiting(&b, caller, &waiting(key, 20_000, 600_000)))
    };
    let w3 = spawn("w3", CALLER);
    let w4 = spawn("w4", CALLER);
    until_waiting(&s, 2.0);
    let (_, _, answer, _) = admit_waiting(&base, CALLER, &waiting("w5", 5_000, 600_000));
    assert_eq!(answer["reason"].as_str(), Some("queue_full"), "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("waiting.per_tenant 2"),
        "{answer}"
    );
    let w6 = spawn("w6", OTHER_CALLER);
    until_waiting(&s, 3.0);
    let (_, _, view) = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None);
    assert_eq!(
        view["waiting"]["tenants"],
        json!({"acme": 2, "globex": 1}),
        "{view}"
    );
    assert_eq!(view["waiting"]["bands"]["standard"], 3);
    let (_, _, answer, _) = admit_waiting(&base, OTHER_CALLER, &waiting("w7", 5_000, 600_000));
    assert_eq!(answer["reason"].as_str(), Some("queue_full"), "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("waiting.total"),
        "{answer}"
    );

    // Each slot that frees admits one waiting call: acme's in arrival order.
    let mut holder = ("w1".to_string(), CALLER);
    for left in [2.0, 1.0, 0.0] {
        complete_by(&holder.0, holder.1);
        until_waiting(&s, left);
        let (_, _, view) = s.call(
            "GET",
            "/v1/admin/operations?state=active",
            Some(ADMIN),
            None,
        );
        let active: Vec<(String, &str)> = view["operations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let caller = if o["tenant"] == "acme" {
                    CALLER
                } else {
                    OTHER_CALLER
                };
                (o["key"].as_str().unwrap().to_string(), caller)
            })
            .collect();
        assert_eq!(active.len(), 1, "{view}");
        holder = active[0].clone();
    }
    let answers = [w3.join().unwrap(), w4.join().unwrap(), w6.join().unwrap()];
    for (status, waited, answer, _) in &answers {
        assert_eq!(*status, 200, "{answer}");
        assert!(waited.is_some());
    }

    // A caller that hangs up leaves the room at once, having spent nothing.
    let globex_requests = |s: &Server| {
        let (_, _, view) = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None);
        view["buckets"]["tenant.globex.requests"].as_i64().unwrap()
    };
    let before = globex_requests(&s);
    let body = waiting("gone-1", 20_000, 600_000).to_string();
    let mut stream = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    write!(
        stream,
        "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OTHER_CALLER}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    until_waiting(&s, 1.0);
    drop(stream);
    until_waiting(&s, 0.0);
    complete_by(&holder.0, holder.1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(globex_requests(&s), before);
    let (status, _, _) = s.call("GET", "/v1/operations/gone-1", Some(OTHER_CALLER), None);
    assert_eq!(status, 404, "never admitted");
    let (_, _, text) = s.call("GET", "/metrics", Some(ADMIN), None);
    let text = text.as_str().unwrap_or_default().to_string();
    assert_eq!(
        series(&text, "tollgate_wait_seconds_count{outcome=\"gone\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "tollgate_wait_seconds_count{outcome=\"deadline\"}"),
        Some(1.0)
    );
    assert_eq!(
        series(&text, "tollgate_wait_seconds_count{outcome=\"admitted\"}"),
        Some(4.0)
    );
    drop(s);

    // waiting.enabled: false answers at once, as before.
    let dir = tempfile::tempdir().unwrap();
    c["waiting"] = json!({"enabled": false});
    let s = Server::start(dir.path(), &c);
    assert_eq!(s.admit(CALLER, request("hold", "interactive", 5)).0, 200);
    let (status, waited, answer, took) =
        admit_waiting(&s.base, CALLER, &waiting("w1", 5_000, 600_000));
    assert_eq!(
        (status, answer["reason"].as_str()),
        (503, Some("global_concurrency")),
        "{answer}"
    );
    assert_eq!(waited, None);
    assert!(took < Duration::from_millis(500), "{took:?}");
}
