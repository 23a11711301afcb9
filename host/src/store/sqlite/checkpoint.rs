//! The background checkpointer: a thread on a connection of its own that copies the WAL
//! back into the database file, so that the writer never waits for a checkpoint's writes
//! and `fsync`.

use crate::store::StoreError;
use rusqlite::Connection;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pages the writer lets the WAL reach before it checkpoints itself when a background
/// checkpointer runs (a bound in case that thread falls behind).
pub(super) const WAL_PAGES_WITH_CHECKPOINTER: u32 = 32_768;
/// WAL frames past which the background checkpointer starts the WAL over.
pub(super) const RESTART_WAL_AT: i64 = 12_000;
/// Frames the last checkpoint before a restart may have had to copy: the catching up goes
/// on, without blocking, until no more than this was added during a round.
const RESTART_WITH_AT_MOST: i64 = 256;
/// Checkpoints without blocking tried per restart before giving up until the next turn (a
/// writer adding frames faster than they are copied, or a reader holding them).
const CATCH_UP_ROUNDS: usize = 8;
/// How long the checkpointer waits for another connection's write or read to end before
/// it gives up starting the WAL over (the writer waits that long at most).
const RESTART_PATIENCE: Duration = Duration::from_millis(100);
/// How many times longer the checkpointer sleeps after a turn that found nothing written.
const IDLE_SLOWDOWN: u32 = 5;
/// How long the checkpointer leaves the writer alone after another connection kept it
/// from starting the WAL over (a long read, say): each attempt costs the writer up to
/// `RESTART_PATIENCE`.
const RESTART_BACKOFF: Duration = Duration::from_secs(5);

/// A thread that copies the WAL back into the database file, so that the writer never
/// waits for a checkpoint's writes and `fsync`. Stops when dropped.
///
/// The WAL starts over from its beginning only once a checkpoint has copied all of it.
/// Under constant load that seldom happens on its own (new commits arrive while a passive
/// checkpoint copies), so the writer would reach its bound and checkpoint itself, copying
/// everything the last passive checkpoint missed while every decision waits (about 50 ms
/// on the reference machine). Instead, past `RESTART_WAL_AT` frames the checkpointer
/// copies without blocking until a round has at most `RESTART_WITH_AT_MOST` frames to
/// copy, syncs the database file, catches up again, and only then holds the writer
/// between two transactions (its gate) for the last frames, their `fsync`s and the
/// restart: 2–10 ms on the reference machine, where holding it for everything since the
/// last sync took 6–24 ms.
pub(super) struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    /// Times it started the WAL over.
    restarts: Arc<AtomicU64>,
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Checkpointer {
    /// Starts the thread on a connection of its own to the file at `path`.
    pub(super) fn start(
        path: &Path,
        gate: Arc<Mutex<()>>,
        every: Duration,
        restart_at: i64,
        on_restart: Option<RestartObserver>,
    ) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(RESTART_PATIENCE)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let restarts = Arc::new(AtomicU64::new(0));
        let mut work = CheckpointWork {
            conn,
            db: std::fs::File::open(path)
                .map_err(|e| StoreError::Schema(format!("opening {}: {e}", path.display())))?,
            gate,
            restart_at,
            restarts: restarts.clone(),
            restart_after: Instant::now(),
            frames_seen: 0,
            on_restart,
        };
        let thread = std::thread::Builder::new()
            .name("tollgate-checkpoint".into())
            .spawn(move || {
                let (stopped, wake) = &*flag;
                let mut done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                let mut wait = every;
                while !*done {
                    (done, _) = wake
                        .wait_timeout(done, wait)
                        .unwrap_or_else(|e| e.into_inner());
                    // While nothing is written, waking at the full rate only costs CPU.
                    wait = if work.run() {
                        every
                    } else {
                        every * IDLE_SLOWDOWN
                    };
                }
            })
            .map_err(|e| StoreError::Schema(format!("starting the checkpointer: {e}")))?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
            restarts,
        })
    }

    /// How many times it started the WAL over.
    pub(super) fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }
}

