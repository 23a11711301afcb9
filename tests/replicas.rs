//! Many replicas, one authority: two `tollgate serve` processes on one PostgreSQL database,
//! concurrent clients spread over both. The tenant's bucket, the concurrency limit and the
//! operation keys hold across replicas, and workers on different replicas never claim the
//! same job.
//!
//! These tests need a PostgreSQL server: `.ci/run` installs and starts one and runs them with
//! `TOLLGATE_TEST_POSTGRES` set to a superuser URL (`cargo test --release --test replicas --
//! --ignored`).

mod common;

use common::pg::{server_url, Database};
use common::server::{now_ms, post, Server};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::Path;

const CALLER: &str = "acme-key";
const SLOTTY: &str = "slotty-key";
const ADMIN: &str = "admin-key";

/// A replica: `tollgate serve` on the shared database, with the replicas' configuration.
fn replica(dir: &Path, n: usize, db: &str) -> Server {
    let config = json!({
        "auth": {"callers": {CALLER: "acme", SLOTTY: "slotty"}, "workers": ["w1", "w2"], "admins": [ADMIN]},
        "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 1000},
        "tenant_defaults": {"tokens": {"capacity": 1e9, "refill_per_s": 0}, "queue_limit": 1000},
        "tenants": {
            "acme": {"requests": {"capacity": 50, "refill_per_s": 0}},
            "slotty": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 3}
        },
        "scheduler": {"max_claims_per_worker": 1000}
    });
    Server::start_on(dir, &format!("replica-{n}"), &config, db, &[])
}

