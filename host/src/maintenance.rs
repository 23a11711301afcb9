//! The housekeeping an engine needs while it serves: taking up tenants, keys and policies
//! changed through other replicas, and sweeping (abandoned calls become `unknown`, records
//! past retention and expired saved answers go). Each run is bounded work.
//!
//! A [`crate::writer::Writer`] does all of it between batches, so a program with a writer
//! needs nothing more. A program that calls the [`Engine`] directly spawns
//! [`spawn`] once and keeps the returned [`MaintenanceTask`] for as long as it serves.
//!
//! Housekeeping runs at the store's clock when it has one (PostgreSQL), else at this
//! machine's: a program that drives the engine in logical time calls [`Engine::sweep`]
//! itself, at its own times.

use crate::engine::Engine;
use crate::store::Store;
use crate::writer::WriterObserver;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a tenant, key or policy change made through another replica is looked for.
pub const SYNC_EVERY: Duration = Duration::from_millis(250);
/// How often a holder of leases renews its registration and expired leases go back
/// (well inside [`crate::engine::LeaseKeep`]'s registration life of 3 s).
pub const LEASES_EVERY: Duration = Duration::from_millis(500);
/// How often the engine is swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// The most time the sweeps of one round may take: a tenth of each second.
const SWEEP_BUDGET: Duration = Duration::from_millis(100);
/// The most sweeps one round runs, each a bounded stretch of the operations.
const MAX_SWEEPS_AT_ONCE: usize = 64;

/// What is due when: call [`Maintenance::run_due`] often (at least every [`SYNC_EVERY`]).
pub struct Maintenance<S: Store> {
    engine: Arc<Engine<S>>,
    observer: Arc<dyn WriterObserver>,
    synced: Instant,
    swept: Instant,
    leases_kept: Option<Instant>,
    /// Whether this engine sweeps (see [`Maintenance::without_sweeps`]).
    sweeps: bool,
}

impl<S: Store> Maintenance<S> {
    /// Housekeeping for `engine`, telling `observer` what each sweep did.
    pub fn new(engine: Arc<Engine<S>>, observer: Arc<dyn WriterObserver>) -> Self {
        let now = Instant::now();
        Maintenance {
            engine,
            observer,
            synced: now,
            swept: now,
            leases_kept: None,
            sweeps: true,
        }
    }

    /// Housekeeping that leaves the sweeps to another engine of this process on the same
    /// store (a writer shard other than the first on a SQLite file's one connection): a
    /// sweep covers the whole store, so one engine sweeping is enough.
    pub fn without_sweeps(self) -> Self {
        Maintenance {
            sweeps: false,
            ..self
        }
    }

    /// Takes up the store's tenants and keys if [`SYNC_EVERY`] has passed, and sweeps if
    /// [`SWEEP_EVERY`] has. Failures are logged and tried again next time.
    pub fn run_due(&mut self) {
        if self.synced.elapsed() >= SYNC_EVERY {
            self.synced = Instant::now();
            match self.engine.sync_directory() {
                Ok(true) => tracing::info!("tenants and keys taken up from the store"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the store's tenants and keys could not be taken up")
                }
            }
        }
        if self
            .leases_kept
            .is_none_or(|at| at.elapsed() >= LEASES_EVERY)
        {
            self.leases_kept = Some(Instant::now());
            self.keep_leases();
        }
        // Replicas that lease take turns: each sweeps once per live holder's second, so the
        // store is swept about once a second whatever their number, and each sweep (which
        // has the store to itself) stops the others' batches as rarely as one node's.
        if self.sweeps && self.swept.elapsed() >= SWEEP_EVERY * self.engine.live_lease_holders() {
            self.swept = Instant::now();
            self.sweep();
        }
    }

    /// The store's time when it has a clock of its own, else this machine's (`None`: the
    /// store could not be asked).
    fn store_now(&self) -> Option<i64> {
        match self.engine.store_clock_ms() {
            Ok(Some(now)) => Some(now),
            Ok(None) => Some(wall_clock_ms()),
            Err(_) => None,
        }
    }

