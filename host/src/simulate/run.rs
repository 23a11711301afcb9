//! The event loop: arrivals, caller retries, worker polls, provider calls and samples in
//! logical time, each admission, completion and dispatch decided by the real engine on its
//! store with the real policy. Nothing sleeps: the clock jumps to the next event.

use super::arrivals::{Arrival, Load};
use super::deployment::{Deployment, Taken};
use super::events::{Call, Event, Timed};
use super::file::{Callers, Distribution, OnRefusal, Simulation};
use super::recorder::{Ending, Recorder};
use super::rng::Rng;
use super::summary::{Series, Summary, TenantSummary};
use crate::engine::{
    waits_for, Batch, Completion, CompletionAnswer, Decision, DispatchAnswer, ProviderLimits,
    Reconciliation, Ticket, WaitingRoom,
};
use crate::model::{CallResult, Request, Route, Usage};
use crate::reason::Outcome;
use crate::store::{Store, StoreError};
use crate::Engine;
use std::collections::{BTreeMap, BinaryHeap};

mod waiting;

/// What one run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The summary, as `summary.json` holds it.
    pub summary: Summary,
    /// The time series the plots draw.
    pub series: Series,
    /// Tenant names, in the series' order.
    pub tenants: Vec<String>,
}

/// One operation's life as the simulation sees it.
#[derive(Clone, Copy, Debug, Default)]
struct Op {
    arrival: u32,
    /// Times its caller asked again after a refusal.
    retries: u32,
    admitted: bool,
    started: bool,
    done: bool,
}

/// The state of one run.
struct Sim<'a, S: Store> {
    sim: &'a Simulation,
    load: &'a Load,
    engine: &'a Engine<S>,
    callers: Vec<Callers>,
    weights: Vec<u32>,
    heap: BinaryHeap<Timed>,
    seq: u64,
    ops: Vec<Op>,
    /// What the run measures.
    books: Recorder,
    in_flight: u32,
    /// The provider's deployments with limits of their own, in name order.
    deployments: Vec<Deployment>,
    worker_busy: Vec<u32>,
    worker_names: Vec<String>,
    provider: Rng,
    engine_calls: u64,
    /// Engine work gathered for the current time, and what to do with each answer.
    pending: Batch,
    thens: Vec<Then>,
    /// Calls waiting for shared capacity (callers with `max_wait_ms`), by operation.
    room: WaitingRoom<u32>,
    /// Whether a call ended since the room was last tried.
    freed: bool,
    /// Calls let in from the room at the current time (another round follows).
    let_in: u32,
}

/// What an engine answer sets in motion.
enum Then {
    Admitted(u32, Ticket<Decision>),
    /// A waiting call tried again: its room id.
    Retried(u64, u32, Ticket<Decision>),
    Completed {
        op: u32,
        attempt: u32,
        call: Call,
        answer: Ticket<CompletionAnswer>,
    },
    Reconciled {
        op: u32,
        output_tokens: u64,
        answer: Ticket<CompletionAnswer>,
    },
    Dispatched(u32, Ticket<DispatchAnswer>),
}

/// Where a provider call was sent, and what it held there.
struct Sent {
    worker: Option<u32>,
    /// Whether it held one of the provider's places.
    held: bool,
    deployment: Option<(usize, bool)>,
    limits: Option<ProviderLimits>,
}

/// The key of operation `id`: unique within the run.
fn key_of(id: u32) -> String {
    format!("sim-{id}")
}

fn id_of(key: &str) -> Option<u32> {
    key.strip_prefix("sim-")?.parse().ok()
}

