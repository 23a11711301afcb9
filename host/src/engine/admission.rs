//! Admission (docs/contract.md section 4): validation, the operation's state, the downstream, the
//! policy's plan, the deadline, the never-fit bound, the budgets and (for a gateway model) one
//! of its deployments, in that order, the first that refuses answering. All of it in one transaction; a refusal writes nothing.

use super::budgets::{Budgets, Needs, Refusal};
use super::decision::Decision;
use super::deployments;
use super::fingerprint::fingerprint;
use super::{downstream_available, Engine};
use crate::explain::{Shortfall, Unit};
use crate::model::{OpState, Operation, Request, Route};
use crate::reason::{Outcome, Reason};
use crate::runtime::{self, Admission, Decider, RefusalReason};
use crate::store::{QueuedJob, Store, StoreError, Tx};
use crate::validate;

/// A fresh admission the policy planned and the host's checks passed, not yet written.
pub(super) struct Planned {
    max_output: u64,
    optional_context: u64,
    degraded: bool,
    reserved: u64,
    cost: u64,
    estimated_exec_ms: u64,
    reservation: super::budgets::Reservation,
    /// What the policy said of its plan (a degradation's reason, say).
    policy_message: Option<String>,
    /// The deployment reserved, for a gateway model's call.
    deployment: Option<super::deployments::Chosen>,
    /// The fallback model that serves the call, when its own model's deployments could not.
    served_model: Option<String>,
}

impl Planned {
    /// What the plan asks of the call, as shadow mode compares it.
    pub(super) fn shape(&self) -> super::shadow::PlanShape {
        super::shadow::PlanShape {
            max_output_tokens: self.max_output,
            optional_context_tokens: self.optional_context,
            degraded: self.degraded,
        }
    }
}

/// What step 2 found: a final answer, or the attempt a fresh admission would start.
enum Existing {
    Answer(Box<Decision>),
    Fresh {
        attempt: u32,
        prior: Option<Box<Operation>>,
    },
}

impl<S: Store> Engine<S> {
    /// Admits, queues or refuses one request given as a JSON object.
    ///
    /// # Errors
    /// Only the store's own failure; a request that is not valid is a refusal
    /// (`invalid_request`, `unknown_tenant`, `too_large`), not an error.
    pub fn admit(&self, raw: &serde_json::Value, now_ms: i64) -> Result<Decision, StoreError> {
        let req = match validate::parse(raw, &self.config()) {
            Ok(r) => r,
            Err(e) => return Ok(Decision::rejected(e.reason(), None)),
        };
        self.admit_checked(&req, now_ms)
    }

    /// Admits, queues or refuses one request made in code (see
    /// [`crate::validate::RequestBuilder`]). It is checked as a JSON one is: a request out
    /// of its bounds is refused with the same reason, never handed to the policy.
    ///
    /// # Errors
    /// Only the store's own failure.
    pub fn admit_request(&self, req: &Request, now_ms: i64) -> Result<Decision, StoreError> {
        if let Err(e) = validate::check(req, &self.config()) {
            return Ok(Decision::rejected(e.reason(), None));
        }
        self.admit_checked(req, now_ms)
    }

    /// Admits, queues or refuses one request already checked.
    fn admit_checked(&self, req: &Request, now_ms: i64) -> Result<Decision, StoreError> {
        let policy = self.active_policy();
        self.transaction(|tx| self.admit_in(tx, policy.as_ref(), req, now_ms))
    }

