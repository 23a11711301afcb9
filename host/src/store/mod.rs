//! The store: where buckets, slots, operations and queues live, behind a narrow interface so
//! that the engine never names a database and another backend can be added beside SQLite.
//!
//! The engine does all of one admission, completion or dispatch inside one
//! [`Store::transaction`]: it reads rows, decides, and writes rows; the store makes that
//! all-or-nothing.

#[cfg(feature = "postgres")]
pub mod postgres;
mod record;
mod row_cache;
mod schema;
mod shared;
pub mod sqlite;

use crate::alerts::Alert;
use crate::bucket;
use crate::model::{Operation, Priority};
use crate::spend::SpendRow;

#[cfg(feature = "postgres")]
pub use postgres::PgStore;
pub use shared::SharedStore;
pub use sqlite::SqliteStore;

/// A driver's own error, kept whole (its [`std::error::Error::source`] chain included) but
/// behind a box, so the store's error names no driver's types: a program can match on what
/// failed without depending on `rusqlite` or `postgres`, and can still downcast when it does.
pub type DriverError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of the store itself (I/O, corruption, a schema from the future).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed; the source is a `rusqlite::Error`.
    #[error("database: {0}")]
    Database(#[source] DriverError),
    /// PostgreSQL failed; the source is a `postgres::Error`.
    #[error("postgres: {0}")]
    Postgres(#[source] DriverError),
    /// The store asked for is not in this build (a `postgres://` URL to a library built
    /// without its `postgres` feature).
    #[error("{0}")]
    Unsupported(String),
    /// A stored record could not be read.
    #[error("stored record is unreadable: {0}")]
    Record(#[from] serde_json::Error),
    /// A packed record is damaged (cut short, or with codes this build does not know).
    #[error("stored record is unreadable: {0}")]
    Corrupt(String),
    /// The schema or the store is not what this version expects.
    #[error("{0}")]
    Schema(String),
    /// The store cannot be reached now (its connection is lost and being re-established):
    /// nothing was written by the failed transaction. Worth retrying shortly.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's disk is full (SQLite's `SQLITE_FULL`, PostgreSQL's `53100`): nothing of
    /// the failed transaction was kept, and writes succeed again once there is room.
    #[error("the store's disk is full: {0}")]
    DiskFull(String),
    /// A batch of a shared store reached a row it had not named while another replica held
    /// it; the store undoes the batch and runs it again with the store to itself, so this
    /// never reaches a caller of [`Store::transaction_batch`].
    #[error("a row the batch did not name is held by another replica")]
    Contended,
}

impl From<rusqlite::Error> for StoreError {
    /// A full disk is the store's absence for a while (nothing of the failed transaction is
    /// kept, and writes succeed again once there is room): `Unavailable`, as a lost
    /// PostgreSQL connection is, so callers get 503 with a Retry-After, not 500.
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            return StoreError::DiskFull(e.to_string());
        }
        StoreError::Database(Box::new(e))
    }
}

#[cfg(feature = "postgres")]
impl From<::postgres::Error> for StoreError {
    fn from(e: ::postgres::Error) -> Self {
        StoreError::Postgres(Box::new(e))
    }
}

impl StoreError {
    /// Whether the failure is the store's absence, not the request's fault or a bug.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::DiskFull(_))
    }

    /// Why the store cannot write now, as `tollgate_store_write_failures_total` names it:
    /// `disk_full` or `unreachable` (`None`: the failure is not the store's absence).
    pub fn unavailable_kind(&self) -> Option<&'static str> {
        match self {
            StoreError::DiskFull(_) => Some("disk_full"),
            StoreError::Unavailable(_) => Some("unreachable"),
            _ => None,
        }
    }
}

/// A queued durable job: metadata only, never a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedJob {
    /// The job's tenant.
    pub tenant: String,
    /// The job's key.
    pub key: String,
    /// The dispatch band it waits in.
    pub priority: crate::model::Priority,
    /// Tokens to reserve at dispatch.
    pub tokens: u64,
    /// Not claimable before this logical time (retries wait here).
    pub not_before_ms: i64,
    /// From this logical time on the job can no longer meet its deadline.
    pub expire_at_ms: i64,
}

