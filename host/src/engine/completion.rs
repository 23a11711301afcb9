//! Completion and reconciliation: slots are released only when termination is known, an
//! unknown outcome is never retried automatically, and retries keep the operation's key
//! and deadline.

use super::budgets::{release_shared_slot, release_slot, Budgets};
use super::deployments::{self, AttemptEnd, DeploymentBudgets, ProviderLimits};
use super::Engine;
use crate::model::{names, CallResult, OpState, Operation, RetryVerdict, Route, Usage};
use crate::runtime::{self, Decider, Failure, GiveUpReason, RetryDecision};
use crate::spend::SpendRow;
use crate::store::{QueuedJob, Store, StoreError, Tx};
use serde::{Deserialize, Serialize};

/// A caller's report of how an attempt ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The operation's tenant.
    pub tenant: String,
    /// The operation's key.
    pub key: String,
    /// How the call ended.
    pub result: CallResult,
    /// Tokens the provider reported, for a refund.
    pub usage: Option<Usage>,
    /// The failure kind (`rate_limited`, `unavailable`, …) when `result` is `failed`.
    pub failure: Option<String>,
    /// The provider's own retry-after, a floor for the retry's delay.
    pub provider_retry_after_ms: Option<u64>,
    /// The caller's reference to the saved answer.
    pub result_ref: Option<String>,
    /// When a worker reports: it may act only on a job it claimed.
    pub worker: Option<String>,
    /// The attempt reported on; a report for another attempt is `stale_attempt` and
    /// changes nothing. `None`: the current attempt.
    pub attempt: Option<u32>,
    /// The call's answer, saved with a success so that a repeated call can be given it
    /// (opaque to the engine; the gateway's encoding).
    pub answer: Option<SavedAnswer>,
    /// What the provider said of its own limits on this answer: it lowers the balances of
    /// the deployment the attempt was sent to.
    pub provider_limits: Option<ProviderLimits>,
}

/// An answer saved with an operation's success, kept until `expires_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedAnswer {
    /// The answer, as its writer encoded it.
    pub bytes: Vec<u8>,
    /// When it is no longer given back.
    pub expires_ms: i64,
}

impl Completion {
    /// A plain success report, with no usage, reference or worker.
    pub fn succeeded(tenant: &str, key: &str) -> Self {
        Completion {
            tenant: tenant.to_string(),
            key: key.to_string(),
            result: CallResult::Succeeded,
            usage: None,
            failure: None,
            provider_retry_after_ms: None,
            result_ref: None,
            worker: None,
            attempt: None,
            answer: None,
            provider_limits: None,
        }
    }
}

/// The resolution of an `unknown` outcome, once the caller knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Reconciliation {
    /// The operation's tenant.
    pub tenant: String,
    /// The operation's key.
    pub key: String,
    /// `succeeded` or `failed` (a failed reconciliation is final: never retried).
    pub resolution: CallResult,
    /// Tokens the provider reported, for a refund.
    pub usage: Option<Usage>,
    /// The caller's reference to the saved answer.
    pub result_ref: Option<String>,
    /// When a worker reports: it may act only on a job it claimed.
    pub worker: Option<String>,
    /// The attempt reported on; another attempt is `stale_attempt`. `None`: the current.
    pub attempt: Option<u32>,
}

/// The answer to `complete` or `reconcile`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionAnswer {
    /// Whether the report applied.
    pub ok: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<CompletionError>,
    /// After a failure: whether and when the host retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryVerdict>,
    /// The operation's state afterwards.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<OpState>,
}

/// Why a completion or reconciliation did not apply; nothing changed. Each is answered
/// as its word (`"error": "not_active"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionError {
    /// No operation has this key (for this tenant).
    UnknownOperation,
    /// A worker reported an attempt another worker claimed.
    NotClaimed,
    /// The report names an attempt older than the operation's current one.
    StaleAttempt,
    /// A completion for an operation that is not `active` (already ended, say).
    NotActive,
    /// A reconciliation for an operation that is not `unknown`.
    NotUnknown,
}

impl CompletionError {
    /// The word the API answers.
    pub fn as_str(self) -> &'static str {
        match self {
            CompletionError::UnknownOperation => "unknown_operation",
            CompletionError::NotClaimed => "not_claimed",
            CompletionError::StaleAttempt => "stale_attempt",
            CompletionError::NotActive => "not_active",
            CompletionError::NotUnknown => "not_unknown",
        }
    }
}

