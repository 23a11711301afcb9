//! The disk under a SQLite store fills up: a 3 MB tmpfs, filled by another file while the
//! server admits. Every admission that cannot be written answers 503 `store_unavailable`
//! with a Retry-After (never 500), nothing of it is kept, every admission acknowledged is
//! in the store; `/healthz` answers 503 with the reason while the store cannot write,
//! `tollgate_store_write_failures_total{kind="disk_full"}` counts the failed writes, and
//! the log says so once, not once per request. Once there is room again `/healthz` is ok
//! by itself (no request needed) and admissions are accepted by the same process.
//!
//! The same on PostgreSQL, whose database lives in a tablespace on a tmpfs of its own: the
//! server answers 503 with the reason while PostgreSQL cannot extend its files, and recovers
//! by itself.
//!
//! It mounts a tmpfs, so it needs root (and PostgreSQL for the second test): `.ci/run` runs
//! it with `cargo test --release --test full_disk -- --ignored`.

mod common;

use common::server::{now_ms, Server};
use serde_json::json;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

const CALLER: &str = "acme-key";
const ADMIN: &str = "admin-key";

/// A tmpfs of `size` mounted at `dir`, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount -t tmpfs failed: this test needs root"
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the disk at `path` to the last byte, then gives back `leave` bytes.
fn fill(path: &std::path::Path, leave: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![7u8; 16 * 1024];
    let mut written = 0u64;
    while f.write_all(&chunk).is_ok() {
        written += chunk.len() as u64;
    }
    let _ = f.sync_all();
    f.set_len(written.saturating_sub(leave)).unwrap();
}

#[test]
#[ignore = "mounts a tmpfs (root only): .ci/run runs it with --ignored"]
fn a_full_disk_answers_503_keeps_nothing_half_written_and_recovers() {
    let dir = std::env::temp_dir().join(format!("tollgate-full-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let disk = Tmpfs::mount(&dir.join("disk"), "3m");
    let config = json!({
        "auth": {"callers": {CALLER: "acme"}, "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1000000, "refill_per_s": 0}, "concurrency": 1000000},
        "tenant_defaults": {"requests": {"capacity": 1000000, "refill_per_s": 0},
                            "tokens": {"capacity": 1000000000, "refill_per_s": 0}},
        "tenants": {"acme": {}},
    });
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let server = Server::start_via(&dir, &config, &disk.0.join("state.db"), |program| {
        let mut command = Command::new(program);
        command.stdout(std::process::Stdio::null()).stderr(log);
        command
    });
    // An admin GET: its status and its body as text.
    let get = |path: &str| {
        let (status, _, body) = server.call("GET", path, Some(ADMIN), None);
        let text = body
            .as_str()
            .map_or_else(|| body.to_string(), str::to_string);
        (status, text)
    };
    let filler = disk.0.join("filler");
    fill(&filler, 512 * 1024);
    let admit = |key: String| {
        let body = json!({"key": key, "route": "interactive", "input_tokens": 10,
                          "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000,
                          "labels": {"pad": "x".repeat(200)}});
        server.admit(CALLER, body)
    };
    // Admit until the store has refused 21 in a row. A write that fails can leave SQLite
    // room it had already taken (a rolled-back transaction's WAL frames), so a smaller
    // admission after a refusal may still fit: it is then acknowledged and must be kept.
    // Every refusal is a 503 with its reason and a Retry-After, never a 500.
    let (mut accepted, mut refusals, mut in_a_row) = (0u64, 0u64, 0u64);
    // Stretches of refusals: each is one change from writing to not writing.
    let mut stretches = 0usize;
    for i in 0..100_000 {
        let (status, retry_after, body) = admit(format!("k{i}"));
        match status {
            200 => {
                accepted += 1;
                in_a_row = 0;
            }
            503 => {
                assert_eq!(body["reason"], "store_unavailable", "{body}");
                assert!(retry_after.is_some(), "a 503 carries Retry-After");
                refusals += 1;
                in_a_row += 1;
                if in_a_row == 1 {
                    stretches += 1;
                }
                if in_a_row == 21 {
                    break;
                }
            }
            other => panic!("admission {i} answered {other}: {body}"),
        }
    }
    assert_eq!(in_a_row, 21, "the disk never filled ({accepted} accepted)");
    assert!(accepted > 0);
    let (status, health) = get("/healthz");
    assert_eq!(status, 503, "{health}");
    assert!(
        health.contains("store_unavailable") && health.contains("disk_full"),
        "{health}"
    );
    let (_, metrics) = get("/metrics");
    let failures = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_store_write_failures_total{kind=\"disk_full\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no disk_full failures in /metrics: {metrics}"));
    assert!(
        failures >= refusals,
        "{failures} failed writes counted, {refusals} refusals"
    );
    // Room again: healthy by itself, with no request to find it out.
    std::fs::remove_file(&filler).unwrap();
    let started = Instant::now();
    while get("/healthz").0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "/healthz not ok after the disk had room"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the same process admits; every acknowledged admission is kept.
    let (status, _, body) = admit("after".into());
    assert_eq!(status, 200, "{body}");
    let (status, _, inspect) = server.call("GET", "/v1/admin/inspect?limit=1", Some(ADMIN), None);
    assert_eq!(status, 200);
    // The refused admissions spent nothing: what is spent is what was acknowledged.
    assert_eq!(
        inspect["buckets"]["tenant.acme.requests"],
        1_000_000 - (accepted + 1),
        "{accepted} acknowledged"
    );
    assert_eq!(inspect["slots"]["global"], accepted + 1);
    assert!(server.stop().success());
    // One line each time the store stopped writing and one each time it wrote again, not
    // one per refused request (a sweep or a probe between two requests may make one more
    // change than the requests saw).
    let log = std::fs::read_to_string(&log_path).unwrap();
    let stopped = log.matches("the store cannot write").count();
    assert!(
        stopped >= stretches && stopped <= stretches + 2,
        "{stretches} stretches: {log}"
    );
    assert_eq!(
        log.matches("the store writes again").count(),
        stopped,
        "{log}"
    );
    drop(disk);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A PostgreSQL database whose tablespace is on a tmpfs of its own, dropped at the end.
struct FullDatabase {
    admin_url: String,
    name: String,
}

impl FullDatabase {
    fn create(location: &std::path::Path) -> FullDatabase {
        let admin_url = std::env::var("TOLLGATE_TEST_POSTGRES")
            .expect("TOLLGATE_TEST_POSTGRES names a PostgreSQL superuser URL");
        let name = format!("tollgate_full_{}", std::process::id());
        Command::new("chown")
            .args(["postgres:postgres"])
            .arg(location)
            .status()
            .unwrap();
        let mut c = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "CREATE TABLESPACE {name} LOCATION '{}'",
            location.display()
        ))
        .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name} TABLESPACE {name}"))
            .unwrap();
        FullDatabase { admin_url, name }
    }

    fn url(&self) -> String {
        let (base, _) = self.admin_url.rsplit_once('/').unwrap();
        format!("{base}/{}", self.name)
    }
}

