//! The writer: work from every caller is queued to a writer thread, which runs it in
//! batches, one store transaction per batch (group commit), each piece all or nothing.
//! A piece is answered only after its batch committed. Batches are taken from the intake
//! round robin across tenants (see `intake`). A writer has one thread, or one per shard
//! on a store replicas share: a tenant's work goes to one shard (see `shard`).
//!
//! A program on tokio calls it with `.await` and never blocks a worker thread on the
//! engine's lock: the typed methods ([`Writer::admit`], [`Writer::complete`],
//! [`Writer::dispatch`], …) each send one job and wait for its committed answer. Between
//! batches the writer thread also keeps the engine up to date and swept (see
//! [`crate::maintenance`]), so a program with a writer needs no other housekeeping, and
//! keeps whether the store can write (see `health`).

mod health;
mod intake;
mod shard;
mod waiting;

pub use health::{StoreHealth, Trouble};
pub use waiting::{WaitingNow, WaitingStats};

use crate::engine::{
    Answer, Completion, CompletionAnswer, Decision, DispatchAnswer, Engine, Inspection, Job,
    JobTimes, OperationView, OperationsPage, Page, Reconciliation, Sweep, TenantLevels,
};
use crate::maintenance;
use crate::model::{OpState, Request};
use crate::store::{Store, StoreError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The writer thread's name (the HTTP bench finds its CPU time by it).
pub const WRITER_THREAD: &str = "tollgate-writer";
/// Most jobs in one transaction.
pub const MAX_BATCH: usize = 128;
/// Jobs waiting for the writer before submitters wait for room, at least.
const QUEUE_BOUND: usize = 4096;
/// Room kept above one job per submitter, for the program's own jobs (metrics, a policy
/// watcher).
const SPARE_ROOM: usize = 64;

/// Why the writer could not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The store cannot be reached now; nothing was written. Worth retrying shortly (the
    /// service answers 503 `store_unavailable`).
    Unavailable(String),
    /// Anything else: the store failed otherwise, or the writer has stopped.
    Failed(String),
}