    pub(super) fn admit_in(
        &self,
        tx: &mut dyn Tx,
        policy: &dyn Decider,
        req: &Request,
        now_ms: i64,
    ) -> Result<Decision, StoreError> {
        let fp = fingerprint(req);
        let (attempt, prior) = match existing(tx, req, &fp, now_ms)? {
            Existing::Answer(d) => return Ok(*d),
            Existing::Fresh { attempt, prior } => (attempt, prior),
        };
        // The deadline stored with the operation wins for its whole life.
        let deadline_ms = prior.as_ref().map_or(req.deadline_ms, |p| p.deadline_ms);

        if req.route == Route::Interactive && !downstream_available(tx)? {
            let busy = self.config().param("busy_retry_after_ms").map(|v| v as u64);
            return Ok(Decision::rejected(Reason::DownstreamUnavailable, busy));
        }

        let digest = policy.digest().to_string();
        let view = self.view(
            tx,
            &req.tenant,
            req.model.as_deref(),
            &req.key,
            attempt,
            now_ms,
        )?;
        let guest_req = runtime::Request {
            tenant: req.tenant.clone(),
            key: req.key.clone(),
            route: super::wit_route(req.route),
            input_tokens: req.input_tokens,
            optional_context_tokens: req.optional_context_tokens,
            max_output_tokens: req.max_output_tokens,
            deadline_ms,
            size_bytes: req.size_bytes,
            attempt,
            model: req.model.clone(),
            priority: super::wit_priority(req.priority),
            labels: req
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        // The shadow decides from the same snapshot, before anything is written.
        let shadow_view = self.has_shadow().then(|| view.clone());
        let avoid = prior.as_ref().and_then(|p| p.deployment.as_deref());
        let planned = match self.judge(tx, policy, req, &guest_req, view, avoid, now_ms)? {
            Ok(p) => p,
            Err(refused) => {
                self.shadow_decision(tx, req, &guest_req, shadow_view, &refused, None, now_ms);
                return Ok(refused);
            }
        };
        let accepted = match req.route {
            Route::Interactive => Outcome::Accepted,
            Route::Durable => Outcome::Queued,
        };
        let live = Decision::plain(accepted);
        let live_plan = Some(planned.shape());
        self.shadow_decision(tx, req, &guest_req, shadow_view, &live, live_plan, now_ms);
        let Planned {
            max_output,
            optional_context,
            degraded,
            reserved,
            cost,
            estimated_exec_ms,
            reservation,
            policy_message,
            deployment,
            served_model,
        } = planned;
        let taken = reservation.apply(tx)?;
        let deployment = match deployment {
            Some(chosen) => {
                let name = chosen.name.clone();
                let holder = self.holding();
                chosen.apply(tx, holder, &self.config().alerts, now_ms)?;
                Some(name)
            }
            None => None,
        };

        let state = match req.route {
            Route::Interactive => OpState::Active,
            Route::Durable => OpState::Queued,
        };
        let op = Operation {
            tenant: req.tenant.clone(),
            key: req.key.clone(),
            fingerprint: fp,
            route: req.route,
            state,
            attempt,
            deadline_ms,
            input_tokens: req.input_tokens,
            max_output_tokens: max_output,
            optional_context_tokens: optional_context,
            reserved_tokens: reserved,
            estimated_exec_ms,
            degraded,
            body_ref: req.body_ref.clone(),
            holds_slot: taken.global_slot,
            holds_tenant_slot: taken.tenant_slot,
            tokens_reserved: req.route == Route::Interactive,
            not_before_ms: None,
            result_ref: None,
            worker: None,
            last_result: None,
            last_retry: None,
            policy_digest: digest.clone(),
            model: served_model.clone().or_else(|| req.model.clone()),
            priority: req.priority,
            reserved_cost_microusd: if req.route == Route::Interactive {
                cost
            } else {
                0
            },
            state_since_ms: Some(now_ms),
            usage: None,
            holds_deployment_slot: deployment.is_some(),
            deployment,
            asked_model: served_model.and(req.model.clone()),
            trace_context: match req.route {
                Route::Durable => req.trace_context.clone(),
                Route::Interactive => None,
            },
        };
        if req.route == Route::Durable {
            tx.enqueue(&QueuedJob {
                tenant: op.tenant.clone(),
                key: op.key.clone(),
                priority: req.priority,
                tokens: reserved,
                not_before_ms: now_ms,
                expire_at_ms: expire_at(deadline_ms, estimated_exec_ms),
            })?;
        }
        tx.put_operation(&op)?;
        let outcome = match req.route {
            Route::Interactive => Outcome::Accepted,
            Route::Durable => Outcome::Queued,
        };
        Ok(Decision {
            policy_message,
            ..Decision::about(outcome, &op)
        })
    }

    /// What `policy` and the host's checks make of a fresh admission, reading `tx` but
    /// writing nothing: the plan with its checked reservation, or the refusal. The active
    /// policy's verdict is then carried out; a shadow's is only counted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn judge(
        &self,
        tx: &mut dyn Tx,
        policy: &dyn Decider,
        req: &Request,
        guest_req: &runtime::Request,
        view: crate::runtime::DecisionView,
        avoid: Option<&str>,
        now_ms: i64,
    ) -> Result<Result<Planned, Decision>, StoreError> {
        let digest = policy.digest().to_string();
        let deadline_ms = guest_req.deadline_ms;
        let with_policy = |mut d: Decision| {
            d.policy = Some(digest.clone());
            d
        };
        let (plan, words) = match super::clock::policy_call(|| {
            policy.admit_explained(view, guest_req)
        }) {
            Err(_fault) => {
                return Ok(Err(with_policy(Decision::rejected(
                    Reason::PolicyError,
                    None,
                ))))
            }
            Ok((Admission::Refuse(r), words)) => {
                let reason = refusal_reason(r.reason);
                let retry_after = if reason == Reason::TooLarge {
                    None
                } else {
                    r.retry_after_ms.map(bounded_estimate)
                };
                let refused = Decision::rejected(reason, retry_after).with_policy_message(words);
                return Ok(Err(with_policy(refused)));
            }
            Ok((Admission::Admit(mut plan), words)) => {
                plan.busy_retry_after_ms = plan.busy_retry_after_ms.map(bounded_estimate);
                (plan, words)
            }
        };
        // The policy's words go with whatever the host's checks answer.
        let with_policy = |d: Decision| with_policy(d).with_policy_message(words.clone());
        // A plan may reduce the request, never raise it; durable work is never degraded.
        let plan_ok = plan.max_output_tokens >= 1
            && plan.max_output_tokens <= req.max_output_tokens
            && plan.optional_context_tokens <= req.optional_context_tokens;
        if !plan_ok {
            return Ok(Err(with_policy(Decision::rejected(
                Reason::PolicyError,
                None,
            ))));
        }
        let (max_output, optional_context) = match req.route {
            Route::Interactive => (plan.max_output_tokens, plan.optional_context_tokens),
            Route::Durable => (req.max_output_tokens, req.optional_context_tokens),
        };
        let degraded =
            max_output < req.max_output_tokens || optional_context < req.optional_context_tokens;

        if i128::from(now_ms) + i128::from(plan.estimated_exec_ms) >= i128::from(deadline_ms) {
            let deadline = Shortfall {
                limit: "deadline".into(),
                requested: plan.estimated_exec_ms,
                available: deadline_ms.saturating_sub(now_ms).max(0) as u64,
                unit: Unit::Ms,
                capacity: None,
                output_tokens: Some(max_output),
            };
            return Ok(Err(with_policy(
                Decision::rejected(Reason::DeadlineExceeded, None).with_shortfall(Some(deadline)),
            )));
        }
        let reserved = req.input_tokens + optional_context + max_output;
        let config = self.config();
        // Validated, but a tenant can be deleted between validation and this transaction.
        let Some(tenant) = config.tenant(&req.tenant) else {
            return Ok(Err(Decision::rejected(Reason::UnknownTenant, None)));
        };
        let budgets = Budgets::for_request(&config, &req.tenant, tenant, req.model.as_deref())
            .held_by(self.holder());
        if let Some(b) = budgets.token_buckets().find(|b| b.never_fits(reserved)) {
            let never = b.never_fits_shortfall(reserved);
            return Ok(Err(with_policy(
                Decision::rejected(Reason::TooLarge, None).with_shortfall(Some(never)),
            )));
        }
        let cost = budgets.cost(req.input_tokens + optional_context, max_output);

        let needs = match req.route {
            Route::Interactive => Needs {
                requests: true,
                tokens: reserved,
                cost_microusd: cost,
                slots: true,
                busy_retry_after_ms: plan.busy_retry_after_ms,
            },
            Route::Durable => Needs {
                requests: true,
                tokens: 0,
                cost_microusd: 0,
                slots: false,
                busy_retry_after_ms: None,
            },
        };
        let reservation = match budgets.check(tx, now_ms, &needs)? {
            Ok(r) => r,
            Err(r) => return Ok(Err(with_policy(Decision::refused(r)))),
        };
        // Durable: the queue bound comes after the request buckets (docs/contract.md section 4, step 7).
        let depth = match req.route {
            Route::Durable => tx.queue_depth(&req.tenant)?,
            Route::Interactive => 0,
        };
        if req.route == Route::Durable && depth >= tenant.queue_limit {
            let full = Refusal {
                reason: Reason::QueueFull,
                retry_after_ms: plan.busy_retry_after_ms,
                shortfall: Some(Shortfall {
                    limit: format!("queue.{}", req.tenant),
                    requested: 1,
                    available: u64::from(tenant.queue_limit.saturating_sub(depth)),
                    unit: Unit::Jobs,
                    capacity: None,
                    output_tokens: None,
                }),
            };
            return Ok(Err(with_policy(Decision::refused(full))));
        }
        let mut planned = Planned {
            max_output,
            optional_context,
            degraded,
            reserved,
            cost,
            estimated_exec_ms: plan.estimated_exec_ms,
            reservation,
            policy_message: words.clone(),
            deployment: None,
            served_model: None,
        };
        // A gateway model's call reserves one of its deployments too (or a fallback's).
        let routed = match (req.route, req.model.as_deref()) {
            (Route::Interactive, Some(m)) => config.routing.get_key_value(m),
            _ => None,
        };
        if let Some((model, routing)) = routed {
            let busy = plan.busy_retry_after_ms;
            let ask = deployments::Ask {
                tokens: reserved,
                avoid,
                busy_retry_after_ms: busy,
                draw: deployments::draw(config.seed, &req.tenant, &req.key, guest_req.attempt),
            };
            let holder = self.holding();
            match deployments::choose(tx, &config, model, now_ms, &ask, holder)? {
                Ok(chosen) => planned.deployment = Some(chosen),
                Err(refusal) => {
                    let fallbacks = if req.fallback {
                        &routing.fallbacks[..]
                    } else {
                        &[]
                    };
                    let found =
                        self.fallback(tx, req, tenant, fallbacks, &planned, &ask, now_ms)?;
                    let Some((reservation, chosen, cost)) = found else {
                        return Ok(Err(with_policy(Decision::refused(refusal))));
                    };
                    planned.served_model = Some(chosen.model.clone());
                    planned.reservation = reservation;
                    planned.cost = cost;
                    planned.deployment = Some(chosen);
                }
            }
        }
        Ok(Ok(planned))
    }

