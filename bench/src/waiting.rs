//! The waiting room at rest: `tollgate serve` with its one global slot taken, then N calls
//! that ask to wait (`POST /v1/admit` with `max_wait_ms`), each on a connection of its own.
//! Measured: the server's resident memory per waiting call (before and after they wait),
//! and its CPU while they wait and nothing changes (none is spent by design: nothing runs
//! until something frees). Then the slot is freed and the waiters are let go.

use crate::http::{cpu_ticks, start_serve};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Clock ticks per second on Linux.
const USER_HZ: f64 = 100.0;

/// What the benchmark found.
#[derive(Debug, Serialize)]
pub struct WaitingFigures {
    /// Calls waiting at once.
    pub waiters: usize,
    /// The server's resident memory before they came, KiB.
    pub rss_before_kib: u64,
    /// And once they all waited, KiB.
    pub rss_waiting_kib: u64,
    /// The difference over the waiters, bytes: each waits on a connection of its own, whose
    /// buffers and task count here with the call's handler, job, reply watcher and place
    /// in the room.
    pub bytes_per_waiter: f64,
    /// How long the CPU was watched while they waited, s.
    pub watched_s: f64,
    /// The server's CPU over that time, as a share of one core.
    pub cpu_share_while_waiting: f64,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The calls waiting now, as `/metrics` counts them (admin key).
fn waiting_now(addr: SocketAddr) -> Result<u64, String> {
    let (status, body) = exchange(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: b\r\nAuthorization: Bearer admin-key\r\nConnection: close\r\n\r\n",
    )?;
    if status != 200 {
        return Err(format!("/metrics answered {status}"));
    }
    Ok(body
        .lines()
        .filter(|l| l.starts_with("tollgate_waiting_calls{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// One request on a connection of its own; the status and the body.
fn exchange(addr: SocketAddr, request: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// An admission request for `key`, waiting up to `max_wait_ms` when given; `close` asks
/// the server to close the connection after its answer.
fn admit(key: &str, max_wait_ms: Option<u64>, close: bool) -> String {
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        + 3_600_000;
    let wait = max_wait_ms.map_or(String::new(), |ms| format!(",\"max_wait_ms\":{ms}"));
    let body = format!(
        "{{\"key\":\"{key}\",\"route\":\"interactive\",\"input_tokens\":10,\"max_output_tokens\":10,\"deadline_ms\":{deadline}{wait}}}"
    );
    format!(
        "POST /v1/admit HTTP/1.1\r\nHost: b\r\nAuthorization: Bearer caller-key\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// Runs the benchmark with `waiters` waiting calls, watching the CPU for `watch`.
pub fn waiting(
    serve: &Path,
    dir: &Path,
    waiters: usize,
    watch: Duration,
) -> Result<WaitingFigures, String> {
    let config = serde_json::json!({
        "auth": {"callers": {"caller-key": "t"}, "admins": ["admin-key"]},
        "global": {"requests": {"capacity": 1e9, "refill_per_s": 0}, "concurrency": 1},
        "tenant_defaults": {"requests": {"capacity": 1e9, "refill_per_s": 0},
                            "tokens": {"capacity": 1e12, "refill_per_s": 0}},
        "tenants": {"t": {}},
        "limits": {"max_connections": waiters + 64},
        "waiting": {"max_wait_ms": 600000, "per_tenant": waiters + 1, "total": waiters + 1},
    });
    let (server, addr) = start_serve(serve, dir, &config)?;
    let pid = server.0.id();
    let (status, body) = exchange(addr, &admit("hold", None, true))?;
    if status != 200 {
        return Err(format!("the first call was not admitted: {status} {body}"));
    }
    // Let the server settle (instances made ahead, first sweeps) before measuring.
    std::thread::sleep(Duration::from_secs(2));
    let rss_before_kib = rss_kib(pid);
    let mut connections = Vec::with_capacity(waiters);
    for n in 0..waiters {
        let mut s = TcpStream::connect(addr).map_err(|e| format!("connection {n}: {e}"))?;
        s.write_all(admit(&format!("w{n}"), Some(600_000), false).as_bytes())
            .map_err(|e| e.to_string())?;
        connections.push(s);
    }
    let started = Instant::now();
    while waiting_now(addr)? < waiters as u64 {
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "only {} of {waiters} calls waiting after two minutes",
                waiting_now(addr)?
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let rss_waiting_kib = rss_kib(pid);
    let before = cpu_ticks(pid, None).ok_or("no CPU figures for the server")?;
    let watching = Instant::now();
    std::thread::sleep(watch);
    let after = cpu_ticks(pid, None).ok_or("no CPU figures for the server")?;
    let watched_s = watching.elapsed().as_secs_f64();
    drop(connections);
    drop(server);
    Ok(WaitingFigures {
        waiters,
        rss_before_kib,
        rss_waiting_kib,
        bytes_per_waiter: (rss_waiting_kib.saturating_sub(rss_before_kib) * 1024) as f64
            / waiters.max(1) as f64,
        watched_s,
        cpu_share_while_waiting: (after.saturating_sub(before)) as f64 / USER_HZ / watched_s,
    })
}