/// What the checkpoint thread does each time it wakes (see `Checkpointer`).
struct CheckpointWork {
    conn: Connection,
    /// The database file, to sync it before a restart.
    db: std::fs::File,
    gate: Arc<Mutex<()>>,
    restart_at: i64,
    restarts: Arc<AtomicU64>,
    /// No restart is tried before this (see `RESTART_BACKOFF`).
    restart_after: Instant,
    /// Frames in the WAL at the last turn.
    frames_seen: i64,
    on_restart: Option<RestartObserver>,
}

/// Told how long a WAL restart held the writer (for metrics).
pub type RestartObserver = Arc<dyn Fn(Duration) + Send + Sync>;

impl CheckpointWork {
    /// One turn; whether the WAL had anything new since the last.
    fn run(&mut self) -> bool {
        // PASSIVE never blocks the writer; what it cannot copy now it copies next time. A
        // failure leaves the WAL to the writer's own bound.
        let Ok(wal) = checkpoint(&self.conn, "PASSIVE") else {
            return true;
        };
        let written = wal.frames != self.frames_seen;
        self.frames_seen = wal.frames;
        // A WAL already started over keeps its frame count until the next write: nothing
        // to do for it until then.
        if written && wal.frames >= self.restart_at && Instant::now() >= self.restart_after {
            self.restart(wal);
        }
        written
    }

    /// Starts the WAL over (see [`Checkpointer`]).
    fn restart(&mut self, wal: WalState) {
        let Some(wal) = self.catch_up(wal) else {
            return;
        };
        // SQLite syncs the database file only after a checkpoint that reached the end of
        // the WAL, which under constant load is the restart's: all the pages copied since
        // the last restart would reach the disk while the writer waits (6-24 ms). Synced
        // here, with the writer going on, the restart syncs only the last few.
        if self.db.sync_data().is_err() || self.catch_up(wal).is_none() {
            return;
        }
        let turn = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let held = Instant::now();
        let restarted = checkpoint(&self.conn, "RESTART");
        drop(turn);
        match restarted {
            Ok(wal) if !wal.busy => {
                self.restarts.fetch_add(1, Ordering::Relaxed);
                self.frames_seen = wal.frames;
                if let Some(observe) = &self.on_restart {
                    observe(held.elapsed());
                }
            }
            _ => self.restart_after = Instant::now() + RESTART_BACKOFF,
        }
    }

    /// Checkpoints without blocking until the last one had at most `RESTART_WITH_AT_MOST`
    /// frames to copy; `None` if they did not get there within `CATCH_UP_ROUNDS`, or the
    /// writer started the WAL over itself. A checkpoint copies the frames there were when
    /// it began, so each one has what the writer added during the last to copy: the rounds
    /// shrink fast.
    fn catch_up(&self, mut last: WalState) -> Option<WalState> {
        for _ in 0..CATCH_UP_ROUNDS {
            let wal = checkpoint(&self.conn, "PASSIVE").ok()?;
            if wal.frames < last.frames {
                return None;
            }
            let added = wal.frames - last.frames;
            last = wal;
            if last.left() == 0 && added <= RESTART_WITH_AT_MOST {
                return Some(last);
            }
        }
        None
    }
}

/// What `PRAGMA wal_checkpoint` reports.
struct WalState {
    /// The checkpoint could not finish: another connection was in the way.
    busy: bool,
    /// Frames in the WAL.
    frames: i64,
    /// Frames of it copied into the database file.
    copied: i64,
}

impl WalState {
    /// Frames not copied yet.
    fn left(&self) -> i64 {
        self.frames - self.copied
    }
}

fn checkpoint(conn: &Connection, mode: &str) -> Result<WalState, StoreError> {
    Ok(
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok(WalState {
                busy: r.get::<_, i64>(0)? != 0,
                frames: r.get(1)?,
                copied: r.get(2)?,
            })
        })?,
    )
}
