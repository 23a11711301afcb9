//! Shadow mode: a candidate policy asked beside the active one on live admissions. Its
//! verdicts go through the same host checks (plan contract, deadline, never-fit bound,
//! budgets, queue bound) on the same snapshot, and are counted against the live answers;
//! they are never carried out, never spend, and a fault of the shadow is only counted.

use super::decision::Decision;
use super::swap::{PolicyIdentity, SwapError, Verifier};
use super::Engine;
use crate::model::{Priority, Request, Route};
use crate::runtime::{self, Decider, DecisionView};
use crate::store::{Store, StoreError, Tx};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Disagreements kept for `GET /v1/admin/policy/shadow`, newest last.
pub const RECENT_DISAGREEMENTS: usize = 20;

/// An installed shadow policy and what it has been seen to decide.
pub(super) struct Shadow {
    policy: Arc<dyn Decider>,
    /// The share of live decisions it is asked about, in millionths.
    sample_ppm: u32,
    stats: Mutex<Stats>,
}

#[derive(Default)]
struct Stats {
    decisions: u64,
    agreements: u64,
    by_outcome: BTreeMap<(String, String), u64>,
    recent: VecDeque<Disagreement>,
}

/// One live decision where the shadow would have answered otherwise.
#[derive(Clone, Debug, Serialize)]
pub struct Disagreement {
    /// The decision's logical time.
    pub at_ms: i64,
    /// The request, as validated.
    pub tenant: String,
    /// The operation key.
    pub key: String,
    /// Interactive or durable.
    pub route: Route,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// The output cap asked for.
    pub max_output_tokens: u64,
    /// The model, when named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The priority.
    pub priority: Priority,
    /// The labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// What the active policy answered (`accepted`, `accepted:degraded`, `queued`,
    /// `rejected:<reason>`).
    pub active: String,
    /// What the shadow would have answered.
    pub shadow: String,
    /// The active policy's plan, when it admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_plan: Option<PlanShape>,
    /// The shadow's plan, when it would have admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow_plan: Option<PlanShape>,
}

/// What an admitted plan asks of the call: two plans that differ here disagree, even when
/// both admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PlanShape {
    /// The output cap the call must use.
    pub max_output_tokens: u64,
    /// The optional context it may send.
    pub optional_context_tokens: u64,
    /// Whether that reduces the request.
    pub degraded: bool,
}

/// Counts of one pair of answers.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct OutcomePair {
    /// The active policy's answer.
    pub active: String,
    /// The shadow's answer.
    pub shadow: String,
    /// How many live decisions had this pair.
    pub count: u64,
}

/// What `GET /v1/admin/policy/shadow` answers.
#[derive(Clone, Debug, Serialize)]
pub struct ShadowReport {
    /// The shadow policy.
    pub policy: PolicyIdentity,
    /// The share of live decisions it is asked about.
    pub sample: f64,
    /// Live decisions it was asked about.
    pub decisions: u64,
    /// Of those, the ones where it answered as the active policy did.
    pub agreements: u64,
    /// The others.
    pub disagreements: u64,
    /// Every pair of answers seen, with its count.
    pub by_outcome: Vec<OutcomePair>,
    /// The latest disagreements, newest last.
    pub recent_disagreements: Vec<Disagreement>,
}

impl ShadowReport {
    /// This report and `other`'s counts together (engines that share the work, each asked
    /// about its own admissions), when both are about the same shadow; else this one.
    #[must_use]
    pub fn merge(mut self, other: ShadowReport) -> ShadowReport {
        if other.policy.sha256 != self.policy.sha256 {
            return self;
        }
        self.decisions += other.decisions;
        self.agreements += other.agreements;
        self.disagreements += other.disagreements;
        for pair in other.by_outcome {
            match self
                .by_outcome
                .iter_mut()
                .find(|p| p.active == pair.active && p.shadow == pair.shadow)
            {
                Some(p) => p.count += pair.count,
                None => self.by_outcome.push(pair),
            }
        }
        self.recent_disagreements.extend(other.recent_disagreements);
        self.recent_disagreements.sort_by_key(|d| d.at_ms);
        let over = self
            .recent_disagreements
            .len()
            .saturating_sub(RECENT_DISAGREEMENTS);
        self.recent_disagreements.drain(..over);
        self
    }
}

/// An answer's label: its outcome, the reason of a refusal, and whether an admission
/// reduced the request.
fn label(d: &Decision, plan: Option<&PlanShape>) -> String {
    match (d.reason, plan) {
        (Some(r), _) => format!("rejected:{}", r.as_str()),
        (None, Some(p)) if p.degraded => format!("{}:degraded", d.outcome.as_str()),
        (None, _) => d.outcome.as_str().to_string(),
    }
}

