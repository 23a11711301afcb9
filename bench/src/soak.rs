//! `tollgate-bench soak`: the service under a steady mixed load for N minutes, watched for
//! what grows. The load is half the capacity measured first: interactive calls completed
//! with usage, durable jobs claimed and completed by a worker, a tenant past its budget, and
//! a policy swap every few minutes. Each minute it samples the server's memory (RSS), open
//! descriptors, admission latency (p50, p99), the store's and the WAL's size (finished
//! operations are kept three minutes, so the store must stay bounded); at the end it checks
//! the books (slots held equal the calls in flight; the spend ledger equals the completions
//! the server acknowledged) and says whether memory, latency and descriptors stayed flat.

use crate::http::start_serve;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const ADMIN: &str = "admin-key";
const WORKER: &str = "worker-key";
const TENANTS: u64 = 8;
/// Callers at once.
const CALLERS: usize = 16;
/// How long the soak's store keeps finished operations: three minutes.
const RETENTION_DAYS: f64 = 3.0 / (24.0 * 60.0);
/// Tokens each completion reports.
const USED_TOKENS: i64 = 140;

/// One minute's sample.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Minutes since the load began.
    pub minute: u64,
    /// The server's resident memory, in KiB.
    pub rss_kib: u64,
    /// The server's open descriptors.
    pub fds: u64,
    /// Admission latency over the minute, in ms.
    pub p50_ms: f64,
    /// The same, 99th percentile.
    pub p99_ms: f64,
    /// Calls (of every kind) answered in the minute.
    pub calls: u64,
    /// Answers that were neither the expected success nor the expected refusal.
    pub errors: u64,
    /// The store file's size, in bytes.
    pub store_bytes: u64,
    /// The WAL's size, in bytes.
    pub wal_bytes: u64,
}

/// What the soak found.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// Calls per second the load aimed at (half the measured capacity).
    pub rate_per_s: f64,
    /// Calls per second measured before the load.
    pub capacity_per_s: f64,
    /// One sample a minute.
    pub samples: Vec<Sample>,
    /// Memory in the last tenth within 10% of the first tenth after warm-up.
    pub rss_flat: bool,
    /// p99 latency likewise.
    pub p99_flat: bool,
    /// Open descriptors likewise.
    pub fds_flat: bool,
    /// The store stopped growing once retention began deleting: its size at the end within
    /// 25% of its size a minute after the first operations expired (true when the run is
    /// too short to tell).
    pub store_bounded: bool,
    /// Whether the server was still running at the end.
    pub server_alive: bool,
    /// Slots held equal the calls in flight, and the ledger equals the operations' usage.
    pub accounting_held: bool,
    /// What the accounting compared, in words.
    pub accounting: String,
}

fn config() -> serde_json::Value {
    let mut callers: serde_json::Map<String, serde_json::Value> = (0..TENANTS)
        .map(|t| (format!("key-{t}"), serde_json::json!(format!("t{t}"))))
        .collect();
    callers.insert("broke-key".into(), serde_json::json!("broke"));
    let mut tenants: serde_json::Map<String, serde_json::Value> = (0..TENANTS)
        .map(|t| (format!("t{t}"), serde_json::json!({})))
        .collect();
    tenants.insert(
        "broke".into(),
        serde_json::json!({"requests": {"limit": 5, "period": "day"}}),
    );
    serde_json::json!({
        "refund_unused_tokens": true,
        "auth": {"callers": callers, "workers": [WORKER], "admins": [ADMIN]},
        "global": {"requests": {"capacity": 1e12, "refill_per_s": 1e9}, "concurrency": 100000},
        "models": {"m": {"price_microusd_per_token": {"input": 1, "output": 2}}},
        "groups": {"all": {"budgets": {"cost_microusd": {"limit": 1e12, "period": "month"}}}},
        "tenant_defaults": {"requests": {"capacity": 1e12, "refill_per_s": 1e9},
                            "tokens": {"capacity": 1e12, "refill_per_s": 1e9},
                            "queue_limit": 100000, "group": "all"},
        "tenants": tenants,
        "scheduler": {"max_claims_per_worker": 100000},
        // Finished operations go after three minutes: the store must stay bounded.
        "retention": {"operations_days": RETENTION_DAYS}
    })
}

async fn call(
    http: &HttpClient,
    base: &str,
    method: &str,
    path: &str,
    key: &str,
    body: Vec<u8>,
) -> Result<(u16, Bytes), String> {
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = http.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
}

fn admission(key: &str, route: &str) -> Vec<u8> {
    serde_json::json!({"key": key, "route": route, "model": "m", "input_tokens": 100,
                       "max_output_tokens": 100, "deadline_ms": i64::MAX / 2})
    .to_string()
    .into_bytes()
}

const USAGE: &str = r#"{"result":"succeeded","usage":{"input_tokens":100,"output_tokens":40}}"#;

