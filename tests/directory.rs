//! Tenants and keys at run time on a running server: made, changed, revoked and deleted
//! through the admin endpoints and `tollgate tenants` / `tollgate keys`, kept by the store
//! across restarts, with keys kept only as hashes.

mod common;

use common::http::*;
use serde_json::{json, Value};
use std::process::Command;

fn send(s: &Server, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let text = body.map(|b| b.to_string());
    let (status, _, answer) = s.call(method, path, Some(key), text.as_deref());
    (status, answer)
}

/// `tollgate <args> --server <base> --key ADMIN`: success and stdout.
fn cli(s: &Server, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .args(["--server", &s.base, "--key", ADMIN])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn requests_left(s: &Server, tenant: &str) -> i64 {
    let view = send(s, "GET", "/v1/admin/inspect", ADMIN, None).1;
    view["buckets"][format!("tenant.{tenant}.requests")]
        .as_i64()
        .unwrap_or_else(|| panic!("{view}"))
}

#[test]
fn tenants_and_keys_are_made_at_run_time_and_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());

    // The file's tenants seeded the store.
    let (status, listed) = send(&s, "GET", "/v1/admin/tenants", ADMIN, None);
    assert_eq!(status, 200);
    let names: Vec<&str> = listed["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "globex"]);
    // Only admins.
    assert_eq!(send(&s, "GET", "/v1/admin/tenants", CALLER, None).0, 403);

    // A bad tenant is refused whole, with what is wrong.
    for bad in [
        json!({"wieght": 2}),
        json!({"weight": 0}),
        json!({"requests": {"capacity": -1}}),
        json!({"models": {"nope": {"tokens": {"capacity": 1, "refill_per_s": 1}}}}),
        json!([1]),
    ] {
        let (status, answer) = send(
            &s,
            "PUT",
            "/v1/admin/tenants/initech",
            ADMIN,
            Some(bad.clone()),
        );
        assert_eq!(status, 400, "{bad} -> {answer}");
    }
    assert_eq!(
        send(&s, "GET", "/v1/admin/tenants/initech", ADMIN, None).0,
        404
    );
    // Names that could alias another's rows are refused, the rule in the message, and
    // nothing changes: acme's budget for a model is not a tenant's.
    let before = send(&s, "GET", "/v1/admin/inspect", ADMIN, None).1["buckets"].clone();
    for (path, field) in [
        ("/v1/admin/tenants/acme.model.mc", "tenant name"),
        ("/v1/admin/tenants/a:b", "tenant name"),
        ("/v1/admin/tenants/a%2Fb", "tenant name"),
        ("/v1/admin/tenants/a%20b", "tenant name"),
        ("/v1/admin/groups/org.team", "group name"),
    ] {
        let body = json!({"tokens": {"capacity": 5, "refill_per_s": 0}});
        let (status, answer) = send(&s, "PUT", path, ADMIN, Some(body));
        assert_eq!(status, 400, "{path} -> {answer}");
        let text = answer.to_string();
        assert!(
            text.contains(field) && text.contains("A-Z, a-z, 0-9"),
            "{text}"
        );
    }
    assert_eq!(
        send(&s, "GET", "/v1/admin/inspect", ADMIN, None).1["buckets"],
        before
    );

    // A new tenant and a caller key for it, through the CLI.
    let (ok, out) = cli(
        &s,
        &[
            "tenants",
            "put",
            "initech",
            r#"{"requests": {"capacity": 10, "refill_per_s": 0}}"#,
        ],
    );
    assert!(ok, "{out}");
    let (status, initech) = send(&s, "GET", "/v1/admin/tenants/initech", ADMIN, None);
    assert_eq!(status, 200);
    assert_eq!(
        initech["config"],
        json!({"requests": {"capacity": 10.0, "refill_per_s": 0.0}})
    );
    // The defaults applied: the file's tenant_defaults' tokens.
    assert_eq!(initech["effective"]["tokens"]["capacity"], 10000.0);

    let (ok, out) = cli(
        &s,
        &["keys", "create", "--role", "caller", "--tenant", "initech"],
    );
    assert!(ok, "{out}");
    let made: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    let key = made["key"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(key.len() >= 32, "{key}");
    let (status, _, answer) = s.admit(&key, request("i1", "interactive", 10));
    assert_eq!(status, 200, "{answer}");
    let (status, _, answer) = s.admit(&key, request("i2", "interactive", 10));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(requests_left(&s, "initech"), 8);

    // A key for an unknown tenant, or of an unknown role, is refused.
    let (status, _) = send(
        &s,
        "POST",
        "/v1/admin/keys",
        ADMIN,
        Some(json!({"role": "caller", "tenant": "nobody"})),
    );
    assert_eq!(status, 404);
    let (status, _) = send(
        &s,
        "POST",
        "/v1/admin/keys",
        ADMIN,
        Some(json!({"role": "root"})),
    );
    assert_eq!(status, 400);

    // Listing shows ids and roles, never a key.
    let (status, keys) = send(&s, "GET", "/v1/admin/keys", ADMIN, None);
    assert_eq!(status, 200);
    let text = keys.to_string();
    assert!(
        !text.contains(&key) && !text.contains(CALLER) && !text.contains(ADMIN),
        "{text}"
    );
    assert!(keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["id"] == id.as_str() && k["role"] == "caller" && k["tenant"] == "initech"));

    // Lowering the capacity keeps the balance, capped; raising it does not refill.
    let (status, _) = send(
        &s,
        "PUT",
        "/v1/admin/tenants/initech",
        ADMIN,
        Some(json!({"requests": {"capacity": 5, "refill_per_s": 0}})),
    );
    assert_eq!(status, 200);
    assert_eq!(requests_left(&s, "initech"), 5);
    let (status, _) = send(
        &s,
        "PUT",
        "/v1/admin/tenants/initech",
        ADMIN,
        Some(json!({"requests": {"capacity": 50, "refill_per_s": 0}})),
    );
    assert_eq!(status, 200);
    assert_eq!(requests_left(&s, "initech"), 5);

    // A tenant with an active operation cannot be deleted.
    let (status, answer) = send(&s, "DELETE", "/v1/admin/tenants/initech", ADMIN, None);
    assert_eq!(
        (status, answer["reason"].as_str()),
        (409, Some("tenant_busy")),
        "{answer}"
    );

    // A revoked key is refused at once.
    let (ok, out) = cli(&s, &["keys", "revoke", "acme-and-nothing"]);
    assert!(!ok, "{out}");
    let acme_id = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["tenant"] == "globex")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A key the configuration file owns is changed there, not through the API.
    let (ok, out) = cli(&s, &["keys", "revoke", &acme_id]);
    assert!(!ok && out.contains("owned_by_configuration"), "{out}");
    // Still the tenant's key (the two slots are taken: refused for that, not for the key).
    let (status, _, answer) = s.admit(OTHER_CALLER, request("g1", "interactive", 1));
    assert_eq!(answer["reason"], "global_concurrency", "{status} {answer}");
    // A key made through the API is revoked at once.
    let (ok, out) = cli(
        &s,
        &["keys", "create", "--role", "caller", "--tenant", "initech"],
    );
    assert!(ok, "{out}");
    let spare: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out}"));
    let (spare_key, spare_id) = (
        spare["key"].as_str().unwrap().to_string(),
        spare["id"].as_str().unwrap().to_string(),
    );
    let (ok, out) = cli(&s, &["keys", "revoke", &spare_id]);
    assert!(ok, "{out}");
    assert_eq!(s.admit(&spare_key, request("s1", "interactive", 1)).0, 401);
    assert!(s.stop().success());

    // Keys are kept as hashes: no key in the store's files.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for secret in [key.as_str(), CALLER, ADMIN, WORKER] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} found in {}",
                path.display()
            );
        }
    }

    // A restart with the same file keeps the store's tenants and keys.
    let s = Server::start(dir.path(), &config());
    assert_eq!(
        send(&s, "GET", "/v1/admin/tenants/initech", ADMIN, None).0,
        200
    );
    assert_eq!(requests_left(&s, "initech"), 5);
    assert_eq!(
        s.admit(&spare_key, request("s2", "interactive", 1)).0,
        401,
        "revoked stays revoked"
    );
    // The created key still acts for its tenant (the global limit is 2 calls in flight).
    let done = Some(json!({"result": "succeeded"}));
    let path = "/v1/operations/i1/complete";
    assert_eq!(send(&s, "POST", path, &key, done.clone()).0, 200);
    let (status, _, answer) = s.admit(&key, request("i3", "interactive", 10));
    assert_eq!(status, 200, "{answer}");

    // Once its work is done the tenant can be deleted; its caller keys go with it.
    for op in ["i2", "i3"] {
        let path = format!("/v1/operations/{op}/complete");
        assert_eq!(
            send(
                &s,
                "POST",
                &path,
                &key,
                Some(json!({"result": "succeeded"}))
            )
            .0,
            200
        );
    }
    let (ok, out) = cli(&s, &["tenants", "delete", "initech"]);
    assert!(ok, "{out}");
    assert!(out.contains(&id), "{out}");
    assert_eq!(s.admit(&key, request("i4", "interactive", 10)).0, 401);
    let (ok, out) = cli(&s, &["tenants", "list"]);
    assert!(ok && !out.contains("initech"), "{out}");

    // The last admin key cannot be revoked.
    let (status, answer) = revoke_the_admin_key(&s);
    assert_eq!(
        (status, answer["reason"].as_str()),
        (409, Some("owned_by_configuration")),
        "{answer}"
    );
    assert!(s.stop().success());
}