    /// Renews the engine's registration as a holder of leases and returns expired ones, at
    /// the store's time (an engine that holds no leases does nothing).
    fn keep_leases(&self) {
        if self.engine.lease_holder().is_none() {
            return;
        }
        let Some(now) = self.store_now() else {
            return;
        };
        match self.engine.keep_leases(now) {
            Ok(Some(kept)) if kept.returned > 0 => {
                tracing::debug!(
                    returned = kept.returned,
                    live_holders = kept.live_holders,
                    "expired leases given back"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "leases could not be kept"),
        }
    }

    /// Gives back this engine's leases (a replica that stops), at the store's time.
    pub fn stop_leases(&self) {
        if self.engine.lease_holder().is_none() {
            return;
        }
        let Some(now) = self.store_now() else {
            return;
        };
        if let Err(e) = self.engine.stop_leases(now) {
            tracing::warn!(error = %e, "leases could not be given back: they expire on their own");
        }
    }

    /// Sweeps, at the store's time when it has a clock of its own: one bounded stretch of
    /// the operations, and more stretches at once while the table goes on, up to
    /// [`SWEEP_BUDGET`] of each second, so that retention keeps up with a busy store.
    fn sweep(&self) {
        let started = Instant::now();
        for _ in 0..MAX_SWEEPS_AT_ONCE {
            let Some(now) = self.store_now() else {
                return;
            };
            match self.engine.sweep(now) {
                Ok(s) => {
                    for (tenant, key) in &s.abandoned {
                        tracing::warn!(%tenant, %key, "call abandoned: active past limits.max_call_ms, now unknown until reconciled");
                    }
                    self.observer.swept(&s);
                    if !s.more || started.elapsed() >= SWEEP_BUDGET {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "housekeeping sweep failed");
                    return;
                }
            }
        }
    }
}

/// Takes up policy changes made through another replica, on a thread of its own until
/// `stopped` says so: taking one up compiles it, which takes seconds for an interpreter's
/// component and must not hold the writer.
pub(crate) fn follow_policy<S: Store + Send + 'static>(
    engine: Arc<Engine<S>>,
    stopped: impl Fn() -> bool + Send + 'static,
) -> Option<JoinHandle<()>> {
    let spawned = std::thread::Builder::new()
        .name("tollgate-policy-follower".into())
        .spawn(move || {
            while !stopped() {
                std::thread::sleep(SYNC_EVERY);
                match engine.sync_policy() {
                    Ok(Some(p)) => tracing::info!(name = %p.name, sha256 = %p.sha256, "policy taken up from the store"),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "the store's policy could not be taken up"),
                }
            }
        });
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::error!(error = %e, "the policy follower could not start: policy changes from other replicas are not taken up");
            None
        }
    }
}

/// Housekeeping on threads of its own, until the task is stopped or dropped.
pub struct MaintenanceTask {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Starts housekeeping for `engine`: for a program that calls the engine directly rather
/// than through a [`crate::writer::Writer`] (which does this itself).
///
/// # Errors
/// When the operating system refuses a thread.
pub fn spawn<S: Store + Send + 'static>(
    engine: Arc<Engine<S>>,
    observer: Arc<dyn WriterObserver>,
) -> std::io::Result<MaintenanceTask> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let stopped = stop.clone();
    threads.extend(follow_policy(engine.clone(), move || {
        stopped.load(Ordering::Relaxed)
    }));
    let stopped = stop.clone();
    let mut housekeeping = Maintenance::new(engine, observer);
    threads.push(
        std::thread::Builder::new()
            .name("tollgate-maintenance".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(SYNC_EVERY);
                    housekeeping.run_due();
                }
            })?,
    );
    Ok(MaintenanceTask { stop, threads })
}

impl MaintenanceTask {
    /// Stops housekeeping and waits for its threads (at most one round, a fraction of a
    /// second, unless a policy is being compiled).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for MaintenanceTask {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Milliseconds since the Unix epoch.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