/// Runs `load` through `engine` (fresh, on an empty store) for `sim`'s duration.
pub fn run<S: Store>(
    sim: &Simulation,
    load: &Load,
    engine: &Engine<S>,
    name: &str,
) -> Result<RunResult, String> {
    let config = engine.config();
    let n = load.tenants.len();
    let mut weights = Vec::with_capacity(n);
    let mut callers = Vec::with_capacity(n);
    for t in &load.tenants {
        let tenant = config.tenant(t).ok_or_else(|| {
            format!("{name}: tenant {t:?} has load but is not in the configuration")
        })?;
        weights.push(tenant.weight);
        callers.push(
            sim.tenants
                .get(t)
                .and_then(|l| l.callers)
                .unwrap_or(sim.callers),
        );
    }
    let samples = sim.duration_ms / sim.sample_ms + 1;
    if samples.saturating_mul(n as u64) > super::file::MOST_SERIES_POINTS {
        return Err(format!(
            "{name}: {n} tenants × {samples} samples is over {} points: raise sample_ms",
            super::file::MOST_SERIES_POINTS
        ));
    }
    let durable = load.arrivals.iter().any(|a| a.route == Route::Durable);
    let deployments: Vec<Deployment> = sim
        .provider
        .deployments
        .iter()
        .map(|(name, spec)| Deployment::new(name, spec))
        .collect();
    let deployment_names: Vec<String> = deployments.iter().map(|d| d.name.clone()).collect();
    let workers = if durable { sim.workers.count } else { 0 };
    let mut s = Sim {
        sim,
        load,
        engine,
        callers,
        weights,
        heap: BinaryHeap::new(),
        seq: 0,
        ops: Vec::with_capacity(load.arrivals.len()),
        books: Recorder::new(n, deployment_names),
        in_flight: 0,
        deployments,
        worker_busy: vec![0; workers as usize],
        worker_names: (0..workers).map(|w| format!("sim-worker-{w}")).collect(),
        provider: Rng::new(sim.seed, u64::MAX),
        engine_calls: 0,
        pending: Batch::new(),
        thens: Vec::new(),
        room: WaitingRoom::new(),
        freed: false,
        let_in: 0,
    };
    for w in 0..workers {
        let offset = (sim.workers.poll_ms * w as u64 / workers.max(1) as u64) as i64;
        s.push(offset, Event::Poll(w));
    }
    s.sample(0)?;
    s.push(sim.sample_ms as i64, Event::Sample);
    let end = sim.duration_ms as i64;
    let mut next = 0usize;
    loop {
        // Everything that happens at the next time runs as one batch.
        let arrival_t = load.arrivals.get(next).map(|a| a.t_ms);
        let event_t = s.heap.peek().map(|e| e.t);
        let Some(now) = arrival_t.into_iter().chain(event_t).min() else {
            break;
        };
        if now > end {
            break;
        }
        let mut sample = false;
        while let Some(a) = load.arrivals.get(next).filter(|a| a.t_ms == now) {
            let id = s.ops.len() as u32;
            s.ops.push(Op {
                arrival: next as u32,
                ..Op::default()
            });
            s.books.offered(a.tenant);
            next += 1;
            s.admit(id, now);
        }
        while s.heap.peek().is_some_and(|e| e.t == now) {
            let Timed { event, .. } = s.heap.pop().expect("peeked");
            match event {
                Event::Admit(op) => s.admit(op, now),
                Event::CallEnd {
                    op,
                    attempt,
                    worker,
                    held,
                    deployment,
                    limits,
                    call,
                } => {
                    let sent = Sent {
                        worker,
                        held,
                        deployment,
                        limits,
                    };
                    s.call_end(now, op, attempt, sent, call)
                }
                Event::Reconcile {
                    op,
                    attempt,
                    output_tokens,
                } => s.reconcile(now, op, attempt, output_tokens),
                Event::Poll(w) => s.poll(now, w),
                Event::Wake => {}
                // Taken after the batch of its time, so that it sees that time's work.
                Event::Sample => sample = true,
            }
        }
        s.flush(now)?;
        s.serve_waiting(now)?;
        if sample {
            s.sample(now)?;
            s.push(now + sim.sample_ms as i64, Event::Sample);
        }
    }
    Ok(s.finish(name))
}

impl<'a, S: Store> Sim<'a, S> {
    fn push(&mut self, t: i64, event: Event) {
        self.seq += 1;
        self.heap.push(Timed {
            t,
            seq: self.seq,
            event,
        });
    }