/// Revokes the (only) admin key through the API: the status and the answer.
fn revoke_the_admin_key(s: &Server) -> (u16, Value) {
    let admin_id = send(s, "GET", "/v1/admin/keys", ADMIN, None).1["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["role"] == "admin")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    send(
        s,
        "DELETE",
        &format!("/v1/admin/keys/{admin_id}"),
        ADMIN,
        None,
    )
}

fn tenant_config(s: &Server, name: &str) -> (u16, Value) {
    let (status, t) = send(s, "GET", &format!("/v1/admin/tenants/{name}"), ADMIN, None);
    (status, t["config"].clone())
}

/// What the file says is applied at every start: its tenants and keys are created, updated
/// and removed to match it and owned by it; tenants and keys made through the API are kept.
#[test]
fn the_file_is_applied_at_every_start_beside_what_the_api_made() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    // An API-made tenant with a key.
    let (status, _) = send(
        &s,
        "PUT",
        "/v1/admin/tenants/hooli",
        ADMIN,
        Some(json!({"requests": {"capacity": 4, "refill_per_s": 0}})),
    );
    assert_eq!(status, 200);
    let (ok, out) = cli(
        &s,
        &["keys", "create", "--role", "caller", "--tenant", "hooli"],
    );
    assert!(ok, "{out}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let hooli_key = made["key"].as_str().unwrap().to_string();
    // A file-owned tenant cannot be changed or deleted through the API.
    for (method, body) in [("PUT", Some(json!({"weight": 3}))), ("DELETE", None)] {
        let (status, answer) = send(&s, method, "/v1/admin/tenants/acme", ADMIN, body);
        assert_eq!(
            (status, answer["reason"].as_str()),
            (409, Some("owned_by_configuration")),
            "{method} {answer}"
        );
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains("tenant acme")),
            "{answer}"
        );
    }
    assert!(s.stop().success());

    // A tenant and key added to the file, another tenant changed: usable after a restart.
    let mut grown = config();
    grown["tenants"]["initech"] = json!({"requests": {"capacity": 7, "refill_per_s": 0}});
    grown["tenants"]["globex"] = json!({"requests": {"capacity": 3, "refill_per_s": 0}});
    grown["auth"]["callers"]["initech-key"] = json!("initech");
    let s = Server::start(dir.path(), &grown);
    let (status, _, answer) = s.admit("initech-key", request("n1", "interactive", 1));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(requests_left(&s, "initech"), 6);
    assert_eq!(tenant_config(&s, "globex").1["requests"]["capacity"], 3.0);
    // The API-made tenant and key survive.
    assert_eq!(tenant_config(&s, "hooli").0, 200);
    let (status, _, answer) = s.admit(&hooli_key, request("h1", "interactive", 1));
    assert_eq!(status, 200, "{answer}");
    let done = Some(json!({"result": "succeeded"}));
    for (key, op) in [("initech-key", "n1"), (hooli_key.as_str(), "h1")] {
        let path = format!("/v1/operations/{op}/complete");
        assert_eq!(send(&s, "POST", &path, key, done.clone()).0, 200);
    }
    assert!(s.stop().success());

    // Taken out of the file again: its tenant and key go; the API's stay.
    let s = Server::start(dir.path(), &config());
    assert_eq!(tenant_config(&s, "initech").0, 404);
    assert_eq!(
        s.admit("initech-key", request("n2", "interactive", 1)).0,
        401
    );
    assert_eq!(
        tenant_config(&s, "globex").1,
        json!({"requests": {"capacity": 1.0, "refill_per_s": 0.5}})
    );
    assert_eq!(tenant_config(&s, "hooli").0, 200);
    assert!(s.stop().success());

    // With `api_may_change_file_entries`, the API may change the file's entries until the
    // next start applies the file again; the last admin key is still never revoked.
    let mut open = config();
    open["api_may_change_file_entries"] = json!(true);
    let s = Server::start(dir.path(), &open);
    let (status, answer) = send(
        &s,
        "PUT",
        "/v1/admin/tenants/acme",
        ADMIN,
        Some(json!({"weight": 3})),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(tenant_config(&s, "acme").1, json!({"weight": 3}));
    let (status, answer) = revoke_the_admin_key(&s);
    assert_eq!(
        (status, answer["reason"].as_str()),
        (409, Some("last_admin_key"))
    );
    assert!(s.stop().success());
    let s = Server::start(dir.path(), &open);
    assert_eq!(tenant_config(&s, "acme").1, json!({}));
    assert!(s.stop().success());
}

