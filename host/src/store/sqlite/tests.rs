//! The SQLite store: durability, the row cache, the bucket log and the checkpointer.

use super::*;
use crate::bucket;
use std::time::Instant;

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
    assert_eq!(version(&path), "4");
    // What a host of version 1 left: balances in `buckets`, no log table, a queue without
    // priorities (with a job in it).
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        r#"DROP TABLE bucket_log;
         DROP INDEX queue_by_band;
         ALTER TABLE queue DROP COLUMN priority;
         INSERT INTO queue (tenant, key, tokens, not_before_ms, expire_at_ms)
             VALUES ('acme', 'old', 5, 0, 99);
         INSERT INTO buckets (name, balance_micro, updated_ms) VALUES ('a', 9, 1);
         INSERT INTO operations (tenant, key, state, worker, record) VALUES ('acme', 'done',
             'succeeded', NULL, '{"fingerprint":"f","route":"interactive","state":"succeeded",
             "attempt":1,"deadline_ms":9,"input_tokens":2,"max_output_tokens":3,
             "reserved_tokens":5,"policy_digest":"p"}');
         UPDATE meta SET value = '1' WHERE name = 'schema_version';"#,
    )
    .unwrap();
    let mut store = SqliteStore::open(&path).unwrap();
    assert_eq!(read(&mut store, "a"), Some(9));
    set(&mut store, "a", 8);
    assert_eq!(version(&path), "4");
    // A finished operation's JSON record reads as it did; written again, it is packed.
    let mut done = store
        .transaction(|tx| tx.operation("acme", "done"))
        .unwrap()
        .unwrap();
    assert_eq!((done.fingerprint.as_str(), done.reserved_tokens), ("f", 5));
    done.attempt = 2;
    store.transaction(|tx| tx.put_operation(&done)).unwrap();
    let kind: String = conn
        .query_row(
            "SELECT typeof(record) FROM operations WHERE key = 'done'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kind, "blob");
    let again = store
        .transaction(|tx| tx.operation("acme", "done"))
        .unwrap()
        .unwrap();
    assert_eq!(again.attempt, 2);
    // The job queued before bands existed waits in the standard band.
    let head = store
        .transaction(|tx| tx.ready_head("acme", crate::model::Priority::Standard, 0))
        .unwrap()
        .unwrap();
    assert_eq!((head.key.as_str(), head.tokens), ("old", 5));
    drop(store);
    conn.execute(
        "UPDATE meta SET value = '5' WHERE name = 'schema_version'",
        [],
    )
    .unwrap();
    let e = SqliteStore::open(&path).err().unwrap().to_string();
    assert!(e.contains("schema version 5 is not 4"), "{e}");
    assert_eq!(version(&path), "5");
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

#[test]
fn a_panic_inside_a_transaction_leaves_nothing_to_be_written_later() {
    let (_dir, path, mut store) = fresh();
    set(&mut store, "n", 5);
    // A job that writes and then panics: SQL rolls back as the transaction unwinds.
    for batch in [false, true] {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let write = |tx: &mut dyn Tx| -> Result<(), StoreError> {
                tx.set_bucket("n", state(99))?;
                tx.set_slots_in_use("global", 3)?;
                panic!("a job that panics")
            };
            if batch {
                let _ = store.transaction_many(1, |_, tx| write(tx));
            } else {
                let _ = store.transaction(write);
            }
        }));
        assert!(panicked.is_err());
        // A later commit that touches other rows must not write the rolled-back ones.
        store.transaction(|tx| tx.set_meta("after", "1")).unwrap();
        assert_eq!(read(&mut store, "n"), Some(5), "batch: {batch}");
        assert_eq!(in_sql(&path, "n"), Some(5), "batch: {batch}");
        let slots = store.transaction(|tx| tx.slots_in_use("global")).unwrap();
        assert_eq!(slots, 0, "batch: {batch}");
    }
}
