//! `tollgate serve` under load on loopback: the load generator and what the machine did
//! meanwhile.

use crate::store::admit_config_json;
use serde::Serialize;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

/// The HTTP service under load on loopback.
#[derive(Clone, Debug, Serialize)]
pub struct HttpFigures {
    pub connections: usize,
    pub requests: u64,
    pub admissions_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// The tail past the p99: how long the rare stalls (a preempted writer, a WAL restart)
    /// held the requests caught in them.
    pub p999_ms: f64,
    pub errors: u64,
    /// Bytes the server handed to `write`/`pwrite` per admission (WAL, checkpoints, logs
    /// and responses), when the operating system reports it (Linux `/proc/<pid>/io`).
    pub written_bytes_per_admission: Option<f64>,
    /// CPU time (user + system) the server process spent per admission, in microseconds,
    /// and the part of it spent by the writer thread (Linux `/proc`). Steadier than the
    /// rate on a shared machine: it does not count time the server waited for a core.
    pub server_cpu_us_per_admission: Option<f64>,
    pub writer_cpu_us_per_admission: Option<f64>,
    /// How the machine's CPU time was spent while the load ran, in percent of all its cores
    /// (Linux `/proc/stat`). `steal_percent` is time the hypervisor gave to other guests:
    /// on a shared host the cores the figures above were measured on were only partly
    /// there, and a rate lower than usual with a high steal is the machine's, not the code's.
    pub machine: Option<MachineShare>,
    /// The shared budget run short after the timed load (see [`PROBE_LIMIT`]): whether the
    /// servers together admitted more than it holds.
    pub shared_budget: Option<SharedBudget>,
}

/// What a shared budget admitted when every connection, on every replica, asked for more
/// than it holds at once.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SharedBudget {
    /// The bucket's name.
    pub budget: String,
    /// What it holds (a hard budget: it never refills).
    pub limit: u64,
    /// Admissions answered 200.
    pub admitted: u64,
    /// Admissions beyond the limit: 0, or the budget was broken.
    pub overshoot: u64,
    /// What it still held when the probe's requests had all been answered (none were left
    /// unanswered, so this is what no server could reach).
    pub stranded: u64,
}

/// The requests of the probe's model, a hard budget shared by every tenant. Once the timed
/// load is over, twice as many admissions as it holds are sent naming it, spread over every
/// connection and replica: exactly this many must be admitted.
pub const PROBE_LIMIT: u64 = 1_000;
/// The model whose budget the probe runs short.
const PROBE_MODEL: &str = "probe";

/// Shares of the machine's CPU time over an interval, in percent of all its cores.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct MachineShare {
    pub steal_percent: f64,
    pub idle_percent: f64,
}

/// The machine-wide CPU counters of `/proc/stat` (the `cpu` line, in clock ticks).
#[derive(Clone, Copy, Debug)]
struct MachineTicks {
    total: u64,
    idle: u64,
    steal: u64,
}

impl MachineTicks {
    fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The first line: `cpu user nice system idle iowait irq softirq steal guest guest_nice`.
    /// Guest time is already counted in user and nice, so it is left out of the total.
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = line
            .split_whitespace()
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = f[..] else {
            return None;
        };
        Some(MachineTicks {
            total: user + nice + system + idle + iowait + irq + softirq + steal,
            idle: idle + iowait,
            steal,
        })
    }

    /// The shares of the interval from `self` to `later`; none when no tick passed.
    fn share_until(self, later: MachineTicks) -> Option<MachineShare> {
        let total = later.total.checked_sub(self.total).filter(|&t| t > 0)? as f64;
        let percent = |a: u64, b: u64| 100.0 * a.saturating_sub(b) as f64 / total;
        Some(MachineShare {
            steal_percent: percent(later.steal, self.steal),
            idle_percent: percent(later.idle, self.idle),
        })
    }
}

/// The gateway model the timed admissions name when the benchmark routes them to
/// deployments (`--deployments N`).
const ROUTED_MODEL: &str = "routed";

