//! Work submitted in batches, for callers that group several decisions into one transaction
//! (the writer, the simulator). Each job is still all or nothing on its own.
//!
//! A [`Batch`] made in code hands back a typed [`Ticket`] for each piece, and the
//! [`Answers`] give each piece's answer in its own type: which answer belongs to which
//! piece is this module's business, never the caller's.

use super::budgets::Budgets;
use super::{Completion, Reconciliation, DOWNSTREAM};
use super::{CompletionAnswer, Decision, DispatchAnswer, Engine, Inspection, OperationView};
use crate::config::Config;
use crate::model::Request;
use crate::runtime::Decider;
use crate::store::{Prefetch, Store, StoreError, Tx};

/// One unit of engine work.
#[derive(Clone, Debug)]
pub(crate) enum Job {
    /// An admission of an already validated request.
    Admit {
        /// The validated request.
        request: Request,
        /// The time of the decision.
        now_ms: i64,
    },
    /// An admission, answered with the tenant's buckets as they are after it (a gateway's
    /// rate-limit headers), in the same job.
    AdmitWithLevels {
        /// The validated request.
        request: Request,
        /// The time of the decision.
        now_ms: i64,
    },
    /// Report how an active operation's call ended.
    Complete {
        /// The report.
        completion: Completion,
        /// The time of the report.
        now_ms: i64,
    },
    /// Resolve an unknown outcome.
    Reconcile {
        /// The resolution.
        reconciliation: Reconciliation,
        /// The time of the resolution.
        now_ms: i64,
    },
    /// Read the answer saved with an operation's success.
    SavedAnswer {
        /// Its tenant.
        tenant: String,
        /// Its key.
        key: String,
        /// The time of the read (an expired answer is not given).
        now_ms: i64,
    },
    /// Claim queued durable jobs for a worker.
    Dispatch {
        /// The worker's name.
        worker: String,
        /// Most jobs to claim.
        count: u32,
        /// The time of the dispatch.
        now_ms: i64,
    },
    /// Mark the downstream available or not.
    SetDownstream {
        /// Whether it is available.
        available: bool,
    },
    /// Read one operation back.
    Operation {
        /// Its tenant.
        tenant: String,
        /// Its key.
        key: String,
    },
    /// Everything `inspect` shows, with one page of operations.
    Inspect {
        /// The time buckets are read at.
        now_ms: i64,
        /// Which operations.
        page: super::Page,
    },
    /// One page of operations, in one state when given.
    Operations {
        /// Only operations in this state.
        state: Option<crate::model::OpState>,
        /// Which page.
        page: super::Page,
    },
    /// One tenant's request and token buckets (for rate-limit headers).
    TenantLevels {
        /// The tenant.
        tenant: String,
        /// The time buckets are read at.
        now_ms: i64,
    },
    /// As `Inspect`, without the list of operations (for metrics).
    Levels {
        /// The time buckets are read at.
        now_ms: i64,
    },
    /// Record an object a tenant made (a stored response).
    OwnObject {
        /// Its maker.
        tenant: String,
        /// The object.
        object: crate::store::OwnedObject,
    },
    /// Look up an object by its maker.
    OwnedObject {
        /// The tenant asking: only its own objects are found.
        tenant: String,
        /// What it is (`response`).
        kind: String,
        /// The provider's id.
        id: String,
    },
    /// Forget an object its maker deleted.
    ForgetObject {
        /// Its maker.
        tenant: String,
        /// What it is.
        kind: String,
        /// The provider's id.
        id: String,
    },
}

/// The answer to one [`Job`].
#[derive(Clone, Debug)]
pub(crate) enum Answer {
    /// The answer to `Admit`.
    Decision(Decision),
    /// The answer to `Complete` or `Reconcile`.
    Completion(CompletionAnswer),
    /// The answer to `Dispatch`.
    Dispatch(DispatchAnswer),
    /// The answer to `SetDownstream`.
    Done,
    /// The answer to `AdmitWithLevels`.
    DecisionWithLevels(Decision, Option<super::TenantLevels>),
    /// The answer to `TenantLevels` (`None`: no such tenant).
    TenantLevels(Option<super::TenantLevels>),
    /// The answer to `Operation`.
    Operation(Option<OperationView>),
    /// The answer to `Inspect` and `Levels`.
    Inspection(Box<Inspection>),
    /// The answer to `Operations`.
    Operations(super::OperationsPage),
    /// The answer to `SavedAnswer`.
    Saved(Option<Vec<u8>>),
    /// The answer to `OwnedObject` (`None`: not this tenant's, or no such object).
    Owned(Option<crate::store::OwnedObject>),
    /// The answer to `ForgetObject`: whether there was one.
    Forgot(bool),
}