impl std::fmt::Display for CompletionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CompletionAnswer {
    fn error(error: CompletionError) -> Self {
        CompletionAnswer {
            ok: false,
            error: Some(error),
            retry: None,
            state: None,
        }
    }

    fn done(op: &Operation) -> Self {
        CompletionAnswer {
            ok: true,
            error: None,
            retry: op.last_retry.clone(),
            state: Some(op.state),
        }
    }
}

/// The operation a `complete` or `reconcile` reports on: it must exist, be the reporting
/// worker's claim when a worker reports, and be at the attempt the report names (a late
/// report of attempt N must not end attempt N+1), before any state is looked at.
fn reported_operation(
    tx: &mut dyn Tx,
    tenant: &str,
    key: &str,
    worker: &Option<String>,
    attempt: Option<u32>,
) -> Result<Result<Operation, CompletionAnswer>, StoreError> {
    let Some(op) = tx.operation(tenant, key)? else {
        return Ok(Err(CompletionAnswer::error(
            CompletionError::UnknownOperation,
        )));
    };
    if worker.is_some() && op.worker != *worker {
        return Ok(Err(CompletionAnswer::error(CompletionError::NotClaimed)));
    }
    if attempt.is_some_and(|a| a != op.attempt) {
        return Ok(Err(CompletionAnswer::error(CompletionError::StaleAttempt)));
    }
    Ok(Ok(op))
}

fn give_up(reason: &str) -> RetryVerdict {
    RetryVerdict {
        eligible: false,
        reason: Some(reason.to_string()),
        not_before_ms: None,
    }
}

/// Longest failure word kept; longer ones are cut (they are labels, not messages).
const MAX_FAILURE_BYTES: usize = 64;

fn failure_kind(word: &str) -> Failure {
    match word {
        "rate_limited" => Failure::RateLimited,
        "unavailable" => Failure::Unavailable,
        "connect_failed" => Failure::ConnectFailed,
        "bad_request" => Failure::BadRequest,
        "auth_failed" => Failure::AuthFailed,
        "content_filtered" => Failure::ContentFiltered,
        other => Failure::Other(other.chars().take(MAX_FAILURE_BYTES).collect()),
    }
}

impl<S: Store> Engine<S> {
    /// Records how an `active` attempt ended.
    ///
    /// # Errors
    /// Only the store's own failure (nothing was written); a report that does not apply
    /// (no such operation, not active, a stale attempt) is an answer with its
    /// [`CompletionError`].
    pub fn complete(&self, c: &Completion, now_ms: i64) -> Result<CompletionAnswer, StoreError> {
        let policy = self.active_policy();
        self.transaction(|tx| self.complete_in(tx, policy.as_ref(), c, now_ms))
    }

    /// The answer saved with the success of operation `(tenant, key)`, unless it expired by
    /// `now_ms`.
    pub fn saved_answer(
        &self,
        tenant: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.transaction(|tx| tx.answer(tenant, key, now_ms))
    }

    /// Resolves an `unknown` outcome; releases its slot.
    ///
    /// # Errors
    /// Only the store's own failure; a reconciliation that does not apply is an answer with
    /// its [`CompletionError`].
    pub fn reconcile(
        &self,
        r: &Reconciliation,
        now_ms: i64,
    ) -> Result<CompletionAnswer, StoreError> {
        self.transaction(|tx| self.reconcile_in(tx, r, now_ms))
    }

    pub(super) fn reconcile_in(
        &self,
        tx: &mut dyn Tx,
        r: &Reconciliation,
        now_ms: i64,
    ) -> Result<CompletionAnswer, StoreError> {
        let mut op = match reported_operation(tx, &r.tenant, &r.key, &r.worker, r.attempt)? {
            Ok(op) => op,
            Err(refused) => return Ok(refused),
        };
        if op.state != OpState::Unknown {
            return Ok(CompletionAnswer::error(CompletionError::NotUnknown));
        }
        self.finish_attempt(tx, &mut op, r.usage, now_ms)?;
        op.state = match r.resolution {
            CallResult::Succeeded => OpState::Succeeded,
            // Work that went through the unknown region is never retried automatically.
            _ => OpState::FailedFinal,
        };
        if r.result_ref.is_some() {
            op.result_ref = r.result_ref.clone();
        }
        op.state_since_ms = Some(now_ms);
        tx.put_operation(&op)?;
        Ok(CompletionAnswer {
            ok: true,
            error: None,
            retry: None,
            state: Some(op.state),
        })
    }

