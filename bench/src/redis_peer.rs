//! The peer design: the same all-or-nothing multi-bucket reservation with operation keys as
//! a Redis Lua script (how LLM gateways such as LiteLLM keep shared limits), on a
//! `redis-server` this benchmark starts on loopback, one script call per admission and per
//! completion.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// KEYS: operation, global requests, tenant requests, tenant tokens, global slots.
/// ARGV: now_ms, fingerprint, tokens, request capacity, request refill/s, token capacity,
/// token refill/s, global request capacity, global refill/s, concurrency limit.
const ADMIT: &str = r#"
local fp = redis.call('HGET', KEYS[1], 'fp')
if fp then
  if fp == ARGV[2] then return 'duplicate' else return 'conflict' end
end
local now = tonumber(ARGV[1])
local function level(key, cap, rate)
  local b = redis.call('HMGET', key, 'bal', 'ts')
  local bal = tonumber(b[1]) or cap
  local ts = tonumber(b[2]) or now
  if now > ts then bal = math.min(cap, bal + (now - ts) * rate / 1000) end
  return bal
end
local tr = level(KEYS[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
local gr = level(KEYS[2], tonumber(ARGV[8]), tonumber(ARGV[9]))
local tt = level(KEYS[4], tonumber(ARGV[6]), tonumber(ARGV[7]))
local need = tonumber(ARGV[3])
if tr < 1 then return 'tenant_rate' end
if gr < 1 then return 'global_rate' end
if tt < need then return 'token_budget' end
local slots = tonumber(redis.call('GET', KEYS[5]) or '0')
if slots >= tonumber(ARGV[10]) then return 'global_concurrency' end
redis.call('HSET', KEYS[3], 'bal', tr - 1, 'ts', now)
redis.call('HSET', KEYS[2], 'bal', gr - 1, 'ts', now)
redis.call('HSET', KEYS[4], 'bal', tt - need, 'ts', now)
redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[1], 'fp', ARGV[2], 'state', 'active', 'reserved', need)
return 'accepted'
"#;

/// KEYS: operation, global slots.
const COMPLETE: &str = r#"
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'unknown_operation' end
if state ~= 'active' then return 'not_active' end
redis.call('HSET', KEYS[1], 'state', 'succeeded')
redis.call('DECR', KEYS[2])
return 'ok'
"#;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Cycles per second through `redis-server` (started here on a loopback port, with an
/// append-only file synced every second, like SQLite's WAL with `synchronous=NORMAL`),
/// or `None` when `redis-server` is not installed.
pub fn run(dir: &Path, tenants: u32, ops: u64) -> Result<Option<f64>, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
        ])
        .args(["--appendfsync", "everysec", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else { return Ok(None) };
    let _server = Server(child);
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut con = loop {
        match client.get_connection() {
            Ok(c) => break c,
            Err(_) if started.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("redis-server did not start: {e}")),
        }
    };
    let admit = redis::Script::new(ADMIT);
    let complete = redis::Script::new(COMPLETE);
    let started = Instant::now();
    for i in 0..ops {
        let tenant = format!("t{:05}", i % u64::from(tenants));
        let op = format!("op:{tenant}:op-{i}");
        let now_ms = 1 + (i / 1000) as i64;
        let answer: String = admit
            .key(&op)
            .key("bucket:global:requests")
            .key(format!("bucket:{tenant}:requests"))
            .key(format!("bucket:{tenant}:tokens"))
            .key("slots:global")
            .arg(now_ms)
            .arg(format!("fp-{i}"))
            .arg(500)
            .arg(1e12)
            .arg(1e9)
            .arg(1e12)
            .arg(1e9)
            .arg(1e12)
            .arg(1e9)
            .arg(100_000_000)
            .invoke(&mut con)
            .map_err(|e| e.to_string())?;
        if answer != "accepted" {
            return Err(format!("redis peer refused an admission: {answer}"));
        }
        let done: String = complete
            .key(&op)
            .key("slots:global")
            .invoke(&mut con)
            .map_err(|e| e.to_string())?;
        if done != "ok" {
            return Err(format!("redis peer refused a completion: {done}"));
        }
    }
    Ok(Some(ops as f64 / started.elapsed().as_secs_f64()))
}
