//! Connections: refused bodies still being sent, the connection bound, and running out of
//! file descriptors.

mod common;

use common::http::*;
use serde_json::json;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_client_still_sending_a_refused_body_sees_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &config());
    let addr = s.base.trim_start_matches("http://").to_string();
    let head = |extra: &str, length: usize| {
        format!(
            "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CALLER}\r\n\
             {extra}Content-Length: {length}\r\n\r\n"
        )
    };
    // The body follows the headers after a pause (as from a client streaming a file): the
    // server reads and throws it away, then answers, instead of resetting the connection
    // under a client that has not finished writing.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.write_all(head("", 5_000_000).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stream.write_all(&vec![b'x'; 5_000_000]).unwrap();
    assert_eq!(read_answer(&mut stream).0, 413);
    // A client that waits for `100 Continue` is answered 413 without sending the body.
    let mut stream = TcpStream::connect(&addr).unwrap();
    let waiting = head("Expect: 100-continue\r\n", 300_000);
    stream.write_all(waiting.as_bytes()).unwrap();
    let (status, body) = read_answer(&mut stream);
    assert_eq!((status, body["reason"].clone()), (413, json!("too_large")));
    // A chunked body over the limit is cut off: the answer comes, and the connection ends
    // long before the client could send all it had.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .write_all(
            head("Transfer-Encoding: chunked\r\n", 0)
                .replace("Content-Length: 0\r\n", "")
                .as_bytes(),
        )
        .unwrap();
    let mut sender = stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
        let mut sent = 0usize;
        while sent < 256 << 20 && sender.write_all(chunk.as_bytes()).is_ok() {
            sent += 0x10000;
        }
        sent
    });
    let (status, body) = read_answer(&mut stream);
    assert_eq!((status, body["reason"].clone()), (413, json!("too_large")));
    let sent = sending.join().unwrap();
    assert!(sent < 256 << 20, "the server read all {sent} bytes");
    // So is a body refused before it is read at all: an unknown key, a key of the wrong
    // role, an unknown path.
    for (request, status) in [
        (
            "POST /v1/admit HTTP/1.1\r\nAuthorization: Bearer nobody\r\n",
            401,
        ),
        (
            &format!("PUT /v1/admin/policy HTTP/1.1\r\nAuthorization: Bearer {CALLER}\r\n"),
            403,
        ),
        ("POST /v1/nowhere HTTP/1.1\r\n", 404),
    ] {
        let mut stream = TcpStream::connect(&addr).unwrap();
        let head = format!("{request}Host: x\r\nContent-Length: 5000000\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stream.write_all(&vec![b'x'; 5_000_000]).unwrap();
        assert_eq!(read_answer(&mut stream).0, status, "{request}");
    }
    // A client waiting for `100 Continue` is refused without being asked for the body.
    let mut stream = TcpStream::connect(&addr).unwrap();
    let waiting = "POST /v1/admit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nobody\r\n\
                   Expect: 100-continue\r\nContent-Length: 5000000\r\n\r\n";
    stream.write_all(waiting.as_bytes()).unwrap();
    assert_eq!(read_answer(&mut stream).0, 401);
    let inspect = s.call("GET", "/v1/admin/inspect", Some(ADMIN), None).2;
    assert_eq!(inspect["buckets"]["tenant.acme.requests"], 100);
    assert!(s.stop().success());
}

/// `n` connections that have each sent a request and read its answer, kept open.
fn served_connections(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut answer = [0u8; 256];
            let n = std::io::Read::read(&mut c, &mut answer).unwrap();
            assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
            c
        })
        .collect()
}

#[test]
fn connections_past_the_bound_wait_for_a_free_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config["limits"]["max_connections"] = json!(4);
    let s = Server::start(dir.path(), &config);
    let addr = s.base.trim_start_matches("http://").to_string();
    // Four connections that have sent a request are not shed...
    let held = served_connections(&addr, 4);
    // ...so a fifth connection is not served while they are open...
    let waiting = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(500))
        .build()
        .get(&format!("{}/healthz", s.base))
        .call();
    assert!(waiting.is_err(), "served past the bound: {waiting:?}");
    // ...and is once they close.
    drop(held);
    let (status, _, metrics) = s.call("GET", "/metrics", None, None);
    assert_eq!(status, 200);
    let open = metrics.as_str().unwrap().lines().find_map(|l| {
        l.strip_prefix("tollgate_http_connections ")
            .map(|v| v.parse::<i64>().unwrap())
    });
    assert!(matches!(open, Some(1..=4)), "{open:?}");
    assert!(s.stop().success());
}

/// Slow clients: every place taken by a connection that sent half a request head and
/// stopped. The oldest of them are shed, so an admission is served at once.
#[test]
fn connections_with_half_a_head_are_shed_for_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config["limits"]["max_connections"] = json!(50);
    let s = Server::start(dir.path(), &config);
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut slow: Vec<TcpStream> = (0..60)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(b"POST /v1/admit HTTP/1.1\r\nHost: t\r\nX-Slow: ")
                .unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (status, _, answer) = s.admit(CALLER, request("through", "interactive", 5));
    assert_eq!(status, 200, "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the admission waited {:?} behind slow clients",
        started.elapsed()
    );
    // Shed ones were closed by the server: they read the end of the stream.
    let mut closed = 0;
    for c in &mut slow {
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        if matches!(std::io::Read::read(c, &mut [0u8; 16]), Ok(0)) {
            closed += 1;
        }
    }
    assert!(closed > 0);
    assert!(s.stop().success());
}