    pub(super) fn complete_in(
        &self,
        tx: &mut dyn Tx,
        policy: &dyn Decider,
        c: &Completion,
        now_ms: i64,
    ) -> Result<CompletionAnswer, StoreError> {
        let mut op = match reported_operation(tx, &c.tenant, &c.key, &c.worker, c.attempt)? {
            Ok(op) => op,
            Err(refused) => return Ok(refused),
        };
        if op.state != OpState::Active {
            // Repeating the completion that ended the latest attempt changes nothing.
            return Ok(if op.last_result == Some(c.result) {
                CompletionAnswer::done(&op)
            } else {
                CompletionAnswer::error(CompletionError::NotActive)
            });
        }
        if c.result_ref.is_some() {
            op.result_ref = c.result_ref.clone();
        }
        op.last_result = Some(c.result);
        // The deployment learns from how its attempt ended before its slot is released.
        if let (Some(model), Some(name)) = (op.model.as_deref(), op.deployment.as_deref()) {
            let end = AttemptEnd {
                result: c.result,
                failure: c.failure.as_deref(),
                provider_retry_after_ms: c.provider_retry_after_ms,
                limits: c.provider_limits.as_ref(),
            };
            let holder = self.holding();
            deployments::end_attempt(tx, &self.config(), model, name, now_ms, &end, holder)?;
        }
        match c.result {
            CallResult::Succeeded => {
                self.finish_attempt(tx, &mut op, c.usage, now_ms)?;
                op.state = OpState::Succeeded;
                op.last_retry = None;
                // In the same transaction: a repeat sees the success only with its answer.
                if let Some(a) = &c.answer {
                    tx.put_answer(&op.tenant, &op.key, a.expires_ms, &a.bytes)?;
                }
            }
            CallResult::Unknown => {
                // The provider may still be working: the slot and the tokens stay held.
                op.state = OpState::Unknown;
                op.last_retry = Some(give_up("unknown_outcome"));
            }
            CallResult::Failed => {
                self.finish_attempt(tx, &mut op, c.usage, now_ms)?;
                let verdict = self.retry_verdict(tx, policy, &op, c, now_ms)?;
                op.policy_digest = policy.digest().to_string();
                match (verdict.eligible, verdict.not_before_ms) {
                    (true, Some(not_before)) => {
                        op.not_before_ms = Some(not_before);
                        match op.route {
                            Route::Interactive => op.state = OpState::RetryPending,
                            Route::Durable => {
                                // Back to the tail of its queue, waiting for `not_before`.
                                op.state = OpState::Queued;
                                tx.enqueue(&QueuedJob {
                                    tenant: op.tenant.clone(),
                                    key: op.key.clone(),
                                    priority: op.priority,
                                    tokens: op.reserved_tokens,
                                    not_before_ms: not_before,
                                    expire_at_ms: super::admission::expire_at(
                                        op.deadline_ms,
                                        op.estimated_exec_ms,
                                    ),
                                })?;
                            }
                        }
                    }
                    _ => op.state = OpState::FailedFinal,
                }
                op.last_retry = Some(verdict);
            }
        }
        op.state_since_ms = Some(now_ms);
        tx.put_operation(&op)?;
        Ok(CompletionAnswer::done(&op))
    }

