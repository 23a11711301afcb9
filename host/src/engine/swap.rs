//! Policy activation: a candidate is compiled, checked against the world, self-checked and
//! given a few smoke decisions in a scratch in-memory store before one atomic switch.
//! The previous version stays loaded for rollback.

use super::{Engine, Policies};
use crate::reason::Reason;
use crate::runtime::{Decider, DecisionView, LoadError, Runtime};
use crate::store::{SqliteStore, Store, StoreError};
use serde::Serialize;
use std::sync::Arc;

/// A loaded policy's identity: what it says it is, and its content hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyIdentity {
    /// The name the policy gives itself.
    pub name: String,
    /// The version the policy gives itself.
    pub version: String,
    /// The SHA-256 of the component, in hex.
    pub sha256: String,
    /// The world the component was built for (`0.1.0`, `0.2.0`), or `native` for rules
    /// compiled into the host.
    pub world: String,
}

impl PolicyIdentity {
    /// The identity of a loaded policy.
    pub fn of(p: &dyn Decider) -> Self {
        let (info, digest) = (p.info(), p.digest());
        PolicyIdentity {
            name: info.name.clone(),
            version: info.version.clone(),
            sha256: digest.to_string(),
            world: p.world().map_or("native".into(), |w| w.to_string()),
        }
    }
}

/// Why a candidate policy was refused; the active policy is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// It could not be loaded: size, compilation, world or self-check.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An ordinary admission faulted or broke the plan contract.
    #[error("policy failed its smoke decisions: {0}")]
    Smoke(String),
    /// The verifier (scenario files) refused it.
    #[error("policy failed verification: {0}")]
    Verify(String),
    /// A rollback with nothing to roll back to.
    #[error("no previous policy to roll back to")]
    NoPrevious,
    /// The scratch store of the smoke decisions failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A check a candidate must pass before activation, beyond the world, its self-check and
/// the smoke decisions: the scenario files of `--verify-with`, say. The caller supplies it,
/// so the engine knows nothing of scenario files.
pub trait Verifier {
    /// `Err` with the reason refuses the candidate.
    fn verify(&self, runtime: &Runtime, candidate: Arc<dyn Decider>) -> Result<(), String>;
}

/// Passes every candidate: activation's own checks only.
pub struct NoVerifier;

impl Verifier for NoVerifier {
    fn verify(&self, _: &Runtime, _: Arc<dyn Decider>) -> Result<(), String> {
        Ok(())
    }
}

impl<S: Store> Engine<S> {
    /// Checks a candidate policy as the engine would use it, without touching this engine's
    /// state: the world, its self-check, and smoke decisions in a scratch in-memory store.
    pub fn check_candidate(&self, bytes: &[u8]) -> Result<Arc<dyn Decider>, SwapError> {
        let candidate = self.runtime.load(bytes, self.config().policy_limits())?;
        match candidate.self_check(DecisionView::scratch(self.params.clone())) {
            Err(fault) => return Err(LoadError::Fault(fault).into()),
            Ok(Err(message)) => return Err(LoadError::SelfCheck(message).into()),
            Ok(Ok(())) => {}
        }
        let candidate: Arc<dyn Decider> = Arc::new(candidate);
        if let Some(tenant) = self.config().tenants.keys().next() {
            let scratch = Engine::new(
                crate::config::Config::clone(&self.config()),
                SqliteStore::in_memory()?,
                self.runtime.clone(),
                candidate.clone(),
            );
            let request = serde_json::json!({
                "tenant": tenant, "key": "tollgate-smoke", "route": "interactive",
                "input_tokens": 1, "max_output_tokens": 1, "deadline_ms": 3_600_000
            });
            let decision = scratch.admit(&request, 0)?;
            if decision.reason == Some(Reason::PolicyError) {
                return Err(SwapError::Smoke(
                    "an ordinary admission faulted or broke the plan contract".into(),
                ));
            }
        }
        Ok(candidate)
    }

    /// Validates `bytes` as a policy and, if it passes, makes it the active policy atomically.
    /// Decisions already running finish on the version they started with.
    /// The change is recorded in the store first, so that every replica on it takes it up
    /// and a restart keeps it.
    pub fn swap_policy(&self, bytes: &[u8]) -> Result<PolicyIdentity, SwapError> {
        let candidate = self.check_candidate(bytes)?;
        self.record_and_activate(candidate, bytes)
    }

    /// As [`Engine::swap_policy`], with the candidate also given to `verifier` first.
    pub fn swap_policy_verified(
        &self,
        bytes: &[u8],
        verifier: &dyn Verifier,
    ) -> Result<PolicyIdentity, SwapError> {
        let candidate = self.check_verified(bytes, verifier)?;
        self.record_and_activate(candidate, bytes)
    }

    /// Every check of [`Engine::swap_policy_verified`], without activating the candidate.
    pub fn check_verified(
        &self,
        bytes: &[u8],
        verifier: &dyn Verifier,
    ) -> Result<Arc<dyn Decider>, SwapError> {
        let candidate = self.check_candidate(bytes)?;
        verifier
            .verify(&self.runtime, candidate.clone())
            .map_err(SwapError::Verify)?;
        Ok(candidate)
    }

    /// The runtime policies are loaded with.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Makes an already-checked policy active in this engine only (the store's policy
    /// state is not changed: see [`Engine::swap_policy`]); the one it replaces is kept for
    /// rollback.
    pub fn activate(&self, policy: Arc<dyn Decider>) -> PolicyIdentity {
        let identity = PolicyIdentity::of(policy.as_ref());
        let mut p = self.policies.write().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut p.active, policy);
        if old.digest() != p.active.digest() {
            p.previous = Some(old);
        }
        identity
    }

    /// The policy before the active one, when this engine has it loaded.
    pub(super) fn previous_policy(&self) -> Option<Arc<dyn Decider>> {
        let p = self.policies.read().unwrap_or_else(|e| e.into_inner());
        p.previous.clone()
    }

    /// Sets both policies at once (at start-up, from the store).
    pub(super) fn set_policies(
        &self,
        active: Arc<dyn Decider>,
        previous: Option<Arc<dyn Decider>>,
    ) {
        let mut p = self.policies.write().unwrap_or_else(|e| e.into_inner());
        *p = Policies { active, previous };
    }

    /// The active policy's identity.
    pub fn policy_identity(&self) -> PolicyIdentity {
        PolicyIdentity::of(self.active_policy().as_ref())
    }
}
