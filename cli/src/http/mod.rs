//! The floor both HTTP faces stand on: the state every handler shares (the engine, the
//! writer, metrics, the clock), who is asking (`auth`), reading what they send (`body`),
//! refusing in one table (`refusal`), bounding connections (`listen`) and draining what a
//! refused client still sends (`linger`). The service (`crate::service`) and the gateway
//! (`crate::gateway`) are siblings above it; the server (`crate::server`) composes them.

pub mod auth;
pub mod body;
pub mod linger;
pub mod listen;
pub mod metrics;
pub mod refusal;

pub use metrics::Metrics;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate::engine::Engine;
use tollgate::store::AnyStore;
use tollgate::writer::Writer;

/// How long a client may take to send its body (slow bodies are cut off with 408).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (request line and headers) a connection buffers: past it the HTTP
/// stack answers 431. hyper's default, about 400 KiB, would let a client holding the
/// permitted connections open make the server hold hundreds of MiB of headers.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// The retry-after of a `store_unavailable` answer: about how long connecting again takes.
pub const STORE_RETRY_AFTER_MS: u64 = 1000;

/// A wall clock in Unix milliseconds that never steps backwards.
#[derive(Default)]
pub struct Clock {
    last: AtomicI64,
}

impl Clock {
    /// Now, or the latest time given before if the wall clock stepped back.
    pub fn now_ms(&self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        prev.max(wall)
    }
}

/// What every handler shares, the service's and the gateway's.
pub struct AppState {
    /// The engine, for what is read outside the writer (roles, the configuration), and
    /// what the admin API changes: the first shard's.
    pub engine: Arc<Engine<AnyStore>>,
    /// Every shard's engine, the first one first (one unless `serve --writers` asks for
    /// more).
    pub engines: Vec<Arc<Engine<AnyStore>>>,
    /// The writer every decision goes through, a tenant's to its shard.
    pub writer: Writer,
    /// Every series `/metrics` shows.
    pub metrics: Metrics,
    /// The time every decision is made at.
    pub clock: Clock,
    /// Connections served at once (see `listen`).
    pub max_connections: usize,
    /// Connections one client address may hold.
    pub max_connections_per_address: usize,
}

impl AppState {
    /// Has every other shard's engine take up a change just made through the first
    /// (tenants, keys, groups, the policy, the shadow) now rather than at its next
    /// housekeeping, so that whoever made it sees it whichever shard serves them next.
    pub async fn take_up_changes(&self) {
        if self.engines.len() < 2 {
            return;
        }
        let others = self.engines[1..].to_vec();
        let taken = tokio::task::spawn_blocking(move || {
            for engine in others {
                if let Err(e) = engine.sync_directory() {
                    tracing::warn!(error = %e, "a shard could not take up the tenants and keys: it will at its next housekeeping");
                }
                if let Err(e) = engine.sync_policy() {
                    tracing::warn!(error = %e, "a shard could not take up the policy: it will at its next housekeeping");
                }
            }
        });
        let _ = taken.await;
    }

    /// The shadow policy's counts over every shard; `None` when no shadow is installed.
    pub fn shadow_report(&self) -> Option<tollgate::engine::ShadowReport> {
        self.engines
            .iter()
            .filter_map(|e| e.shadow_report())
            .reduce(tollgate::engine::ShadowReport::merge)
    }
}

/// The state every handler shares.
pub type Shared = Arc<AppState>;
