//! Accepting connections. At most `limits.max_connections` are open at once, and at most
//! `limits.max_connections_per_address` from one client address. At either bound, the
//! oldest connection (of that address, for its bound) that has not yet finished sending a
//! request head is shed to make room: a client holding connections open with half a head
//! each cannot keep everyone else out. When every connection has sent one, a new connection
//! waits until a place is free, or, past an address bound below the whole one, is closed at
//! once (one address may not make the others wait). A listener error that is not about one
//! connection (no file descriptor left, say) pauses accepting for a moment: retrying at once
//! would find the same error, spin a core and fill the log, which is exactly what a client
//! holding many connections wants.

use prometheus::IntGauge;
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How long accepting pauses after a listener error that is not about one connection.
const PAUSE_AFTER_ERROR: Duration = Duration::from_millis(100);
/// While listener errors go on, they are logged again at most this often (with how many
/// there were since).
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The listener with its connection bounds.
pub struct Acceptor {
    listener: TcpListener,
    places: Arc<Semaphore>,
    open: IntGauge,
    errors: ErrorReport,
    per_address: usize,
    registry: Arc<Mutex<Registry>>,
    next_id: u64,
}

/// The open connections: per address how many, and each one's state for shedding.
#[derive(Default)]
struct Registry {
    by_address: HashMap<IpAddr, usize>,
    connections: HashMap<u64, Tracked>,
}

struct Tracked {
    address: IpAddr,
    accepted: Instant,
    head_seen: Arc<AtomicBool>,
    shed: Arc<Notify>,
}

impl Registry {
    /// Asks the oldest connection (from `address`, when given) that has not finished a
    /// request head to close; whether there was one.
    fn shed_oldest_headless(&mut self, address: Option<IpAddr>) -> bool {
        let oldest = self
            .connections
            .values()
            .filter(|c| address.is_none_or(|a| c.address == a))
            .filter(|c| !c.head_seen.load(Ordering::Relaxed))
            .min_by_key(|c| c.accepted);
        match oldest {
            Some(c) => {
                // Marked so that it is not chosen again while it closes.
                c.head_seen.store(true, Ordering::Relaxed);
                c.shed.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Held by a connection's task: its place is free again when the connection ends.
pub struct Place {
    _permit: OwnedSemaphorePermit,
    open: IntGauge,
    id: u64,
    address: IpAddr,
    registry: Arc<Mutex<Registry>>,
    /// Set once the connection has sent a whole request head.
    pub head_seen: Arc<AtomicBool>,
    /// Notified when the connection is shed: its task drops it.
    pub shed: Arc<Notify>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.dec();
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.connections.remove(&self.id);
        if let Some(n) = registry.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                registry.by_address.remove(&self.address);
            }
        }
    }
}

impl Acceptor {
    /// `open` counts the connections open (the `tollgate_http_connections` gauge).
    pub fn new(
        listener: TcpListener,
        max_connections: usize,
        per_address: usize,
        open: IntGauge,
    ) -> Self {
        Acceptor {
            listener,
            places: Arc::new(Semaphore::new(max_connections.max(1))),
            open,
            errors: ErrorReport::default(),
            // An address bound no lower than the whole one adds nothing: its connections
            // wait for a place like everyone's.
            per_address: if per_address >= max_connections {
                usize::MAX
            } else {
                per_address.max(1)
            },
            registry: Arc::default(),
            next_id: 0,
        }
    }

