//! A shard's waiting room. An admission that may wait (a gateway call; a `POST /v1/admit`
//! that asks with `max_wait_ms`) and is refused only by shared capacity that frees by itself
//! ([`waits_for`]) is kept here with its reply instead of being answered. The room's calls
//! are tried again, in its fair order, when something may have freed: a batch that
//! completed or reconciled a call, a bucket's refill or a pause's end (a timer at that
//! instant), and, where other shards or replicas free what they share, each time the shard
//! looks for their changes. A call is answered once admitted, or refused once its deadline
//! (less its estimated execution) or the longest wait comes; one whose caller left is
//! dropped at once, having spent nothing. A call that may wait does not pass those waiting
//! for the same model: it waits behind them.

use super::shard::Intake;
use super::{Answer, Failure, Reply, WriterObserver};
use crate::engine::{
    frees_at, given_up, waiter_for, waits_for, Decision, Engine, Job, TenantLevels, Waiter,
    WaitingRoom,
};
use crate::model::Route;
use crate::reason::Reason;
use crate::store::Store;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::oneshot;

/// Most calls tried in one round.
const MOST_PER_ROUND: usize = 64;
/// Most rounds at one look: each round after the first only follows admissions.
const MOST_ROUNDS: usize = 16;

/// A call that could not wait: its job, its reply, and the answer to give it instead.
type NotParked = (Job, Reply, Result<Answer, Failure>);

/// What waits with a call: its job, where its answer goes, and the tenant's levels with
/// its latest refusal (for the rate-limit headers of a refusal after waiting).
pub(super) struct Parked {
    job: Job,
    reply: Reply,
    levels: Option<TenantLevels>,
    /// The job's clock less this machine's when it was parked: the room keeps time on this
    /// machine's clock, and a waiting job is decided again at its own clock's time.
    offset_ms: i64,
}

/// What the writer shows of one shard's waiting room.
#[derive(Debug, Default)]
pub struct WaitingStats {
    by_band: [AtomicUsize; 3],
    by_tenant: Mutex<BTreeMap<String, usize>>,
}