impl Failure {
    fn of(e: &StoreError) -> Self {
        if e.is_unavailable() {
            Failure::Unavailable(e.to_string())
        } else {
            Failure::Failed(e.to_string())
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unavailable(e) | Failure::Failed(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for Failure {}

/// Told what the writer and its housekeeping did, for metrics. Every method has a default
/// that does nothing.
pub trait WriterObserver: Send + Sync + 'static {
    /// A batch of `jobs` ran in one transaction that took `took`, commit included.
    fn batch(&self, jobs: usize, took: Duration) {
        let _ = (jobs, took);
    }

    /// A housekeeping sweep ended (see [`Engine::sweep`]).
    fn swept(&self, sweep: &Sweep) {
        let _ = sweep;
    }

    /// A batch could not be written for the store's absence (`trouble.kind`: `disk_full`
    /// or `unreachable`); called for each such batch.
    fn write_failed(&self, trouble: &Trouble) {
        let _ = trouble;
    }

    /// The store stopped writing (`Some`) or writes again (`None`); called once per change.
    fn store_state(&self, trouble: Option<&Trouble>) {
        let _ = trouble;
    }

    /// A job submitted inside an enabled `tracing` span was answered: its times in the
    /// writer, for the span's trace. Called on the submitter's runtime, not the writer's
    /// thread.
    fn traced(&self, span: &tracing::Span, stamps: &Stamps) {
        let _ = (span, stamps);
    }

    /// A call left the waiting room after `waited`: `admitted` (tried again and answered),
    /// `deadline` or `max_wait` (its time came), `gone` (its caller left) or `queue_full`
    /// (the room's bounds refused it).
    fn waited(&self, outcome: &'static str, waited: Duration) {
        let _ = (outcome, waited);
    }
}

/// One traced job's way through the writer.
#[derive(Clone, Copy, Debug)]
pub struct Stamps {
    /// When it was submitted.
    pub queued: Instant,
    /// When its batch began.
    pub batch_started: Instant,
    /// Its own turn in the batch (`None` when the batch failed as a whole).
    pub job: Option<JobTimes>,
    /// When its batch committed (or failed).
    pub batch_ended: Instant,
    /// How many jobs the batch held.
    pub batch_jobs: usize,
}

/// Observes nothing.
pub struct NoObserver;

impl WriterObserver for NoObserver {}

/// Where one job's answer goes: its channel, and the runtime its submitter waits on.
struct Reply {
    to: oneshot::Sender<Result<Answer, Failure>>,
    runtime: Option<Handle>,
    /// The submitter's span and when it submitted, when that span is enabled (traced).
    traced: Option<(tracing::Span, Instant)>,
    /// For an admission that may wait in the waiting room: the longest wait, in ms.
    wait: Option<u64>,
}

impl Reply {
    /// Whether its job may wait in the waiting room.
    fn may_wait(&self) -> bool {
        self.wait.is_some()
    }
}

/// The handle callers submit work through; clone it freely. The writer finishes (and
/// commits) what it was given and ends once every handle is dropped.
pub struct Writer {
    shards: Arc<[Shard]>,
}

/// One shard's intake, and the store's state as its thread last found it.
struct Shard {
    intake: Arc<shard::Intake>,
    health: Arc<StoreHealth>,
    waiting: Arc<WaitingStats>,
}

impl Clone for Writer {
    fn clone(&self) -> Self {
        for s in self.shards.iter() {
            s.intake.add_sender();
        }
        Writer {
            shards: self.shards.clone(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            s.intake.remove_sender();
        }
    }
}

/// The shard of `shards` that tenant `tenant`'s jobs go to: the same for a name in every
/// process (FNV-1a of its bytes).
pub fn shard_of(tenant: &str, shards: usize) -> usize {
    let hash = tenant.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % shards.max(1) as u64) as usize
}

/// A job answered with another job's answer: a bug in the writer, never the caller's.
fn out_of_turn(answer: Answer) -> Failure {
    Failure::Failed(format!("the engine answered out of turn: {answer:?}"))
}

impl Writer {
    /// Starts the writer thread over `engine`, and the thread that takes up policy changes
    /// made through other replicas. `submitters` is how many callers may wait at once (the
    /// service's connections: each has at most one request in flight); the intake has
    /// room for all of them, so a tenant with many callers cannot keep the others'
    /// requests out of their lanes by filling it.
    pub fn start<S: Store + Send + 'static>(
        engine: Arc<Engine<S>>,
        submitters: usize,
        observer: Arc<dyn WriterObserver>,
    ) -> (Writer, JoinHandle<()>) {
        Self::start_shards(vec![engine], submitters, observer)
    }

    /// As [`Writer::start`], with one shard per engine: each its own thread, intake, batches
    /// and transactions. A tenant's jobs all go to one shard ([`shard_of`] its name), jobs
    /// for no tenant to the first. The engines share one store: on connections of their
    /// own, each a holder of leases on the budgets tenants share (see
    /// [`Engine::hold_leases`]), so that what they admit together never exceeds a budget,
    /// and each sweeping in turn; or taking turns on one connection ([`SharedStore`]),
    /// holding no leases, the first alone sweeping. The returned thread ends once every
    /// shard's has.
    ///
    /// [`SharedStore`]: crate::store::SharedStore
    ///
    /// # Panics
    /// When `engines` is empty.
    pub fn start_shards<S: Store + Send + 'static>(
        engines: Vec<Arc<Engine<S>>>,
        submitters: usize,
        observer: Arc<dyn WriterObserver>,
    ) -> (Writer, JoinHandle<()>) {
        assert!(!engines.is_empty(), "a writer needs an engine");
        let bound = QUEUE_BOUND.max(submitters.saturating_add(SPARE_ROOM));
        let count = engines.len();
        let mut shards: Vec<Shard> = Vec::with_capacity(engines.len());
        let mut threads = Vec::with_capacity(engines.len());
        for (i, engine) in engines.into_iter().enumerate() {
            // Engines that hold no leases share one connection: the first sweeps for all,
            // and what one finds of the store's state is the others' too (one log line
            // when it stops writing, one probe a second while it cannot).
            let shares_connection = i > 0 && engine.lease_holder().is_none();
            let sweeps = !shares_connection;
            let intake = Arc::new(shard::Intake::new(bound));
            let follower = intake.clone();
            maintenance::follow_policy(engine.clone(), move || follower.is_closed());
            let health = match shards.first() {
                Some(first) if shares_connection => Arc::clone(&first.health),
                _ => Arc::new(StoreHealth::default()),
            };
            let (taken, found, observer) = (intake.clone(), health.clone(), observer.clone());
            let waiting = Arc::new(WaitingStats::default());
            let room =
                waiting::Waiting::new(engine.clone(), intake.clone(), waiting.clone(), count);
            let thread = std::thread::Builder::new()
                .name(WRITER_THREAD.into())
                .spawn(move || shard::run(engine, taken, found, observer, sweeps, room))
                .expect("spawn the writer thread");
            threads.push(thread);
            shards.push(Shard {
                intake,
                health,
                waiting,
            });
        }
        let handle = if threads.len() == 1 {
            threads.pop().expect("one thread")
        } else {
            std::thread::Builder::new()
                .name("tollgate-writers".into())
                .spawn(move || {
                    for t in threads {
                        let _ = t.join();
                    }
                })
                .expect("spawn the writers' joiner")
        };
        let writer = Writer {
            shards: shards.into(),
        };
        (writer, handle)
    }

    /// Why the store cannot write now, as the writer last found it (`None`: it writes).
    pub fn store_trouble(&self) -> Option<Trouble> {
        self.shards.iter().find_map(|s| s.health.trouble())
    }

    /// Whether every shard's thread still takes jobs (each closes its intake when it ends,
    /// unwinding included).
    pub fn is_running(&self) -> bool {
        self.shards.iter().all(|s| !s.intake.is_closed())
    }

    /// How many shards the writer has.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// What waits in the waiting rooms now, every shard's together.
    pub fn waiting(&self) -> WaitingNow {
        let shards: Vec<Arc<WaitingStats>> =
            self.shards.iter().map(|s| s.waiting.clone()).collect();
        WaitingNow::of(&shards)
    }

    /// Submits one job and waits for its committed answer.
    async fn submit(&self, job: Job) -> Result<Answer, Failure> {
        self.submit_waiting(job, None).await
    }

    /// As [`Writer::submit`]; an admission with `wait` may wait in the waiting room that
    /// long at most.
    async fn submit_waiting(&self, job: Job, wait: Option<u64>) -> Result<Answer, Failure> {
        let (to, answer) = oneshot::channel();
        let span = tracing::Span::current();
        let reply = Reply {
            to,
            runtime: Handle::try_current().ok(),
            traced: (!span.is_disabled()).then(|| (span, Instant::now())),
            wait,
        };
        let lane = job.tenant().map(str::to_string);
        let shard = match &lane {
            Some(tenant) if self.shards.len() > 1 => shard_of(tenant, self.shards.len()),
            _ => 0,
        };
        self.shards[shard]
            .intake
            .send(lane, (job, reply))
            .await
            .map_err(|_| Failure::Failed("the writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| Failure::Failed("the writer dropped the job".into()))?
    }

    /// Admits, queues or refuses a request; checked first as [`Engine::admit_request`]
    /// checks it.
    pub async fn admit(&self, request: Request, now_ms: i64) -> Result<Decision, Failure> {
        self.admit_waiting(request, now_ms, None).await
    }

    /// As [`Writer::admit`], with the tenant's buckets as they are after it, read in the
    /// same transaction (for rate-limit headers); `None` for a tenant not configured.
    pub async fn admit_with_levels(
        &self,
        request: Request,
        now_ms: i64,
    ) -> Result<(Decision, Option<TenantLevels>), Failure> {
        self.admit_with_levels_waiting(request, now_ms, None).await
    }

    /// As [`Writer::admit`]; with `max_wait_ms`, a call refused only by shared capacity that
    /// frees by itself waits for it in the waiting room, that long at most (and
    /// `waiting.max_wait_ms`) and never past its deadline less its estimated execution, and
    /// is answered then.
    pub async fn admit_waiting(
        &self,
        request: Request,
        now_ms: i64,
        max_wait_ms: Option<u64>,
    ) -> Result<Decision, Failure> {
        let job = Job::Admit { request, now_ms };
        match self.submit_waiting(job, max_wait_ms).await? {
            Answer::Decision(d) => Ok(d),
            other => Err(out_of_turn(other)),
        }
    }

    /// As [`Writer::admit_with_levels`], waiting as [`Writer::admit_waiting`] does.
    pub async fn admit_with_levels_waiting(
        &self,
        request: Request,
        now_ms: i64,
        max_wait_ms: Option<u64>,
    ) -> Result<(Decision, Option<TenantLevels>), Failure> {
        let job = Job::AdmitWithLevels { request, now_ms };
        match self.submit_waiting(job, max_wait_ms).await? {
            Answer::DecisionWithLevels(d, levels) => Ok((d, levels)),
            other => Err(out_of_turn(other)),
        }
    }

    /// Reports how an active operation's call ended (see [`Engine::complete`]).
    pub async fn complete(
        &self,
        completion: Completion,
        now_ms: i64,
    ) -> Result<CompletionAnswer, Failure> {
        match self.submit(Job::Complete { completion, now_ms }).await? {
            Answer::Completion(a) => Ok(a),
            other => Err(out_of_turn(other)),
        }
    }

    /// Resolves an unknown outcome (see [`Engine::reconcile`]).
    pub async fn reconcile(
        &self,
        reconciliation: Reconciliation,
        now_ms: i64,
    ) -> Result<CompletionAnswer, Failure> {
        let job = Job::Reconcile {
            reconciliation,
            now_ms,
        };
        match self.submit(job).await? {
            Answer::Completion(a) => Ok(a),
            other => Err(out_of_turn(other)),
        }
    }

    /// The answer saved with an operation's success, while it is kept.
    pub async fn saved_answer(
        &self,
        tenant: String,
        key: String,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, Failure> {
        match self
            .submit(Job::SavedAnswer {
                tenant,
                key,
                now_ms,
            })
            .await?
        {
            Answer::Saved(a) => Ok(a),
            other => Err(out_of_turn(other)),
        }
    }

    /// Records that `tenant` made `object` (a stored response).
    pub async fn own_object(
        &self,
        tenant: String,
        object: crate::store::OwnedObject,
    ) -> Result<(), Failure> {
        match self.submit(Job::OwnObject { tenant, object }).await? {
            Answer::Done => Ok(()),
            other => Err(out_of_turn(other)),
        }
    }

    /// `tenant`'s object `(kind, id)`, if `tenant` made it.
    pub async fn owned_object(
        &self,
        tenant: String,
        kind: String,
        id: String,
    ) -> Result<Option<crate::store::OwnedObject>, Failure> {
        match self.submit(Job::OwnedObject { tenant, kind, id }).await? {
            Answer::Owned(o) => Ok(o),
            other => Err(out_of_turn(other)),
        }
    }

    /// Forgets `tenant`'s object `(kind, id)`; whether there was one.
    pub async fn forget_object(
        &self,
        tenant: String,
        kind: String,
        id: String,
    ) -> Result<bool, Failure> {
        match self.submit(Job::ForgetObject { tenant, kind, id }).await? {
            Answer::Forgot(b) => Ok(b),
            other => Err(out_of_turn(other)),
        }
    }

    /// Claims up to `count` queued durable jobs for `worker` (see [`Engine::dispatch`]).
    pub async fn dispatch(
        &self,
        worker: String,
        count: u32,
        now_ms: i64,
    ) -> Result<DispatchAnswer, Failure> {
        let job = Job::Dispatch {
            worker,
            count,
            now_ms,
        };
        match self.submit(job).await? {
            Answer::Dispatch(a) => Ok(a),
            other => Err(out_of_turn(other)),
        }
    }

    /// Marks the downstream available or not.
    pub async fn set_downstream(&self, available: bool) -> Result<(), Failure> {
        match self.submit(Job::SetDownstream { available }).await? {
            Answer::Done => Ok(()),
            other => Err(out_of_turn(other)),
        }
    }

    /// One operation, as the API shows it.
    pub async fn operation(
        &self,
        tenant: String,
        key: String,
    ) -> Result<Option<OperationView>, Failure> {
        match self.submit(Job::Operation { tenant, key }).await? {
            Answer::Operation(op) => Ok(op),
            other => Err(out_of_turn(other)),
        }
    }

    /// Everything `inspect` shows, with one page of operations.
    pub async fn inspect(&self, now_ms: i64, page: Page) -> Result<Inspection, Failure> {
        match self.submit(Job::Inspect { now_ms, page }).await? {
            Answer::Inspection(i) => Ok(*i),
            other => Err(out_of_turn(other)),
        }
    }

    /// As [`Writer::inspect`], without the operations (for metrics).
    pub async fn levels(&self, now_ms: i64) -> Result<Inspection, Failure> {
        match self.submit(Job::Levels { now_ms }).await? {
            Answer::Inspection(i) => Ok(*i),
            other => Err(out_of_turn(other)),
        }
    }

    /// One page of operations, only those in `state` when given.
    pub async fn operations(
        &self,
        state: Option<OpState>,
        page: Page,
    ) -> Result<OperationsPage, Failure> {
        match self.submit(Job::Operations { state, page }).await? {
            Answer::Operations(p) => Ok(p),
            other => Err(out_of_turn(other)),
        }
    }

    /// One tenant's request and token buckets (`None`: no such tenant).
    pub async fn tenant_levels(
        &self,
        tenant: String,
        now_ms: i64,
    ) -> Result<Option<TenantLevels>, Failure> {
        match self.submit(Job::TenantLevels { tenant, now_ms }).await? {
            Answer::TenantLevels(l) => Ok(l),
            other => Err(out_of_turn(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Arc<Engine<crate::store::SqliteStore>> {
        Arc::new(crate::engine::test_engine(
            &serde_json::json!({"tenants": {"a": {}}}),
        ))
    }

    /// A call waiting for the one global slot is admitted as soon as the call holding it
    /// ends, on the job's own clock (its deadline is not this machine's time).
    #[test]
    fn a_waiting_call_is_admitted_when_a_completion_frees_its_slot() {
        use crate::validate::RequestBuilder;
        let config = crate::config::Config::from_json(&serde_json::json!({
            "global": {"concurrency": 1}, "tenants": {"a": {}, "b": {}},
        }))
        .unwrap();
        let engine = Arc::new(crate::engine::test_engine_on(
            &config,
            crate::store::SqliteStore::in_memory().unwrap(),
        ));
        let (writer, thread) = Writer::start(engine, 4, Arc::new(NoObserver));
        let writer = Arc::new(writer);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let request = |tenant: &str, key: &str| {
            RequestBuilder::new(tenant, key, crate::model::Route::Interactive)
                .input_tokens(10)
                .max_output_tokens(10)
                .deadline_ms(60_000)
                .build(&config)
                .unwrap()
        };
        let first = rt.block_on(writer.admit(request("a", "k1"), 10)).unwrap();
        assert!(first.authorises_call());
        let w = writer.clone();
        let second = request("b", "k2");
        let waiting = rt.spawn(async move { w.admit_waiting(second, 20, Some(30_000)).await });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiting.is_finished());
        let freed = Instant::now();
        let done = rt
            .block_on(writer.complete(Completion::succeeded("a", "k1"), 130))
            .unwrap();
        assert!(done.ok);
        let d = rt.block_on(waiting).unwrap().unwrap();
        assert!(d.authorises_call(), "{d:?}");
        assert!(
            freed.elapsed() < Duration::from_millis(100),
            "{:?}",
            freed.elapsed()
        );
        assert!(d.waited_ms.unwrap() >= 90, "{d:?}");
        drop(writer);
        thread.join().unwrap();
    }

    #[test]
    fn shards_take_each_tenant_to_the_engine_its_name_picks() {
        // Two engines told apart by their tenants' request capacity.
        let tenants: Vec<String> = (0..16).map(|n| format!("t{n}")).collect();
        let engine = |capacity: u32| {
            let config: serde_json::Map<String, serde_json::Value> = tenants
                .iter()
                .map(|t| (t.clone(), serde_json::json!({})))
                .collect();
            Arc::new(crate::engine::test_engine(&serde_json::json!({
                "tenant_defaults": {"requests": {"capacity": capacity, "refill_per_s": 1}},
                "tenants": config,
            })))
        };
        let (writer, thread) =
            Writer::start_shards(vec![engine(5), engine(7)], 1, Arc::new(NoObserver));
        assert_eq!(writer.shards(), 2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut seen = [0, 0];
        for t in &tenants {
            let levels = rt
                .block_on(writer.tenant_levels(t.clone(), 0))
                .unwrap()
                .unwrap();
            let shard = shard_of(t, 2);
            assert_eq!(levels.requests.capacity, [5, 7][shard], "{t}");
            seen[shard] += 1;
        }
        assert!(
            seen[0] > 0 && seen[1] > 0,
            "one shard took every tenant: {seen:?}"
        );
        drop(writer);
        thread.join().unwrap();
    }

    #[test]
    fn shards_on_one_sqlite_connection_admit_against_one_global_budget_and_share_its_state() {
        use crate::store::{SharedStore, SqliteStore};
        use crate::validate::RequestBuilder;
        let tenants: Vec<String> = (0..12).map(|n| format!("t{n}")).collect();
        let config = crate::config::Config::from_json(&serde_json::json!({
            "global": {"requests": {"capacity": 10, "refill_per_s": 0}, "concurrency": 100},
            "tenants": tenants.iter().map(|t| (t.clone(), serde_json::json!({})))
                .collect::<serde_json::Map<_, _>>(),
        }))
        .unwrap();
        let engines: Vec<_> = SharedStore::split(SqliteStore::in_memory().unwrap(), 3)
            .into_iter()
            .map(|store| Arc::new(crate::engine::test_engine_on(&config, store)))
            .collect();
        let (writer, thread) = Writer::start_shards(engines, 1, Arc::new(NoObserver));
        // One store's state: what one shard finds of it, every shard answers by.
        assert!(writer
            .shards
            .iter()
            .all(|s| Arc::ptr_eq(&s.health, &writer.shards[0].health)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Twelve tenants over three shards, one budget of ten: exactly ten admitted.
        let mut admitted = 0;
        for (n, t) in tenants.iter().enumerate() {
            let request = RequestBuilder::new(
                t.as_str(),
                format!("k{n}"),
                crate::model::Route::Interactive,
            )
            .input_tokens(10)
            .max_output_tokens(10)
            .deadline_ms(60_000)
            .build(&config)
            .unwrap();
            let decision = rt.block_on(writer.admit(request, 10)).unwrap();
            admitted += usize::from(decision.outcome == crate::reason::Outcome::Accepted);
        }
        assert_eq!(admitted, 10);
        let seen = rt.block_on(writer.levels(10)).unwrap();
        assert_eq!(seen.buckets["global.requests"], 0);
        assert_eq!(seen.slots["global"], 10);
        drop(writer);
        thread.join().unwrap();
    }

    #[test]
    fn a_tenant_keeps_its_shard() {
        for n in 1..8 {
            for t in ["acme", "globex", "t00623", ""] {
                let s = shard_of(t, n);
                assert!(s < n);
                assert_eq!(s, shard_of(t, n));
            }
        }
        assert_eq!(shard_of("acme", 1), 0);
    }

    #[test]
    fn answers_reach_a_submitter_whose_runtime_started_after_another_ended() {
        let (writer, thread) = Writer::start(engine(), 1, Arc::new(NoObserver));
        // Each runtime is gone before the next one submits.
        for _ in 0..3 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let answer = rt.block_on(writer.levels(0));
            assert!(answer.is_ok(), "{answer:?}");
        }
        assert!(writer.is_running());
        // A writer thread that ends (here: closed as its unwinding would) is seen as stopped.
        writer.shards[0].intake.close();
        assert!(!writer.is_running());
        let stopped = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(writer.levels(0));
        assert_eq!(
            stopped.unwrap_err(),
            Failure::Failed("the writer has stopped".into())
        );
        drop(writer);
        thread.join().unwrap();
    }
}