impl Drop for FullDatabase {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin_url, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
            let _ = c.batch_execute(&format!("DROP TABLESPACE IF EXISTS {}", self.name));
        }
    }
}

#[test]
#[ignore = "mounts a tmpfs (root only) and needs PostgreSQL: .ci/run runs it with --ignored"]
fn a_full_postgres_tablespace_answers_503_and_recovers() {
    let dir = std::env::temp_dir().join(format!("tollgate-full-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let disk = Tmpfs::mount(&dir.join("disk"), "32m");
    let space = disk.0.join("space");
    std::fs::create_dir_all(&space).unwrap();
    let db = FullDatabase::create(&space);
    let config = json!({
        "auth": {"callers": {CALLER: "acme"}, "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1000000, "refill_per_s": 0}, "concurrency": 1000000},
        "tenant_defaults": {"requests": {"capacity": 1000000, "refill_per_s": 0},
                            "tokens": {"capacity": 1000000000, "refill_per_s": 0}},
        "tenants": {"acme": {}},
    });
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let url = db.url();
    let server = Server::start_via(&dir, &config, std::path::Path::new(&url), |program| {
        let mut command = Command::new(program);
        command.stdout(std::process::Stdio::null()).stderr(log);
        command
    });
    let filler = disk.0.join("filler");
    fill(&filler, 256 * 1024);
    let admit = |key: String| {
        let body = json!({"key": key, "route": "interactive", "input_tokens": 10,
                          "max_output_tokens": 10, "deadline_ms": now_ms() + 600_000,
                          "labels": {"a": "x".repeat(250), "b": "y".repeat(250)}});
        server.admit(CALLER, body)
    };
    let (mut accepted, mut refused) = (0u64, None);
    for i in 0..100_000 {
        let (status, retry_after, body) = admit(format!("k{i}"));
        match status {
            200 => accepted += 1,
            503 => {
                refused = Some((retry_after, body));
                break;
            }
            other => panic!("admission {i} answered {other}: {body}"),
        }
    }
    let (retry_after, body) = refused.expect("the tablespace never filled");
    println!("{accepted} admissions acknowledged before the tablespace was full");
    assert!(accepted > 0);
    assert_eq!(body["reason"], "store_unavailable", "{body}");
    assert!(retry_after.is_some(), "a 503 carries Retry-After");
    for i in 0..5 {
        let (status, _, body) = admit(format!("again{i}"));
        assert_eq!(status, 503, "{body}");
    }
    let (status, _, health) = server.call("GET", "/healthz", None, None);
    let health = health.to_string();
    assert_eq!(status, 503, "{health}");
    assert!(health.contains("disk_full"), "{health}");
    std::fs::remove_file(&filler).unwrap();
    let started = Instant::now();
    while server.call("GET", "/healthz", None, None).0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "/healthz not ok after the tablespace had room"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _, body) = admit("after".into());
    assert_eq!(status, 200, "{body}");
    let (_, _, inspect) = server.call("GET", "/v1/admin/inspect?limit=1", Some(ADMIN), None);
    assert_eq!(
        inspect["buckets"]["tenant.acme.requests"],
        1_000_000 - (accepted + 1),
        "{accepted} acknowledged"
    );
    assert!(server.stop().success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log.matches("the store cannot write").count(), 1, "{log}");
    assert_eq!(log.matches("the store writes again").count(), 1, "{log}");
    drop(db);
    drop(disk);
    let _ = std::fs::remove_dir_all(&dir);
}