impl Job {
    /// The tenant the job acts for, if any.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. } => {
                Some(&request.tenant)
            }
            Job::Complete { completion, .. } => Some(&completion.tenant),
            Job::Reconcile { reconciliation, .. } => Some(&reconciliation.tenant),
            Job::Operation { tenant, .. }
            | Job::TenantLevels { tenant, .. }
            | Job::SavedAnswer { tenant, .. }
            | Job::OwnObject { tenant, .. }
            | Job::OwnedObject { tenant, .. }
            | Job::ForgetObject { tenant, .. } => Some(tenant),
            Job::Dispatch { .. }
            | Job::SetDownstream { .. }
            | Job::Inspect { .. }
            | Job::Operations { .. }
            | Job::Levels { .. } => None,
        }
    }
}

/// Work for one transaction, made in code: each piece all or nothing on its own, each
/// answered in its own type through the [`Ticket`] its method returned.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    jobs: Vec<Job>,
}

/// Where one piece's answer will be, typed by what it answers; taken once.
#[derive(Debug)]
pub struct Ticket<T> {
    index: usize,
    /// The piece's answer in its own type (`None`: another piece's answer).
    convert: fn(Answer) -> Option<T>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Pieces in the batch.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the batch has no piece.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    fn push<T>(&mut self, job: Job, convert: fn(Answer) -> Option<T>) -> Ticket<T> {
        self.jobs.push(job);
        Ticket {
            index: self.jobs.len() - 1,
            convert,
        }
    }

    /// Admits, queues or refuses `request` at `now_ms` (checked first, as
    /// [`Engine::admit_request`] checks it).
    pub fn admit(&mut self, request: Request, now_ms: i64) -> Ticket<Decision> {
        let job = Job::Admit { request, now_ms };
        self.push(job, |answer| match answer {
            Answer::Decision(d) => Some(d),
            _ => None,
        })
    }

    /// Reports how an active operation's call ended.
    pub fn complete(&mut self, completion: Completion, now_ms: i64) -> Ticket<CompletionAnswer> {
        self.push(Job::Complete { completion, now_ms }, completion_answer)
    }

    /// Resolves an unknown outcome.
    pub fn reconcile(
        &mut self,
        reconciliation: Reconciliation,
        now_ms: i64,
    ) -> Ticket<CompletionAnswer> {
        let job = Job::Reconcile {
            reconciliation,
            now_ms,
        };
        self.push(job, completion_answer)
    }

    /// Claims up to `count` queued jobs for `worker`.
    pub fn dispatch(&mut self, worker: String, count: u32, now_ms: i64) -> Ticket<DispatchAnswer> {
        let job = Job::Dispatch {
            worker,
            count,
            now_ms,
        };
        self.push(job, |answer| match answer {
            Answer::Dispatch(a) => Some(a),
            _ => None,
        })
    }
}

/// A completion's or a reconciliation's answer.
fn completion_answer(answer: Answer) -> Option<CompletionAnswer> {
    match answer {
        Answer::Completion(a) => Some(a),
        _ => None,
    }
}

/// The answers to a [`Batch`], each taken by its ticket.
#[derive(Debug)]
pub struct Answers {
    answers: Vec<Option<Result<Answer, StoreError>>>,
}

impl Answers {
    /// The answer `ticket` stands for: what the engine decided, or the store's failure
    /// for that piece alone.
    ///
    /// # Errors
    /// The piece's own [`StoreError`]; or [`StoreError::Schema`] for a ticket of another
    /// batch (its place empty or of another type), which a program's own tickets never are.
    pub fn take<T>(&mut self, ticket: Ticket<T>) -> Result<T, StoreError> {
        let other_batch = || StoreError::Schema("a ticket of another batch".into());
        let answer = self
            .answers
            .get_mut(ticket.index)
            .and_then(Option::take)
            .ok_or_else(other_batch)??;
        (ticket.convert)(answer).ok_or_else(other_batch)
    }
}

impl<S: Store> Engine<S> {
    /// The store's own clock, when it has one that must be the one clock (PostgreSQL).
    pub fn store_clock_ms(&self) -> Result<Option<i64>, StoreError> {
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clock_ms()
    }