/// An object a tenant made through the gateway and can fetch later (a stored response):
/// who made it is the row's key, so another tenant's is never found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OwnedObject {
    /// What it is: `response`.
    pub kind: String,
    /// The provider's id for it.
    pub id: String,
    /// The gateway model whose deployment made it.
    pub model: String,
    /// The deployment that holds it (its upstream account).
    pub deployment: String,
    /// When it was recorded.
    pub created_ms: i64,
}

/// How the jobs of one batch are kept apart inside its transaction. Most batches have no
/// failing job, so a store first runs a batch `Together` and, only if a job fails, again
/// with `Savepoints`: a savepoint per job costs SQLite a statement journal of every page
/// the job changes, and PostgreSQL two round trips.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// No savepoints: a failing job ends the attempt, which rolls back whole.
    Together,
    /// A savepoint per job: a failing job is rolled back alone, the others commit.
    Savepoints,
}

/// The results of one batch under `Isolation`; `None` when a job failed under `Together`
/// (nothing was written).
pub(crate) type BatchAttempt<T> = Result<Option<Vec<Result<T, StoreError>>>, StoreError>;

/// Runs a batch `Together`, and again with `Savepoints` only if a job failed.
pub(crate) fn together_then_apart<T>(
    mut attempt: impl FnMut(Isolation) -> BatchAttempt<T>,
) -> Result<Vec<Result<T, StoreError>>, StoreError> {
    match attempt(Isolation::Together)? {
        Some(all) => Ok(all),
        None => Ok(attempt(Isolation::Savepoints)?.unwrap_or_default()),
    }
}

/// A backend that runs write transactions.
pub trait Store: Send {
    /// Runs `f` in one write transaction: committed when it returns `Ok`, rolled back otherwise.
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>;

    /// Runs `n` pieces of work in one transaction (group commit). Each piece is still all or
    /// nothing: one that fails is rolled back alone and the others commit. The default runs
    /// each in a transaction of its own. `f` may run more than once for a job (a store may
    /// undo a whole attempt and run the batch again), so what it does must depend only on
    /// the store's state and its arguments.
    fn transaction_many<T>(
        &mut self,
        n: usize,
        mut f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        Ok((0..n).map(|i| self.transaction(|tx| f(i, tx))).collect())
    }

    /// As [`Store::transaction_many`], with the rows the jobs will touch named up front: read
    /// ahead, and on a shared store locked one by one instead of the store as a whole when
    /// `hint` names everything the jobs write ([`Prefetch::complete`]).
    fn transaction_batch<T>(
        &mut self,
        n: usize,
        hint: &Prefetch,
        mut f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        self.transaction_many(n, |i, tx| {
            if i == 0 {
                tx.prefetch(hint)?;
            }
            f(i, tx)
        })
    }

    /// The store's own clock in Unix ms, when the store is shared by replicas and its clock
    /// must be the one clock (PostgreSQL); `None` for a store owned by one process.
    fn clock_ms(&mut self) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }
}

/// A store chosen at run time: a SQLite file (the default) or a `postgres://` URL.
pub enum AnyStore {
    /// An embedded SQLite file (or memory).
    Sqlite(SqliteStore),
    /// One writer shard's handle on a SQLite file whose one connection the shards of this
    /// process take in turns (`serve --writers N` on SQLite).
    SqliteShard(SharedStore<SqliteStore>),
    /// A PostgreSQL database shared by replicas.
    #[cfg(feature = "postgres")]
    Postgres(Box<PgStore>),
}

impl AnyStore {
    /// `postgres://…` or `postgresql://…` selects PostgreSQL; anything else is a SQLite file.
    ///
    /// # Errors
    /// As [`SqliteStore::open`] or `PgStore::open`; [`StoreError::Unsupported`] for a
    /// PostgreSQL URL when the library is built without its `postgres` feature.
    pub fn open(db: &str) -> Result<Self, StoreError> {
        if is_postgres_url(db) {
            #[cfg(feature = "postgres")]
            return Ok(AnyStore::Postgres(Box::new(PgStore::open(db)?)));
            #[cfg(not(feature = "postgres"))]
            return Err(StoreError::Unsupported(
                "this build of tollgate has no PostgreSQL store (its `postgres` feature is off); \
                 use a SQLite file"
                    .into(),
            ));
        } else {
            Ok(AnyStore::Sqlite(SqliteStore::open(std::path::Path::new(
                db,
            ))?))
        }
    }