/// What the callers share: latencies of this minute, counters, the next ticket.
#[derive(Default)]
struct Tally {
    latencies: Mutex<Vec<f64>>,
    calls: AtomicU64,
    errors: AtomicU64,
    ticket: AtomicU64,
    /// Completions with usage the server acknowledged.
    completed: AtomicU64,
}

/// Asks to admit `key` on `route` for the tenant of key `caller`: the status.
async fn admit(
    http: &HttpClient,
    base: &str,
    caller: &str,
    key: &str,
    route: &str,
) -> Result<u16, String> {
    let body = admission(key, route);
    Ok(call(http, base, "POST", "/v1/admit", caller, body).await?.0)
}

/// Completes `key` with usage (`body`): whether the server acknowledged it.
async fn complete(
    http: &HttpClient,
    base: &str,
    caller: &str,
    key: &str,
    body: String,
    tally: &Tally,
) -> Result<bool, String> {
    let path = format!("/v1/operations/{key}/complete");
    let (status, _) = call(http, base, "POST", &path, caller, body.into_bytes()).await?;
    if status == 200 {
        tally.completed.fetch_add(1, Ordering::Relaxed);
    }
    Ok(status == 200)
}

/// One ticket of the mix: six in ten an interactive call completed with usage, two a
/// durable job, one the broke tenant (refused), one a worker's dispatch and completions.
async fn ticket(http: &HttpClient, base: &str, n: u64, tally: &Tally) -> Result<(), String> {
    let caller = format!("key-{}", n % TENANTS);
    let check = |ok: bool| {
        tally.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            tally.errors.fetch_add(1, Ordering::Relaxed);
        }
    };
    match n % 10 {
        0..=5 => {
            let key = format!("i{n}");
            let t = Instant::now();
            let status = admit(http, base, &caller, &key, "interactive").await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            tally.latencies.lock().unwrap().push(ms);
            check(status == 200);
            if status == 200 {
                check(complete(http, base, &caller, &key, USAGE.into(), tally).await?);
            }
        }
        6 | 7 => {
            let status = admit(http, base, &caller, &format!("d{n}"), "durable").await?;
            check(status == 202);
        }
        8 => {
            let status = admit(http, base, "broke-key", &format!("b{n}"), "interactive").await?;
            // Five a day, then refused by its period budget.
            check(status == 200 || status == 429);
        }
        _ => {
            let dispatch = br#"{"count":4}"#.to_vec();
            let (status, body) = call(http, base, "POST", "/v1/dispatch", WORKER, dispatch).await?;
            check(status == 200);
            let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            for job in answer["claimed"].as_array().into_iter().flatten() {
                let tenant = job["tenant"].as_str().unwrap_or("");
                let key = job["key"].as_str().unwrap_or("");
                let body = format!(
                    r#"{{"tenant":"{tenant}","result":"succeeded","usage":{{"input_tokens":100,"output_tokens":40}}}}"#
                );
                check(complete(http, base, WORKER, key, body, tally).await?);
            }
        }
    }
    Ok(())
}