    /// The next connection, once there is a place for it (shedding a connection that has
    /// not sent a request head when there is none). A connection waits for its place inside
    /// this future: dropping it closes that one connection.
    pub async fn accept(&mut self) -> (TcpStream, Place) {
        loop {
            let (stream, address) = match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.errors.cleared(Instant::now());
                    (stream, peer.ip())
                }
                Err(e) => {
                    self.errors.note(&e, Instant::now());
                    if !about_one_connection(&e) {
                        tokio::time::sleep(PAUSE_AFTER_ERROR).await;
                    }
                    continue;
                }
            };
            {
                let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
                let held = registry.by_address.get(&address).copied().unwrap_or(0);
                if held >= self.per_address && !registry.shed_oldest_headless(Some(address)) {
                    // Closed at once: that address holds all it may, each with a request.
                    continue;
                }
            }
            let permit = match self.places.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    self.registry
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .shed_oldest_headless(None);
                    self.places
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed")
                }
            };
            self.open.inc();
            self.next_id += 1;
            let head_seen = Arc::new(AtomicBool::new(false));
            let shed = Arc::new(Notify::new());
            {
                let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
                *registry.by_address.entry(address).or_default() += 1;
                registry.connections.insert(
                    self.next_id,
                    Tracked {
                        address,
                        accepted: Instant::now(),
                        head_seen: head_seen.clone(),
                        shed: shed.clone(),
                    },
                );
            }
            let place = Place {
                _permit: permit,
                open: self.open.clone(),
                id: self.next_id,
                address,
                registry: self.registry.clone(),
                head_seen,
                shed,
            };
            return (stream, place);
        }
    }
}

/// Errors that end one connection before it was accepted; the next one may be fine.
fn about_one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Logs a run of listener errors once when it begins (again only every [`REPORT_EVERY`]
/// while it lasts, counting the ones in between), and once when accepting works again.
#[derive(Default)]
struct ErrorReport {
    /// When the current run of errors began.
    since: Option<Instant>,
    last: Option<Instant>,
    unreported: u64,
    /// Errors in the current run.
    total: u64,
}

impl ErrorReport {
    /// Returns whether this error was logged.
    fn note(&mut self, e: &io::Error, now: Instant) -> bool {
        self.unreported += 1;
        self.total += 1;
        self.since.get_or_insert(now);
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < REPORT_EVERY)
        {
            return false;
        }
        tracing::warn!(error = %e, errors = self.unreported, "accept failed: accepting pauses until it clears; connections already accepted are served");
        self.unreported = 0;
        self.last = Some(now);
        true
    }

    /// A connection was accepted: the run of errors, if any, is over. Whether it logged.
    fn cleared(&mut self, now: Instant) -> bool {
        let Some(since) = self.since.take() else {
            return false;
        };
        tracing::info!(
            errors = self.total,
            seconds = now.duration_since(since).as_secs_f64(),
            "accepting again after failed accepts"
        );
        *self = ErrorReport::default();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_errors_is_reported_when_it_begins_and_when_it_ends() {
        let mut report = ErrorReport::default();
        let e = io::Error::from_raw_os_error(24);
        let t0 = Instant::now();
        assert!(!report.cleared(t0));
        assert!(report.note(&e, t0));
        let quiet = (1..100).filter(|s| report.note(&e, t0 + Duration::from_millis(100 * s)));
        assert_eq!(quiet.count(), 0);
        assert_eq!(report.unreported, 99);
        assert!(report.note(&e, t0 + REPORT_EVERY));
        assert_eq!(report.unreported, 0);
        assert!(report.cleared(t0 + REPORT_EVERY));
        assert!(!report.cleared(t0 + REPORT_EVERY));
        // A new run is reported at once.
        assert!(report.note(&e, t0 + REPORT_EVERY + Duration::from_millis(1)));
    }

    #[test]
    fn only_connection_errors_are_retried_at_once() {
        assert!(about_one_connection(
            &io::ErrorKind::ConnectionAborted.into()
        ));
        // EMFILE: no file descriptor left for the process.
        assert!(!about_one_connection(&io::Error::from_raw_os_error(24)));
    }

    #[tokio::test]
    async fn a_place_is_free_again_when_its_connection_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = IntGauge::new("open", "open").unwrap();
        let mut acceptor = Acceptor::new(listener, 1, 2, open.clone());
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let (_first, place) = acceptor.accept().await;
        assert_eq!(open.get(), 1);
        // The first sent a request head, so it is not shed: the second waits for its place.
        place.head_seen.store(true, Ordering::Relaxed);
        let waiting = tokio::spawn(async move { acceptor.accept().await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "a second connection was accepted past the bound"
        );
        drop(place);
        let (_second, _place) = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the freed place takes the waiting connection")
            .unwrap();
        assert_eq!(open.get(), 1);
    }
}