    /// Asks the policy whether a failed attempt may be retried. A fault gives up (fails
    /// closed); a retry time in the past is moved to now.
    fn retry_verdict(
        &self,
        tx: &mut dyn Tx,
        policy: &dyn Decider,
        op: &Operation,
        c: &Completion,
        now_ms: i64,
    ) -> Result<RetryVerdict, StoreError> {
        let report = runtime::FailureReport {
            tenant: op.tenant.clone(),
            key: op.key.clone(),
            route: super::wit_route(op.route),
            attempt: op.attempt,
            failure: c.failure.as_deref().map(failure_kind),
            // Where the call can move to another deployment or model, the provider's
            // retry-after pauses the deployment (above), not the call.
            provider_retry_after_ms: c.provider_retry_after_ms.filter(|_| {
                let config = self.config();
                let asked = op.asked_model.as_ref().or(op.model.as_ref());
                !deployments::can_move(asked.and_then(|m| config.routing.get(m)))
            }),
            deadline_ms: op.deadline_ms,
            max_output_tokens: op.max_output_tokens,
            optional_context_tokens: op.optional_context_tokens,
            input_tokens: op.input_tokens,
            model: op.model.clone(),
            priority: super::wit_priority(op.priority),
        };
        let view = self.view(
            tx,
            &op.tenant,
            op.model.as_deref(),
            &op.key,
            op.attempt,
            now_ms,
        )?;
        Ok(match policy.on_failure(view, &report) {
            Err(_) => give_up("policy_error"),
            Ok(RetryDecision::Retry(not_before)) => RetryVerdict {
                eligible: true,
                reason: None,
                not_before_ms: Some(not_before.max(now_ms)),
            },
            Ok(RetryDecision::GiveUp(r)) => give_up(match r {
                GiveUpReason::UnknownOutcome => "unknown_outcome",
                GiveUpReason::NotRetryable => "not_retryable",
                GiveUpReason::AttemptsExhausted => "attempts_exhausted",
                GiveUpReason::DeadlineExceeded => "deadline_exceeded",
            }),
        })
    }

    /// Ends an attempt whose termination is known: releases what it holds (once), refunds
    /// unused tokens when configured and usage is reported, and adds reported usage and
    /// its cost to the spend ledger.
    fn finish_attempt(
        &self,
        tx: &mut dyn Tx,
        op: &mut Operation,
        usage: Option<Usage>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if let Some(u) = &usage {
            op.usage = usage;
            let config = self.config();
            let price = op
                .model
                .as_deref()
                .and_then(|m| config.model(m))
                .and_then(|m| m.price_microusd_per_token);
            tx.add_spend(&SpendRow::of_call(
                now_ms,
                &op.tenant,
                &config.group_chain(&op.tenant),
                op.model.as_deref(),
                op.deployment.as_deref(),
                u,
                price.map_or(0, |p| p.cost_of(u)),
            ))?;
        }
        if op.holds_slot {
            let global = Budgets::global_slots(&self.config());
            release_shared_slot(tx, self.holding(), &global, now_ms)?;
            op.holds_slot = false;
        }
        if op.holds_tenant_slot {
            release_slot(tx, &names::tenant_slots(&op.tenant))?;
            op.holds_tenant_slot = false;
        }
        if op.holds_deployment_slot {
            if let (Some(model), Some(name)) = (&op.model, &op.deployment) {
                match DeploymentBudgets::find(&self.config(), model, name) {
                    Some(d) => d.release_slot(tx, self.holding(), now_ms)?,
                    // Configured away since: its row alone.
                    None => release_slot(tx, &names::deployment_slots(model, name))?,
                }
            }
            op.holds_deployment_slot = false;
        }
        if op.tokens_reserved {
            op.tokens_reserved = false;
            let reserved_cost = std::mem::take(&mut op.reserved_cost_microusd);
            if let (true, Some(u), Some(t)) = (
                self.config().refund_unused_tokens,
                usage,
                self.config().tenant(&op.tenant),
            ) {
                let budgets =
                    Budgets::for_request(&self.config(), &op.tenant, t, op.model.as_deref())
                        .held_by(self.holder());
                let used = u.input_tokens.saturating_add(u.output_tokens);
                let unused = op.reserved_tokens.saturating_sub(used);
                // The money used is what the reported usage costs at the model's price.
                let cost_used = budgets.cost_of(&u);
                let unused_cost = reserved_cost.saturating_sub(cost_used);
                budgets.refund(tx, unused, unused_cost, now_ms)?;
                if let (Some(model), Some(name), true) = (&op.model, &op.deployment, unused > 0) {
                    if let Some(d) = DeploymentBudgets::find(&self.config(), model, name) {
                        d.refund_tokens(tx, self.holding(), unused, now_ms)?;
                    }
                }
            }
        }
        Ok(())
    }
}
