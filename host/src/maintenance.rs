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
/// The longest a pass over the operations takes while it finds nothing to do (shorter for a
/// short `limits.max_call_ms`: see [`SweepPace`]).
pub const SWEEP_PASS_AT_MOST: Duration = Duration::from_secs(60);
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
    pace: SweepPace,
}

/// How far a round of sweeps walks the operations when it finds nothing to change.
///
/// Each sweep is a stretch of the table in key order; a pass is the stretches from its
/// start to its end. A round goes on at once while its sweeps change operations (so that
/// retention keeps up with a busy store), and otherwise walks only its share of a pass
/// that covers the table, as the last pass found it, once per pass period: a quarter of
/// `limits.max_call_ms`, from 1 s to [`SWEEP_PASS_AT_MOST`]. An abandoned call is so found
/// within that period of going past `limits.max_call_ms`, and a large quiet table costs the
/// writer a stretch or two a second, not a tenth of its time. Until a first pass has
/// measured the table, rounds walk as far as their time allows.
#[derive(Debug, Default)]
struct SweepPace {
    walked_in_pass: u64,
    last_pass: Option<u64>,
}

impl SweepPace {
    /// Counts a sweep's stretch, closing the pass at the table's end.
    fn walked(&mut self, sweep: &crate::engine::Sweep) {
        self.walked_in_pass += sweep.walked;
        if !sweep.more {
            self.last_pass = Some(self.walked_in_pass);
            self.walked_in_pass = 0;
        }
    }

    /// Operations a round every `round` walks while it changes nothing.
    fn rows_per_round(&self, round: Duration, max_call_ms: u64) -> u64 {
        let Some(table) = self.last_pass else {
            return u64::MAX;
        };
        let period = Duration::from_millis(max_call_ms / 4).clamp(SWEEP_EVERY, SWEEP_PASS_AT_MOST);
        let share = u128::from(table) * round.as_millis() / period.as_millis().max(1);
        u64::try_from(share).unwrap_or(u64::MAX)
    }
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
            pace: SweepPace::default(),
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
        let round = SWEEP_EVERY * self.engine.live_lease_holders();
        if self.sweeps && self.swept.elapsed() >= round {
            self.swept = Instant::now();
            self.sweep(round);
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
    /// the operations, and more stretches at once while they change operations or the
    /// round has not walked its share of the pass ([`SweepPace`]), up to [`SWEEP_BUDGET`]
    /// of each second. `round` is how often this engine sweeps.
    fn sweep(&mut self, round: Duration) {
        let started = Instant::now();
        let share = self
            .pace
            .rows_per_round(round, self.engine.config().max_call_ms);
        let mut walked = 0;
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
                    self.pace.walked(&s);
                    walked += s.walked;
                    let enough = !s.changed_any() && walked >= share;
                    if !s.more || enough || started.elapsed() >= SWEEP_BUDGET {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Completion, Sweep, SWEEP_ROWS};
    use crate::store::SqliteStore;
    use std::sync::Mutex;

    fn stretch(walked: u64, more: bool) -> Sweep {
        Sweep {
            walked,
            more,
            ..Sweep::default()
        }
    }

    #[test]
    fn a_pass_measures_the_table_a_quiet_round_walks_a_share_of() {
        let mut pace = SweepPace::default();
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 600_000), u64::MAX);
        pace.walked(&stretch(1024, true));
        pace.walked(&stretch(1024, true));
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 600_000), u64::MAX);
        pace.walked(&stretch(952, false));
        // 3,000 rows over the longest pass, 60 s.
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 600_000), 50);
        assert_eq!(pace.rows_per_round(SWEEP_EVERY * 2, 600_000), 100);
        // A quarter of a 40 s max_call_ms: a pass every 10 s.
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 40_000), 300);
        // Never a pass more often than each round.
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 100), 3000);
        pace.walked(&stretch(10, false));
        assert_eq!(pace.rows_per_round(SWEEP_EVERY, 4_000), 10);
    }

    /// The rows each sweep walked, and the operations it deleted.
    #[derive(Default)]
    struct Walks(Mutex<Vec<(u64, u64)>>);

    impl WriterObserver for Walks {
        fn swept(&self, sweep: &Sweep) {
            self.0.lock().unwrap().push((sweep.walked, sweep.deleted));
        }
    }

    impl Walks {
        fn taken(&self) -> Vec<(u64, u64)> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// An engine whose store holds `n` operations that finished at `at_ms`.
    fn finished(n: usize, at_ms: i64, retention_days: Option<f64>) -> Arc<Engine<SqliteStore>> {
        let mut config = serde_json::json!({
            "global": {"requests": {"capacity": 100_000, "refill_per_s": 1}},
            "tenant_defaults": {"requests": {"capacity": 100_000, "refill_per_s": 1}},
            "tenants": {"acme": {}},
        });
        if let Some(days) = retention_days {
            config["retention"] = serde_json::json!({"operations_days": days});
        }
        let engine = crate::engine::test_engine(&config);
        for i in 0..n {
            let key = format!("k{i:05}");
            let request = serde_json::json!({"tenant": "acme", "key": key, "route": "interactive",
                "input_tokens": 1, "max_output_tokens": 1, "deadline_ms": at_ms + 60_000});
            let decision = engine.admit(&request, at_ms).unwrap();
            assert!(decision.authorises_call(), "{i}: {decision:?}");
            assert!(
                engine
                    .complete(&Completion::succeeded("acme", &key), at_ms)
                    .unwrap()
                    .ok
            );
        }
        Arc::new(engine)
    }

    #[test]
    fn a_quiet_table_is_walked_a_stretch_a_round_and_one_that_changes_at_once() {
        let walks = Arc::new(Walks::default());
        let quiet = finished(3000, wall_clock_ms(), None);
        let mut maintenance = Maintenance::new(quiet, walks.clone());
        // No pass has measured the table: the first round walks it whole.
        maintenance.sweep(SWEEP_EVERY);
        assert_eq!(walks.taken(), [(1024, 0), (1024, 0), (952, 0)]);
        // Its share is then 50 rows a round: one stretch, where it was the whole table.
        maintenance.sweep(SWEEP_EVERY);
        assert_eq!(walks.taken(), [(u64::from(SWEEP_ROWS), 0)]);
        maintenance.sweep(SWEEP_EVERY);
        assert_eq!(walks.taken(), [(1024, 0)]);

        // Operations past retention: a round goes on while its sweeps delete.
        let day_ms = 86_400_000;
        let stale = finished(3000, wall_clock_ms() - 3 * day_ms, Some(1.0));
        let mut maintenance = Maintenance::new(stale, walks.clone());
        maintenance.pace.last_pass = Some(3000);
        maintenance.sweep(SWEEP_EVERY);
        assert_eq!(walks.taken(), [(1024, 1024), (1024, 1024), (952, 952)]);
    }
}
