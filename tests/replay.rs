//! Answer replay: a gateway call made with an `Idempotency-Key` keeps its answer, and a
//! repeat with the same key and body gets it back byte for byte, marked
//! `x-tollgate-replayed: true`, without a second upstream call or a second spend; plain
//! and streamed, on SQLite and across two PostgreSQL replicas.
//!
//! The replica test needs a PostgreSQL server: `.ci/run` sets `TOLLGATE_TEST_POSTGRES` and
//! runs it with `--ignored`. So does the test of stored responses across replicas: each is its
//! tenant's on every replica.

mod common;

use common::server::Server;
use common::stub::Stub;
use serde_json::{json, Value};
use std::time::Duration;

const CALLER: &str = "acme-key";
/// Another tenant's caller key.
const OTHER: &str = "globex-key";
const ADMIN: &str = "admin-key";
const MODEL: &str = "gpt-4o-mini";

fn config(stub: &Stub, replay: bool) -> Value {
    json!({
        "refund_unused_tokens": true,
        "auth": {"callers": {CALLER: "acme", OTHER: "globex"}, "admins": [ADMIN]},
        "tenant_defaults": {"requests": {"capacity": 1000, "refill_per_s": 0},
                            "tokens": {"capacity": 100000, "refill_per_s": 0}},
        "tenants": {"acme": {}, "globex": {}},
        "gateway": {
            "upstreams": {"stub": {"base_url": stub.base_url()}},
            "models": {MODEL: {"upstream": "stub", "tokenizer": "o200k_base"}},
            "replay": replay
        }
    })
}

/// What a caller got: status, the headers a client reads, and the body's bytes.
struct Got {
    status: u16,
    replayed: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

fn chat(base: &str, key: &str, content: &str, stream: bool) -> Got {
    let body = json!({"model": MODEL, "max_tokens": 10, "stream": stream,
                      "messages": [{"role": "user", "content": content}]});
    let r = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Authorization", &format!("Bearer {CALLER}"))
        .set("Idempotency-Key", key)
        .timeout(Duration::from_secs(30))
        .send_string(&body.to_string());
    let r = match r {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{key}: {e}"),
    };
    let (status, replayed, content_type) = (
        r.status(),
        r.header("x-tollgate-replayed").map(String::from),
        r.header("content-type").map(String::from),
    );
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut bytes).unwrap();
    Got {
        status,
        replayed,
        content_type,
        body: bytes,
    }
}

fn tokens_left(base: &str) -> i64 {
    let r = ureq::get(&format!("{base}/v1/admin/inspect"))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap();
    let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    v["buckets"]["tenant.acme.tokens"].as_i64().unwrap()
}

