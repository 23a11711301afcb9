//! A deployment's health as `inspect`, `/metrics` and the dashboard show it.

use super::{DeploymentBudgets, EJECT_AFTER_FAILURES};
use crate::store::{StoreError, Tx};

impl DeploymentBudgets<'_> {
    /// What the deployment is now, as `inspect` shows it.
    pub fn health(&self, tx: &mut dyn Tx, now_ms: i64) -> Result<Health, StoreError> {
        let failures = tx.slots_in_use(&self.failures)?;
        let paused_until = self.paused_until(tx, now_ms, None)?;
        let state = match (paused_until, failures >= EJECT_AFTER_FAILURES) {
            (Some(_), true) => HealthState::Ejected,
            (Some(_), false) => HealthState::Paused,
            (None, true) => HealthState::Probing,
            (None, false) => HealthState::Healthy,
        };
        Ok(Health {
            model: self.model.to_string(),
            deployment: self.deployment.name.clone(),
            state,
            until_ms: paused_until,
            failures,
            in_flight: tx.slots_in_use(&self.slots)?,
            concurrency_limit: self.concurrency_limit(tx)?,
        })
    }
}

/// A deployment's state, as `inspect`, `/metrics` and the dashboard show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Taking calls.
    Healthy,
    /// Paused by a 429 until its retry-after.
    Paused,
    /// Ejected after consecutive failures, until its cool-down ends.
    Ejected,
    /// Its cool-down over: one call at a time decides whether it is healthy again.
    Probing,
}

impl HealthState {
    /// Its number in `tollgate_deployment_state` (0 healthy, 1 paused, 2 ejected, 3 probing).
    pub fn number(self) -> i64 {
        match self {
            HealthState::Healthy => 0,
            HealthState::Paused => 1,
            HealthState::Ejected => 2,
            HealthState::Probing => 3,
        }
    }
}

/// A deployment's health and load.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Health {
    /// The gateway model.
    pub model: String,
    /// The deployment's name.
    pub deployment: String,
    /// Healthy, paused, ejected or probing.
    pub state: HealthState,
    /// When a pause or an ejection ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// Consecutive failures.
    pub failures: u32,
    /// Calls in flight.
    pub in_flight: u32,
    /// Its concurrency limit now (configured or learned), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
}
