//! The policy state kept in the store, so that every replica on one store decides with the
//! same policy and a restart keeps it: the components by digest, and in `meta` the active
//! digest, the previous one (for rollback), the shadow and its sample, and a generation
//! bumped by every change. A swap, rollback or shadow change through any replica is written
//! there first; each writer reads the generation now and then ([`Engine::sync_policy`]) and
//! takes up what changed. The configuration's policy seeds an empty store, and at every
//! start a configured policy whose bytes changed since the last start (`policy.configured`
//! keeps their digest) is installed as a new version; an unchanged one leaves a runtime
//! swap in force.

use super::swap::{PolicyIdentity, SwapError};
use super::Engine;
use crate::runtime::Decider;
use crate::store::{Store, StoreError, Tx};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const ACTIVE: &str = "policy.active";
const PREVIOUS: &str = "policy.previous";
const SHADOW: &str = "policy.shadow";
const SHADOW_SAMPLE: &str = "policy.shadow_sample";
const GENERATION: &str = "policy.generation";
/// The digest of the configuration's policy at the last start.
const CONFIGURED: &str = "policy.configured";

/// What [`Engine::adopt_stored_policy`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adopted {
    /// The store had no policy: the engine's is now the store's.
    Seeded,
    /// The store's policy is the engine's.
    Same,
    /// The store's policy differs from the one the engine was made with, and is now active:
    /// the configuration's is the one of the last start, so a runtime swap stays in force.
    FromStore {
        /// The store's policy, now active.
        stored: PolicyIdentity,
        /// The one the engine was made with (the configuration's).
        configured: PolicyIdentity,
    },
    /// The configuration's policy changed since the last start: it is now the store's
    /// active policy, and the one it replaced is the previous (rollback returns to it).
    Installed {
        /// The store's policy before, now the previous.
        replaced: String,
    },
}

/// The policy state as the store has it.
struct StoredState {
    generation: i64,
    active: Option<String>,
    shadow: Option<(String, u32)>,
}

fn read_state(tx: &mut dyn Tx) -> Result<StoredState, StoreError> {
    let generation = tx
        .meta(GENERATION)?
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let active = tx.meta(ACTIVE)?.filter(|d| !d.is_empty());
    let shadow = match tx.meta(SHADOW)?.filter(|d| !d.is_empty()) {
        Some(digest) => {
            let ppm = tx
                .meta(SHADOW_SAMPLE)?
                .and_then(|p| p.parse().ok())
                .unwrap_or(1_000_000);
            Some((digest, ppm))
        }
        None => None,
    };
    Ok(StoredState {
        generation,
        active,
        shadow,
    })
}

/// Ends a change to the policy state (in the caller's transaction): forgets components no
/// longer named, bumps the generation and returns the new one.
fn bump(tx: &mut dyn Tx) -> Result<i64, StoreError> {
    let state = read_state(tx)?;
    let previous = tx.meta(PREVIOUS)?.unwrap_or_default();
    let active = state.active.unwrap_or_default();
    let shadow = state.shadow.map(|(d, _)| d).unwrap_or_default();
    tx.retain_policy_components([&active, &previous, &shadow])?;
    let next = state.generation + 1;
    tx.set_meta(GENERATION, &next.to_string())?;
    Ok(next)
}

impl<S: Store> Engine<S> {
    /// Makes the store's policy active if it has one (the configuration's policy is then
    /// only reported as different), else records the engine's as the store's. `bytes` are the
    /// engine's current policy's. Called once at start-up, before serving.
    pub fn adopt_stored_policy(&self, bytes: &[u8]) -> Result<Adopted, SwapError> {
        let current = self.active_policy();
        let digest = current.digest().to_string();
        let (state, stored_bytes, installed) = self.transaction(|tx| {
            let state = read_state(tx)?;
            let last_configured = tx.meta(CONFIGURED)?.filter(|d| !d.is_empty());
            tx.set_meta(CONFIGURED, &digest)?;
            let stored = match &state.active {
                None => {
                    tx.put_policy_component(&digest, bytes)?;
                    tx.set_meta(ACTIVE, &digest)?;
                    bump(tx)?;
                    None
                }
                Some(d) if *d == digest => None,
                // The file names other bytes than at the last start: they are the new
                // version. (A store from before `policy.configured` was kept has no record:
                // its active policy stays, as it did then.)
                Some(d) if last_configured.as_ref().is_some_and(|c| *c != digest) => {
                    tx.put_policy_component(&digest, bytes)?;
                    tx.set_meta(PREVIOUS, d)?;
                    tx.set_meta(ACTIVE, &digest)?;
                    bump(tx)?;
                    return Ok((state, None, true));
                }
                Some(d) => tx.policy_component(d)?,
            };
            Ok((state, stored, false))
        })?;
        let adopted = match (&state.active, stored_bytes) {
            (Some(d), _) if installed => Adopted::Installed {
                replaced: d.clone(),
            },
            (None, _) => Adopted::Seeded,
            (Some(_), None) if state.active.as_deref() == Some(digest.as_str()) => Adopted::Same,
            (Some(d), None) => {
                return Err(SwapError::Store(StoreError::Schema(format!(
                    "the store names policy {d} as active but does not keep its component"
                ))))
            }
            (Some(_), Some(bytes)) => {
                let stored: Arc<dyn Decider> = Arc::new(
                    self.runtime
                        .load(&bytes, self.config().policy_limits().any_size())?,
                );
                let configured = PolicyIdentity::of(current.as_ref());
                let identity = PolicyIdentity::of(stored.as_ref());
                self.set_policies(stored, None);
                Adopted::FromStore {
                    stored: identity,
                    configured,
                }
            }
        };
        self.sync_shadow(state.shadow)?;
        self.policy_generation.store(
            self.transaction(|tx| Ok(read_state(tx)?.generation))?,
            Ordering::SeqCst,
        );
        Ok(adopted)
    }

