//! The one SQLite writer: jobs from every connection are queued to one thread, which runs
//! them in batches, one transaction per batch (group commit), each job all or nothing.
//! A job is answered only after its batch committed. Batches are taken from the intake
//! round robin across tenants (see `intake`).

use super::intake::Intake;
use super::metrics::Metrics;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tollgate::engine::{Answer, Engine, Job};
use tollgate::store::AnyStore;

/// The writer thread's name (the HTTP bench finds its CPU time by it).
pub const WRITER_THREAD: &str = "tollgate-writer";
/// How often a policy, tenant or key change made through another replica is looked for
/// (policies by their own thread, tenants and keys by the writer).
const POLICY_SYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
/// How often the writer sweeps for abandoned calls and expired records (bounded work each).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Most jobs in one transaction.
pub const MAX_BATCH: usize = 128;
/// Jobs waiting for the writer before submitters wait for room, at least.
const QUEUE_BOUND: usize = 4096;
/// Room kept above one job per connection, for jobs of the service's own (metrics, the
/// policy watcher).
const SPARE_ROOM: usize = 64;

/// Why the writer could not answer a job.
#[derive(Clone, Debug)]
pub enum Failure {
    /// The store cannot be reached now; nothing was written for the job. Answered 503
    /// `store_unavailable`, worth retrying shortly.
    Unavailable(String),
    /// Anything else (answered 500).
    Failed(String),
}