/// The service's configuration for the HTTP benchmark: `tenants` tenants, caller key
/// `key-N` for tenant N, limits high enough that every admission is accepted; and, with
/// `deployments` above 0, gateway model [`ROUTED_MODEL`] with that many deployments, each
/// with request and token budgets and a concurrency limit that never bind, so that every
/// admission reserves one deployment's budgets and a slot of it.
fn http_config(tenants: u32, deployments: usize) -> serde_json::Value {
    let mut config = admit_config_json(tenants);
    let callers: serde_json::Map<String, serde_json::Value> = (0..tenants)
        .map(|t| (format!("key-{t}"), serde_json::json!(format!("t{t:05}"))))
        .collect();
    config["auth"] = serde_json::json!({ "callers": callers });
    config["models"] = serde_json::json!({
        PROBE_MODEL: {"requests": {"capacity": PROBE_LIMIT, "refill_per_s": 0}}
    });
    if deployments > 0 {
        let each: Vec<serde_json::Value> = (0..deployments)
            .map(|d| {
                serde_json::json!({
                    "name": format!("d{d}"), "upstream": "upstream",
                    "requests": {"capacity": 1e9, "refill_per_s": 1e9},
                    "tokens": {"capacity": 1e12, "refill_per_s": 1e12},
                    "max_concurrency": 100_000_000,
                })
            })
            .collect();
        config["models"][ROUTED_MODEL] = serde_json::json!({});
        config["gateway"] = serde_json::json!({
            "upstreams": {"upstream": {"base_url": "http://127.0.0.1:9/v1"}},
            "models": {ROUTED_MODEL: {"deployments": each}},
        });
    }
    config
}

/// Runs the probe of [`PROBE_LIMIT`] against servers at `addrs`.
fn probe(
    addrs: &[std::net::SocketAddr],
    tenants: u32,
    connections: usize,
) -> Result<SharedBudget, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let connections = connections.clamp(1, PROBE_LIMIT as usize);
    let per_connection = (2 * PROBE_LIMIT).div_ceil(connections as u64);
    rt.block_on(async {
        let mut tasks = drivers(
            addrs,
            tenants,
            connections,
            per_connection,
            Some(PROBE_MODEL),
        );
        let (mut sent, mut refused) = (0, 0);
        while let Some(done) = tasks.join_next().await {
            let (l, e) = done.map_err(|e| e.to_string())??;
            sent += l.len() as u64;
            refused += e;
        }
        let admitted = sent - refused;
        Ok(SharedBudget {
            budget: format!("model.{PROBE_MODEL}.requests"),
            limit: PROBE_LIMIT,
            admitted,
            overshoot: admitted.saturating_sub(PROBE_LIMIT),
            stranded: PROBE_LIMIT.saturating_sub(admitted),
        })
    })
}

