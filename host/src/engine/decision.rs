//! The answer to one admission: its outcome, the HTTP status and reason, what was reserved,
//! and, for a refusal, the message that explains it.

use super::budgets::Refusal;
use crate::explain::{self, Shortfall};
use crate::model::{OpState, Operation};
use crate::reason::{outcome_http, Outcome, Reason};
use serde::Serialize;

/// The answer to one admission.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// What happened: accepted, queued, a duplicate, a conflict, or rejected.
    pub outcome: Outcome,
    /// Why, when rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// The HTTP status this outcome maps to.
    pub http: u16,
    /// When a retry may succeed, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The attempt this answer concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Tokens reserved (or to be reserved at dispatch, for durable work).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_tokens: Option<u64>,
    /// The output limit the call must use (reduced when degraded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// The optional context the call may send (0 when degraded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional_context_tokens: Option<u64>,
    /// Whether the policy reduced the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<bool>,
    /// The operation's state after this admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<OpState>,
    /// The saved answer's reference, for a completed duplicate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_ref: Option<String>,
    /// The content hash of the policy that decided, when a policy was consulted or the
    /// answer replays an operation it decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// For a refusal: one sentence saying what was asked, what was available and when to
    /// retry (with the policy's own words when it gave some).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For a refusal by a limit: `limit`, `requested`, `available` and `unit`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub shortfall: Option<Shortfall>,
    /// What the policy said of its refusal or degradation, bounded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_message: Option<String>,
    /// The deployment of the gateway model reserved for the call (and the one to send it to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The model that serves the call when it is not the one asked for (a fallback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    /// How long the call waited in the waiting room before this answer, when it waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
}

impl Decision {
    /// A refusal decided before any state was read (validation, say).
    pub fn rejected(reason: Reason, retry_after_ms: Option<u64>) -> Self {
        Decision {
            message: Some(explain::message(reason, None, None, retry_after_ms)),
            shortfall: None,
            policy_message: None,
            outcome: Outcome::Rejected,
            reason: Some(reason),
            http: reason.http(),
            retry_after_ms,
            attempt: None,
            reserved_tokens: None,
            max_output_tokens: None,
            optional_context_tokens: None,
            degraded: None,
            state: None,
            result_ref: None,
            policy: None,
            deployment: None,
            served_model: None,
            waited_ms: None,
        }
    }

    /// An answer of `outcome` with nothing else known (what a shadow would have answered).
    pub(super) fn plain(outcome: Outcome) -> Self {
        Decision {
            outcome,
            http: outcome_http(outcome),
            ..Decision::rejected(Reason::InvalidRequest, None)
        }
        .without_reason()
    }

    fn without_reason(mut self) -> Self {
        self.reason = None;
        self.message = None;
        self
    }

    pub(super) fn refused(r: Refusal) -> Self {
        Self::rejected(r.reason, r.retry_after_ms).with_shortfall(r.shortfall)
    }

    /// The same refusal, explained by the limit that was short.
    pub(super) fn with_shortfall(mut self, shortfall: Option<Shortfall>) -> Self {
        self.shortfall = shortfall;
        self.explain();
        self
    }

    /// The same refusal, with the policy's own words.
    pub(super) fn with_policy_message(mut self, message: Option<String>) -> Self {
        self.policy_message = message;
        self.explain();
        self
    }

    /// Writes the message again from the reason, shortfall, policy message and retry-after.
    fn explain(&mut self) {
        if let Some(reason) = self.reason {
            self.message = Some(explain::message(
                reason,
                self.shortfall.as_ref(),
                self.policy_message.as_deref(),
                self.retry_after_ms,
            ));
        }
    }

    /// An answer that describes an existing operation.
    pub(super) fn about(outcome: Outcome, op: &Operation) -> Self {
        Decision {
            outcome,
            reason: None,
            http: outcome_http(outcome),
            retry_after_ms: None,
            attempt: Some(op.attempt),
            reserved_tokens: Some(op.reserved_tokens),
            max_output_tokens: Some(op.max_output_tokens),
            optional_context_tokens: Some(op.optional_context_tokens),
            degraded: Some(op.degraded),
            state: Some(op.state),
            result_ref: op.result_ref.clone(),
            policy: Some(op.policy_digest.clone()),
            message: None,
            shortfall: None,
            policy_message: None,
            deployment: op.deployment.clone(),
            served_model: op.asked_model.as_ref().and(op.model.clone()),
            waited_ms: None,
        }
    }

    /// Whether this answer authorises a provider call now.
    pub fn authorises_call(&self) -> bool {
        self.outcome == Outcome::Accepted
    }
}

impl Decision {
    /// A conflict says nothing about the other payload's operation.
    pub(super) fn without_details(self) -> Self {
        Decision {
            attempt: None,
            reserved_tokens: None,
            max_output_tokens: None,
            optional_context_tokens: None,
            degraded: None,
            state: None,
            result_ref: None,
            policy: None,
            ..self
        }
    }
}
