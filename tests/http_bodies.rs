//! Hostile bodies: every way to spoil a valid one is refused with a bounded reason and
//! changes nothing.

mod common;

use common::http::*;
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;

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
            // The error answer of docs/http-api.md, with a reason of a few words. A
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