/// `tollgate serve` as its own process, killed when dropped.
pub struct ServeProcess(pub std::process::Child);

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve` (the `tollgate` executable) with `config` on a fresh SQLite file in `dir`,
/// its logs in `dir/serve.log`, on a free loopback port; returns once it listens.
pub fn start_serve(
    serve: &Path,
    dir: &Path,
    config: &serde_json::Value,
) -> Result<(ServeProcess, std::net::SocketAddr), String> {
    start_serve_with(serve, dir, config, &[])
}

/// As [`start_serve`], with more arguments for `serve` (`--writers N`).
pub fn start_serve_with(
    serve: &Path,
    dir: &Path,
    config: &serde_json::Value,
    extra: &[String],
) -> Result<(ServeProcess, std::net::SocketAddr), String> {
    use std::process::{Command, Stdio};
    let config_path = dir.join("serve.json");
    std::fs::write(&config_path, config.to_string()).map_err(|e| e.to_string())?;
    let db = dir.join("http.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let log = std::fs::File::create(dir.join("serve.log")).map_err(|e| e.to_string())?;
    let child = Command::new(serve)
        .arg("serve")
        .arg("--config")
        .arg(&config_path)
        .arg("--db")
        .arg(&db)
        .args(["--listen", &addr.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", serve.display()))?;
    let mut server = ServeProcess(child);
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        let log = || std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(format!("tollgate serve exited ({status}):\n{}", log()));
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            return Err(format!(
                "tollgate serve did not start listening:\n{}",
                log()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok((server, addr))
}

/// Runs `serve` (the `tollgate` executable) as its own process on a SQLite file in `dir`,
/// exactly as an operator starts it (its logs go to `dir/serve.log`), and drives it from
/// this process with `connections` keep-alive HTTP/1.1 connections, `requests` admissions
/// in all, with `servers.writers` writer shards (`serve --writers`; one server whatever
/// `servers.replicas` says).
pub fn http(
    serve: &Path,
    dir: &Path,
    tenants: u32,
    connections: usize,
    requests: u64,
    servers: Servers,
) -> Result<HttpFigures, String> {
    let mut extra = vec!["--writers".to_string(), servers.writers.max(1).to_string()];
    if let Some(n) = servers.instances_ahead {
        extra.extend(["--policy-instances-ahead".to_string(), n.to_string()]);
    }
    let config = http_config(tenants, servers.deployments);
    let (server, addr) = start_serve_with(serve, dir, &config, &extra)?;
    let pid = server.0.id();
    // A thread takes its name when it first runs, which may come after the server listens.
    let writer_before = (0..50).find_map(|_| {
        let ticks = cpu_ticks(pid, Some(tollgate::writer::WRITER_THREAD));
        if ticks.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ticks
    });
    let cpu_before = (cpu_ticks(pid, None), writer_before);
    let mut figures = load(&[addr], tenants, connections, requests, servers.routed())?;
    let per_admission = |n: u64| n as f64 / figures.requests.max(1) as f64;
    figures.written_bytes_per_admission = written_bytes(pid).map(per_admission);
    let us_per_tick = 1e6 / USER_HZ;
    let spent = |before: Option<u64>, after: Option<u64>| {
        Some(per_admission(after?.saturating_sub(before?)) * us_per_tick)
    };
    figures.server_cpu_us_per_admission = spent(cpu_before.0, cpu_ticks(pid, None));
    figures.writer_cpu_us_per_admission = spent(
        cpu_before.1,
        cpu_ticks(pid, Some(tollgate::writer::WRITER_THREAD)),
    );
    figures.shared_budget = Some(probe(&[addr], tenants, connections)?);
    Ok(figures)
}

/// CPU time (user + system, in clock ticks) of a process, or of its thread named `thread`.
pub fn cpu_ticks(pid: u32, thread: Option<&str>) -> Option<u64> {
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let ticks = |stat: &str| -> Option<u64> {
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let at = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        Some(at(11)? + at(12)?)
    };
    match thread {
        None => ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?),
        // Every thread of that name (the writer's shards are one thread each).
        Some(name) => std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .map(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| ticks(&s))
            })
            .collect::<Option<Vec<u64>>>()
            .filter(|each| !each.is_empty())
            .map(|each| each.iter().sum()),
    }
}

/// Clock ticks per second of `/proc` CPU times: Linux reports them in `USER_HZ`, which is
/// 100 on every architecture it runs on.
const USER_HZ: f64 = 100.0;

/// What a process has written so far (`wchar` of `/proc/<pid>/io`).
fn written_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// How many servers share the store, and how many writer shards each has.
#[derive(Clone, Copy, Debug)]
pub struct Servers {
    /// Servers in this process sharing the store, the connections spread over them.
    pub replicas: usize,
    /// Writer shards in each, each on a connection of its own.
    pub writers: usize,
    /// Fresh instances each writer's policy keeps made ahead (`serve
    /// --policy-instances-ahead`); `None`: serve's default.
    pub instances_ahead: Option<usize>,
    /// Deployments the timed admissions are routed to (0: none, no model named).
    pub deployments: usize,
}

impl Servers {
    /// The model the timed admissions name.
    fn routed(&self) -> Option<&'static str> {
        (self.deployments > 0).then_some(ROUTED_MODEL)
    }
}

