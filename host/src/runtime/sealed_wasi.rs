//! The WASI surface a policy component may import, granting nothing.
//!
//! Components made from interpreted languages (componentize-py, componentize-js) import
//! WASI 0.2 because their runtimes are built on it. They link against this surface, which
//! answers every import and grants nothing: no files (no preopened folders), no environment,
//! no arguments, no stdin, no sockets or name lookups. What remains is what a decision may
//! have, read from the decision itself so that reruns and replicas agree:
//! - the wall and monotonic clocks read the decision's logical time and never move during it;
//!   a sleep or a wait on a clock is ready at once (it cannot hold a thread);
//! - random and insecure random read a stream seeded like `host::random` (configuration seed,
//!   tenant, key, attempt), as does the insecure seed;
//! - stdout and stderr go to the policy's log, line by line, under its per-call bounds.
//!
//! The context is made lazily, on a component's first WASI call: a policy that imports no
//! WASI (every Rust policy) pays nothing for it.

use super::host::HostState;
use super::view::{DecisionView, Jitter};
use bytes::Bytes;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::WasiClocksView;
use wasmtime_wasi::p2::bindings::sync::clocks::monotonic_clock::Host as _;
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder};

/// Bytes of stdout and of stderr kept per guest call; the rest is dropped, never refused
/// (an interpreter that cannot print raises, and the decision would fail for a print).
pub const MAX_OUTPUT_BYTES: usize = 8 << 10;

/// The monotonic clock's interface, whose waits are made ready at once.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Sealed contexts made since the process started (a policy that imports no WASI makes none).
static CONTEXTS_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many guest calls have used WASI since the process started.
pub fn contexts_made() -> u64 {
    CONTEXTS_MADE.load(std::sync::atomic::Ordering::Relaxed)
}

/// One guest call's WASI state.
pub(super) struct SealedWasi {
    pub(super) ctx: WasiCtx,
    pub(super) table: ResourceTable,
    stdout: Captured,
    stderr: Captured,
}

impl SealedWasi {
    pub(super) fn new(view: &DecisionView) -> Self {
        CONTEXTS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stdout = Captured::default();
        let stderr = Captured::default();
        let now_ms = view.now_ms;
        let mut random = view.jitter.fork(b"wasi:random");
        let seed = (u128::from(random.next_u64()) << 64) | u128::from(random.next_u64());
        let ctx = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(LogicalClock(now_ms))
            .monotonic_clock(LogicalClock(now_ms))
            .secure_random(SeededRandom(view.jitter.fork(b"wasi:random/random")))
            .insecure_random(SeededRandom(view.jitter.fork(b"wasi:random/insecure")))
            .insecure_random_seed(seed)
            .max_random_size(64 << 10)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        SealedWasi {
            ctx,
            table: ResourceTable::new(),
            stdout,
            stderr,
        }
    }

    /// The lines written to stdout and stderr since the last call, emptied.
    pub(super) fn take_output(&mut self) -> (String, String) {
        (self.stdout.take(), self.stderr.take())
    }
}

/// Adds WASI 0.2 (every interface a component may import, as wasmtime-wasi serves it from
/// the sealed context) to `linker`, with the monotonic clock's waits made ready at once.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Ok((ready_now(store.data_mut())?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Ok((ready_now(store.data_mut())?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable that is ready at once: logical time does not pass inside a decision.
fn ready_now(state: &mut HostState) -> wasmtime::Result<Resource<DynPollable>> {
    state.clocks().subscribe_duration(0)
}

/// A clock stopped at the decision's logical time.
struct LogicalClock(i64);

impl LogicalClock {
    fn nanos(&self) -> u64 {
        u64::try_from(self.0).unwrap_or(0).saturating_mul(1_000_000)
    }
}

impl HostWallClock for LogicalClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }
}

impl HostMonotonicClock for LogicalClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        self.nanos()
    }
}

/// The decision's seeded draw, as WASI's random source.
struct SeededRandom(Jitter);

impl rand_core::TryRng for SeededRandom {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.0.next_u64() as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let word = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        Ok(())
    }
}

/// Output kept for the log: at most [`MAX_OUTPUT_BYTES`] per call, the rest dropped.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn take(&self) -> String {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    /// The WASI 0.3 stream, which this surface does not link: a sink.
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }
}

impl OutputStream for Captured {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        // Always room: what does not fit is dropped rather than refused.
        Ok(4096)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}
