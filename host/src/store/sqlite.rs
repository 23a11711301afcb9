//! The embedded SQLite store: one file in WAL mode (or memory), every transaction
//! `BEGIN IMMEDIATE`, the schema created and versioned by the host.

use super::bucket_log::{self, BucketLog};
use super::row_cache::RowCache;
use super::{
    schema, together_then_apart, BatchAttempt, Isolation, QueuedJob, Store, StoreError, Tx,
};
use crate::bucket;
use crate::model::Operation;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A SQLite database owned by this process.
pub struct SqliteStore {
    conn: Connection,
    /// The file, for a second connection (the background checkpointer); `None` in memory.
    path: Option<PathBuf>,
    checkpointer: Option<Checkpointer>,
    /// Buckets, slots and meta as this connection last left them (see `row_cache`).
    rows: Box<RowCache>,
    /// Where bucket balances are written (see `bucket_log`).
    log: Box<BucketLog>,
    /// `PRAGMA data_version` when `rows` was last known to be right.
    data_version: i64,
    /// Held by this connection for each transaction; the background checkpointer takes it
    /// to pause the writer between two transactions (see `Checkpointer`).
    gate: Arc<Mutex<()>>,
}

/// Pages the writer lets the WAL reach before it checkpoints itself when a background
/// checkpointer runs (a bound in case that thread falls behind).
const WAL_PAGES_WITH_CHECKPOINTER: u32 = 32_768;
/// WAL frames past which the background checkpointer starts the WAL over.
const RESTART_WAL_AT: i64 = 12_000;
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
struct Checkpointer {
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

/// Process-wide SQLite settings, applied once before the library is first used: no
/// memory statistics, which would take a global lock on every allocation SQLite makes
/// (and it allocates for every statement a decision runs).
fn configure_sqlite() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_config` with an `int` argument, before any connection is opened
        // by this process's store; if the library was already initialised (another user
        // of SQLite in the process), it refuses with SQLITE_MISUSE and changes nothing.
        unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
                0 as std::ffi::c_int,
            );
        }
    });
}

impl SqliteStore {
    /// Opens (or creates) a database file in WAL mode.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        configure_sqlite();
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // 8 MiB of page cache. Not more: a commit whose inserts split a B-tree page walks the
        // whole cache (SQLite renumbers the new pages through a scratch page number, above
        // the end of the file, and then drops every cached page past the end), so each MiB
        // costs every such commit; the operating system's page cache serves what falls out.
        conn.pragma_update(None, "cache_size", -8192)?;
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        Self::init(conn, Some(path.to_path_buf()))
    }

    /// A private in-memory database (scenarios, smoke checks of a candidate policy).
    pub fn in_memory() -> Result<Self, StoreError> {
        configure_sqlite();
        Self::init(Connection::open_in_memory()?, None)
    }

    /// Moves WAL checkpoints to a thread of their own, run every `every` (for a long-lived
    /// writer such as `tollgate serve`). Durability is unchanged: a commit is in the WAL
    /// either way. `on_restart` is told how long each WAL restart held the writer. Does
    /// nothing for an in-memory database or when already running.
    pub fn checkpoint_in_background(
        &mut self,
        every: Duration,
        on_restart: Option<RestartObserver>,
    ) -> Result<(), StoreError> {
        self.start_checkpointer(
            every,
            RESTART_WAL_AT,
            WAL_PAGES_WITH_CHECKPOINTER,
            on_restart,
        )
    }

    /// How many times the background checkpointer started the WAL over (0 without one).
    pub fn wal_restarts(&self) -> u64 {
        self.checkpointer
            .as_ref()
            .map_or(0, |c| c.restarts.load(Ordering::Relaxed))
    }

    fn start_checkpointer(
        &mut self,
        every: Duration,
        restart_at: i64,
        writer_bound: u32,
        on_restart: Option<RestartObserver>,
    ) -> Result<(), StoreError> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        if self.checkpointer.is_some() {
            return Ok(());
        }
        let conn = Connection::open(&path)?;
        conn.busy_timeout(RESTART_PATIENCE)?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let restarts = Arc::new(AtomicU64::new(0));
        let mut work = CheckpointWork {
            conn,
            db: std::fs::File::open(&path)
                .map_err(|e| StoreError::Schema(format!("opening {}: {e}", path.display())))?,
            gate: self.gate.clone(),
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
        self.conn
            .pragma_update(None, "wal_autocheckpoint", writer_bound)?;
        self.checkpointer = Some(Checkpointer {
            stop,
            thread: Some(thread),
            restarts,
        });
        Ok(())
    }

    fn init(conn: Connection, path: Option<PathBuf>) -> Result<Self, StoreError> {
        // Every statement of this file stays prepared (the default cache holds only 16).
        conn.set_prepared_statement_cache_capacity(64);
        {
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(&schema::tables("INTEGER PRIMARY KEY AUTOINCREMENT"))?;
            tx.execute_batch(bucket_log::TABLE)?;
            let found = tx
                .query_row(schema::READ_VERSION_SQL, [], |r| r.get(0))
                .optional()?;
            if schema::check_version(found, schema::SQLITE_VERSION)? {
                tx.execute(
                    &schema::record_version_sql("?1"),
                    [schema::SQLITE_VERSION.to_string()],
                )?;
            }
            tx.commit()?;
        }
        Ok(SqliteStore {
            conn,
            path,
            checkpointer: None,
            rows: Box::default(),
            log: Box::default(),
            data_version: 0,
            gate: Arc::default(),
        })
    }
}

impl Store for SqliteStore {
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let gate = self.gate.clone();
        let _turn = gate.lock().unwrap_or_else(|e| e.into_inner());
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::from)?;
        let rows = &mut self.rows;
        let log = &mut self.log;
        begin(&tx, rows, log, &mut self.data_version)?;
        match f(&mut SqliteTx { tx: &tx, rows }) {
            // A failed flush or commit empties the cache (see `commit`).
            Ok(v) => commit(tx, rows, log).map(|()| v).map_err(E::from),
            Err(e) => {
                // Rolled back: SQL holds what it held before, and so does the cache.
                rows.roll_back();
                log.rolled_back();
                Err(e)
            }
        }
    }

    /// Together first, with savepoints only if a job failed (see [`Isolation`]).
    fn transaction_many<T>(
        &mut self,
        n: usize,
        mut f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        let gate = self.gate.clone();
        let _turn = gate.lock().unwrap_or_else(|e| e.into_inner());
        together_then_apart(|isolation| self.run_batch(n, &mut f, isolation))
    }
}

impl SqliteStore {
    /// Runs the jobs in one transaction and commits it; `None` (nothing written) when a
    /// job failed under [`Isolation::Together`].
    fn run_batch<T>(
        &mut self,
        n: usize,
        f: &mut impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
        isolation: Isolation,
    ) -> BatchAttempt<T> {
        let savepoints = isolation == Isolation::Savepoints;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let rows = &mut self.rows;
        let log = &mut self.log;
        let mut run = |rows: &mut RowCache, log: &mut BucketLog| -> BatchAttempt<T> {
            begin(&tx, rows, log, &mut self.data_version)?;
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                if savepoints {
                    tx.prepare_cached("SAVEPOINT item")?.execute([])?;
                }
                let result = f(i, &mut SqliteTx { tx: &tx, rows });
                if result.is_ok() {
                    rows.keep();
                } else if savepoints {
                    tx.prepare_cached("ROLLBACK TO item")?.execute([])?;
                    rows.roll_back();
                } else {
                    return Ok(None);
                }
                if savepoints {
                    tx.prepare_cached("RELEASE item")?.execute([])?;
                }
                out.push(result);
            }
            Ok(Some(out))
        };
        match run(rows, log) {
            // A failed flush or commit empties the cache (see `commit`).
            Ok(Some(out)) => commit(tx, rows, log).map(|()| Some(out)),
            // Rolled back (dropping `tx` does it): the cache cannot say what SQL holds.
            other => {
                distrust(rows, log);
                other
            }
        }
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

/// SQL may hold other rows than the cache: it is emptied, and the bucket log will be folded
/// from SQL before the next transaction reads a balance.
fn distrust(rows: &mut RowCache, log: &mut BucketLog) {
    rows.clear();
    log.forget();
}

/// The start of every transaction: empties the row cache if another connection committed
/// since this one last looked, and folds the bucket log if the cache cannot vouch for it.
fn begin(
    tx: &Connection,
    rows: &mut RowCache,
    log: &mut BucketLog,
    known: &mut i64,
) -> Result<(), StoreError> {
    let version: i64 = tx
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))?;
    if version != *known {
        distrust(rows, log);
        *known = version;
    }
    log.begin(tx)
}

/// Writes the rows the transaction changed, then commits. On failure the transaction
/// rolls back and the cache, which may hold the rolled-back values, is emptied.
fn commit(
    tx: rusqlite::Transaction<'_>,
    rows: &mut RowCache,
    log: &mut BucketLog,
) -> Result<(), StoreError> {
    let flush = rows.take_flush();
    let result = (|| -> Result<(), StoreError> {
        log.write(&tx, rows, &flush.buckets)?;
        for (scope, in_use) in &flush.slots {
            tx.prepare_cached(
                "INSERT INTO slots (scope, in_use) VALUES (?1, ?2)
                 ON CONFLICT (scope) DO UPDATE SET in_use = ?2",
            )?
            .execute(params![scope, in_use])?;
        }
        Ok(tx.commit()?)
    })();
    if result.is_err() {
        distrust(rows, log);
    }
    result
}

struct SqliteTx<'a> {
    tx: &'a Connection,
    rows: &'a mut RowCache,
}

fn job_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<QueuedJob> {
    Ok(QueuedJob {
        tenant: r.get(0)?,
        key: r.get(1)?,
        tokens: r.get::<_, i64>(2)? as u64,
        not_before_ms: r.get(3)?,
        expire_at_ms: r.get(4)?,
    })
}

impl Tx for SqliteTx<'_> {
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError> {
        if let Some(s) = self.rows.bucket(name) {
            return Ok(s);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT balance_micro, updated_ms FROM buckets WHERE name = ?1")?;
        let s = st
            .query_row([name], |r| {
                Ok(bucket::State {
                    balance_micro: r.get(0)?,
                    updated_ms: r.get(1)?,
                })
            })
            .optional()?;
        self.rows.bucket_read(name, s);
        Ok(s)
    }

    fn set_bucket(&mut self, name: &str, s: bucket::State) -> Result<(), StoreError> {
        // Written to SQL when the transaction commits.
        self.rows.set_bucket(name, s);
        Ok(())
    }

    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.rows.slots(scope) {
            return Ok(n);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT in_use FROM slots WHERE scope = ?1")?;
        let n = st
            .query_row([scope], |r| r.get::<_, u32>(0))
            .optional()?
            .unwrap_or(0);
        self.rows.slots_read(scope, n);
        Ok(n)
    }

    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError> {
        // Written to SQL when the transaction commits.
        self.rows.set_slots(scope, in_use);
        Ok(())
    }

    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT record FROM operations WHERE tenant = ?1 AND key = ?2")?;
        let record: Option<String> = st.query_row([tenant, key], |r| r.get(0)).optional()?;
        Ok(record
            .map(|r| Operation::from_record(tenant.to_string(), key.to_string(), &r))
            .transpose()?)
    }

    fn put_operation(&mut self, op: &Operation) -> Result<(), StoreError> {
        let record = serde_json::to_string(op)?;
        let mut st = self.tx.prepare_cached(
            "INSERT INTO operations (tenant, key, state, worker, record) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (tenant, key) DO UPDATE SET state = ?3, worker = ?4, record = ?5",
        )?;
        st.execute(params![
            op.tenant,
            op.key,
            op.state.as_str(),
            op.worker,
            record
        ])?;
        Ok(())
    }

    fn operations(&mut self) -> Result<Vec<Operation>, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT tenant, key, record FROM operations ORDER BY tenant, key")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (tenant, key, record) = row?;
            out.push(Operation::from_record(tenant, key, &record)?);
        }
        Ok(out)
    }

    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT COUNT(*) FROM operations WHERE worker = ?1 AND state IN ('active', 'unknown')",
        )?;
        Ok(st.query_row([worker], |r| r.get(0))?)
    }

    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        if let Some(v) = self.rows.meta(name) {
            return Ok(v);
        }
        let mut st = self
            .tx
            .prepare_cached("SELECT value FROM meta WHERE name = ?1")?;
        let v: Option<String> = st.query_row([name], |r| r.get(0)).optional()?;
        self.rows.meta_read(name, v.clone());
        Ok(v)
    }

    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError> {
        let mut st = self.tx.prepare_cached(
            "INSERT INTO meta (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET value = ?2",
        )?;
        st.execute([name, value])?;
        self.rows.meta_written(name, value);
        Ok(())
    }

    fn enqueue(&mut self, job: &QueuedJob) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO queue (tenant, key, tokens, not_before_ms, expire_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![job.tenant, job.key, job.tokens as i64, job.not_before_ms, job.expire_at_ms])?;
        self.tx
            .prepare_cached(
                "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES (?1, 1, 0)
                 ON CONFLICT (tenant) DO UPDATE SET depth = depth + 1",
            )?
            .execute([&job.tenant])?;
        Ok(())
    }

    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let removed = self
            .tx
            .prepare_cached("DELETE FROM queue WHERE tenant = ?1 AND key = ?2")?
            .execute([tenant, key])?;
        if removed > 0 {
            self.tx
                .prepare_cached("UPDATE tenant_queues SET depth = depth - ?2 WHERE tenant = ?1")?
                .execute(params![tenant, removed as i64])?;
        }
        Ok(())
    }

    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT depth FROM tenant_queues WHERE tenant = ?1")?;
        Ok(st
            .query_row([tenant], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    fn ready_head(&mut self, tenant: &str, now_ms: i64) -> Result<Option<QueuedJob>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT tenant, key, tokens, not_before_ms, expire_at_ms FROM queue
             WHERE tenant = ?1 AND not_before_ms <= ?2 ORDER BY seq LIMIT 1",
        )?;
        Ok(st
            .query_row(params![tenant, now_ms], job_from_row)
            .optional()?)
    }

    fn next_backlogged(&mut self, after: Option<&str>) -> Result<Option<String>, StoreError> {
        // Two statements, so that each is a plain seek on the partial index.
        let row = match after {
            Some(after) => self
                .tx
                .prepare_cached(
                    "SELECT tenant FROM tenant_queues WHERE depth > 0 AND tenant > ?1
                     ORDER BY tenant LIMIT 1",
                )?
                .query_row([after], |r| r.get(0))
                .optional()?,
            None => self
                .tx
                .prepare_cached(
                    "SELECT tenant FROM tenant_queues WHERE depth > 0 ORDER BY tenant LIMIT 1",
                )?
                .query_row([], |r| r.get(0))
                .optional()?,
        };
        Ok(row)
    }

    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError> {
        let mut st = self.tx.prepare_cached(
            "SELECT tenant, key, tokens, not_before_ms, expire_at_ms FROM queue
             WHERE expire_at_ms <= ?1 ORDER BY expire_at_ms, seq",
        )?;
        let rows = st.query_map([now_ms], job_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError> {
        let mut st = self
            .tx
            .prepare_cached("SELECT deficit FROM tenant_queues WHERE tenant = ?1")?;
        Ok(st
            .query_row([tenant], |r| r.get::<_, i64>(0))
            .optional()?
            .unwrap_or(0) as u64)
    }

    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError> {
        self.tx
            .prepare_cached(
                "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES (?1, 0, ?2)
                 ON CONFLICT (tenant) DO UPDATE SET deficit = ?2",
            )?
            .execute(params![tenant, deficit.min(i64::MAX as u64) as i64])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(balance_micro: i64) -> bucket::State {
        bucket::State {
            balance_micro,
            updated_ms: 7,
        }
    }

    /// A store on a new file in a folder of its own (kept while the folder is).
    fn fresh() -> (tempfile::TempDir, PathBuf, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = SqliteStore::open(&path).unwrap();
        (dir, path, store)
    }

    /// The balance another connection finds, read without writing anything.
    fn in_sql(path: &Path, name: &str) -> Option<i64> {
        let conn = Connection::open(path).unwrap();
        bucket_log::state_in_sql(&conn, name)
            .unwrap()
            .map(|s| s.balance_micro)
    }

    fn count(path: &Path, table: &str) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    /// Commits `write` in a transaction of its own, again and again for `how_long`; how
    /// many times.
    fn commit_for(
        store: &mut SqliteStore,
        how_long: Duration,
        write: impl Fn(&mut dyn Tx) -> Result<(), StoreError>,
    ) -> i64 {
        let started = Instant::now();
        let mut commits = 0;
        while started.elapsed() < how_long {
            store.transaction(&write).unwrap();
            commits += 1;
        }
        commits
    }

    /// Commits one bucket's balance.
    fn set(store: &mut SqliteStore, name: &str, balance_micro: i64) {
        store
            .transaction(|tx| tx.set_bucket(name, state(balance_micro)))
            .unwrap();
    }

    fn read(store: &mut SqliteStore, name: &str) -> Option<i64> {
        store
            .transaction(|tx| Ok::<_, StoreError>(tx.bucket(name)?.map(|s| s.balance_micro)))
            .unwrap()
    }

    #[test]
    fn cached_rows_reach_sql_at_commit_and_follow_other_connections() {
        let (_dir, path, mut store) = fresh();
        set(&mut store, "x", 5);
        assert_eq!(in_sql(&path, "x"), Some(5));
        assert_eq!(read(&mut store, "x"), Some(5));
        // Another connection commits: the cached row is not trusted any more.
        let mut other = SqliteStore::open(&path).unwrap();
        assert_eq!(read(&mut other, "x"), Some(5));
        set(&mut other, "x", 42);
        assert_eq!(read(&mut store, "x"), Some(42));
        // And the other way round, through the log each of them folds when it must.
        set(&mut store, "x", 43);
        assert_eq!(read(&mut other, "x"), Some(43));
    }

    #[test]
    fn logged_balances_survive_a_stop_before_any_fold() {
        let (_dir, path, mut store) = fresh();
        for i in 0..5 {
            store
                .transaction(|tx| {
                    tx.set_bucket("a", state(i))?;
                    tx.set_bucket(&format!("b{i}"), state(100 + i))
                })
                .unwrap();
        }
        // Only the log holds them: one row per commit, nothing in `buckets` yet.
        assert_eq!(count(&path, "bucket_log"), 5);
        assert_eq!(count(&path, "buckets"), 0);
        drop(store);
        let mut reopened = SqliteStore::open(&path).unwrap();
        assert_eq!(read(&mut reopened, "a"), Some(4));
        for i in 0..5 {
            assert_eq!(read(&mut reopened, &format!("b{i}")), Some(100 + i));
        }
        // The first transaction folded the log into `buckets`.
        assert_eq!(count(&path, "bucket_log"), 0);
        assert_eq!(count(&path, "buckets"), 6);
    }

    #[test]
    fn folding_in_epochs_keeps_every_balance_and_bounds_the_log() {
        let (_dir, path, mut store) = fresh();
        *store.log = BucketLog::with_limits(4, 3);
        let mut model = std::collections::BTreeMap::new();
        let mut most_rows = 0;
        for round in 0..300i64 {
            // Two or three of twenty buckets per commit, some commits none.
            let names: Vec<String> = (0..round % 4)
                .map(|k| format!("t{}", (round * 7 + k * 3) % 20))
                .collect();
            store
                .transaction(|tx| {
                    for n in &names {
                        tx.set_bucket(n, state(round))?;
                    }
                    Ok::<_, StoreError>(())
                })
                .unwrap();
            for n in names {
                model.insert(n, round);
            }
            most_rows = most_rows.max(count(&path, "bucket_log"));
            if round % 25 == 0 {
                for (n, v) in &model {
                    assert_eq!(in_sql(&path, n), Some(*v), "{n} after round {round}");
                }
            }
            if round % 70 == 0 {
                // Another connection folds the log from SQL wherever the epoch stands; this
                // one then cannot vouch for its cache and folds again before going on.
                let mut other = SqliteStore::open(&path).unwrap();
                for (n, v) in &model {
                    assert_eq!(read(&mut other, n), Some(*v), "{n} after round {round}");
                }
                assert_eq!(count(&path, "bucket_log"), 0);
            }
        }
        // An epoch starts after 4 rows, writes 3 buckets per commit (20 at most), then
        // deletes 3 rows per commit: the log stays near its threshold (300 rows unfolded).
        assert!(most_rows <= 12, "{most_rows} rows in the log");
        assert!(count(&path, "buckets") == 20);
        for (n, v) in &model {
            assert_eq!(in_sql(&path, n), Some(*v), "{n}");
            assert_eq!(read(&mut store, n), Some(*v), "{n}");
        }
        drop(store);
        let mut reopened = SqliteStore::open(&path).unwrap();
        for (n, v) in &model {
            assert_eq!(read(&mut reopened, n), Some(*v), "{n}");
        }
    }

    #[test]
    fn a_damaged_log_row_is_an_error_and_nothing_is_lost() {
        let (_dir, path, mut store) = fresh();
        set(&mut store, "a", 7);
        drop(store);
        let conn = Connection::open(&path).unwrap();
        conn.execute("UPDATE bucket_log SET states = x'0500'", [])
            .unwrap();
        let mut store = SqliteStore::open(&path).unwrap();
        let e = store
            .transaction(|tx| tx.bucket("a"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bucket log row 1: cut short"), "{e}");
        // Refused again, the row still there for whoever repairs it.
        assert!(store.transaction(|tx| tx.bucket("a")).is_err());
        assert_eq!(count(&path, "bucket_log"), 1);
    }

    #[test]
    fn a_version_1_database_is_upgraded_and_a_newer_one_refused() {
        let (_dir, path, mut store) = fresh();
        let version = |path: &Path| -> String {
            Connection::open(path)
                .unwrap()
                .query_row(schema::READ_VERSION_SQL, [], |r| r.get(0))
                .unwrap()
        };
        set(&mut store, "a", 7);
        drop(store);
        assert_eq!(version(&path), "2");
        // What a host of version 1 left: balances in `buckets`, no log table.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE bucket_log;
             INSERT INTO buckets (name, balance_micro, updated_ms) VALUES ('a', 9, 1);
             UPDATE meta SET value = '1' WHERE name = 'schema_version';",
        )
        .unwrap();
        let mut store = SqliteStore::open(&path).unwrap();
        assert_eq!(read(&mut store, "a"), Some(9));
        set(&mut store, "a", 8);
        assert_eq!(version(&path), "2");
        drop(store);
        conn.execute(
            "UPDATE meta SET value = '3' WHERE name = 'schema_version'",
            [],
        )
        .unwrap();
        let e = SqliteStore::open(&path).err().unwrap().to_string();
        assert!(e.contains("schema version 3 is not 2"), "{e}");
        assert_eq!(version(&path), "3");
        assert_eq!(in_sql(&path, "a"), Some(8));
    }

    #[test]
    fn rolled_back_work_leaves_neither_sql_nor_the_cache_changed() {
        let (_dir, path, mut store) = fresh();
        // One transaction that fails after writing.
        let failed: Result<(), StoreError> = store.transaction(|tx| {
            tx.set_bucket("z", state(1))?;
            tx.set_slots_in_use("global", 3)?;
            Err(StoreError::Schema("no".into()))
        });
        assert!(failed.is_err());
        assert_eq!(read(&mut store, "z"), None);
        assert_eq!(in_sql(&path, "z"), None);
        // A batch where the middle piece fails: the others commit.
        let answers = store
            .transaction_many(3, |i, tx| {
                tx.set_bucket("y", state(i as i64 + 1))?;
                tx.set_slots_in_use("global", i as u32 + 1)?;
                if i == 1 {
                    return Err(StoreError::Schema("no".into()));
                }
                Ok(())
            })
            .unwrap();
        assert!(answers[0].is_ok() && answers[1].is_err() && answers[2].is_ok());
        assert_eq!(read(&mut store, "y"), Some(3));
        assert_eq!(in_sql(&path, "y"), Some(3));
        let slots = store.transaction(|tx| tx.slots_in_use("global")).unwrap();
        assert_eq!(slots, 3);
        // The middle piece's value never showed: the last piece read what the first wrote.
        let seen = store
            .transaction_many(2, |i, tx| {
                let before = tx.bucket("w")?.map(|s| s.balance_micro);
                if i == 0 {
                    tx.set_bucket("w", state(10))?;
                    return Err(StoreError::Schema("no".into()));
                }
                Ok(before)
            })
            .unwrap();
        assert_eq!(seen[1].as_ref().unwrap(), &None);
    }

    #[test]
    fn the_checkpointer_starts_the_wal_over_under_constant_writes() {
        let (_dir, path, mut store) = fresh();
        // The writer never checkpoints itself here, and the background thread starts the
        // WAL over whenever it holds a frame: it must get its turn between the writer's
        // transactions without stopping them for good.
        let observed = Arc::new(Mutex::new(Vec::new()));
        let seen = observed.clone();
        let on_restart: RestartObserver = Arc::new(move |held| seen.lock().unwrap().push(held));
        store
            .start_checkpointer(Duration::from_millis(5), 1, 1_000_000, Some(on_restart))
            .unwrap();
        let commits = commit_for(&mut store, Duration::from_millis(400), |tx| {
            for i in 0..20 {
                tx.set_meta(&format!("m{i}"), &"x".repeat(2000))?;
            }
            Ok(())
        });
        assert!(store.wal_restarts() > 0);
        // Without restarts the WAL would hold a frame or more per commit.
        let frames: i64 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
            .unwrap();
        assert!(commits > 200, "{commits} commits");
        assert!(
            frames < commits / 2,
            "{frames} frames in the WAL after {commits} commits"
        );
        // Once nothing is written, the WAL started over is left alone (it keeps its frame
        // count until the next write, so a restart would be tried on every turn).
        std::thread::sleep(Duration::from_millis(300));
        let settled = store.wal_restarts();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(store.wal_restarts(), settled);
        // Every restart was reported with the time it held the writer.
        let observed = observed.lock().unwrap();
        assert_eq!(observed.len() as u64, settled);
        assert!(observed.iter().all(|held| *held < Duration::from_secs(1)));
    }

    #[test]
    fn a_long_reader_elsewhere_does_not_keep_stopping_the_writer() {
        let (_dir, path, mut store) = fresh();
        store.transaction(|tx| tx.set_meta("m", "x")).unwrap();
        // Another connection reads the WAL and does not finish: no restart can complete.
        let reader = Connection::open(&path).unwrap();
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM meta;")
            .unwrap();
        store
            .start_checkpointer(Duration::from_millis(5), 1, 1_000_000, None)
            .unwrap();
        let commits = commit_for(&mut store, Duration::from_millis(600), |tx| {
            tx.set_meta("m", "y")
        });
        // The attempt waited RESTART_PATIENCE for the reader and reported itself busy: it
        // is not counted, and the writer went on.
        assert_eq!(store.wal_restarts(), 0);
        assert!(commits > 200, "{commits} commits");
        reader.execute_batch("COMMIT").unwrap();
    }
}