impl Failure {
    fn of(e: &tollgate::store::StoreError) -> Self {
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

/// Where one job's answer goes: its channel, and the runtime its submitter waits on.
struct Reply {
    to: oneshot::Sender<Result<Answer, Failure>>,
    runtime: Option<Handle>,
}

/// The handle connections submit jobs through. The writer finishes (and commits) what it
/// was given and ends once every handle is dropped.
pub struct Writer {
    intake: Arc<Intake<(Job, Reply)>>,
}

impl Clone for Writer {
    fn clone(&self) -> Self {
        self.intake.add_sender();
        Writer {
            intake: self.intake.clone(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.intake.remove_sender();
    }
}

/// Closes the intake when the writer thread ends, unwinding included, so that nobody
/// waits for an answer that will not come.
struct CloseOnExit<'a>(&'a Intake<(Job, Reply)>);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Writer {
    /// Starts the writer thread. Each of `connections` has at most one request in flight,
    /// so the intake has room for all of them: a tenant holding many connections cannot
    /// keep the others' requests out of their lanes by filling it.
    pub fn start(
        engine: Arc<Engine<AnyStore>>,
        metrics: Metrics,
        connections: usize,
    ) -> (Writer, JoinHandle<()>) {
        let bound = QUEUE_BOUND.max(connections.saturating_add(SPARE_ROOM));
        let intake = Arc::new(Intake::new(bound));
        follow_policy(engine.clone(), intake.clone());
        let taken = intake.clone();
        let handle = std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || {
                let _close = CloseOnExit(&taken);
                let mut synced = std::time::Instant::now();
                let mut swept = std::time::Instant::now();
                while let Some(batch) = taken.take(MAX_BATCH, POLICY_SYNC_EVERY) {
                    if synced.elapsed() >= POLICY_SYNC_EVERY {
                        synced = std::time::Instant::now();
                        match engine.sync_directory() {
                            Ok(true) => tracing::info!("tenants and keys taken up from the store"),
                            Ok(false) => {}
                            Err(e) => tracing::warn!(error = %e, "the store's tenants and keys could not be taken up"),
                        }
                    }
                    if swept.elapsed() >= SWEEP_EVERY {
                        swept = std::time::Instant::now();
                        sweep(&engine, &metrics);
                    }
                    if batch.is_empty() {
                        continue;
                    }
                    // Replicas on a shared store all use its clock, read in the batch's
                    // transaction, so that skewed machine clocks cannot mint credits.
                    let (jobs, replies): (Vec<Job>, Vec<Reply>) = batch.into_iter().unzip();
                    let started = std::time::Instant::now();
                    let result = engine.run_batch_at_store_time(&jobs);
                    metrics.batch_jobs.observe(jobs.len() as f64);
                    metrics
                        .batch_seconds
                        .observe(started.elapsed().as_secs_f64());
                    let answers: Vec<Result<Answer, Failure>> = match result {
                        Ok(answers) => answers
                            .into_iter()
                            .map(|a| a.map_err(|e| Failure::of(&e)))
                            .collect(),
                        Err(e) => replies.iter().map(|_| Err(Failure::of(&e))).collect(),
                    };
                    deliver(replies, answers);
                }
            })
            .expect("spawn the writer thread");
        (Writer { intake }, handle)
    }

    /// Whether the writer thread still takes jobs (it closes the intake when it ends,
    /// unwinding included).
    pub fn is_running(&self) -> bool {
        !self.intake.is_closed()
    }

    /// Submits one job and waits for its committed answer.
    pub async fn submit(&self, job: Job) -> Result<Answer, Failure> {
        let (to, answer) = oneshot::channel();
        let reply = Reply {
            to,
            runtime: Handle::try_current().ok(),
        };
        let lane = job.tenant().map(str::to_string);
        self.intake
            .send(lane, (job, reply))
            .await
            .map_err(|_| Failure::Failed("the writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| Failure::Failed("the writer dropped the job".into()))?
    }
}

/// Takes up policy changes made through another replica, on a thread of its own until the
/// writer stops: taking one up compiles it, which takes seconds for an interpreter's
/// component and must not hold the writer (a swap through this replica is checked on a
/// blocking task for the same reason).
fn follow_policy<T: Send + Sync + 'static>(engine: Arc<Engine<AnyStore>>, intake: Arc<Intake<T>>) {
    let spawned = std::thread::Builder::new()
        .name("tollgate-policy-follower".into())
        .spawn(move || {
            while !intake.is_closed() {
                std::thread::sleep(POLICY_SYNC_EVERY);
                match engine.sync_policy() {
                    Ok(Some(p)) => tracing::info!(name = %p.name, sha256 = %p.sha256, "policy taken up from the store"),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "the store's policy could not be taken up"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "the policy follower could not start: policy changes from other replicas are not taken up");
    }
}

/// One housekeeping sweep, at the store's time when it has a clock of its own.
fn sweep(engine: &Engine<AnyStore>, metrics: &Metrics) {
    let now = match engine.store_clock_ms() {
        Ok(Some(now)) => now,
        Ok(None) => wall_clock_ms(),
        Err(_) => return,
    };
    match engine.sweep(now) {
        Ok(s) => {
            for (tenant, key) in &s.abandoned {
                tracing::warn!(%tenant, %key, "call abandoned: active past limits.max_call_ms, now unknown until reconciled");
            }
            metrics.abandoned.inc_by(s.abandoned.len() as u64);
            metrics.retention_deleted.inc_by(s.deleted);
            metrics.unknown_operations.set(s.unknown as i64);
        }
        Err(e) => tracing::warn!(error = %e, "housekeeping sweep failed"),
    }
}

/// Milliseconds since the Unix epoch.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Answers a committed batch. Waking a waiting request from outside the runtime costs a
/// system call whenever a worker sleeps, which is most of the time while the writer is the
/// busy one; so the batch's answers go to the runtime as one task, which wakes the
/// requests from inside (one wake-up per batch instead of one per request).
fn deliver(replies: Vec<Reply>, answers: Vec<Result<Answer, Failure>>) {
    // The newest submitter's runtime is the one most surely still running.
    let runtime = replies.iter().rev().find_map(|r| r.runtime.clone());
    let send_all = move || {
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.to.send(answer);
        }
    };
    match runtime {
        Some(runtime) => {
            runtime.spawn(async move { send_all() });
        }
        None => send_all(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::config::Config;
    use tollgate::runtime::{builtin, Runtime};
    use tollgate::store::SqliteStore;

    #[test]
    fn answers_reach_a_submitter_whose_runtime_started_after_another_ended() {
        let runtime = Runtime::new().unwrap();
        let policy = runtime
            .load(
                builtin::get("standard").unwrap(),
                tollgate::runtime::PolicyLimits::DEFAULT.any_size(),
            )
            .unwrap();
        let config = Config::from_json(&serde_json::json!({"tenants": {"a": {}}})).unwrap();
        let store = AnyStore::Sqlite(SqliteStore::in_memory().unwrap());
        let engine = Engine::new(config, store, runtime, Arc::new(policy));
        let (writer, thread) = Writer::start(Arc::new(engine), Metrics::new(), 1);
        // Each runtime is gone before the next one submits.
        for _ in 0..3 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let answer = rt.block_on(writer.submit(Job::Levels { now_ms: 0 }));
            assert!(matches!(answer, Ok(Answer::Inspection(_))), "{answer:?}");
        }
        assert!(writer.is_running());
        // A writer thread that ends (here: closed as its unwinding would) is seen as stopped.
        writer.intake.close();
        assert!(!writer.is_running());
        drop(writer);
        thread.join().unwrap();
    }
}