    fn arrival(&self, op: u32) -> &'a Arrival {
        &self.load.arrivals[self.ops[op as usize].arrival as usize]
    }

    fn admit(&mut self, op: u32, now: i64) {
        let request = self.request(op);
        // A caller that may wait does not pass calls waiting for the same model.
        let a = self.arrival(op);
        if self.callers[a.tenant].max_wait_ms.is_some()
            && a.route == Route::Interactive
            && self
                .room
                .would_pass(request.model.as_deref(), request.priority)
        {
            if let Some(last) = self.room.refusal_for(request.model.as_deref()).cloned() {
                self.wait(op, now, last);
                return;
            }
        }
        let decision = self.pending.admit(request, now);
        self.thens.push(Then::Admitted(op, decision));
    }

    /// The request of operation `op`.
    fn request(&self, op: u32) -> Request {
        let a = self.arrival(op);
        let tenant = a.tenant;
        Request {
            tenant: self.load.tenants[tenant].clone(),
            key: key_of(op),
            route: a.route,
            input_tokens: a.input_tokens,
            optional_context_tokens: 0,
            max_output_tokens: a.max_output_tokens,
            deadline_ms: a.deadline_ms,
            size_bytes: 1,
            body_ref: None,
            fingerprint: None,
            model: a.model.as_deref().map(str::to_string),
            priority: a.priority,
            labels: BTreeMap::new(),
            fallback: true,
            trace_context: None,
        }
    }

    fn admitted(&mut self, op: u32, now: i64, d: Decision) {
        let a = self.arrival(op);
        let tenant = a.tenant;
        match d.outcome {
            Outcome::Accepted | Outcome::Queued => {
                if d.outcome == Outcome::Accepted {
                    self.room.started(&self.load.tenants[tenant]);
                }
                if !self.ops[op as usize].admitted {
                    self.ops[op as usize].admitted = true;
                    self.books.admitted(tenant);
                }
                if d.outcome == Outcome::Accepted {
                    let max_output = d.max_output_tokens.unwrap_or(a.max_output_tokens);
                    let to = d.deployment.as_deref();
                    self.start_call(now, op, d.attempt.unwrap_or(1), max_output, None, to);
                }
            }
            _ if self.callers[tenant].max_wait_ms.is_some()
                && a.route == Route::Interactive
                && self.engine.config().waiting.enabled
                && waits_for(&d) =>
            {
                self.wait(op, now, d)
            }
            _ => self.refused(op, now, &d),
        }
    }

    /// A refusal reaches the caller: it asks again as its callers do, or gives up.
    fn refused(&mut self, op: u32, now: i64, d: &Decision) {
        let a = self.arrival(op);
        let tenant = a.tenant;
        let reason = match d.reason {
            Some(r) => r.as_str(),
            None => d.outcome.as_str(),
        };
        self.books.refused(tenant, reason);
        let callers = self.callers[tenant];
        let retries = self.ops[op as usize].retries;
        if callers.on_refusal != OnRefusal::GiveUp && retries < callers.max_retries {
            let delay = match callers.on_refusal {
                OnRefusal::RetryAfter => d.retry_after_ms.unwrap_or(callers.retry_ms),
                _ => callers.retry_ms,
            }
            .max(1) as i64;
            if now + delay < a.deadline_ms {
                self.ops[op as usize].retries += 1;
                self.push(now + delay, Event::Admit(op));
                return;
            }
        }
        self.books.gave_up(tenant);
        self.ops[op as usize].done = true;
    }

    /// Sends a call to the provider (to `deployment` where the engine reserved one the
    /// provider knows): refused at once when all its places are taken, or past the
    /// deployment's own limits.
    fn start_call(
        &mut self,
        now: i64,
        op: u32,
        attempt: u32,
        max_output: u64,
        worker: Option<u32>,
        deployment: Option<&str>,
    ) {
        let a = self.arrival(op);
        if !self.ops[op as usize].started {
            self.ops[op as usize].started = true;
            self.books.first_call(a.tenant, now - a.t_ms);
        }
        let p = &self.sim.provider;
        let rate_limited = Call::Failed {
            kind: "rate_limited",
            retry_after_ms: Some(p.failures.rate_limited_retry_after_ms),
        };
        let refused_at = now + p.failures.fail_after_ms as i64;
        if self.in_flight >= p.concurrency {
            let end = Event::CallEnd {
                op,
                attempt,
                worker,
                held: false,
                deployment: None,
                limits: None,
                call: rate_limited,
            };
            self.push(refused_at, end);
            return;
        }
        let to = deployment.and_then(|n| self.deployments.iter().position(|d| d.name == n));
        let mut limits = None;
        if let Some(i) = to {
            let tokens = a.input_tokens + max_output;
            let busy = p.failures.rate_limited_retry_after_ms;
            self.books.deployment_sent(i);
            match self.deployments[i].take(now, tokens, busy) {
                Taken::Yes(said) => {
                    limits = said;
                    self.books
                        .deployment_in_flight(i, self.deployments[i].in_flight);
                }
                Taken::RateLimited(wait, said) => {
                    let end = Event::CallEnd {
                        op,
                        attempt,
                        worker,
                        held: false,
                        deployment: Some((i, false)),
                        limits: said,
                        call: Call::Failed {
                            kind: "rate_limited",
                            retry_after_ms: Some(wait),
                        },
                    };
                    self.push(refused_at, end);
                    return;
                }
            }
        }
        self.in_flight += 1;
        let output_tokens = (max_output as f64 * p.output_fraction).round() as u64;
        let mean = p.base_ms + p.per_output_token_ms * output_tokens as f64;
        let service = match p.distribution {
            Distribution::Fixed => mean,
            Distribution::Exponential => self.provider.exponential(mean),
            Distribution::Uniform => mean * (0.5 + self.provider.unit()),
        };
        let service = (service.round() as i64).max(1);
        let f = to
            .and_then(|i| self.deployments[i].failures.as_ref())
            .unwrap_or(&p.failures);
        let u = self.provider.unit();
        let (after, call) = if u < f.unknown {
            (service, Call::Unknown { output_tokens })
        } else if u < f.unknown + f.rate_limited {
            (f.fail_after_ms as i64, rate_limited)
        } else if u < f.unknown + f.rate_limited + f.unavailable {
            let call = Call::Failed {
                kind: "unavailable",
                retry_after_ms: None,
            };
            (f.fail_after_ms as i64, call)
        } else {
            (service, Call::Succeeded { output_tokens })
        };
        let end = Event::CallEnd {
            op,
            attempt,
            worker,
            held: true,
            deployment: to.map(|i| (i, true)),
            limits,
            call,
        };
        self.push(now + after, end);
    }

    fn call_end(&mut self, now: i64, op: u32, attempt: u32, sent: Sent, call: Call) {
        if sent.held {
            self.in_flight -= 1;
        }
        if let Some(w) = sent.worker {
            self.worker_busy[w as usize] -= 1;
        }
        if let Some((i, held)) = sent.deployment {
            if held {
                self.deployments[i].in_flight -= 1;
            }
            let kind = match call {
                Call::Succeeded { .. } => "succeeded",
                Call::Failed { kind, .. } => kind,
                Call::Unknown { .. } => "unknown",
            };
            self.books.deployment_ended(i, kind);
        }
        let worker = sent.worker;
        let a = self.arrival(op);
        let (result, usage, failure, retry_after) = match call {
            Call::Succeeded { output_tokens } => (
                CallResult::Succeeded,
                Some(usage(a, output_tokens)),
                None,
                None,
            ),
            Call::Failed {
                kind,
                retry_after_ms,
            } => (
                CallResult::Failed,
                None,
                Some(kind.to_string()),
                retry_after_ms,
            ),
            Call::Unknown { .. } => (CallResult::Unknown, None, None, None),
        };
        let completion = Completion {
            tenant: self.load.tenants[a.tenant].clone(),
            key: key_of(op),
            result,
            usage,
            failure,
            provider_retry_after_ms: retry_after,
            result_ref: None,
            worker: worker.map(|w| self.worker_names[w as usize].clone()),
            attempt: Some(attempt),
            answer: None,
            provider_limits: sent.limits,
        };
        let answer = self.pending.complete(completion, now);
        self.thens.push(Then::Completed {
            op,
            attempt,
            call,
            answer,
        });
    }

    fn completed(
        &mut self,
        now: i64,
        op: u32,
        attempt: u32,
        call: Call,
        answer: CompletionAnswer,
    ) -> Result<(), String> {
        let a = self.arrival(op);
        if !matches!(call, Call::Unknown { .. }) {
            // Its slots are free again: the waiting calls may fit now.
            self.room.ended(&self.load.tenants[a.tenant]);
            self.freed = true;
        }
        if !answer.ok {
            return Err(format!(
                "the engine refused a completion of {}: {:?}",
                key_of(op),
                answer.error
            ));
        }
        match call {
            Call::Succeeded { output_tokens } => {
                let tokens = a.input_tokens + output_tokens;
                let late = now > a.deadline_ms;
                self.books.succeeded(a.tenant, tokens, now - a.t_ms, late);
                self.ops[op as usize].done = true;
            }
            Call::Failed { .. } => match answer.retry {
                Some(v) if v.eligible => {
                    // Durable work goes back to the queue for dispatch; an interactive
                    // caller asks again, same key, at the time the verdict gives.
                    if a.route == Route::Interactive {
                        let at = v.not_before_ms.unwrap_or(now).max(now + 1);
                        self.push(at, Event::Admit(op));
                    }
                }
                _ => {
                    self.books.failed_final(a.tenant);
                    self.ops[op as usize].done = true;
                }
            },
            Call::Unknown { output_tokens } => {
                self.books.unknown(a.tenant);
                let at = now + self.sim.provider.reconcile_after_ms as i64;
                self.push(
                    at,
                    Event::Reconcile {
                        op,
                        attempt,
                        output_tokens,
                    },
                );
            }
        }
        Ok(())
    }

    fn reconcile(&mut self, now: i64, op: u32, attempt: u32, output_tokens: u64) {
        let a = self.arrival(op);
        let rec = Reconciliation {
            tenant: self.load.tenants[a.tenant].clone(),
            key: key_of(op),
            resolution: CallResult::Succeeded,
            usage: Some(usage(a, output_tokens)),
            result_ref: None,
            worker: None,
            attempt: Some(attempt),
        };
        let answer = self.pending.reconcile(rec, now);
        self.thens.push(Then::Reconciled {
            op,
            output_tokens,
            answer,
        });
    }

    fn reconciled(&mut self, op: u32, output_tokens: u64) {
        let a = self.arrival(op);
        self.books
            .reconciled(a.tenant, a.input_tokens + output_tokens);
        self.ops[op as usize].done = true;
    }

    fn poll(&mut self, now: i64, w: u32) {
        let free = self
            .sim
            .workers
            .claim_batch
            .saturating_sub(self.worker_busy[w as usize]);
        if free > 0 {
            let worker = self.worker_names[w as usize].clone();
            let claims = self.pending.dispatch(worker, free, now);
            self.thens.push(Then::Dispatched(w, claims));
        }
        self.push(now + self.sim.workers.poll_ms as i64, Event::Poll(w));
    }

    fn dispatched(&mut self, now: i64, w: u32, answer: DispatchAnswer) {
        for job in answer.expired {
            if let Some(op) = id_of(&job.key) {
                let tenant = self.arrival(op).tenant;
                self.books.expired(tenant);
                self.ops[op as usize].done = true;
            }
        }
        for claim in answer.claimed {
            let Some(op) = id_of(&claim.key) else {
                continue;
            };
            self.worker_busy[w as usize] += 1;
            let tokens = claim.max_output_tokens;
            self.start_call(now, op, claim.attempt, tokens, Some(w), None);
        }
    }

    /// Runs the engine work gathered for time `now` in one transaction (each job all or
    /// nothing on its own, in order, as the service's writer runs them), then what each
    /// answer sets in motion.
    fn flush(&mut self, now: i64) -> Result<(), String> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        self.engine_calls += batch.len() as u64;
        let mut answers = self.engine.run(batch).map_err(|e| e.to_string())?;
        let failed = |e: StoreError| e.to_string();
        for then in std::mem::take(&mut self.thens) {
            match then {
                Then::Admitted(op, d) => {
                    let d = answers.take(d).map_err(failed)?;
                    self.admitted(op, now, d)
                }
                Then::Retried(id, op, d) => {
                    let d = answers.take(d).map_err(failed)?;
                    self.retried(id, op, now, d)
                }
                Then::Completed {
                    op,
                    attempt,
                    call,
                    answer,
                } => {
                    let c = answers.take(answer).map_err(failed)?;
                    self.completed(now, op, attempt, call, c)?
                }
                Then::Reconciled {
                    op,
                    output_tokens,
                    answer,
                } => {
                    answers.take(answer).map_err(failed)?;
                    self.reconciled(op, output_tokens)
                }
                Then::Dispatched(w, claims) => {
                    let d = answers.take(claims).map_err(failed)?;
                    self.dispatched(now, w, d)
                }
            }
        }
        Ok(())
    }

    fn sample(&mut self, now: i64) -> Result<(), String> {
        let depths = self.engine.queue_depths().map_err(|e| e.to_string())?;
        let tenants = &self.load.tenants;
        let depth = |i: usize| depths.get(&tenants[i]).copied().unwrap_or(0);
        self.books.sample(now, self.in_flight, depth);
        Ok(())
    }

    fn finish(mut self, name: &str) -> RunResult {
        let end = self.sim.duration_ms as i64;
        for op in &self.ops {
            if !op.done {
                let a = &self.load.arrivals[op.arrival as usize];
                self.books.pending_at_end(a.tenant, a.deadline_ms < end);
            }
        }
        let (tallies, overall, deployments, series) = self.books.finish(Ending {
            weights: &self.weights,
            engine_calls: self.engine_calls,
        });
        let tenants: BTreeMap<String, TenantSummary> =
            self.load.tenants.iter().cloned().zip(tallies).collect();
        RunResult {
            summary: Summary {
                name: name.to_string(),
                policy: crate::engine::PolicyIdentity::of(&*self.engine.active_policy()),
                duration_ms: self.sim.duration_ms,
                tenants,
                overall,
                deployments,
            },
            series,
            tenants: self.load.tenants.clone(),
        }
    }
}

/// What the provider reports for a call of `a` that wrote `output_tokens`.
fn usage(a: &Arrival, output_tokens: u64) -> Usage {
    Usage::new(a.input_tokens, output_tokens)
}