    /// Records `candidate` (whose component is `bytes`) as the store's active policy, the
    /// current one as the previous, then activates it here.
    pub(super) fn record_and_activate(
        &self,
        candidate: Arc<dyn Decider>,
        bytes: &[u8],
    ) -> Result<PolicyIdentity, SwapError> {
        let digest = candidate.digest().to_string();
        let current = self.active_policy().digest().to_string();
        let generation = self.transaction(|tx| {
            tx.put_policy_component(&digest, bytes)?;
            if digest != current {
                tx.set_meta(PREVIOUS, &current)?;
            }
            tx.set_meta(ACTIVE, &digest)?;
            bump(tx)
        })?;
        let identity = self.activate(candidate);
        self.policy_generation.store(generation, Ordering::SeqCst);
        Ok(identity)
    }

    /// Switches the store's policy back to its previous one, and this engine with it.
    ///
    /// # Errors
    /// [`SwapError::NoPrevious`] when there is nothing to roll back to; the store's failure.
    pub fn rollback(&self) -> Result<PolicyIdentity, SwapError> {
        let local_previous = self.previous_policy();
        let (previous_digest, bytes, generation) = self.transaction(|tx| {
            let Some(previous) = tx.meta(PREVIOUS)?.filter(|d| !d.is_empty()) else {
                return Ok((None, None, 0));
            };
            let active = tx.meta(ACTIVE)?.unwrap_or_default();
            let known = local_previous
                .as_ref()
                .is_some_and(|p| p.digest().to_string() == previous);
            let bytes = if known {
                None
            } else {
                tx.policy_component(&previous)?
            };
            tx.set_meta(ACTIVE, &previous)?;
            tx.set_meta(PREVIOUS, &active)?;
            let generation = bump(tx)?;
            Ok((Some(previous), bytes, generation))
        })?;
        let Some(previous_digest) = previous_digest else {
            return Err(SwapError::NoPrevious);
        };
        let previous: Arc<dyn Decider> = match (local_previous, bytes) {
            (Some(p), _) if p.digest().to_string() == previous_digest => p,
            (_, Some(bytes)) => Arc::new(
                self.runtime
                    .load(&bytes, self.config().policy_limits().any_size())?,
            ),
            _ => {
                return Err(SwapError::Store(StoreError::Schema(format!(
                    "the store's previous policy {previous_digest} has no component"
                ))))
            }
        };
        let identity = self.activate(previous);
        self.policy_generation.store(generation, Ordering::SeqCst);
        Ok(identity)
    }

    /// Records the shadow (or its removal) in the store.
    pub(super) fn record_shadow(
        &self,
        shadow: Option<(&dyn Decider, &[u8], u32)>,
    ) -> Result<(), StoreError> {
        let generation = self.transaction(|tx| {
            match shadow {
                Some((policy, bytes, ppm)) => {
                    let digest = policy.digest().to_string();
                    tx.put_policy_component(&digest, bytes)?;
                    tx.set_meta(SHADOW, &digest)?;
                    tx.set_meta(SHADOW_SAMPLE, &ppm.to_string())?;
                }
                None => tx.set_meta(SHADOW, "")?,
            }
            bump(tx)
        })?;
        self.policy_generation.store(generation, Ordering::SeqCst);
        Ok(())
    }

    /// Takes up a policy change another replica (or an earlier run) made: when the store's
    /// generation moved, its active policy and shadow become this engine's. Returns the new
    /// active identity when it changed. A component that no longer loads here keeps the
    /// current policy (the error says why).
    pub fn sync_policy(&self) -> Result<Option<PolicyIdentity>, SwapError> {
        let seen = self.policy_generation.load(Ordering::SeqCst);
        let current = self.active_policy().digest().to_string();
        let (state, bytes) = self.read(|tx| {
            let state = read_state(tx)?;
            let bytes = match &state.active {
                Some(d) if state.generation != seen && *d != current => tx.policy_component(d)?,
                _ => None,
            };
            Ok((state, bytes))
        })?;
        if state.generation == seen {
            return Ok(None);
        }
        let mut changed = None;
        if let Some(bytes) = bytes {
            let policy: Arc<dyn Decider> = Arc::new(
                self.runtime
                    .load(&bytes, self.config().policy_limits().any_size())?,
            );
            changed = Some(self.activate(policy));
        }
        self.sync_shadow(state.shadow)?;
        self.policy_generation
            .store(state.generation, Ordering::SeqCst);
        Ok(changed)
    }

    /// Makes the local shadow the store's `shadow` (digest and sample).
    fn sync_shadow(&self, shadow: Option<(String, u32)>) -> Result<(), SwapError> {
        let local = self.shadow_identity();
        match (shadow, local) {
            (None, None) => {}
            (None, Some(_)) => {
                self.drop_shadow_here();
            }
            (Some((digest, ppm)), local) => {
                let same = local
                    .as_ref()
                    .is_some_and(|(d, p)| d.to_string() == digest && *p == ppm);
                if !same {
                    let bytes = self
                        .transaction(|tx| tx.policy_component(&digest))?
                        .ok_or_else(|| {
                            StoreError::Schema(format!("shadow policy {digest} has no component"))
                        })?;
                    let policy: Arc<dyn Decider> = Arc::new(
                        self.runtime
                            .load(&bytes, self.config().policy_limits().any_size())?,
                    );
                    self.set_shadow_here(policy, ppm);
                }
            }
        }
        Ok(())
    }
}