/// A worker given as a bare key is named after the key's hash, never the key; claims an
/// earlier release recorded under the key itself are renamed when the directory is seeded,
/// so the worker still completes them.
#[test]
fn a_bare_key_worker_keeps_its_claims_from_an_earlier_release_under_a_name_that_is_not_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let now = now_ms();
    {
        // As an earlier release left it: a job claimed by the worker named by its key.
        let store = tollgate::store::SqliteStore::open(&db).unwrap();
        let mut engine_config = config();
        engine_config.as_object_mut().unwrap().remove("auth");
        let engine = common::engine_on(engine_config, store, "standard");
        let d = engine
            .admit(
                &common::request("acme", "job-1", "durable", 10, now + 600_000),
                now,
            )
            .unwrap();
        assert_eq!(d.outcome, tollgate::reason::Outcome::Queued, "{d:?}");
        let claimed = engine.dispatch(WORKER, 1, now).unwrap();
        assert_eq!(claimed.claimed.len(), 1);
    }
    let s = Server::start(dir.path(), &config());
    let (status, _, answer) = s.call(
        "POST",
        "/v1/operations/job-1/complete",
        Some(WORKER),
        Some(r#"{"tenant": "acme", "result": "succeeded"}"#),
    );
    assert_eq!(status, 200, "{answer}");
    let (_, keys) = send(&s, "GET", "/v1/admin/keys", ADMIN, None);
    let worker = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["role"] == "worker")
        .unwrap()
        .clone();
    let name = worker["name"].as_str().unwrap();
    assert!(name.starts_with("worker-") && name != WORKER, "{worker}");
    assert!(s.stop().success());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let holding: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM operations WHERE worker = ?1 OR record LIKE '%' || ?1 || '%'",
            [WORKER],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(holding, 0, "the worker's key is still in the operations");
    let named: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM operations WHERE worker = ?1",
            [name],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(named, 1);
}
