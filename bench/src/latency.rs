//! A TCP proxy that delays every byte by a fixed time each way, put between the replicas
//! and PostgreSQL (`tollgate-bench http --db-latency-ms X`), so that the round trips of a
//! real network are present on one machine. Bytes keep their order and are never held
//! back by one another: each read is passed on `delay` after it arrived, so the link has
//! latency but no lower bandwidth.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy: connect to [`Proxy::addr`] to reach the target.
pub struct Proxy {
    /// Where it listens.
    pub addr: SocketAddr,
    _thread: std::thread::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `target` that adds `round_trip` to each round trip (half of it
    /// each way), on a thread of its own.
    pub fn start(target: String, round_trip: Duration) -> Result<Proxy, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let one_way = round_trip / 2;
        let thread = std::thread::Builder::new()
            .name("db-latency".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("a listener");
                    while let Ok((client, _)) = listener.accept().await {
                        let target = target.clone();
                        tokio::spawn(async move {
                            if let Ok(server) = TcpStream::connect(&target).await {
                                let _ = client.set_nodelay(true);
                                let _ = server.set_nodelay(true);
                                let (cr, cw) = client.into_split();
                                let (sr, sw) = server.into_split();
                                tokio::join!(relay(cr, sw, one_way), relay(sr, cw, one_way));
                            }
                        });
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        Ok(Proxy {
            addr,
            _thread: thread,
        })
    }
}

/// Passes what `from` sends on to `to`, each read `delay` after it arrived.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A proxy in front of the server `url` (a `postgres://` URL) names, adding `round_trip`,
/// and the URL that reaches that server through it.
pub fn in_front_of(url: &str, round_trip: Duration) -> Result<(Proxy, String), String> {
    let (_, target) = through(url, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let proxy = Proxy::start(target, round_trip)?;
    let (via, _) = through(url, proxy.addr)?;
    Ok((proxy, via))
}

/// `url` (a `postgres://` URL) with its host and port replaced by `addr`, and the host and
/// port it named (`host:port`, 5432 when it names none).
fn through(url: &str, addr: SocketAddr) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .ok_or("--db-latency-ms needs a postgres:// URL")?;
    let scheme = &url[..url.len() - rest.len()];
    let (user, after) = match rest.split_once('@') {
        Some((user, after)) => (format!("{user}@"), after),
        None => (String::new(), rest),
    };
    let end = after.find(['/', '?']).unwrap_or(after.len());
    let (hostport, tail) = after.split_at(end);
    let target = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    };
    Ok((format!("{scheme}{user}{addr}{tail}"), target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_goes_through_the_proxy() {
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let (url, target) = through("postgres://u:p@db:6432/t?sslmode=disable", addr).unwrap();
        assert_eq!(url, "postgres://u:p@127.0.0.1:7000/t?sslmode=disable");
        assert_eq!(target, "db:6432");
        let (url, target) = through("postgres://u@127.0.0.1/t", addr).unwrap();
        assert_eq!(
            (url.as_str(), target.as_str()),
            ("postgres://u@127.0.0.1:7000/t", "127.0.0.1:5432")
        );
    }

    #[test]
    fn the_proxy_adds_its_delay_and_keeps_the_bytes() {
        let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 5];
            std::io::Read::read_exact(&mut s, &mut buf).unwrap();
            std::io::Write::write_all(&mut s, &buf).unwrap();
        });
        let proxy = Proxy::start(target, Duration::from_millis(40)).unwrap();
        let mut c = std::net::TcpStream::connect(proxy.addr).unwrap();
        let started = std::time::Instant::now();
        std::io::Write::write_all(&mut c, b"hello").unwrap();
        let mut back = [0u8; 5];
        std::io::Read::read_exact(&mut c, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        assert!(started.elapsed() >= Duration::from_millis(40));
    }
}