impl WaitingStats {
    /// Calls waiting in each band (critical, standard, sheddable).
    pub fn by_band(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.by_band[i].load(Ordering::Relaxed))
    }

    /// Calls waiting for each tenant that has any.
    pub fn by_tenant(&self) -> BTreeMap<String, usize> {
        self.by_tenant
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What waits in a writer's waiting rooms, every shard's together (`inspect`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WaitingNow {
    /// Calls waiting in all.
    pub calls: usize,
    /// Calls waiting in each band (`critical`, `standard`, `sheddable`).
    pub bands: BTreeMap<&'static str, usize>,
    /// Calls waiting for each tenant that has any.
    pub tenants: BTreeMap<String, usize>,
}

impl WaitingNow {
    /// The sum of `shards`' rooms.
    pub fn of(shards: &[Arc<WaitingStats>]) -> Self {
        let mut out = WaitingNow::default();
        for band in crate::model::Priority::BANDS {
            out.bands.insert(band.as_str(), 0);
        }
        for s in shards {
            for (band, n) in crate::model::Priority::BANDS.iter().zip(s.by_band()) {
                *out.bands.entry(band.as_str()).or_default() += n;
                out.calls += n;
            }
            for (t, n) in s.by_tenant() {
                *out.tenants.entry(t).or_default() += n;
            }
        }
        out
    }
}

/// The shard's room, and what it needs to answer from it.
pub(super) struct Waiting<S: Store> {
    engine: Arc<Engine<S>>,
    room: WaitingRoom<Parked>,
    /// Waiters whose callers left, told by their replies' watchers.
    gone: Arc<Mutex<Vec<u64>>>,
    intake: Arc<Intake>,
    stats: Arc<WaitingStats>,
    /// How many shards share `waiting.total`.
    shards: usize,
    /// Whether capacity this shard waits for can be freed elsewhere (other shards or
    /// replicas): then the room is tried again every [`LOOK_EVERY`].
    shared: bool,
    /// When the room was last tried for capacity freed elsewhere.
    last_look: std::time::Instant,
}

/// How often a room whose capacity other shards or replicas share is tried again while
/// nothing of its own frees it.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The admission's decision in an answer, if it is one.
fn decision_mut(a: &mut Answer) -> Option<&mut Decision> {
    match a {
        Answer::Decision(d) | Answer::DecisionWithLevels(d, _) => Some(d),
        _ => None,
    }
}

/// The time on this machine, in Unix ms.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The job's own time.
fn job_now(job: &Job) -> Option<i64> {
    match job {
        Job::Admit { now_ms, .. } | Job::AdmitWithLevels { now_ms, .. } => Some(*now_ms),
        _ => None,
    }
}

/// The job's admission time set to `now_ms` (a waiting call is decided afresh).
fn at(job: &Job, now_ms: i64) -> Job {
    let mut job = job.clone();
    if let Job::Admit { now_ms: t, .. } | Job::AdmitWithLevels { now_ms: t, .. } = &mut job {
        *t = now_ms;
    }
    job
}

impl<S: Store> Waiting<S> {
    pub(super) fn new(
        engine: Arc<Engine<S>>,
        intake: Arc<Intake>,
        stats: Arc<WaitingStats>,
        shards: usize,
    ) -> Self {
        let shared = shards > 1 || engine.lease_holder().is_some();
        Waiting {
            engine,
            room: WaitingRoom::new(),
            gone: Arc::default(),
            intake,
            stats,
            shards: shards.max(1),
            shared,
            last_look: std::time::Instant::now(),
        }
    }

    /// How long the shard may sleep before the room needs a look: until the next give-up
    /// or retry time, and no longer than `most`.
    pub(super) fn idle(&self, most: Duration) -> Duration {
        match self.room.next_due(wall_ms()) {
            Some(at) => Duration::from_millis((at - wall_ms()).clamp(0, i64::MAX) as u64).min(most),
            None if self.shared && !self.room.is_empty() => most.min(LOOK_EVERY),
            None => most,
        }
    }

    /// Whether the room has calls whose capacity may have freed elsewhere since it was
    /// last tried for that ([`LOOK_EVERY`] ago): then it is tried again now.
    pub(super) fn looks_with_others(&mut self) -> bool {
        if !self.shared || self.room.is_empty() || self.last_look.elapsed() < LOOK_EVERY {
            return false;
        }
        self.last_look = std::time::Instant::now();
        true
    }

    /// Drops the waiters whose callers left.
    pub(super) fn drop_gone(&mut self, observer: &Arc<dyn WriterObserver>) {
        let gone = std::mem::take(&mut *self.gone.lock().unwrap_or_else(|e| e.into_inner()));
        if gone.is_empty() {
            return;
        }
        let now = wall_ms();
        for id in gone {
            if let Some(w) = self.room.take(id) {
                observer.waited("gone", waited(&w, now));
            }
        }
        self.publish();
    }

    /// Keeps back the jobs that may wait and would pass calls waiting for the same model:
    /// they wait behind them. Returns the others, to run now.
    pub(super) fn hold_back(
        &mut self,
        jobs: Vec<Job>,
        replies: Vec<Reply>,
        observer: &Arc<dyn WriterObserver>,
    ) -> (Vec<Job>, Vec<Reply>) {
        if self.room.is_empty() {
            return (jobs, replies);
        }
        let now = wall_ms();
        let mut run = (
            Vec::with_capacity(jobs.len()),
            Vec::with_capacity(jobs.len()),
        );
        for (job, reply) in jobs.into_iter().zip(replies) {
            let request = match &job {
                Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. } => Some(request),
                _ => None,
            };
            let behind = reply.may_wait()
                && request.is_some_and(|r| {
                    r.route == Route::Interactive
                        && self.room.would_pass(r.model.as_deref(), r.priority)
                });
            if !behind {
                run.0.push(job);
                run.1.push(reply);
                continue;
            }
            let model = request.and_then(|r| r.model.clone());
            let last = self
                .room
                .refusal_for(model.as_deref())
                .cloned()
                .unwrap_or_else(|| Decision::rejected(Reason::DeploymentCapacity, None));
            if let Err(not) = self.park(job, reply, last, None, now) {
                let (job, reply, answer) = *not;
                let _ = reply.to.send(answer);
                observer.waited("queue_full", Duration::ZERO);
                drop(job);
            }
        }
        self.publish();
        run
    }

    /// Of a batch's answers, parks those that may wait; returns the indexes of the jobs
    /// answered here (parked, or refused by the room's bounds), whose replies were taken.
    pub(super) fn park_refused(
        &mut self,
        jobs: &[Job],
        replies: &mut [Option<Reply>],
        answers: &mut [Option<Result<Answer, Failure>>],
        observer: &Arc<dyn WriterObserver>,
    ) -> bool {
        let now = wall_ms();
        let mut parked = false;
        for (i, job) in jobs.iter().enumerate() {
            // Only interactive calls wait: durable work has its queue.
            let interactive = matches!(
                job,
                Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. }
                    if request.route == Route::Interactive
            );
            let may = interactive && replies[i].as_ref().is_some_and(Reply::may_wait);
            let waitable = matches!(
                &answers[i],
                Some(Ok(Answer::Decision(d) | Answer::DecisionWithLevels(d, _))) if waits_for(d)
            );
            if !may || !waitable {
                continue;
            }
            let Some(Ok(answer)) = answers[i].take() else {
                continue;
            };
            let (last, levels) = match answer {
                Answer::Decision(d) => (d, None),
                Answer::DecisionWithLevels(d, l) => (d, l),
                _ => unreachable!("checked above"),
            };
            let reply = replies[i].take().expect("checked above");
            match self.park(job.clone(), reply, last, levels, now) {
                Ok(()) => parked = true,
                Err(not) => {
                    let (_, reply, answer) = *not;
                    // Refused without waiting: counted as the room's refusal it is.
                    let reason = match &answer {
                        Ok(Answer::Decision(d) | Answer::DecisionWithLevels(d, _)) => d.reason,
                        _ => None,
                    };
                    match reason {
                        Some(Reason::QueueFull) => observer.waited("queue_full", Duration::ZERO),
                        Some(Reason::DeadlineExceeded) => {
                            observer.waited("deadline", Duration::ZERO)
                        }
                        _ => {}
                    }
                    replies[i] = Some(reply);
                    answers[i] = Some(answer);
                }
            }
        }
        if parked {
            self.publish();
        }
        parked
    }

    /// Lets a refused call wait, or says why it cannot: the answer to give instead (its
    /// refusal as it is when the wait cannot fit before its retry time, `deadline_exceeded`
    /// when its deadline is what cannot fit, `queue_full` past the room's bounds).
    fn park(
        &mut self,
        job: Job,
        mut reply: Reply,
        last: Decision,
        levels: Option<TenantLevels>,
        now: i64,
    ) -> Result<(), Box<NotParked>> {
        let (Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. }) = &job else {
            let answer = Ok(Answer::Decision(last));
            return Err(Box::new((job, reply, answer)));
        };
        let config = self.engine.config();
        // The deadline is on the job's clock; the room keeps this machine's.
        let offset_ms = job_now(&job).map_or(0, |t| t.saturating_sub(now));
        let deadline = request.deadline_ms.saturating_sub(offset_ms);
        let (per_tenant, total) =
            crate::engine::waiting_bounds(&config, &request.tenant, self.shards);
        let wait = reply.wait.unwrap_or(0);
        let request = request.clone();
        let with_levels = |d: Decision, job: &Job| match job {
            Job::AdmitWithLevels { .. } => Answer::DecisionWithLevels(d, levels),
            _ => Answer::Decision(d),
        };
        // The caller's channel moves to a watcher on its runtime, which passes the answer
        // on, or says at once that the caller left (a caller on no runtime is answered
        // straight).
        let watched = reply.runtime.clone().map(|runtime| {
            let (inner, outer) = oneshot::channel();
            (runtime, outer, std::mem::replace(&mut reply.to, inner))
        });
        let payload = Parked {
            job,
            reply,
            levels,
            offset_ms,
        };
        let waiter = match waiter_for(&config, &request, last, (now, deadline), wait, payload) {
            Ok(w) => w,
            Err((p, d)) => {
                let Parked { job, mut reply, .. } = p;
                if let Some((_, _, to)) = watched {
                    reply.to = to;
                }
                let answer = Ok(with_levels(d, &job));
                return Err(Box::new((job, reply, answer)));
            }
        };
        match self.room.enter(waiter, per_tenant, total) {
            Ok(id) => {
                if let Some((runtime, outer, to)) = watched {
                    watch(
                        runtime,
                        id,
                        outer,
                        to,
                        self.gone.clone(),
                        self.intake.clone(),
                    );
                }
                Ok(())
            }
            Err((w, full)) => {
                let Parked { job, mut reply, .. } = w.payload;
                if let Some((_, _, to)) = watched {
                    reply.to = to;
                }
                let mut d = Decision::rejected(Reason::QueueFull, None);
                d.message = Some(full.message(&w.tenant));
                let answer = Ok(with_levels(d, &job));
                Err(Box::new((job, reply, answer)))
            }
        }
    }

    /// Counts the calls a batch started and ended, for the room's order (a tenant with
    /// fewer calls in flight goes first).
    pub(super) fn saw(&mut self, jobs: &[Job], answers: &[Result<Answer, Failure>]) {
        use crate::model::CallResult;
        for (job, answer) in jobs.iter().zip(answers) {
            let Ok(answer) = answer else {
                continue;
            };
            match (job, answer) {
                (
                    Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. },
                    Answer::Decision(d) | Answer::DecisionWithLevels(d, _),
                ) if d.authorises_call() => self.room.started(&request.tenant),
                (Job::Complete { completion, .. }, Answer::Completion(a))
                    if a.ok && completion.result != CallResult::Unknown =>
                {
                    self.room.ended(&completion.tenant)
                }
                (Job::Reconcile { reconciliation, .. }, Answer::Completion(a)) if a.ok => {
                    self.room.ended(&reconciliation.tenant)
                }
                _ => {}
            }
        }
    }

    /// Refuses the calls whose time is up, then tries the room's calls in its fair order,
    /// round after round while some are admitted: every tenant's first call when
    /// something was `freed`, else those whose retry time has come.
    pub(super) fn serve(&mut self, freed: bool, observer: &Arc<dyn WriterObserver>) {
        if self.room.is_empty() {
            return;
        }
        let now = wall_ms();
        for w in self.room.due(now) {
            let (d, outcome) = given_up(&w, now);
            observer.waited(outcome, waited(&w, now));
            answer(w.payload, d);
        }
        for _ in 0..MOST_ROUNDS {
            let ids = self.room.candidates(now, MOST_PER_ROUND, freed);
            if ids.is_empty() {
                break;
            }
            let jobs: Vec<Job> = ids
                .iter()
                .filter_map(|id| {
                    let p = &self.room.get_mut(*id)?.payload;
                    Some(at(&p.job, now.saturating_add(p.offset_ms)))
                })
                .collect();
            let Ok(answers) = self.engine.run_batch_at_store_time(&jobs) else {
                // The store failed: they go on waiting, and give up in time.
                break;
            };
            let mut admitted = 0;
            for (id, answer) in ids.into_iter().zip(answers) {
                let still = match &answer {
                    Ok(Answer::Decision(d) | Answer::DecisionWithLevels(d, _)) => waits_for(d),
                    // A store failure for this call alone: it goes on waiting.
                    Err(_) => true,
                    Ok(_) => false,
                };
                if still {
                    if let (Some(w), Ok(a)) = (self.room.get_mut(id), answer) {
                        let (d, levels) = match a {
                            Answer::DecisionWithLevels(d, l) => (d, l),
                            Answer::Decision(d) => (d, None),
                            _ => continue,
                        };
                        w.retry_at_ms = frees_at(&d, now);
                        w.last = d;
                        w.payload.levels = levels;
                    }
                    continue;
                }
                let Some(w) = self.room.take(id) else {
                    continue;
                };
                let waited_for = waited(&w, now);
                let mut answer = answer.expect("an answer, checked above");
                if let Some(d) = decision_mut(&mut answer) {
                    d.waited_ms = Some(ms(waited_for));
                    if d.authorises_call() {
                        self.room
                            .admitted(&w, d.reserved_tokens.unwrap_or(w.tokens));
                        self.room.started(&w.tenant);
                        admitted += 1;
                    }
                }
                observer.waited("admitted", waited_for);
                let _ = w.payload.reply.to.send(Ok(answer));
            }
            if admitted == 0 {
                break;
            }
        }
        self.publish();
    }

    /// Tells the stats what waits now.
    fn publish(&self) {
        let bands = self.room.by_band();
        for (i, n) in bands.iter().enumerate() {
            self.stats.by_band[i].store(*n, Ordering::Relaxed);
        }
        *self
            .stats
            .by_tenant
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = self.room.by_tenant();
    }
}