    /// The rows `jobs` will read and write: their operations, their tenants' buckets, slots
    /// and queues, the global ones and those of the models they may name.
    fn prefetch_hint(&self, jobs: &[Job]) -> Prefetch {
        let config = self.config();
        let mut hint = Prefetch {
            complete: true,
            meta: vec![DOWNSTREAM.to_string()],
            ..Prefetch::default()
        };
        for job in jobs {
            let (tenant, key, model) = match job {
                Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. } => (
                    &request.tenant,
                    Some(&request.key),
                    Some(request.model.as_deref()),
                ),
                Job::Complete { completion, .. } => {
                    (&completion.tenant, Some(&completion.key), None)
                }
                Job::Reconcile { reconciliation, .. } => {
                    (&reconciliation.tenant, Some(&reconciliation.key), None)
                }
                Job::Operation { tenant, key } | Job::SavedAnswer { tenant, key, .. } => {
                    (tenant, Some(key), None)
                }
                Job::TenantLevels { tenant, .. } => (tenant, None, None),
                // One row of their own, locked when reached.
                Job::OwnObject { .. } | Job::OwnedObject { .. } | Job::ForgetObject { .. } => {
                    continue
                }
                Job::Dispatch { .. }
                | Job::SetDownstream { .. }
                | Job::Inspect { .. }
                | Job::Operations { .. }
                | Job::Levels { .. } => {
                    hint.complete = false;
                    continue;
                }
            };
            if let Some(key) = key {
                hint.operations.push((tenant.clone(), key.clone()));
            }
            // Only durable admissions queue; a completion may queue its retry.
            if !matches!(job, Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. }
                if request.route != crate::model::Route::Durable)
            {
                hint.queues.push(tenant.clone());
            }
            let Some(t) = config.tenant(tenant) else {
                continue;
            };
            hint.buckets
                .extend(Budgets::of_tenant(tenant, t).into_iter().map(|b| b.name));
            hint.buckets.extend(
                Budgets::of_tenant_groups(&config, t)
                    .into_iter()
                    .map(|b| b.name),
            );
            let budgets = Budgets::for_request(&config, tenant, t, model.flatten());
            hint.buckets.push(budgets.global_requests.name);
            hint.slots.push(budgets.global_slots.scope);
            hint.slots.extend(budgets.tenant_slots.map(|s| s.scope));
            match model {
                // An admission draws on its own model's buckets.
                Some(_) => hint.buckets.extend(
                    [budgets.model_requests, budgets.model_tokens]
                        .into_iter()
                        .flatten()
                        .map(|b| b.name),
                ),
                // A completion's model is in its stored operation: refunds may reach any.
                None => hint.buckets.extend(
                    config
                        .models
                        .iter()
                        .flatten()
                        .filter(|(_, m)| m.tokens.is_some())
                        .map(|(name, _)| crate::model::names::model_tokens(name)),
                ),
            }
        }
        // Deployments: an admission's model's and its fallbacks'; a completion's may be any.
        let mut routed: Vec<&str> = Vec::new();
        for job in jobs {
            match job {
                Job::Admit { request, .. } | Job::AdmitWithLevels { request, .. } => {
                    if let Some((m, r)) = request
                        .model
                        .as_deref()
                        .and_then(|m| config.routing.get_key_value(m))
                    {
                        routed.push(m);
                        routed.extend(r.fallbacks.iter().map(String::as_str));
                    }
                }
                Job::Complete { .. } | Job::Reconcile { .. } => {
                    routed.extend(config.routing.keys().map(String::as_str))
                }
                _ => {}
            }
        }
        routed.sort_unstable();
        routed.dedup();
        for model in routed {
            for d in super::deployments::DeploymentBudgets::of(&config, model) {
                d.hint(self.holding(), &mut hint);
            }
            // A fallback reserves its own model's buckets.
            if let Some(m) = config.model(model) {
                hint.buckets.extend(
                    m.requests
                        .map(|_| crate::model::names::model_requests(model)),
                );
                hint.buckets
                    .extend(m.tokens.map(|_| crate::model::names::model_tokens(model)));
            }
        }
        for list in [&mut hint.buckets, &mut hint.slots, &mut hint.queues] {
            list.sort();
            list.dedup();
        }
        hint.operations.sort();
        hint.operations.dedup();
        if let Some(holder) = self.holder() {
            holder.hint(&mut hint);
        }
        hint
    }

    /// Runs `batch` in one store transaction, each piece all or nothing on its own, at the
    /// times its pieces carry; each answer is taken from the result by its ticket. Nothing
    /// is answered before the transaction commits.
    ///
    /// # Errors
    /// The store's failure for the whole transaction (nothing of it was written).
    pub fn run(&self, batch: Batch) -> Result<Answers, StoreError> {
        let answers = self.run_batch(&batch.jobs)?;
        Ok(Answers {
            answers: answers.into_iter().map(Some).collect(),
        })
    }

    /// Runs `jobs` in one store transaction, each all or nothing on its own, and answers
    /// each, at the times the jobs carry. Nothing is answered before the transaction commits.
    pub(crate) fn run_batch(
        &self,
        jobs: &[Job],
    ) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        self.run_batch_with(jobs, false, None)
    }

    /// As [`Engine::run_batch`], at the shared store's clock when it has one (read inside
    /// the transaction, after its locks), so that replicas with skewed clocks cannot mint
    /// credits; a clock that cannot be read fails the batch rather than fall back to this
    /// machine's. A store owned by one process keeps the jobs' times.
    pub(crate) fn run_batch_at_store_time(
        &self,
        jobs: &[Job],
    ) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        self.run_batch_with(jobs, true, None)
    }

    /// As [`Engine::run_batch_at_store_time`], noting when each job began and was decided
    /// and when it called the policy (for traces); `times` gets one entry per job.
    pub(crate) fn run_batch_timed(
        &self,
        jobs: &[Job],
        times: &mut Vec<Option<super::JobTimes>>,
    ) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        let mut taking = super::clock::Taking::new(jobs.len());
        let answers = self.run_batch_with(jobs, true, Some(&mut taking));
        *times = taking.into_times();
        answers
    }

    fn run_batch_with(
        &self,
        jobs: &[Job],
        store_time: bool,
        mut taking: Option<&mut super::clock::Taking>,
    ) -> Result<Vec<Result<Answer, StoreError>>, StoreError> {
        let policy = self.active_policy();
        let hint = self.prefetch_hint(jobs);
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the store's lock: the whole transaction sees one configuration.
        let config = self.config();
        store.transaction_batch(jobs.len(), &hint, |i, tx| match taking.as_deref_mut() {
            Some(taking) => taking.job(i, || {
                self.run_job(&jobs[i], tx, &policy, &config, store_time)
            }),
            None => self.run_job(&jobs[i], tx, &policy, &config, store_time),
        })
    }

    /// One job of a batch, in its transaction.
    fn run_job(
        &self,
        job: &Job,
        tx: &mut dyn Tx,
        policy: &std::sync::Arc<dyn Decider>,
        config: &Config,
        store_time: bool,
    ) -> Result<Answer, StoreError> {
        {
            // A shared store's clock, read inside the transaction, is every replica's.
            let store_now = if store_time { tx.store_now_ms()? } else { None };
            let at = |now_ms: &i64| store_now.unwrap_or(*now_ms);
            // A request made in code is checked as a JSON one is (the service's were).
            let unchecked = |request: &Request| {
                crate::validate::check(request, config)
                    .err()
                    .map(|e| Decision::rejected(e.reason(), None))
            };
            Ok(match job {
                Job::Admit { request, now_ms } => Answer::Decision(match unchecked(request) {
                    Some(refused) => refused,
                    None => self.admit_in(tx, policy.as_ref(), request, at(now_ms))?,
                }),
                Job::Complete { completion, now_ms } => Answer::Completion(self.complete_in(
                    tx,
                    policy.as_ref(),
                    completion,
                    at(now_ms),
                )?),
                Job::Reconcile {
                    reconciliation,
                    now_ms,
                } => Answer::Completion(self.reconcile_in(tx, reconciliation, at(now_ms))?),
                Job::Dispatch {
                    worker,
                    count,
                    now_ms,
                } => Answer::Dispatch(self.dispatch_in(tx, worker, *count, at(now_ms))?),
                Job::SetDownstream { available } => {
                    tx.set_meta(DOWNSTREAM, if *available { "1" } else { "0" })?;
                    Answer::Done
                }
                Job::AdmitWithLevels { request, now_ms } => {
                    let decision = match unchecked(request) {
                        Some(refused) => refused,
                        None => self.admit_in(tx, policy.as_ref(), request, at(now_ms))?,
                    };
                    let levels = self.tenant_levels_in(tx, &request.tenant, at(now_ms))?;
                    Answer::DecisionWithLevels(decision, levels)
                }
                Job::TenantLevels { tenant, now_ms } => {
                    Answer::TenantLevels(self.tenant_levels_in(tx, tenant, at(now_ms))?)
                }
                Job::Operation { tenant, key } => {
                    Answer::Operation(tx.operation(tenant, key)?.as_ref().map(OperationView::of))
                }
                Job::SavedAnswer {
                    tenant,
                    key,
                    now_ms,
                } => Answer::Saved(tx.answer(tenant, key, at(now_ms))?),
                Job::Inspect { now_ms, page } => {
                    Answer::Inspection(Box::new(self.inspect_in(tx, at(now_ms), Some(page))?))
                }
                Job::Operations { state, page } => {
                    Answer::Operations(super::housekeeping::page_in(tx, *state, page)?)
                }
                Job::Levels { now_ms } => {
                    Answer::Inspection(Box::new(self.inspect_in(tx, at(now_ms), None)?))
                }
                Job::OwnObject { tenant, object } => {
                    tx.put_owned_object(tenant, object)?;
                    Answer::Done
                }
                Job::OwnedObject { tenant, kind, id } => {
                    Answer::Owned(tx.owned_object(tenant, kind, id)?)
                }
                Job::ForgetObject { tenant, kind, id } => {
                    Answer::Forgot(tx.delete_owned_object(tenant, kind, id)?)
                }
            })
        }
    }
}