    /// The first of `fallbacks` whose budgets (the tenant's and global ones again, and the
    /// fallback model's own) and one of whose deployments can take the call: its checked
    /// reservation, deployment and cost.
    #[allow(clippy::too_many_arguments)]
    fn fallback(
        &self,
        tx: &mut dyn Tx,
        req: &Request,
        tenant: &crate::config::TenantConfig,
        fallbacks: &[String],
        planned: &Planned,
        ask: &deployments::Ask<'_>,
        now_ms: i64,
    ) -> Result<Option<FallbackChoice>, StoreError> {
        let ask = deployments::Ask {
            avoid: None,
            ..*ask
        };
        let config = self.config();
        for f in fallbacks {
            let budgets =
                Budgets::for_request(&config, &req.tenant, tenant, Some(f)).held_by(self.holder());
            if budgets
                .token_buckets()
                .any(|b| b.never_fits(planned.reserved))
            {
                continue;
            }
            let cost = budgets.cost(
                req.input_tokens + planned.optional_context,
                planned.max_output,
            );
            let needs = Needs {
                requests: true,
                tokens: planned.reserved,
                cost_microusd: cost,
                slots: true,
                busy_retry_after_ms: ask.busy_retry_after_ms,
            };
            let Ok(reservation) = budgets.check(tx, now_ms, &needs)? else {
                continue;
            };
            let holder = self.holding();
            if let Ok(chosen) = deployments::choose(tx, &config, f, now_ms, &ask, holder)? {
                return Ok(Some((reservation, chosen, cost)));
            }
        }
        Ok(None)
    }
}

