//! One shard of the writer: a thread that takes batches from its intake, runs each in one
//! store transaction on its engine (group commit), answers the batch's jobs once it
//! committed (or lets those that may wait do so, see `waiting`), and keeps its engine
//! between batches (housekeeping, the waiting room's timers, and probing a store that
//! cannot write).

use super::waiting::Waiting;
use super::{Answer, Failure, Reply, Stamps, StoreHealth, Trouble, WriterObserver, MAX_BATCH};
use crate::engine::{Engine, Job, JobTimes};
use crate::maintenance::{self, Maintenance};
use crate::store::Store;
use std::sync::Arc;
use std::time::Instant;

/// The shard's intake.
pub(super) type Intake = super::intake::Intake<(Job, Reply)>;

/// Closes the intake when the writer thread ends, unwinding included, so that nobody
/// waits for an answer that will not come.
struct CloseOnExit<'a>(&'a Intake);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The shard's thread: batches from `taken` on `engine` until every sender is gone, the
/// store's state kept in `found`; then the engine's leases go back.
/// `sweeps`: whether this shard sweeps the store (see [`Maintenance::without_sweeps`]).
pub(super) fn run<S: Store>(
    engine: Arc<Engine<S>>,
    taken: Arc<Intake>,
    found: Arc<StoreHealth>,
    observer: Arc<dyn WriterObserver>,
    sweeps: bool,
    mut waiting: Waiting<S>,
) {
    let _close = CloseOnExit(&taken);
    let mut housekeeping = Maintenance::new(engine.clone(), observer.clone());
    if !sweeps {
        housekeeping = housekeeping.without_sweeps();
    }
    while let Some(batch) = taken.take(MAX_BATCH, waiting.idle(maintenance::SYNC_EVERY)) {
        housekeeping.run_due();
        waiting.drop_gone(&observer);
        let others = waiting.looks_with_others();
        if batch.is_empty() || others {
            // A timer of the waiting room, or capacity freed by other shards or replicas.
            waiting.serve(others, &observer);
        }
        if batch.is_empty() {
            // Idle while the store cannot write: a probe finds when it can.
            if found.probe_due(std::time::Instant::now()) {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                let trouble = engine
                    .probe_write(now_ms)
                    .err()
                    .and_then(|e| Trouble::of(&e));
                if found.record(trouble.clone()) {
                    observer.store_state(trouble.as_ref());
                }
            }
            continue;
        }
        // Replicas on a shared store all use its clock, read in the batch's
        // transaction, so that skewed machine clocks cannot mint credits.
        let (jobs, replies): (Vec<Job>, Vec<Reply>) = batch.into_iter().unzip();
        // A call that may wait does not pass those waiting for its model.
        let (jobs, replies) = waiting.hold_back(jobs, replies, &observer);
        if jobs.is_empty() {
            waiting.serve(false, &observer);
            continue;
        }
        let frees = jobs.iter().any(frees_capacity);
        let started = Instant::now();
        let mut times = Vec::new();
        let result = if replies.iter().any(|r| r.traced.is_some()) {
            engine.run_batch_timed(&jobs, &mut times)
        } else {
            engine.run_batch_at_store_time(&jobs)
        };
        let ended = Instant::now();
        observer.batch(jobs.len(), ended - started);
        // Whether the store wrote: a batch that failed for its absence, or
        // one of whose jobs did, says it cannot; one that committed, that it can.
        let trouble = match &result {
            Err(e) => Trouble::of(e),
            Ok(answers) => answers
                .iter()
                .find_map(|a| a.as_ref().err().and_then(Trouble::of)),
        };
        let wrote = result.is_ok() || trouble.is_some();
        if let Some(t) = &trouble {
            observer.write_failed(t);
        }
        if wrote && found.record(trouble.clone()) {
            observer.store_state(trouble.as_ref());
        }
        let answers: Vec<Result<Answer, Failure>> = match result {
            Ok(answers) => answers
                .into_iter()
                .map(|a| a.map_err(|e| Failure::of(&e)))
                .collect(),
            Err(e) => replies.iter().map(|_| Err(Failure::of(&e))).collect(),
        };
        waiting.saw(&jobs, &answers);
        // Refusals that may wait go to the waiting room instead of their callers (none can
        // when no job of the batch asked to wait: its answers go as they are).
        let (replies, answers, times, parked) = if replies.iter().any(Reply::may_wait) {
            let mut replies: Vec<Option<Reply>> = replies.into_iter().map(Some).collect();
            let mut answers: Vec<Option<Result<Answer, Failure>>> =
                answers.into_iter().map(Some).collect();
            let parked = waiting.park_refused(&jobs, &mut replies, &mut answers, &observer);
            let (mut kept_replies, mut kept_answers, mut kept_times) = (vec![], vec![], vec![]);
            for (i, (reply, answer)) in replies.into_iter().zip(answers).enumerate() {
                if let (Some(reply), Some(answer)) = (reply, answer) {
                    kept_replies.push(reply);
                    kept_answers.push(answer);
                    kept_times.push(times.get(i).copied().flatten());
                }
            }
            (kept_replies, kept_answers, kept_times, parked)
        } else {
            (replies, answers, times, false)
        };
        let batch = BatchTimes {
            started,
            ended,
            jobs: times,
        };
        deliver(replies, answers, &batch, &observer);
        if frees || parked {
            waiting.serve(frees, &observer);
        }
    }
    // A replica that stops gives its unused leases to the others at once.
    housekeeping.stop_leases();
}

/// Whether a job can free what waiting calls wait for: an attempt's end releases its slots
/// and may refund tokens.
fn frees_capacity(job: &Job) -> bool {
    matches!(job, Job::Complete { .. } | Job::Reconcile { .. })
}

/// When a batch ran, and each of its jobs when it was timed.
struct BatchTimes {
    started: Instant,
    ended: Instant,
    jobs: Vec<Option<JobTimes>>,
}

/// Answers a committed batch. Waking a waiting request from outside the runtime costs a
/// system call whenever a worker sleeps, which is most of the time while the writer is the
/// busy one; so the batch's answers go to the runtime as one task, which wakes the
/// requests from inside (one wake-up per batch instead of one per request).
fn deliver(
    replies: Vec<Reply>,
    answers: Vec<Result<Answer, Failure>>,
    batch: &BatchTimes,
    observer: &Arc<dyn WriterObserver>,
) {
    // The newest submitter's runtime is the one most surely still running.
    let runtime = replies.iter().rev().find_map(|r| r.runtime.clone());
    // Traced jobs' times, told to the observer with the answers (off this thread).
    let jobs = replies.len();
    let traced: Vec<(tracing::Span, Stamps)> = replies
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let (span, queued) = r.traced.clone()?;
            let stamps = Stamps {
                queued,
                batch_started: batch.started,
                job: batch.jobs.get(i).copied().flatten(),
                batch_ended: batch.ended,
                batch_jobs: jobs,
            };
            Some((span, stamps))
        })
        .collect();
    let observer = (!traced.is_empty()).then(|| observer.clone());
    let send_all = move || {
        if let Some(observer) = observer {
            for (span, stamps) in &traced {
                observer.traced(span, stamps);
            }
        }
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