fn admit(base: &str, key: &str, op: &str, route: &str) -> (u16, Value) {
    let deadline = now_ms() + 600_000;
    let body = json!({"key": op, "route": route, "input_tokens": 10, "max_output_tokens": 10, "deadline_ms": deadline});
    post(base, "/v1/admit", key, &body)
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn budgets_slots_and_keys_hold_across_replicas() {
    let db = Database::create("budgets");
    let dir = tempfile::tempdir().unwrap();
    let replicas = [
        replica(dir.path(), 1, &db.url()),
        replica(dir.path(), 2, &db.url()),
    ];
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();

    // 8 clients over both replicas: unique keys (completed at once) and shared keys.
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let bases = bases.clone();
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                for i in 0..20 {
                    let base = &bases[(c + i) % 2];
                    for op in [format!("c{c}-{i}"), format!("shared-{i}")] {
                        let (status, body) = admit(base, CALLER, &op, "interactive");
                        if body["outcome"] == "accepted" {
                            accepted.push(op.clone());
                            let done = json!({"result": "succeeded"});
                            assert_eq!(
                                post(
                                    base,
                                    &format!("/v1/operations/{op}/complete"),
                                    CALLER,
                                    &done
                                )
                                .0,
                                200
                            );
                        } else {
                            assert!(matches!(status, 200 | 409 | 429), "{status} {body}");
                        }
                    }
                }
                accepted
            })
        })
        .collect();
    let accepted: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let unique: HashSet<&String> = accepted.iter().collect();
    assert_eq!(
        unique.len(),
        accepted.len(),
        "an operation key was accepted twice"
    );
    assert_eq!(
        accepted.len(),
        50,
        "exactly the tenant's bucket was admitted, across both replicas"
    );

    // Concurrency: a tenant limit of 3 holds across replicas.
    let slot_clients: Vec<_> = (0..6)
        .map(|c| {
            let base = bases[c % 2].clone();
            std::thread::spawn(move || {
                (0..10)
                    .filter(|i| admit(&base, SLOTTY, &format!("s{c}-{i}"), "interactive").0 == 200)
                    .count()
            })
        })
        .collect();
    let held: usize = slot_clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(held, 3);
    let view = ureq::get(&format!("{}/v1/admin/inspect", bases[0]))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let view: Value = serde_json::from_str(&view).unwrap();
    assert_eq!(view["slots"]["tenant.slotty"], 3);
    assert_eq!(view["buckets"]["tenant.acme.requests"], 0);
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn workers_on_different_replicas_never_claim_the_same_job() {
    let db = Database::create("dispatch");
    let dir = tempfile::tempdir().unwrap();
    let replicas = [
        replica(dir.path(), 1, &db.url()),
        replica(dir.path(), 2, &db.url()),
    ];
    for i in 0..40 {
        let (status, _) = admit(
            &replicas[i % 2].base,
            SLOTTY,
            &format!("job-{i}"),
            "durable",
        );
        assert_eq!(status, 202);
    }
    let workers: Vec<_> = [
        ("w1", replicas[0].base.clone()),
        ("w2", replicas[1].base.clone()),
    ]
    .into_iter()
    .map(|(w, base)| {
        std::thread::spawn(move || {
            let mut claimed = Vec::new();
            for _ in 0..40 {
                let (status, body) = post(&base, "/v1/dispatch", w, &json!({"count": 1}));
                assert_eq!(status, 200);
                for c in body["claimed"].as_array().unwrap() {
                    let key = c["key"].as_str().unwrap().to_string();
                    let done = json!({"tenant": "slotty", "result": "succeeded"});
                    assert_eq!(
                        post(&base, &format!("/v1/operations/{key}/complete"), w, &done).0,
                        200
                    );
                    claimed.push(key);
                }
            }
            claimed
        })
    })
    .collect();
    let claimed: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let unique: HashSet<&String> = claimed.iter().collect();
    assert_eq!(unique.len(), claimed.len(), "a job was claimed twice");
    assert_eq!(claimed.len(), 40, "every job was claimed once");
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn a_failing_job_in_a_batch_rolls_back_alone_on_postgres() {
    let db = Database::create("batch");
    let mut store = tollgate::store::PgStore::open(&db.url()).unwrap();
    let (answers, calls) = common::batch_with_a_failing_job(&mut store);
    // Run together up to the failure (rolled back), then job by job.
    assert_eq!(calls, 3 + 4);
    assert_eq!(answers, vec![Some(0), Some(1), None, Some(2)]);
    let (n, jobs) = common::batch_left(&mut store);
    assert_eq!(n, Some(3));
    let done = Some("done".to_string());
    assert_eq!(jobs, vec![done.clone(), done.clone(), None, done]);
}

/// A database written by the release before dispatch bands (schema version 1: a queue
/// without priorities) opens in this one, upgraded in place, and its queued job is claimed.
#[test]
#[ignore = "needs PostgreSQL: run by .ci/run with TOLLGATE_TEST_POSTGRES"]
fn a_queue_written_before_priority_bands_is_upgraded_and_its_jobs_claimed() {
    use tollgate::store::{PgStore, Store};
    let db = Database::create("upgrade");
    let config = json!({"tenants": {"acme": {}}});
    let queued = common::request("acme", "old-job", "durable", 10, i64::MAX);
    {
        let engine = common::engine_on(
            config.clone(),
            PgStore::open(&db.url()).unwrap(),
            "standard",
        );
        assert_eq!(engine.admit(&queued, 0).unwrap().http, 202);
    }
    // What the earlier release left: no `priority` column, no band index, version 1.
    let mut c = postgres::Client::connect(&db.url(), postgres::NoTls).unwrap();
    c.batch_execute(
        "DROP INDEX queue_by_band; ALTER TABLE queue DROP COLUMN priority;
         UPDATE meta SET value = '1' WHERE name = 'schema_version'",
    )
    .unwrap();
    let mut store = PgStore::open(&db.url()).unwrap();
    let version: String = c
        .query_one("SELECT value FROM meta WHERE name = 'schema_version'", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, "3");
    let depth = store.transaction(|tx| tx.queue_depth("acme")).unwrap();
    assert_eq!(depth, 1);
    let engine = common::engine_on(config, store, "standard");
    // A retry of the same request is the same operation.
    assert_eq!(
        engine.admit(&queued, 1).unwrap().outcome.as_str(),
        "duplicate_active"
    );
    let claimed = engine.dispatch("w1", 1, 2).unwrap();
    assert_eq!(claimed.claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed.claimed[0].key, "old-job");
}

/// GETs `path` on `base` as the admin: the status and the JSON answer.
fn get(base: &str, path: &str) -> (u16, Value) {
    let r = match ureq::get(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
    {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    (
        r.status(),
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

/// PUTs a built-in policy module to `base` + `path` as the admin: the status.
fn put_policy(base: &str, path: &str, name: &str) -> u16 {
    match ureq::put(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .send_bytes(&common::policy_bytes(name))
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{path}: {e}"),
    }
}

/// Polls `base` + `path` until `field` of the answer (a JSON pointer) is `want`.
fn eventually(base: &str, path: &str, field: &str, want: &str) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(5) {
        if get(base, path).1.pointer(field).and_then(Value::as_str) == Some(want) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// A swap, a shadow and a rollback made through one replica are every replica's within a
/// moment (idle replicas included), and a replica started later takes them from the store.
#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn a_policy_change_through_one_replica_is_every_replicas() {
    let db = Database::create("policy");
    let dir = tempfile::tempdir().unwrap();
    let a = replica(dir.path(), 1, &db.url());
    let b = replica(dir.path(), 2, &db.url());
    assert_eq!(get(&b.base, "/v1/admin/policy").1["name"], "standard");

    assert_eq!(put_policy(&a.base, "/v1/admin/policy", "deny-all"), 200);
    assert!(
        eventually(&b.base, "/v1/admin/policy", "/name", "deny-all"),
        "the swap through A did not reach B"
    );
    let (status, body) = admit(&b.base, CALLER, "after-swap", "interactive");
    assert_eq!((status, body["reason"].as_str()), (503, Some("overloaded")));

    assert_eq!(
        put_policy(&b.base, "/v1/admin/policy/shadow", "standard"),
        200
    );
    assert!(
        eventually(
            &a.base,
            "/v1/admin/policy/shadow",
            "/policy/name",
            "standard"
        ),
        "the shadow installed through B did not reach A"
    );

    // Rollback through B: A goes back too.
    let (status, back) = post(&b.base, "/v1/admin/policy/rollback", ADMIN, &json!({}));
    assert_eq!((status, back["name"].as_str()), (200, Some("standard")));
    assert!(
        eventually(&a.base, "/v1/admin/policy", "/name", "standard"),
        "the rollback through B did not reach A"
    );
    let (status, body) = admit(&a.base, CALLER, "after-rollback", "interactive");
    assert_eq!(status, 200, "{body}");

    // A replica started now takes the store's state, shadow included.
    let c = replica(dir.path(), 3, &db.url());
    assert_eq!(
        get(&c.base, "/v1/admin/policy/shadow").1["policy"]["name"],
        "standard"
    );
    let removed = ureq::delete(&format!("{}/v1/admin/policy/shadow", c.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap();
    assert_eq!(removed.status(), 200);
    let started = std::time::Instant::now();
    while get(&a.base, "/v1/admin/policy/shadow").0 != 404 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the shadow removed through C stayed on A"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Admits `op` on `base` with `key` until the status is `want` (a directory change reaching
/// a replica), for at most a second.
fn admitted_within_a_second(base: &str, key: &str, op: &str, want: u16) -> bool {
    let started = std::time::Instant::now();
    let mut n = 0;
    while started.elapsed() < std::time::Duration::from_millis(1000) {
        n += 1;
        if admit(base, key, &format!("{op}-{n}"), "interactive").0 == want {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// The done-when of the shared directory: a swap, a new tenant and a revoked key through
/// replica A take effect on replica B within a second, and a restart of B keeps all three.
#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn a_tenant_and_a_key_made_through_one_replica_work_on_another() {
    let db = Database::create("directory");
    let dir = tempfile::tempdir().unwrap();
    let a = replica(dir.path(), 1, &db.url());
    let b = replica(dir.path(), 2, &db.url());

    let (status, _) = put_json(
        &a.base,
        "/v1/admin/tenants/initech",
        &json!({"requests": {"capacity": 100, "refill_per_s": 0}}),
    );
    assert_eq!(status, 200);
    let (status, made) = post(
        &a.base,
        "/v1/admin/keys",
        ADMIN,
        &json!({"role": "caller", "tenant": "initech"}),
    );
    assert_eq!(status, 200, "{made}");
    let key = made["key"].as_str().unwrap().to_string();
    assert!(
        admitted_within_a_second(&b.base, &key, "new", 200),
        "the tenant and key made through A did not work on B within a second"
    );

    // Revoke a key made through A, through A: B refuses it within a second. (A key the
    // configuration file owns cannot be revoked through the API.)
    let (status, spare) = post(
        &a.base,
        "/v1/admin/keys",
        ADMIN,
        &json!({"role": "caller", "tenant": "initech"}),
    );
    assert_eq!(status, 200, "{spare}");
    let spare_key = spare["key"].as_str().unwrap().to_string();
    let spare_id = spare["id"].as_str().unwrap().to_string();
    let revoked = ureq::delete(&format!("{}/v1/admin/keys/{spare_id}", a.base))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .call()
        .unwrap();
    assert_eq!(revoked.status(), 200);
    assert!(
        admitted_within_a_second(&b.base, &spare_key, "revoked", 401),
        "the key revoked through A still worked on B after a second"
    );

    // And a swap through A.
    assert_eq!(put_policy(&a.base, "/v1/admin/policy", "deny-all"), 200);
    assert!(
        eventually(&b.base, "/v1/admin/policy", "/name", "deny-all"),
        "the swap through A did not reach B"
    );

    // B restarted keeps all three.
    drop(b);
    let b = replica(dir.path(), 2, &db.url());
    assert_eq!(get(&b.base, "/v1/admin/policy").1["name"], "deny-all");
    assert_eq!(
        admit(&b.base, &spare_key, "after-restart", "interactive").0,
        401
    );
    let (status, body) = admit(&b.base, &key, "after-restart", "interactive");
    assert_eq!(
        (status, body["reason"].as_str()),
        (503, Some("overloaded")),
        "the new tenant's key is known (and deny-all decides): {body}"
    );
}

/// PUTs JSON to `base` + `path` as the admin: the status and the answer.
fn put_json(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = match ureq::put(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {ADMIN}"))
        .send_string(&body.to_string())
    {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path}: {e}"),
    };
    (
        r.status(),
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

/// Whether the connection named `app` (its `application_name`) uses TLS, as the server sees it.
fn uses_tls(app: &str) -> Option<bool> {
    let mut admin = postgres::Client::connect(&server_url(), postgres::NoTls).unwrap();
    admin
        .query_opt(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = $1 LIMIT 1",
            &[&app],
        )
        .unwrap()
        .map(|r| r.get(0))
}

/// `sslmode` as libpq reads it: plain without it; `require` encrypts; `verify-full` checks
/// the server's certificate (here the cluster's self-signed one, given as `sslrootcert`)
/// and its host name, and refuses a certificate it cannot check.
#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn the_database_connection_uses_tls_as_sslmode_asks() {
    use tollgate::store::PgStore;
    let mut admin = postgres::Client::connect(&server_url(), postgres::NoTls).unwrap();
    let ssl: String = admin.query_one("SHOW ssl", &[]).unwrap().get(0);
    assert_eq!(ssl, "on", "the test cluster serves TLS (Debian's default)");
    let cert: String = admin.query_one("SHOW ssl_cert_file", &[]).unwrap().get(0);
    let db = Database::create("tls");
    let url = db.url();
    let with = |query: &str| format!("{url}?{query}");

    let plain = PgStore::open(&with("application_name=tg_plain")).unwrap();
    assert_eq!(uses_tls("tg_plain"), Some(false));
    drop(plain);

    let required = PgStore::open(&with("application_name=tg_require&sslmode=require")).unwrap();
    assert_eq!(uses_tls("tg_require"), Some(true));
    // The store works over it.
    let engine = common::engine_on(json!({"tenants": {"acme": {}}}), required, "standard");
    let d = engine
        .admit(
            &common::request("acme", "k1", "interactive", 10, i64::MAX),
            0,
        )
        .unwrap();
    assert_eq!(d.outcome, tollgate::reason::Outcome::Accepted);
    drop(engine);

    // verify-full: the self-signed certificate is not among Mozilla's roots.
    let local = url.replace("127.0.0.1", "localhost");
    let refused = PgStore::open(&format!("{local}?sslmode=verify-full"));
    let err = refused
        .err()
        .expect("an unverifiable certificate is refused")
        .to_string();
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("tls"),
        "{err}"
    );
    // Given as the root, it verifies for the name it carries (localhost).
    let verified = PgStore::open(&format!(
        "{local}?application_name=tg_verified&sslmode=verify-full&sslrootcert={cert}"
    ))
    .unwrap();
    assert_eq!(uses_tls("tg_verified"), Some(true));
    drop(verified);
    // The same certificate does not name 127.0.0.1.
    assert!(PgStore::open(&with(&format!("sslmode=verify-full&sslrootcert={cert}"))).is_err());
}

/// Adds one to bucket `b` in a batch of `jobs` on `store`, naming `b` up front or not; with
/// how many times the jobs ran (more than `jobs` when the batch was run again).
fn add_one(
    store: &mut tollgate::store::PgStore,
    named: bool,
    jobs: usize,
    inside: impl Fn(),
) -> usize {
    use tollgate::store::{Prefetch, Store};
    let hint = Prefetch {
        buckets: if named { vec!["b".into()] } else { Vec::new() },
        complete: true,
        ..Prefetch::default()
    };
    let mut calls = 0;
    let results = store
        .transaction_batch(jobs, &hint, |_, tx| {
            calls += 1;
            let mut s = tx.bucket("b")?.unwrap_or(tollgate::bucket::State {
                balance_micro: 0,
                updated_ms: 0,
            });
            inside();
            s.balance_micro += 1;
            tx.set_bucket("b", s)
        })
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    calls
}

fn balance(store: &mut tollgate::store::PgStore) -> i64 {
    use tollgate::store::Store;
    store
        .transaction(|tx| tx.bucket("b"))
        .unwrap()
        .map_or(0, |s| s.balance_micro)
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn batches_of_two_replicas_lock_rows_not_the_store_and_lose_no_update() {
    use std::sync::{Arc, Barrier};
    let db = Database::create("rowlocks");
    let url = db.url();
    // Two connections adding to one row at once, named up front or reached unnamed: every
    // addition lands.
    let adders: Vec<_> = (0..2)
        .map(|c| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut store = tollgate::store::PgStore::open(&url).unwrap();
                for i in 0..150 {
                    add_one(&mut store, (i + c) % 3 != 0, 2, || {});
                }
            })
        })
        .collect();
    for a in adders {
        a.join().unwrap();
    }
    let mut store = tollgate::store::PgStore::open(&url).unwrap();
    assert_eq!(balance(&mut store), 2 * 150 * 2);

    // A batch that reaches a row another replica's batch holds, without having named it,
    // does not wait out of order: it is undone and run again with the store to itself,
    // after the holder commits.
    let holding = Arc::new(Barrier::new(2));
    let holder = {
        let (url, holding) = (url.clone(), holding.clone());
        std::thread::spawn(move || {
            let mut store = tollgate::store::PgStore::open(&url).unwrap();
            add_one(&mut store, true, 1, || {
                holding.wait();
                std::thread::sleep(std::time::Duration::from_millis(300));
            })
        })
    };
    holding.wait();
    let calls = add_one(&mut store, false, 1, || {});
    assert_eq!(holder.join().unwrap(), 1);
    assert_eq!(calls, 2, "the unnamed batch ran again once, alone");
    assert_eq!(balance(&mut store), 2 * 150 * 2 + 2);
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn a_batch_reads_the_databases_clock_once_with_its_rows() {
    use tollgate::store::{Prefetch, Store};
    let db = Database::create("clock");
    let mut store = tollgate::store::PgStore::open(&db.url()).unwrap();
    let hint = Prefetch {
        complete: true,
        ..Prefetch::default()
    };
    let before = now_ms();
    let seen = store
        .transaction_batch(3, &hint, |_, tx| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            tx.store_now_ms()
        })
        .unwrap();
    let seen: Vec<i64> = seen.into_iter().map(|t| t.unwrap().unwrap()).collect();
    assert!(
        seen.iter().all(|t| *t == seen[0]),
        "one time for the batch: {seen:?}"
    );
    // The test and the database share this machine's clock.
    assert!(
        (seen[0] - before).abs() < 2_000,
        "{} against {before}",
        seen[0]
    );
}

/// One chat completion through a replica's gateway: its status and the deployment header.
fn chat(base: &str, model: &str) -> (u16, Option<String>) {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let answer = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Authorization", &format!("Bearer {CALLER}"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let response = match answer {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let deployment = response.header("x-tollgate-deployment").map(str::to_string);
    (response.status(), deployment)
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs this with --ignored"]
fn two_replicas_sharing_deployments_never_send_a_provider_past_its_limit() {
    let db = Database::create("deployments");
    let dir = tempfile::tempdir().unwrap();
    // Two accounts of 40 and 20 requests a minute, each refusing more with OpenAI's 429.
    let stubs = [
        common::stub::Stub::limited(40),
        common::stub::Stub::limited(20),
    ];
    let config = json!({
        "auth": {"callers": {CALLER: "acme"}, "admins": [ADMIN]},
        "global": {"requests": {"capacity": 100000, "refill_per_s": 0}, "concurrency": 1000},
        "tenant_defaults": {"requests": {"capacity": 100000, "refill_per_s": 0},
                            "tokens": {"capacity": 1e9, "refill_per_s": 0}},
        "tenants": {"acme": {}},
        // Refused at once past the budgets (a call would otherwise wait for their refill):
        // what is counted here is the budgets used whole and no more.
        "waiting": {"enabled": false},
        "gateway": {
            "upstreams": {"big": {"base_url": stubs[0].base_url()},
                          "small": {"base_url": stubs[1].base_url()}},
            "models": {"m": {"default_max_output_tokens": 16, "deployments": [
                {"name": "big", "upstream": "big",
                 "requests": {"capacity": 40, "refill_per_s": 40.0 / 60.0}},
                {"name": "small", "upstream": "small",
                 "requests": {"capacity": 20, "refill_per_s": 20.0 / 60.0}}]}},
        }
    });
    let replicas = [
        Server::start_on(dir.path(), "replica-1", &config, &db.url(), &[]),
        Server::start_on(dir.path(), "replica-2", &config, &db.url(), &[]),
    ];
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let base = bases[c % 2].clone();
            std::thread::spawn(move || (0..12).map(|_| chat(&base, "m")).collect::<Vec<_>>())
        })
        .collect();
    let answers: Vec<(u16, Option<String>)> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let (big, small) = (stubs[0].stats(), stubs[1].stats());
    // Neither provider was asked past its limit, from either replica.
    assert_eq!(big["refused"], 0, "{big}");
    assert_eq!(small["refused"], 0, "{small}");
    let served = answers.iter().filter(|(s, _)| *s == 200).count() as u64;
    assert_eq!(
        served,
        big["served"].as_u64().unwrap() + small["served"].as_u64().unwrap()
    );
    // Both accounts' whole budgets were used, no more (a few refills while the test runs).
    assert!((60..=66).contains(&served), "{served} served");
    for (status, _) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 429);
    }
}