/// A fallback model's checked reservation, its deployment, and the call's cost there.
type FallbackChoice = (super::budgets::Reservation, super::deployments::Chosen, u64);

/// The longest retry-after a policy may estimate; a policy's figure is advice to callers,
/// and an absurd one (a hostile or broken module) must not tell them to go away for years.
pub const MAX_POLICY_RETRY_AFTER_MS: u64 = 3_600_000;

fn bounded_estimate(ms: u64) -> u64 {
    ms.min(MAX_POLICY_RETRY_AFTER_MS)
}

/// From this time on, `now + estimate >= deadline`: the job can no longer finish in time.
pub(crate) fn expire_at(deadline_ms: i64, estimated_exec_ms: u64) -> i64 {
    deadline_ms.saturating_sub(estimated_exec_ms.min(i64::MAX as u64) as i64)
}

/// Step 2: the operation's state decides duplicates, conflicts and retries.
fn existing(tx: &mut dyn Tx, req: &Request, fp: &str, now_ms: i64) -> Result<Existing, StoreError> {
    let Some(op) = tx.operation(&req.tenant, &req.key)? else {
        return Ok(Existing::Fresh {
            attempt: 1,
            prior: None,
        });
    };
    if op.fingerprint != fp {
        return Ok(Existing::Answer(Box::new(
            Decision::about(Outcome::Conflict, &op).without_details(),
        )));
    }
    Ok(Existing::Answer(Box::new(match op.state {
        OpState::Queued | OpState::Active => Decision::about(Outcome::DuplicateActive, &op),
        OpState::Unknown => Decision::rejected(Reason::UnknownOutcomePending, None),
        OpState::Succeeded | OpState::FailedFinal | OpState::Expired => {
            Decision::about(Outcome::DuplicateCompleted, &op)
        }
        OpState::RetryPending => {
            let not_before = op.not_before_ms.unwrap_or(now_ms);
            if now_ms < not_before {
                Decision::rejected(Reason::RetryTooEarly, Some((not_before - now_ms) as u64))
            } else {
                return Ok(Existing::Fresh {
                    attempt: op.attempt + 1,
                    prior: Some(Box::new(op)),
                });
            }
        }
    })))
}

fn refusal_reason(r: RefusalReason) -> Reason {
    match r {
        RefusalReason::Overloaded => Reason::Overloaded,
        RefusalReason::TooLarge => Reason::TooLarge,
        RefusalReason::DeadlineExceeded => Reason::DeadlineExceeded,
        RefusalReason::TokenBudget => Reason::TokenBudget,
        RefusalReason::TenantRate => Reason::TenantRate,
        RefusalReason::GlobalRate => Reason::GlobalRate,
        RefusalReason::TenantConcurrency => Reason::TenantConcurrency,
        RefusalReason::GlobalConcurrency => Reason::GlobalConcurrency,
        RefusalReason::QueueFull => Reason::QueueFull,
        RefusalReason::DownstreamUnavailable => Reason::DownstreamUnavailable,
        RefusalReason::ModelRate => Reason::ModelRate,
        RefusalReason::ModelTokenBudget => Reason::ModelTokenBudget,
        RefusalReason::CostBudget => Reason::CostBudget,
    }
}
