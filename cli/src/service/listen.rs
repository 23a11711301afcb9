//! Accepting connections. At most `limits.max_connections` are open at once: past that the
//! server stops accepting, and new connections wait in the kernel's backlog until one
//! closes. A listener error that is not about one connection (no file descriptor left,
//! say) pauses accepting for a moment: retrying at once would find the same error, spin a
//! core and fill the log, which is exactly what a client holding many connections wants.

use prometheus::IntGauge;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long accepting pauses after a listener error that is not about one connection.
const PAUSE_AFTER_ERROR: Duration = Duration::from_millis(100);
/// Listener errors are logged at most this often (with how many there were since).
const REPORT_EVERY: Duration = Duration::from_secs(1);

/// The listener with its connection bound.
pub struct Acceptor {
    listener: TcpListener,
    places: Arc<Semaphore>,
    open: IntGauge,
    errors: ErrorReport,
}

/// Held by a connection's task: its place is free again when the connection ends.
pub struct Place {
    _permit: OwnedSemaphorePermit,
    open: IntGauge,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Acceptor {
    /// `open` counts the connections open (the `tollgate_http_connections` gauge).
    pub fn new(listener: TcpListener, max_connections: usize, open: IntGauge) -> Self {
        Acceptor {
            listener,
            places: Arc::new(Semaphore::new(max_connections.max(1))),
            open,
            errors: ErrorReport::default(),
        }
    }

    /// The next connection, once fewer than the maximum are open. Cancel-safe: dropping the
    /// future loses no connection and holds no place.
    pub async fn accept(&mut self) -> (TcpStream, Place) {
        let permit = self
            .places
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    self.open.inc();
                    let open = self.open.clone();
                    return (
                        stream,
                        Place {
                            _permit: permit,
                            open,
                        },
                    );
                }
                Err(e) => {
                    self.errors.note(&e, Instant::now());
                    if !about_one_connection(&e) {
                        tokio::time::sleep(PAUSE_AFTER_ERROR).await;
                    }
                }
            }
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

/// Logs listener errors at most once per [`REPORT_EVERY`], counting the ones in between.
#[derive(Default)]
struct ErrorReport {
    last: Option<Instant>,
    unreported: u64,
}

impl ErrorReport {
    /// Returns whether this error was logged.
    fn note(&mut self, e: &io::Error, now: Instant) -> bool {
        self.unreported += 1;
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < REPORT_EVERY)
        {
            return false;
        }
        tracing::warn!(error = %e, errors = self.unreported, "accept failed");
        self.unreported = 0;
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_reported_once_a_second_with_their_count() {
        let mut report = ErrorReport::default();
        let e = io::Error::from_raw_os_error(24);
        let t0 = Instant::now();
        assert!(report.note(&e, t0));
        let quiet = (1..100).filter(|ms| report.note(&e, t0 + Duration::from_millis(*ms)));
        assert_eq!(quiet.count(), 0);
        assert_eq!(report.unreported, 99);
        assert!(report.note(&e, t0 + REPORT_EVERY));
        assert_eq!(report.unreported, 0);
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
        let mut acceptor = Acceptor::new(listener, 1, open.clone());
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let (_first, place) = acceptor.accept().await;
        assert_eq!(open.get(), 1);
        let second = tokio::time::timeout(Duration::from_millis(200), acceptor.accept()).await;
        assert!(
            second.is_err(),
            "a second connection was accepted past the bound"
        );
        drop(place);
        assert_eq!(open.get(), 0);
        let (_second, _place) = tokio::time::timeout(Duration::from_secs(5), acceptor.accept())
            .await
            .expect("the freed place takes the waiting connection");
        assert_eq!(open.get(), 1);
    }
}