/// As [`http`], with servers in this process sharing the PostgreSQL store at `url` (in a
/// scratch schema), the connections spread over them.
pub fn http_postgres(
    url: &str,
    tenants: u32,
    connections: usize,
    requests: u64,
    wanted: Servers,
) -> Result<HttpFigures, String> {
    let Servers {
        replicas,
        writers,
        instances_ahead,
        deployments,
    } = wanted;
    use tollgate::config::ConfigFile;
    use tollgate::store::{AnyStore, PgStore};
    use tollgate_cli::server;
    let config =
        ConfigFile::from_json(&http_config(tenants, deployments)).map_err(|e| e.to_string())?;
    let schema = format!("tollgate_bench_{}", std::process::id());
    let mut servers = Vec::new();
    for r in 0..replicas.max(1) {
        let mut stores = Vec::new();
        for w in 0..writers.max(1) {
            let store = if r == 0 && w == 0 {
                PgStore::open_scratch(url, &schema)
            } else {
                PgStore::open_in_schema(url, &schema)
            }
            .map_err(|e| e.to_string())?;
            stores.push(AnyStore::Postgres(Box::new(store)));
        }
        servers.push(server::build_shards(
            config.clone(),
            stores,
            Vec::new(),
            instances_ahead.unwrap_or_else(server::default_instances_ahead),
        )?);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut addrs = Vec::new();
    let mut stops = Vec::new();
    let mut handles = Vec::new();
    for (state, writer) in servers {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .map_err(|e| e.to_string())?;
        addrs.push(listener.local_addr().map_err(|e| e.to_string())?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        handles.push(rt.spawn(server::serve(listener, state, writer, async move {
            let _ = stopped.await;
        })));
    }
    let figures =
        load(&addrs, tenants, connections, requests, wanted.routed()).and_then(|mut f| {
            f.shared_budget = Some(probe(&addrs, tenants, connections)?);
            Ok(f)
        });
    for stop in stops {
        let _ = stop.send(());
    }
    for h in handles {
        let _ = rt.block_on(h);
    }
    figures
}

/// The load generator: `connections` keep-alive connections on one thread, each sending
/// its next admission as soon as the last one is answered. Requests are written whole and
/// responses read with a minimal HTTP/1.1 parser, so that the generator takes as little
/// as possible of the cores it shares with the server.
fn load(
    addrs: &[std::net::SocketAddr],
    tenants: u32,
    connections: usize,
    requests: u64,
    model: Option<&'static str>,
) -> Result<HttpFigures, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let per_connection = requests.div_ceil(connections.max(1) as u64);
    rt.block_on(async {
        let machine_before = MachineTicks::read();
        let started = Instant::now();
        let mut tasks = drivers(addrs, tenants, connections.max(1), per_connection, model);
        let mut latencies = Vec::with_capacity(requests as usize);
        let mut errors = 0;
        while let Some(done) = tasks.join_next().await {
            let (l, e) = done.map_err(|e| e.to_string())??;
            latencies.extend(l);
            errors += e;
        }
        let secs = started.elapsed().as_secs_f64();
        let machine = machine_before.zip(MachineTicks::read());
        if latencies.is_empty() {
            return Err("no request was answered".into());
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
        Ok(HttpFigures {
            connections,
            requests: latencies.len() as u64,
            admissions_per_s: latencies.len() as f64 / secs,
            p50_ms: pct(0.5),
            p90_ms: pct(0.9),
            p99_ms: pct(0.99),
            p999_ms: pct(0.999),
            errors,
            written_bytes_per_admission: None,
            server_cpu_us_per_admission: None,
            writer_cpu_us_per_admission: None,
            machine: machine.and_then(|(before, after)| before.share_until(after)),
            shared_budget: None,
        })
    })
}

/// `connections` tasks driving `per_connection` admissions each (naming `model` when
/// given), spread over `addrs` in turn; each answers its latencies and how many were not 200.
fn drivers(
    addrs: &[std::net::SocketAddr],
    tenants: u32,
    connections: usize,
    per_connection: u64,
    model: Option<&'static str>,
) -> tokio::task::JoinSet<Result<(Vec<f64>, u64), String>> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let addr = addrs[c % addrs.len()];
        let first = c as u64 * per_connection;
        tasks.spawn(async move {
            drive(addr, tenants, first, per_connection, model)
                .await
                .map_err(|e| format!("connection {c}: {e}"))
        });
    }
    tasks
}