fn waited(w: &Waiter<Parked>, now: i64) -> Duration {
    Duration::from_millis((now - w.entered_ms).max(0) as u64)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// Answers a parked call with `d` (and the levels it was last refused with).
fn answer(p: Parked, d: Decision) {
    let a = match p.job {
        Job::AdmitWithLevels { .. } => Answer::DecisionWithLevels(d, p.levels),
        _ => Answer::Decision(d),
    };
    let _ = p.reply.to.send(Ok(a));
}

/// Passes the answer from `outer` to the caller's `to` on the caller's runtime; if the
/// caller leaves first, tells the shard (`gone`, and a wake-up) so that it drops the
/// waiter at once.
fn watch(
    runtime: tokio::runtime::Handle,
    id: u64,
    mut outer: oneshot::Receiver<Result<Answer, Failure>>,
    mut to: oneshot::Sender<Result<Answer, Failure>>,
    gone: Arc<Mutex<Vec<u64>>>,
    intake: Arc<Intake>,
) {
    let relay = async move {
        let ended = std::future::poll_fn(|cx| {
            if let Poll::Ready(a) = Pin::new(&mut outer).poll(cx) {
                return Poll::Ready(a.ok());
            }
            if to.poll_closed(cx).is_ready() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        match ended {
            Some(answer) => {
                let _ = to.send(answer);
            }
            None if to.is_closed() => {
                gone.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                intake.wake();
            }
            None => {}
        }
    };
    runtime.spawn(relay);
}