    /// Handles on this store for `n` writer shards: a SQLite store's one connection shared
    /// between `n`; any other store alone, since a PostgreSQL shard opens a connection of
    /// its own.
    pub fn into_shards(self, n: usize) -> Vec<AnyStore> {
        match self {
            AnyStore::Sqlite(s) => SharedStore::split(s, n)
                .into_iter()
                .map(AnyStore::SqliteShard)
                .collect(),
            other => vec![other],
        }
    }
}

/// Whether a `--db` value names a PostgreSQL server.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

impl Store for AnyStore {
    fn transaction<T, E>(&mut self, f: impl FnOnce(&mut dyn Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        match self {
            AnyStore::Sqlite(s) => s.transaction(f),
            AnyStore::SqliteShard(s) => s.transaction(f),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s.transaction(f),
        }
    }

    fn transaction_many<T>(
        &mut self,
        n: usize,
        f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.transaction_many(n, f),
            AnyStore::SqliteShard(s) => s.transaction_many(n, f),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s.transaction_many(n, f),
        }
    }

    fn transaction_batch<T>(
        &mut self,
        n: usize,
        hint: &Prefetch,
        f: impl FnMut(usize, &mut dyn Tx) -> Result<T, StoreError>,
    ) -> Result<Vec<Result<T, StoreError>>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.transaction_batch(n, hint, f),
            AnyStore::SqliteShard(s) => s.transaction_batch(n, hint, f),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s.transaction_batch(n, hint, f),
        }
    }

    fn clock_ms(&mut self) -> Result<Option<i64>, StoreError> {
        match self {
            AnyStore::Sqlite(s) => s.clock_ms(),
            AnyStore::SqliteShard(s) => s.clock_ms(),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s.clock_ms(),
        }
    }
}

/// A key as the store keeps it: never the key itself, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKey {
    /// The key's public id, for listing and revoking.
    pub id: String,
    /// SHA-256 of the key, hex.
    pub sha256: String,
    /// What the key may do.
    pub role: KeyRole,
    /// The caller's tenant, the worker's name, empty for an admin.
    pub subject: String,
}

/// What a stored key may do, as the store keeps it (`caller`, `worker`, `admin`). A word
/// this release does not know is an error of the store, never read as some other role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyRole {
    /// Acts for one tenant (the key's subject).
    Caller,
    /// A dispatch worker (named by the key's subject).
    Worker,
    /// An operator.
    Admin,
}

impl KeyRole {
    /// The word the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRole::Caller => "caller",
            KeyRole::Worker => "worker",
            KeyRole::Admin => "admin",
        }
    }

    /// The role a stored word names.
    ///
    /// # Errors
    /// [`StoreError::Schema`] for a word this release does not know (a store written by a
    /// later release, or edited by hand): refused rather than guessed.
    pub fn from_stored(word: &str, key_id: &str) -> Result<KeyRole, StoreError> {
        match word {
            "caller" => Ok(KeyRole::Caller),
            "worker" => Ok(KeyRole::Worker),
            "admin" => Ok(KeyRole::Admin),
            other => Err(StoreError::Schema(format!(
                "api key {key_id} has the role {other:?}, which this release does not know"
            ))),
        }
    }
}

/// The rows a batch of jobs will read, named up front so that a store that pays a round trip
/// per read can fetch them all at once ([`Tx::prefetch`]), and a store shared by replicas can
/// lock just them.
#[derive(Clone, Debug, Default)]
pub struct Prefetch {
    /// Bucket names.
    pub buckets: Vec<String>,
    /// Slot scopes.
    pub slots: Vec<String>,
    /// Operations, by tenant and key.
    pub operations: Vec<(String, String)>,
    /// Meta values the jobs read.
    pub meta: Vec<String>,
    /// Tenants whose queue the jobs may change or count.
    pub queues: Vec<String>,
    /// Whether the rows above are all the jobs write (admissions, completions,
    /// reconciliations); `false` when a job reaches further (dispatch, listings, meta).
    pub complete: bool,
}