/// Callers taking tickets at `rate` per second (0: as fast as they can) until `until`.
async fn drive(base: &str, rate: f64, until: Instant, tally: Arc<Tally>) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (base, tally) = (base.to_string(), tally.clone());
        tasks.spawn(async move {
            let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
            loop {
                let n = tally.ticket.fetch_add(1, Ordering::Relaxed);
                if rate > 0.0 {
                    let due = started + Duration::from_secs_f64(n as f64 / rate);
                    if due > until {
                        return;
                    }
                    tokio::time::sleep_until(due.into()).await;
                } else if Instant::now() > until {
                    return;
                }
                if ticket(&http, &base, n, &tally).await.is_err() {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

fn proc_value(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Whether the last tenth of `xs` (after the first, the warm-up) is within 10% of its first
/// tenth, by their means; for descriptors, a handful more is no trend.
fn flat(xs: &[f64], slack: f64) -> bool {
    let xs = if xs.len() > 2 { &xs[1..] } else { xs };
    let tenth = (xs.len() / 10).max(1);
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
    let (first, last) = (mean(&xs[..tenth]), mean(&xs[xs.len() - tenth..]));
    last <= first * 1.10 + slack
}

/// The books at the end, read from the store: the global slots held against the operations
/// in flight, and the spend ledger against the completions with usage the server
/// acknowledged (the operations themselves go after retention; the ledger stays).
fn accounting(db: &Path, completed: i64) -> Result<(bool, String), String> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| e.to_string())?;
    let one = |sql: &str| -> Result<i64, String> {
        c.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
            .map(|n| n.unwrap_or(0))
            .map_err(|e| format!("{sql}: {e}"))
    };
    let slots = one("SELECT in_use FROM slots WHERE scope = 'global'")?;
    let in_flight = one("SELECT COUNT(*) FROM operations WHERE state IN ('active', 'unknown')")?;
    let ledger_calls = one("SELECT SUM(calls) FROM spend")?;
    let ledger_tokens = one("SELECT SUM(input_tokens + output_tokens) FROM spend")?;
    let held =
        slots == in_flight && ledger_calls == completed && ledger_tokens == completed * USED_TOKENS;
    Ok((
        held,
        format!(
            "slots held {slots}, calls in flight {in_flight}; ledger {ledger_calls} calls and {ledger_tokens} tokens, {completed} completions acknowledged"
        ),
    ))
}

/// Runs the soak: capacity first, then `minutes` of load at half of it (or `rate`).
pub fn soak(
    serve: &Path,
    dir: &Path,
    minutes: u64,
    rate: Option<f64>,
    mut each_minute: impl FnMut(&Sample),
) -> Result<SoakReport, String> {
    let (mut server, addr) = start_serve(serve, dir, &config())?;
    let pid = server.0.id();
    let base = format!("http://{addr}");
    let db = dir.join("http.db");
    let wal = dir.join("http.db-wal");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let standard = tollgate::runtime::builtin::get("standard").ok_or("no standard policy")?;
    rt.block_on(async {
        // Capacity: the same mix, as fast as the callers can, for ten seconds.
        let probe = Arc::new(Tally::default());
        let t = Instant::now();
        drive(
            &base,
            0.0,
            Instant::now() + Duration::from_secs(10),
            probe.clone(),
        )
        .await;
        let capacity = probe.calls.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64();
        // Tickets per second: a ticket is about 1.5 calls.
        let rate = rate.unwrap_or(capacity / 2.0 / 1.5);
        let tally = Arc::new(Tally {
            ticket: AtomicU64::new(probe.ticket.load(Ordering::Relaxed)),
            ..Tally::default()
        });
        let until = Instant::now() + Duration::from_secs(minutes * 60);
        let load = tokio::spawn({
            let (base, tally) = (base.clone(), tally.clone());
            async move { drive(&base, rate, until, tally).await }
        });
        let admin: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let swap_every = (minutes / 5).clamp(1, 5);
        let mut samples = Vec::new();
        for minute in 1..=minutes {
            tokio::time::sleep_until((until - Duration::from_secs((minutes - minute) * 60)).into())
                .await;
            if minute % swap_every == 0 && minute < minutes {
                let _ = call(
                    &admin,
                    &base,
                    "PUT",
                    "/v1/admin/policy",
                    ADMIN,
                    standard.to_vec(),
                )
                .await;
            }
            let mut latencies = std::mem::take(&mut *tally.latencies.lock().unwrap());
            latencies.sort_by(|a, b| a.total_cmp(b));
            let sample = Sample {
                minute,
                rss_kib: proc_value(pid, "VmRSS:"),
                fds: open_fds(pid),
                p50_ms: percentile(&latencies, 0.5),
                p99_ms: percentile(&latencies, 0.99),
                calls: tally.calls.swap(0, Ordering::Relaxed),
                errors: tally.errors.swap(0, Ordering::Relaxed),
                store_bytes: file_size(&db),
                wal_bytes: file_size(&wal),
            };
            each_minute(&sample);
            samples.push(sample);
        }
        let _ = load.await;
        // The last completions are committed by the writer's next batches.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let alive = matches!(server.0.try_wait(), Ok(None));
        let completed =
            probe.completed.load(Ordering::Relaxed) + tally.completed.load(Ordering::Relaxed);
        let (accounting_held, accounting) = accounting(&db, completed as i64)?;
        let col = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
        Ok(SoakReport {
            rate_per_s: rate * 1.5,
            capacity_per_s: capacity,
            rss_flat: flat(&col(|s| s.rss_kib as f64), 0.0),
            p99_flat: flat(&col(|s| s.p99_ms), 0.0),
            fds_flat: flat(&col(|s| s.fds as f64), 4.0),
            store_bounded: samples
                .get(3)
                .zip(samples.last())
                .is_none_or(|(settled, last)| {
                    last.store_bytes as f64 <= settled.store_bytes as f64 * 1.25
                }),
            server_alive: alive,
            accounting_held,
            accounting,
            samples,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::flat;

    #[test]
    fn flat_compares_the_last_tenth_with_the_first_after_warm_up() {
        // The first sample is warm-up and left out.
        assert!(flat(&[500.0, 100.0, 101.0, 105.0, 109.0], 0.0));
        assert!(!flat(&[100.0, 100.0, 100.0, 100.0, 115.0], 0.0));
        assert!(flat(&[20.0, 20.0, 22.0], 4.0));
        let growing: Vec<f64> = (0..60).map(|m| 100.0 + m as f64).collect();
        assert!(!flat(&growing, 0.0));
    }
}