/// The first call, then its repeat on `again` (the same server or another replica): the
/// repeat is the first answer, byte for byte, with one upstream call and one spend.
fn replayed_once(stub: &Stub, first: &str, again: &str, key: &str, stream: bool) {
    let content = format!("replay me {key}");
    let before = tokens_left(first);
    let one = chat(first, key, &content, stream);
    assert_eq!(one.status, 200, "{}", String::from_utf8_lossy(&one.body));
    assert_eq!(one.replayed, None);
    let spent = before - tokens_left(first);
    assert_eq!(spent, 13, "the stub's usage: 11 in, 2 out");
    let two = chat(again, key, &content, stream);
    assert_eq!(two.status, 200);
    assert_eq!(two.replayed.as_deref(), Some("true"));
    assert_eq!(two.content_type, one.content_type);
    assert_eq!(
        String::from_utf8_lossy(&two.body),
        String::from_utf8_lossy(&one.body),
        "byte for byte"
    );
    assert_eq!(two.body, one.body);
    assert_eq!(stub.calls(&content).len(), 1, "one upstream call");
    assert_eq!(before - tokens_left(again), spent, "one spend");
    if stream {
        let text = String::from_utf8_lossy(&one.body);
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

#[test]
fn a_repeated_call_gets_its_first_answer_back_plain_and_streamed() {
    let stub = Stub::start();
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config(&stub, true));
    replayed_once(&stub, &s.base, &s.base, "plain-1", false);
    replayed_once(&stub, &s.base, &s.base, "stream-1", true);
    // Another body under the same key is still a conflict, and goes nowhere.
    let other = chat(&s.base, "plain-1", "something else", false);
    assert_eq!(other.status, 422);
    assert!(stub.calls("something else").is_empty());
    // A call without a key keeps nothing: each is its own call.
    assert!(s.stop().success());

    // Kept in the store: a restart replays it too.
    let s = Server::start(dir.path(), &config(&stub, true));
    let again = chat(&s.base, "plain-1", "replay me plain-1", false);
    assert_eq!(
        (again.status, again.replayed.as_deref()),
        (200, Some("true"))
    );
    assert_eq!(stub.calls("replay me plain-1").len(), 1);
    assert!(s.stop().success());

    // With replay off, a repeat is 409 duplicate_completed, and still no second call.
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config(&stub, false));
    assert_eq!(chat(&s.base, "off-1", "no replay", false).status, 200);
    let repeat = chat(&s.base, "off-1", "no replay", false);
    assert_eq!(repeat.status, 409);
    let v: Value = serde_json::from_slice(&repeat.body).unwrap();
    assert_eq!(v["error"]["code"], "duplicate_completed");
    assert_eq!(stub.calls("no replay").len(), 1);
    assert!(s.stop().success());
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run sets TOLLGATE_TEST_POSTGRES and runs it with --ignored"]
fn a_repeated_call_is_replayed_by_another_replica() {
    let database = common::pg::Database::create("replay");
    let db = database.url();
    let stub = Stub::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&stub, true);
    let a = Server::start_on(dir.path(), "a", &config, &db, &[]);
    let b = Server::start_on(dir.path(), "b", &config, &db, &[]);
    replayed_once(&stub, &a.base, &b.base, "plain-pg", false);
    replayed_once(&stub, &b.base, &a.base, "stream-pg", true);
    assert!(a.stop().success());
    assert!(b.stop().success());
}

/// `method` on `path` with caller `key`: the status and the body.
fn send(base: &str, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let r = ureq::request(method, &format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {key}"))
        .timeout(Duration::from_secs(30));
    let r = match body {
        Some(b) => r.send_string(&b.to_string()),
        None => r.call(),
    };
    let r = match r {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = r.status();
    let text = r.into_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run sets TOLLGATE_TEST_POSTGRES and runs it with --ignored"]
fn a_stored_response_is_its_tenants_on_every_replica() {
    let database = common::pg::Database::create("owned");
    let db = database.url();
    let stub = Stub::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&stub, false);
    let a = Server::start_on(dir.path(), "a", &config, &db, &[]);
    let b = Server::start_on(dir.path(), "b", &config, &db, &[]);
    let made = json!({"model": MODEL, "input": "keep this", "max_output_tokens": 10});
    let (status, answer) = send(&a.base, "POST", "/v1/responses", CALLER, Some(made));
    assert_eq!(status, 200, "{answer}");
    let id = answer["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    // The other replica knows whose it is.
    let (status, got) = send(&b.base, "GET", &path, CALLER, None);
    assert_eq!(
        (status, got["id"].as_str()),
        (200, Some(id.as_str())),
        "{got}"
    );
    for base in [&a.base, &b.base] {
        assert_eq!(send(base, "GET", &path, OTHER, None).0, 404);
        assert_eq!(send(base, "DELETE", &path, OTHER, None).0, 404);
    }
    assert_eq!(send(&b.base, "DELETE", &path, CALLER, None).0, 200);
    assert_eq!(send(&a.base, "GET", &path, CALLER, None).0, 404);
    assert!(a.stop().success());
    assert!(b.stop().success());
}