/// The reads and writes of one transaction. Missing rows read as absent, never as errors.
pub trait Tx {
    /// Reads ahead the rows `hint` names (a store with its rows in memory ignores it).
    fn prefetch(&mut self, _hint: &Prefetch) -> Result<(), StoreError> {
        Ok(())
    }
    /// Holds and reads ahead the buckets and slot counts `hint` names, in as few round
    /// trips as the store can, before a job reads them: on a store replicas share, those
    /// its transaction did not name when it began are locked only if free at once
    /// ([`StoreError::Contended`] when one is not, as a single read would find). A store
    /// owned by one process reads them as it reads any row.
    fn reach(&mut self, hint: &Prefetch) -> Result<(), StoreError> {
        self.prefetch(hint)
    }
    /// The shared store's clock in Unix ms as this transaction read it (after its locks),
    /// the one clock of every replica; `None` for a store owned by one process.
    fn store_now_ms(&mut self) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }
    /// A bucket's balance, if it was ever written.
    fn bucket(&mut self, name: &str) -> Result<Option<bucket::State>, StoreError>;
    /// Writes a bucket's balance.
    fn set_bucket(&mut self, name: &str, state: bucket::State) -> Result<(), StoreError>;

    /// Calls in flight in a scope.
    fn slots_in_use(&mut self, scope: &str) -> Result<u32, StoreError>;
    /// Sets the calls in flight in a scope.
    fn set_slots_in_use(&mut self, scope: &str, in_use: u32) -> Result<(), StoreError>;

    /// An operation by tenant and key.
    fn operation(&mut self, tenant: &str, key: &str) -> Result<Option<Operation>, StoreError>;
    /// Writes an operation (inserted or replaced).
    fn put_operation(&mut self, op: &Operation) -> Result<(), StoreError>;
    /// Every operation, ordered by tenant and key (for `inspect`).
    fn operations(&mut self) -> Result<Vec<Operation>, StoreError>;
    /// Up to `limit` operations after `after` (a tenant and key), ordered by tenant and key.
    fn operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError>;
    /// As [`Tx::operations_after`], of the `unknown` operations only (a partial index: the
    /// hot path never writes it, since operations rarely become unknown).
    fn unknown_operations_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Operation>, StoreError>;
    /// Gives the claims recorded under worker name `from` the name `to`; how many.
    fn rename_worker(&mut self, from: &str, to: &str) -> Result<u64, StoreError>;
    /// Deletes an operation's record (retention).
    fn delete_operation(&mut self, tenant: &str, key: &str) -> Result<(), StoreError>;
    /// How many operations are `unknown`.
    fn count_unknown(&mut self) -> Result<u64, StoreError>;
    /// Claims by `worker` whose outcome is not yet known to be final (`active` or `unknown`).
    fn unfinished_claims(&mut self, worker: &str) -> Result<u32, StoreError>;

    /// A small named value (downstream availability, scheduler position).
    fn meta(&mut self, name: &str) -> Result<Option<String>, StoreError>;
    /// Writes a small named value (scheduler position, downstream flag).
    fn set_meta(&mut self, name: &str, value: &str) -> Result<(), StoreError>;

    /// Appends a job at the tail of its tenant's queue.
    fn enqueue(&mut self, job: &QueuedJob) -> Result<(), StoreError>;
    /// Removes a job from its tenant's queue (claimed or expired).
    fn dequeue(&mut self, tenant: &str, key: &str) -> Result<(), StoreError>;
    /// Jobs in a tenant's queue.
    fn queue_depth(&mut self, tenant: &str) -> Result<u32, StoreError>;
    /// The oldest job of `tenant` in dispatch band `band` that may be claimed at `now_ms`.
    fn ready_head(
        &mut self,
        tenant: &str,
        band: Priority,
        now_ms: i64,
    ) -> Result<Option<QueuedJob>, StoreError>;
    /// The first tenant by name strictly after `after` (or the first at all) with jobs
    /// queued in `band`.
    fn next_backlogged(
        &mut self,
        band: Priority,
        after: Option<&str>,
    ) -> Result<Option<String>, StoreError>;
    /// A policy component kept by the store, by its SHA-256 (hex).
    fn policy_component(&mut self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keeps a policy component under its SHA-256 (kept once; bytes never change).
    fn put_policy_component(&mut self, digest: &str, bytes: &[u8]) -> Result<(), StoreError>;
    /// Every tenant kept by the store: its name and its settings as written (JSON).
    fn written_tenants(&mut self) -> Result<Vec<(String, String)>, StoreError>;
    /// Writes a tenant's settings as written (inserted or replaced).
    fn put_written_tenant(&mut self, name: &str, written: &str) -> Result<(), StoreError>;
    /// Deletes a tenant's settings; whether there were any.
    fn delete_written_tenant(&mut self, name: &str) -> Result<bool, StoreError>;
    /// Whether `tenant` has operations queued, active, unknown or waiting to retry.
    fn tenant_has_work(&mut self, tenant: &str) -> Result<bool, StoreError>;
    /// Every key kept by the store (hashes only), by id.
    fn api_keys(&mut self) -> Result<Vec<StoredKey>, StoreError>;
    /// Adds a key.
    fn put_api_key(&mut self, key: &StoredKey) -> Result<(), StoreError>;
    /// Deletes a key by id; whether it existed.
    fn delete_api_key(&mut self, id: &str) -> Result<bool, StoreError>;
    /// Forgets every policy component but those named in `keep` (empty names keep nothing),
    /// so that the store holds only what its policy state can still name.
    fn retain_policy_components(&mut self, keep: [&str; 3]) -> Result<(), StoreError>;
    /// Whether `tenant` has jobs queued in `band`.
    fn band_has_jobs(&mut self, tenant: &str, band: Priority) -> Result<bool, StoreError>;
    /// Queued jobs that can no longer meet their deadline at `now_ms`, oldest first.
    fn infeasible(&mut self, now_ms: i64) -> Result<Vec<QueuedJob>, StoreError>;
    /// The saved answer of operation `(tenant, key)`, unless it expired by `now_ms`.
    fn answer(
        &mut self,
        tenant: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// Saves an operation's answer until `expires_ms` (replacing one saved before).
    fn put_answer(
        &mut self,
        tenant: &str,
        key: &str,
        expires_ms: i64,
        bytes: &[u8],
    ) -> Result<(), StoreError>;
    /// Deletes at most `limit` answers that expire by `by_ms`, soonest first; how many.
    fn delete_answers(&mut self, by_ms: i64, limit: u32) -> Result<u64, StoreError>;
    /// The bytes of every saved answer, for the bound on their total.
    fn answer_bytes(&mut self) -> Result<u64, StoreError>;
    /// The object `(kind, id)` that `tenant` made and a deployment holds (a stored
    /// response), if `tenant` made it; another tenant's is never found.
    fn owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<Option<OwnedObject>, StoreError>;
    /// Records that `tenant` made `object` (replacing a record of the same kind and id).
    fn put_owned_object(&mut self, tenant: &str, object: &OwnedObject) -> Result<(), StoreError>;
    /// Forgets `tenant`'s object `(kind, id)`; whether there was one.
    fn delete_owned_object(
        &mut self,
        tenant: &str,
        kind: &str,
        id: &str,
    ) -> Result<bool, StoreError>;
    /// Deletes at most `limit` owned objects made before `before_ms`, oldest first; how many.
    fn delete_owned_objects(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError>;
    /// A tenant's deficit-round-robin credit, in tokens.
    fn deficit(&mut self, tenant: &str) -> Result<u64, StoreError>;
    /// Sets a tenant's DRR deficit.
    fn set_deficit(&mut self, tenant: &str, deficit: u64) -> Result<(), StoreError>;
    /// Adds `row`'s calls, tokens and cost to its hour's row of the spend ledger (a new row
    /// when there is none).
    fn add_spend(&mut self, row: &SpendRow) -> Result<(), StoreError>;
    /// The ledger's rows of the hours from `from_ms` (inclusive) to `to_ms` (exclusive).
    fn spend_rows(&mut self, from_ms: i64, to_ms: i64) -> Result<Vec<SpendRow>, StoreError>;
    /// Deletes at most `limit` ledger rows of hours before `before_ms`; how many.
    fn delete_spend(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError>;
    /// Puts an alert in the outbox, unless one with its id is there (sent or not).
    fn put_alert(&mut self, alert: &Alert) -> Result<(), StoreError>;
    /// At most `limit` unsent alerts due by `now_ms`, soonest first.
    fn due_alerts(&mut self, now_ms: i64, limit: u32) -> Result<Vec<Alert>, StoreError>;
    /// Records a post of alert `id`: sent at `sent_ms`, or tried `attempts` times and due
    /// again at `next_ms`.
    fn alert_tried(
        &mut self,
        id: &str,
        attempts: u32,
        next_ms: i64,
        sent_ms: Option<i64>,
    ) -> Result<(), StoreError>;
    /// Alerts not yet sent.
    fn pending_alerts(&mut self) -> Result<u64, StoreError>;
    /// Deletes at most `limit` alerts sent before `before_ms`; how many.
    fn delete_sent_alerts(&mut self, before_ms: i64, limit: u32) -> Result<u64, StoreError>;
}

/// The statements of the spend ledger and the alert outbox, the same in both dialects but
/// for their placeholders (written in SQLite's).
pub(crate) mod ledger_sql {
    /// Adds one call's figures to its hour's row.
    pub const ADD: &str =
        "INSERT INTO spend (hour_ms, tenant, group_chain, model, deployment, calls,
        input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, reasoning_tokens,
        cost_microusd) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
        ON CONFLICT (hour_ms, tenant, group_chain, model, deployment) DO UPDATE SET
        calls = spend.calls + excluded.calls,
        input_tokens = spend.input_tokens + excluded.input_tokens,
        output_tokens = spend.output_tokens + excluded.output_tokens,
        cached_input_tokens = spend.cached_input_tokens + excluded.cached_input_tokens,
        cache_write_tokens = spend.cache_write_tokens + excluded.cache_write_tokens,
        reasoning_tokens = spend.reasoning_tokens + excluded.reasoning_tokens,
        cost_microusd = spend.cost_microusd + excluded.cost_microusd";
    /// The rows of a span of hours.
    pub const ROWS: &str = "SELECT hour_ms, tenant, group_chain, model, deployment, calls,
        input_tokens, output_tokens, cached_input_tokens, cache_write_tokens, reasoning_tokens,
        cost_microusd FROM spend WHERE hour_ms >= ?1 AND hour_ms < ?2
        ORDER BY hour_ms, tenant, group_chain, model, deployment";
    /// Puts an alert in the outbox once.
    pub const PUT_ALERT: &str = "INSERT INTO alerts (id, budget, webhook, secret_env, payload,
        attempts, next_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (id) DO NOTHING";
    /// The unsent alerts that are due, soonest first.
    pub const DUE_ALERTS: &str = "SELECT id, budget, webhook, secret_env, payload, attempts,
        next_ms FROM alerts WHERE sent_ms IS NULL AND next_ms <= ?1 ORDER BY next_ms LIMIT ?2";
    /// Records a post.
    pub const ALERT_TRIED: &str =
        "UPDATE alerts SET attempts = ?2, next_ms = ?3, sent_ms = ?4 WHERE id = ?1";
    /// Counts the unsent alerts.
    pub const PENDING_ALERTS: &str = "SELECT COUNT(*) FROM alerts WHERE sent_ms IS NULL";
    /// A statement above with PostgreSQL's placeholders (`$1` for `?1`).
    #[cfg(feature = "postgres")]
    pub fn pg(sql: &str) -> String {
        sql.replace('?', "$")
    }
}
