//! Budget alerts end to end: a real `tollgate serve` posting to a webhook receiver on
//! loopback. Each crossing arrives once, signed so that the receiver can tell a forged or
//! altered post; with the receiver down, alerts wait in the store's outbox (counted by
//! `tollgate_alerts_pending`), survive a restart of the server, and arrive once both are back.

mod common;

use common::http::{now_ms, Server};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: &str = "webhook-secret";

/// One post the receiver took: its signature header and body.
#[derive(Clone, Debug)]
struct Post {
    signature: Option<String>,
    body: Vec<u8>,
}

/// A webhook receiver that answers 200 to every post, on a port that outlives it.
struct Receiver {
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start(port: u16, posts: Arc<Mutex<Vec<Post>>>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (posts, stop.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    if let Some(post) = read_post(stream) {
                        p.lock().unwrap().push(post);
                    }
                }
            }
        });
        Receiver {
            stop,
            port,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.thread.take().unwrap().join().unwrap();
    }
}

fn read_post(mut stream: TcpStream) -> Option<Post> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    let mut signature = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().ok()?,
                "x-tollgate-signature" => signature = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    stream
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .ok()?;
    Some(Post { signature, body })
}

/// What the receiver checks: `sha256=<hex>` of the body under its secret.
fn signed(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

fn wait_for(posts: &Arc<Mutex<Vec<Post>>>, n: usize) -> Vec<Post> {
    let started = Instant::now();
    loop {
        let got = posts.lock().unwrap().clone();
        if got.len() >= n {
            return got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} of {n} alerts arrived",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(dir: &std::path::Path, config: &Value) -> Server {
    Server::start_via(dir, config, &dir.join("state.db"), |program| {
        let mut command = std::process::Command::new(program);
        command
            .env("ALERT_SECRET", SECRET)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    })
}

fn admit(server: &Server, key: &str, n: usize) -> u16 {
    let r = server.admit(
        key,
        json!({"key": format!("k{n}-{}", now_ms()), "route": "interactive", "input_tokens": 1,
               "max_output_tokens": 1, "deadline_ms": now_ms() + 600_000}),
    );
    r.0
}

fn pending(server: &Server) -> i64 {
    let text = ureq::get(&format!("{}/metrics", server.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("tollgate_alerts_pending "))
        .and_then(|v| v.trim().parse().ok())
        .expect("tollgate_alerts_pending in /metrics")
}

#[test]
fn each_crossing_arrives_once_signed_and_survives_a_receiver_down_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let posts = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, posts.clone());
    let port = receiver.port;
    let config = json!({
        "auth": {"callers": {"acme-key": "acme", "globex-key": "globex"}, "admins": ["admin-key"]},
        "global": {"requests": {"capacity": 1000, "refill_per_s": 0}, "concurrency": 100},
        "tenant_defaults": {"requests": {"limit": 4, "period": "day"}},
        "tenants": {"acme": {}, "globex": {}},
        "alerts": [{"budget": "tenant.*.requests", "at": [0.5, 1.0],
                    "webhook": format!("http://127.0.0.1:{port}/hook"),
                    "secret_env": "ALERT_SECRET"}]
    });
    let server = start(dir.path(), &config);
    // Two of four: 50%. Two more: 100%. Past it: refused, and no more alerts.
    for n in 0..2 {
        assert_eq!(admit(&server, "acme-key", n), 200);
    }
    wait_for(&posts, 1);
    for n in 2..4 {
        assert_eq!(admit(&server, "acme-key", n), 200);
    }
    assert_eq!(admit(&server, "acme-key", 9), 429);
    let got = wait_for(&posts, 2);
    std::thread::sleep(Duration::from_millis(1500));
    let got_later = posts.lock().unwrap().clone();
    assert_eq!(got_later.len(), 2, "each crossing once: {got_later:?}");
    let bodies: Vec<Value> = got
        .iter()
        .map(|p| serde_json::from_slice(&p.body).unwrap())
        .collect();
    assert_eq!(bodies[0]["budget"], "tenant.acme.requests");
    assert_eq!(bodies[0]["threshold"], 0.5);
    assert_eq!(bodies[1]["threshold"], 1.0);
    assert_eq!(
        (bodies[1]["spent"].as_i64(), bodies[1]["limit"].as_i64()),
        (Some(4), Some(4))
    );
    assert_ne!(bodies[0]["id"], bodies[1]["id"]);
    assert!(bodies[0]["resets_at"]
        .as_str()
        .unwrap()
        .ends_with("T00:00:00.000Z"));
    for p in &got {
        // The receiver recomputes the signature: it matches under the secret, and would not
        // under another one, nor for an altered body.
        let sig = p.signature.as_deref().expect("signed");
        assert_eq!(sig, signed(SECRET, &p.body));
        assert_ne!(sig, signed("guess", &p.body));
        let mut altered = p.body.clone();
        altered[0] = b' ';
        assert_ne!(sig, signed(SECRET, &altered));
    }
    assert_eq!(pending(&server), 0);

    // The receiver goes away; globex crosses both fractions; the alerts wait.
    receiver.stop();
    for n in 0..4 {
        assert_eq!(admit(&server, "globex-key", n), 200);
    }
    let started = Instant::now();
    while pending(&server) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "alerts not pending"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(posts.lock().unwrap().len(), 2);
    server.stop();

    // Both come back: the alerts written before the restart arrive, once each.
    let receiver = Receiver::start(port, posts.clone());
    let server = start(dir.path(), &config);
    let got = wait_for(&posts, 4);
    let late: Vec<Value> = got[2..]
        .iter()
        .map(|p| serde_json::from_slice(&p.body).unwrap())
        .collect();
    assert!(
        late.iter().all(|b| b["budget"] == "tenant.globex.requests"),
        "{late:?}"
    );
    let started = Instant::now();
    while pending(&server) != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "alerts still pending"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(posts.lock().unwrap().len(), 4);
    server.stop();
    receiver.stop();
}