/// One address may hold `limits.max_connections_per_address`: a connection past that is
/// closed at once, the others stay served.
#[test]
fn one_address_holds_at_most_its_share_of_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config["limits"]["max_connections_per_address"] = json!(3);
    let s = Server::start(dir.path(), &config);
    let addr = s.base.trim_start_matches("http://").to_string();
    let held = served_connections(&addr, 3);
    let mut extra = TcpStream::connect(&addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut buf = [0u8; 64];
    let read = std::io::Read::read(&mut extra, &mut buf);
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a fourth connection from one address was served: {:?}",
        read.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    );
    drop(held);
    // The server learns of the closes as it reads them: until then the address is still at
    // its bound and a new connection is closed at once, so a client tries again.
    let started = Instant::now();
    let served = loop {
        let answer = ureq::get(&format!("{}/healthz", s.base)).call();
        match answer {
            Ok(r) => break r.status(),
            Err(_) if started.elapsed() < Duration::from_secs(2) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("not served within 2 s of the closes: {e}"),
        }
    };
    assert_eq!(served, 200);
    assert!(s.stop().success());
}

#[test]
fn running_out_of_file_descriptors_pauses_accepting_without_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config().to_string()).unwrap();
    let log = dir.path().join("serve.log");
    // The server may open 48 files; the connection bound (1,000 by default) is far above.
    let (child, base) = common::spawn_serve_via(
        &[
            "--config",
            config_path.to_str().unwrap(),
            "--db",
            dir.path().join("state.db").to_str().unwrap(),
        ],
        |program| {
            let mut command = Command::new("sh");
            command
                .args(["-c", "ulimit -n 48 && exec \"$0\" \"$@\"", program])
                .stderr(std::fs::File::create(&log).unwrap());
            command
        },
    );
    let s = Server { child, base };
    let addr = s.base.trim_start_matches("http://").to_string();
    // More connections than the server has descriptors left: the rest wait in the backlog.
    let held = idle_connections(&addr, 80);
    std::thread::sleep(Duration::from_millis(300));
    let cpu_ticks = common::server::cpu_ticks;
    let before = cpu_ticks(s.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(s.child.id()) - before;
    // Retrying accept at once would keep both cores busy (~400 ticks in 2 s).
    assert!(
        used < 50,
        "{used} ticks of CPU in 2 s while out of descriptors"
    );
    let failures = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count();
    assert!(
        (1..=5).contains(&failures),
        "{failures} accept failures logged"
    );
    // Once the connections close, the server serves again.
    drop(held);
    let started = Instant::now();
    while ureq::get(&format!("{}/healthz", s.base)).call().is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "no recovery");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.stop().success());
}

/// How one client's request ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Ended {
    /// A whole answer with this status.
    Answered(u16),
    /// The server closed the connection without an answer.
    Closed,
    /// Anything else: no connection, a hang, a broken answer.
    Broken,
}

/// Connects, waits for every other client to be connected, then sends one request.
fn one_request(addr: &str, barrier: &std::sync::Barrier) -> Ended {
    use std::io::Read;
    let connected = TcpStream::connect(addr);
    barrier.wait();
    let Ok(mut stream) = connected else {
        return Ended::Broken;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let request = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return Ended::Closed;
    }
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) if answer.is_empty() => Ended::Closed,
        Ok(_) => {
            let text = String::from_utf8_lossy(&answer);
            match text.split(' ').nth(1).and_then(|s| s.parse().ok()) {
                Some(status) if text.starts_with("HTTP/1.1 ") => Ended::Answered(status),
                _ => Ended::Broken,
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ended::Closed,
        Err(_) => Ended::Broken,
    }
}

#[test]
fn a_thousand_clients_at_256_descriptors_are_served_or_shed_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config().to_string()).unwrap();
    let log = dir.path().join("serve.log");
    let (child, base) = common::spawn_serve_via(
        &[
            "--config",
            config_path.to_str().unwrap(),
            "--db",
            dir.path().join("state.db").to_str().unwrap(),
        ],
        |program| {
            let mut command = Command::new("sh");
            command
                .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\"", program])
                .stderr(std::fs::File::create(&log).unwrap());
            command
        },
    );
    let mut s = Server { child, base };
    let addr = s.base.trim_start_matches("http://").to_string();
    // A thousand clients connected at once, four times the descriptors, then each sends
    // one whole request.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(1000));
    let clients: Vec<_> = (0..1000)
        .map(|_| {
            let (addr, barrier) = (addr.clone(), barrier.clone());
            std::thread::spawn(move || one_request(&addr, &barrier))
        })
        .collect();
    let ended: Vec<Ended> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let count = |e: Ended| ended.iter().filter(|x| **x == e).count();
    let (served, shed, closed) = (
        count(Ended::Answered(200)),
        count(Ended::Answered(503)),
        count(Ended::Closed),
    );
    // Each one was served, or shed with a 503 or a clean close; none hung or broke.
    assert_eq!(served + shed + closed, 1000, "{ended:?}");
    assert!(
        served >= 200,
        "{served} served, {shed} shed, {closed} closed"
    );
    // The server is still up and serving, and said why it paused once per pause (clients
    // that connect late make more than one), and that it accepts again.
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
    assert!(ureq::get(&format!("{}/healthz", s.base)).call().is_ok());
    let logged = std::fs::read_to_string(&log).unwrap();
    let failures = logged
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count();
    let again = logged
        .lines()
        .filter(|l| l.contains("accepting again"))
        .count();
    assert!((1..=5).contains(&failures) && again == failures, "{logged}");
    assert!(logged.contains("Too many open files"), "{logged}");
    println!(
        "{served} served, {shed} shed with 503, {closed} closed; {failures} accept failures logged"
    );
    assert!(s.stop().success());
}
