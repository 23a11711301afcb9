//! The embedded SQLite store: one file in WAL mode (or memory), every transaction
//! `BEGIN IMMEDIATE`, the schema created and versioned by the host. The transaction is
//! in `tx`, the background checkpointer in `checkpoint`; the schema is `store::schema`.

use super::row_cache::RowCache;
use super::{schema, together_then_apart, BatchAttempt, Isolation, Store, StoreError, Tx};
use bucket_log::BucketLog;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};
use std::time::Duration;

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

mod bucket_log;
mod checkpoint;
mod tx;

pub use checkpoint::RestartObserver;
use checkpoint::{Checkpointer, RESTART_WAL_AT, WAL_PAGES_WITH_CHECKPOINTER};
use tx::SqliteTx;

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
    /// Opens (or creates) a database file in WAL mode; a file of an earlier release is
    /// upgraded in place.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = tollgate::store::SqliteStore::open(&dir.path().join("tollgate.db")).unwrap();
    /// # drop(store);
    /// ```
    ///
    /// # Errors
    /// [`StoreError::Database`] when the file cannot be opened or is not a database;
    /// [`StoreError::Schema`] when a later release wrote it.
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
        conn.pragma_update(None, "cache_size", -2048)?;
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        Self::init(conn, Some(path.to_path_buf()))
    }

    /// A private in-memory database (scenarios, smoke checks of a candidate policy).
    ///
    /// # Errors
    /// Only when SQLite cannot allocate it.
    pub fn in_memory() -> Result<Self, StoreError> {
        configure_sqlite();
        Self::init(Connection::open_in_memory()?, None)
    }

    /// A private database kept in memory as a file (SQLite's `memdb` VFS), for long runs
    /// such as simulations. A plain in-memory database keeps every page in its page cache,
    /// and a commit that splits a B-tree page walks that whole cache: each commit then
    /// costs more as the database grows. Here the cache stays small (2 MiB) and the pages
    /// past it are copied from memory, so a commit's cost stays flat.
    pub fn in_memory_file() -> Result<Self, StoreError> {
        use rusqlite::OpenFlags;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        configure_sqlite();
        let name = format!(
            // Without a leading `/` a memdb database is private to its connection: no
            // mutex around each page read.
            "tollgate-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags_and_vfs(name, flags, "memdb")?;
        conn.pragma_update(None, "journal_mode", "MEMORY")?;
        conn.pragma_update(None, "synchronous", "OFF")?;
        conn.pragma_update(None, "cache_size", -2048)?;
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        Self::init(conn, None)
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
        self.checkpointer.as_ref().map_or(0, Checkpointer::restarts)
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
        let checkpointer =
            Checkpointer::start(&path, self.gate.clone(), every, restart_at, on_restart)?;
        self.conn
            .pragma_update(None, "wal_autocheckpoint", writer_bound)?;
        self.checkpointer = Some(checkpointer);
        Ok(())
    }

    fn init(conn: Connection, path: Option<PathBuf>) -> Result<Self, StoreError> {
        // Every statement of this file stays prepared (the default cache holds only 16).
        conn.set_prepared_statement_cache_capacity(64);
        {
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(&schema::tables("INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB"))?;
            tx.execute_batch(bucket_log::TABLE)?;
            let found: Option<String> = tx
                .query_row(schema::READ_VERSION_SQL, [], |r| r.get(0))
                .optional()?;
            if schema::check_version(found.clone(), schema::SQLITE_VERSION)? {
                for sql in schema::upgrades(found.as_deref(), schema::SQLITE_PRIORITY_SINCE) {
                    tx.execute_batch(sql)?;
                }
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
        let outcome = unwind_distrusting(rows, log, |rows, _| f(&mut SqliteTx { tx: &tx, rows }));
        match outcome {
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

    /// Together first, with savepoints only if a job failed (see `Isolation`).
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
        match unwind_distrusting(rows, log, |rows, log| run(rows, log)) {
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

/// SQL may hold other rows than the cache: it is emptied, and the bucket log will be folded
/// from SQL before the next transaction reads a balance.
fn distrust(rows: &mut RowCache, log: &mut BucketLog) {
    rows.clear();
    log.forget();
}

/// Runs `f` on the cache and the log; if it panics, both are distrusted before the
/// unwinding goes on. The transaction rolls back as it unwinds, and the cache may hold what
/// it wrote: a later commit must not write that.
fn unwind_distrusting<R>(
    rows: &mut RowCache,
    log: &mut BucketLog,
    f: impl FnOnce(&mut RowCache, &mut BucketLog) -> R,
) -> R {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(rows, log)));
    outcome.unwrap_or_else(|panic| {
        distrust(rows, log);
        std::panic::resume_unwind(panic)
    })
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

#[cfg(test)]
mod tests;