/// Whether the key falls in the sample: the same on every replica and every rerun.
fn sampled(sample_ppm: u32, tenant: &str, key: &str) -> bool {
    if sample_ppm >= 1_000_000 {
        return true;
    }
    let mut h = Sha256::new();
    h.update(tenant.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    u32::from_le_bytes(d[..4].try_into().unwrap()) % 1_000_000 < sample_ppm
}

impl<S: Store> Engine<S> {
    /// Checks `bytes` as a swap would and installs it as the shadow, asked about `sample`
    /// (0 to 1) of live admissions. A shadow installed before is replaced, its counts gone.
    pub fn install_shadow(
        &self,
        bytes: &[u8],
        verifier: &dyn Verifier,
        sample: f64,
    ) -> Result<PolicyIdentity, SwapError> {
        if !(sample > 0.0 && sample <= 1.0) {
            return Err(SwapError::Verify(format!(
                "sample must be above 0 and at most 1, not {sample}"
            )));
        }
        let policy = self.check_verified(bytes, verifier)?;
        let identity = PolicyIdentity::of(policy.as_ref());
        let sample_ppm = ((sample * 1_000_000.0).round() as u32).max(1);
        self.record_shadow(Some((policy.as_ref(), bytes, sample_ppm)))?;
        self.set_shadow_here(policy, sample_ppm);
        Ok(identity)
    }

    /// Removes the shadow (from the store, so from every replica); its identity, or `None`
    /// when there was none.
    pub fn remove_shadow(&self) -> Result<Option<PolicyIdentity>, StoreError> {
        // A shadow another replica installed a moment ago is taken up first, so that it is
        // the one removed. (A component that does not load here leaves nothing to remove.)
        if let Err(SwapError::Store(e)) = self.sync_policy() {
            return Err(e);
        }
        if self.shadow_identity().is_none() {
            return Ok(None);
        }
        self.record_shadow(None)?;
        Ok(self
            .drop_shadow_here()
            .map(|s| PolicyIdentity::of(s.policy.as_ref())))
    }

    /// Installs a shadow in this engine only, with fresh counts.
    pub(super) fn set_shadow_here(&self, policy: Arc<dyn Decider>, sample_ppm: u32) {
        let shadow = Shadow {
            policy,
            sample_ppm,
            stats: Mutex::default(),
        };
        *self.shadow.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(shadow));
    }

    /// Removes the shadow from this engine only.
    pub(super) fn drop_shadow_here(&self) -> Option<Arc<Shadow>> {
        self.shadow
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The shadow's digest and sample, when one is installed here.
    pub(super) fn shadow_identity(&self) -> Option<(crate::runtime::PolicyDigest, u32)> {
        let shadow = self.shadow.read().unwrap_or_else(|e| e.into_inner());
        shadow
            .as_ref()
            .map(|s| (s.policy.digest().clone(), s.sample_ppm))
    }

    /// The shadow's counts so far; `None` when no shadow is installed.
    pub fn shadow_report(&self) -> Option<ShadowReport> {
        let shadow = self
            .shadow
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let stats = shadow.stats.lock().unwrap_or_else(|e| e.into_inner());
        Some(ShadowReport {
            policy: PolicyIdentity::of(shadow.policy.as_ref()),
            sample: f64::from(shadow.sample_ppm) / 1_000_000.0,
            decisions: stats.decisions,
            agreements: stats.agreements,
            disagreements: stats.decisions - stats.agreements,
            by_outcome: stats
                .by_outcome
                .iter()
                .map(|((active, shadow), count)| OutcomePair {
                    active: active.clone(),
                    shadow: shadow.clone(),
                    count: *count,
                })
                .collect(),
            recent_disagreements: stats.recent.iter().cloned().collect(),
        })
    }

    /// Whether a shadow is installed (the admission path clones the view only then).
    pub(super) fn has_shadow(&self) -> bool {
        self.shadow
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Asks the shadow about a fresh admission the active policy answered with `live`
    /// (and, when it admitted, `live_plan`), on the same snapshot, and counts the pair: a
    /// different outcome or a different plan is a disagreement. Nothing is written; nothing
    /// can fail the live decision (a store error here is dropped with the shadow's verdict).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn shadow_decision(
        &self,
        tx: &mut dyn Tx,
        req: &Request,
        guest_req: &runtime::Request,
        view: Option<DecisionView>,
        live: &Decision,
        live_plan: Option<PlanShape>,
        now_ms: i64,
    ) {
        let Some(view) = view else {
            return;
        };
        let shadow = self
            .shadow
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(shadow) = shadow else {
            return;
        };
        if !sampled(shadow.sample_ppm, &req.tenant, &req.key) {
            return;
        }
        let verdict: Result<_, StoreError> = self.judge(
            tx,
            shadow.policy.as_ref(),
            req,
            guest_req,
            view,
            None,
            now_ms,
        );
        let (shadow_label, shadow_plan) = match verdict {
            Ok(Ok(planned)) => {
                let plan = planned.shape();
                let outcome = match req.route {
                    Route::Interactive => crate::reason::Outcome::Accepted,
                    Route::Durable => crate::reason::Outcome::Queued,
                };
                (label(&Decision::plain(outcome), Some(&plan)), Some(plan))
            }
            Ok(Err(refused)) => (label(&refused, None), None),
            Err(_) => ("store_error".to_string(), None),
        };
        let live_label = label(live, live_plan.as_ref());
        let mut stats = shadow.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.decisions += 1;
        if live_label == shadow_label && live_plan == shadow_plan {
            stats.agreements += 1;
        } else {
            if stats.recent.len() == RECENT_DISAGREEMENTS {
                stats.recent.pop_front();
            }
            stats.recent.push_back(Disagreement {
                at_ms: now_ms,
                tenant: req.tenant.clone(),
                key: req.key.clone(),
                route: req.route,
                input_tokens: req.input_tokens,
                max_output_tokens: req.max_output_tokens,
                model: req.model.clone(),
                priority: req.priority,
                labels: req.labels.clone(),
                active: live_label.clone(),
                shadow: shadow_label.clone(),
                active_plan: live_plan,
                shadow_plan,
            });
        }
        *stats
            .by_outcome
            .entry((live_label, shadow_label))
            .or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(
        sha: &str,
        decisions: u64,
        agreements: u64,
        pairs: &[(&str, &str, u64)],
        at: &[i64],
    ) -> ShadowReport {
        ShadowReport {
            policy: PolicyIdentity {
                name: "p".into(),
                version: "1".into(),
                sha256: sha.into(),
                world: "0.3.0".into(),
            },
            sample: 1.0,
            decisions,
            agreements,
            disagreements: decisions - agreements,
            by_outcome: pairs
                .iter()
                .map(|(a, s, count)| OutcomePair {
                    active: a.to_string(),
                    shadow: s.to_string(),
                    count: *count,
                })
                .collect(),
            recent_disagreements: at
                .iter()
                .map(|&at_ms| Disagreement {
                    at_ms,
                    tenant: "t".into(),
                    key: format!("k{at_ms}"),
                    route: Route::Interactive,
                    input_tokens: 1,
                    max_output_tokens: 1,
                    model: None,
                    priority: Priority::Standard,
                    labels: BTreeMap::new(),
                    active: "accepted".into(),
                    shadow: "rejected:global_rate".into(),
                    active_plan: None,
                    shadow_plan: None,
                })
                .collect(),
        }
    }

    #[test]
    fn shards_reports_add_up_and_keep_the_latest_disagreements() {
        let a = report(
            "x",
            10,
            8,
            &[("accepted", "accepted", 8), ("accepted", "queued", 2)],
            &[1, 5],
        );
        let older: Vec<i64> = (100..120).collect();
        let b = report(
            "x",
            30,
            10,
            &[("accepted", "accepted", 10), ("queued", "queued", 0)],
            &older,
        );
        let merged = a.merge(b);
        assert_eq!(
            (merged.decisions, merged.agreements, merged.disagreements),
            (40, 18, 22)
        );
        let count = |x: &str, y: &str| {
            merged
                .by_outcome
                .iter()
                .find(|p| p.active == x && p.shadow == y)
                .map(|p| p.count)
        };
        assert_eq!(count("accepted", "accepted"), Some(18));
        assert_eq!(count("accepted", "queued"), Some(2));
        assert_eq!(count("queued", "queued"), Some(0));
        let kept: Vec<i64> = merged
            .recent_disagreements
            .iter()
            .map(|d| d.at_ms)
            .collect();
        assert_eq!(
            kept, older,
            "the newest {RECENT_DISAGREEMENTS}, newest last"
        );
        // Another shadow's counts are not added.
        let other = report("y", 5, 5, &[], &[]);
        assert_eq!(merged.merge(other).decisions, 40);
    }

    #[test]
    fn sampling_is_by_key_and_near_the_asked_share() {
        assert!(sampled(1_000_000, "t", "k"));
        assert!(!sampled(0, "t", "k"));
        let hits = (0..10_000)
            .filter(|i| sampled(250_000, "t", &format!("k{i}")))
            .count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert_eq!(sampled(500_000, "t", "k7"), sampled(500_000, "t", "k7"));
    }
}