/// One connection's requests: admissions `first..first + count`, each for tenant `n % tenants`
/// with a key of its own, naming `model` when given. Returns each request's latency in ms
/// and how many were not 200.
async fn drive(
    addr: std::net::SocketAddr,
    tenants: u32,
    first: u64,
    count: u64,
    model: Option<&str>,
) -> std::io::Result<(Vec<f64>, u64)> {
    use std::io::{Error, ErrorKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut latencies = Vec::with_capacity(count as usize);
    let mut errors = 0;
    let mut request = Vec::with_capacity(512);
    let mut buf = vec![0u8; 16 << 10];
    let (prefix, named) = match model {
        None => ("op", String::new()),
        Some(m) => (m, format!(r#""model":"{m}","#)),
    };
    for n in first..first + count {
        let body = format!(
            r#"{{"key":"{prefix}-{n}","route":"interactive",{named}"input_tokens":200,"max_output_tokens":300,"deadline_ms":{}}}"#,
            i64::MAX
        );
        request.clear();
        write!(
            request,
            "POST /v1/admit HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer key-{}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            n % u64::from(tenants),
            body.len()
        )?;
        let t = Instant::now();
        stream.write_all(&request).await?;
        let mut filled = 0;
        let (status, end) = loop {
            if filled == buf.len() {
                return Err(Error::new(ErrorKind::InvalidData, "response too large"));
            }
            let got = stream.read(&mut buf[filled..]).await?;
            if got == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "server closed"));
            }
            filled += got;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&buf[..filled]) {
                Ok(httparse::Status::Complete(head)) => {
                    let length = response
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                        .unwrap_or(0usize);
                    break (response.code.unwrap_or(0), head + length);
                }
                Ok(httparse::Status::Partial) => continue,
                Err(e) => return Err(Error::new(ErrorKind::InvalidData, e.to_string())),
            }
        };
        if end > buf.len() {
            return Err(Error::new(ErrorKind::InvalidData, "response too large"));
        }
        while filled < end {
            let got = stream.read(&mut buf[filled..end]).await?;
            if got == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "server closed"));
            }
            filled += got;
        }
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        if status != 200 {
            errors += 1;
        }
    }
    Ok((latencies, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_shares_come_from_the_first_line_of_proc_stat() {
        let at = |idle: u64, steal: u64, busy: u64| {
            format!("cpu  {busy} 0 0 {idle} 5 0 0 {steal} 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
        };
        let before = MachineTicks::parse(&at(1000, 10, 500)).unwrap();
        assert_eq!((before.total, before.idle, before.steal), (1515, 1005, 10));
        let after = MachineTicks::parse(&at(1100, 60, 850)).unwrap();
        let share = before.share_until(after).unwrap();
        // 500 ticks passed: 100 idle, 50 stolen.
        assert_eq!(
            share,
            MachineShare {
                steal_percent: 10.0,
                idle_percent: 20.0
            }
        );
        assert_eq!(before.share_until(before), None);
    }

    #[test]
    fn a_damaged_proc_stat_gives_no_share_rather_than_a_wrong_one() {
        for bad in [
            "",
            "cpu0 1 2 3 4 5 6 7 8",
            "cpu  1 2 3",
            "cpu  1 2 x 4 5 6 7 8",
        ] {
            assert!(MachineTicks::parse(bad).is_none(), "{bad:?}");
        }
        // Counters that went backwards (another boot's file) give no share either.
        let later = MachineTicks::parse("cpu  9 0 0 9 0 0 0 0").unwrap();
        let earlier = MachineTicks::parse("cpu  1 0 0 1 0 0 0 0").unwrap();
        assert_eq!(later.share_until(earlier), None);
    }
}
