//! Running a scenario: each step against a fresh engine on an in-memory store (or against
//! writer shards' engines on one shared store), its answer matched against the step's
//! `expect` (partially: the fields named, numbers by value or range).

use super::{default_fixtures, resolve_policy, Op, Scenario, ScenarioError, Step};
use crate::engine::{Completion, Engine, Reconciliation};
use crate::runtime::{Decider, Runtime};
use crate::store::{SqliteStore, Store};
use crate::writer::shard_of;
use serde_json::{json, Map, Value};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A step whose answer did not match its `expect`.
#[derive(Debug, Clone)]
pub struct Mismatch {
    /// The step's index, from 0.
    pub step: usize,
    /// The step's `op`.
    pub op: String,
    /// What `expect` said.
    pub expected: Value,
    /// What the engine answered.
    pub actual: Value,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {} ({}): expected {} got {}",
            self.step, self.op, self.expected, self.actual
        )
    }
}

/// Runs scenarios against the engine, each in a fresh in-memory store.
pub struct Runner {
    runtime: Runtime,
    /// The policy for scenarios that do not name one (default `standard`).
    pub default_policy: String,
    /// A decider for scenarios that do not name a policy, instead of `default_policy`
    /// (native rules, checked against the same scenarios as their wasm build).
    pub default_decider: Option<Arc<dyn Decider>>,
    /// Where test fixtures named by scenarios are found (see [`default_fixtures`]).
    pub fixtures: PathBuf,
}

impl Runner {
    /// A runner whose scenarios default to the `standard` policy.
    pub fn new(runtime: Runtime) -> Self {
        Runner {
            runtime,
            default_policy: "standard".into(),
            default_decider: None,
            fixtures: default_fixtures(),
        }
    }

    /// Runs one scenario; the mismatches, or an error when it could not run at all.
    pub fn run(&self, s: &Scenario) -> Result<Vec<Mismatch>, ScenarioError> {
        let store = SqliteStore::in_memory().map_err(|e| self.err(s, e.to_string()))?;
        self.run_on(s, store)
    }

    /// Runs one scenario on a given (empty) store.
    pub fn run_on<S: Store>(&self, s: &Scenario, store: S) -> Result<Vec<Mismatch>, ScenarioError> {
        self.run_on_shards(s, vec![store])
    }

    /// Runs one scenario with one engine per store, the stores one shared store's
    /// connections (writer shards, as `serve --writers N` runs them): a tenant's steps go
    /// to the engine [`shard_of`] its name picks, the others to the first. With more than
    /// one, every engine on a store with a clock of its own (connections to PostgreSQL)
    /// holds leases on the budgets tenants share and keeps them at each step's time
    /// (handles on one SQLite connection need none), and every engine takes up a policy
    /// swapped through the first before the next step.
    pub fn run_on_shards<S: Store>(
        &self,
        s: &Scenario,
        stores: Vec<S>,
    ) -> Result<Vec<Mismatch>, ScenarioError> {
        let base = s.path.parent();
        let policy: Arc<dyn Decider> = match (&s.policy, &self.default_decider) {
            (None, Some(decider)) => decider.clone(),
            (named, _) => {
                let spec = named.clone().unwrap_or_else(|| self.default_policy.clone());
                let bytes =
                    resolve_policy(&spec, base, &self.fixtures).map_err(|m| self.err(s, m))?;
                let loaded = self
                    .runtime
                    .load(&bytes, s.config.policy_limits())
                    .map_err(|e| self.err(s, e.to_string()))?;
                Arc::new(loaded)
            }
        };
        let shards = stores.len();
        if shards == 0 {
            return Err(self.err(s, "no store to run on".into()));
        }
        let engines: Vec<Engine<S>> = stores
            .into_iter()
            .map(|store| {
                Engine::new(
                    s.config.clone(),
                    store,
                    self.runtime.clone(),
                    policy.clone(),
                )
            })
            .collect();
        if shards > 1 {
            for engine in &engines {
                engine
                    .hold_leases_if_shared()
                    .map_err(|e| self.err(s, e.to_string()))?;
            }
        }
        let mut mismatches = Vec::new();
        for (i, step) in s.steps.iter().enumerate() {
            let failed = |m: String| self.err(s, format!("step {i}: {m}"));
            if shards > 1 {
                for engine in &engines {
                    engine
                        .keep_leases(step.at_ms)
                        .map_err(|e| failed(e.to_string()))?;
                }
            }
            let engine = match step_tenant(&step.op) {
                Some(tenant) => &engines[shard_of(tenant, shards)],
                None => &engines[0],
            };
            let actual = self.step(engine, step, base).map_err(failed)?;
            if matches!(step.op, Op::SwapPolicy(_)) {
                for other in &engines[1..] {
                    other.sync_policy().map_err(|e| failed(e.to_string()))?;
                }
            }
            if let Some(expect) = &step.expect {
                let expected = Value::Object(expect.clone());
                if !matches_expect(&step.op_name, expect, &actual) {
                    mismatches.push(Mismatch {
                        step: i,
                        op: step.op_name.clone(),
                        expected,
                        actual,
                    });
                }
            }
        }
        Ok(mismatches)
    }

    fn err(&self, s: &Scenario, message: String) -> ScenarioError {
        ScenarioError {
            path: s.path.display().to_string(),
            message,
        }
    }

    fn step<S: Store>(
        &self,
        engine: &Engine<S>,
        step: &Step,
        base: Option<&Path>,
    ) -> Result<Value, String> {
        let now = step.at_ms;
        let to_value = |v: Result<Value, crate::store::StoreError>| v.map_err(|e| e.to_string());
        match &step.op {
            Op::Admit(a) => to_value(engine.admit(&a.request, now).map(|d| json!(d))),
            Op::Complete(c) => {
                let completion = Completion {
                    tenant: c.tenant.clone(),
                    key: c.key.clone(),
                    result: c.result,
                    usage: c.usage,
                    failure: c.failure.clone(),
                    provider_retry_after_ms: c.provider_retry_after_ms,
                    result_ref: c.result_ref.clone(),
                    worker: None,
                    attempt: c.attempt,
                    answer: None,
                    provider_limits: None,
                };
                to_value(engine.complete(&completion, now).map(|a| json!(a)))
            }
            Op::Reconcile(r) => {
                let rec = Reconciliation {
                    tenant: r.tenant.clone(),
                    key: r.key.clone(),
                    resolution: r.resolution.into(),
                    usage: r.usage,
                    result_ref: r.result_ref.clone(),
                    worker: None,
                    attempt: r.attempt,
                };
                to_value(engine.reconcile(&rec, now).map(|a| json!(a)))
            }
            Op::Dispatch(d) => to_value(engine.dispatch(&d.worker, d.count, now).map(|a| {
                json!({
                    "claimed": a.claimed,
                    "claimed_count": a.claimed.len(),
                    "claimed_by_tenant": a.claimed_by_tenant(),
                    "expired": a.expired,
                    "reason": a.reason,
                })
            })),
            Op::SetDownstream(d) => to_value(engine.set_downstream(d.available).map(|_| json!({}))),
            Op::SwapPolicy(p) => {
                let result = resolve_policy(&p.policy, base, &self.fixtures)
                    .and_then(|bytes| engine.swap_policy(&bytes).map_err(|e| e.to_string()));
                Ok(match result {
                    Ok(identity) => json!({"ok": true, "policy": identity}),
                    Err(e) => json!({"ok": false, "error": e}),
                })
            }
            Op::Inspect => to_value(engine.inspect(now).map(|i| json!(i))),
        }
    }
}

/// The tenant a step acts for, if it acts for one.
fn step_tenant(op: &Op) -> Option<&str> {
    match op {
        Op::Admit(a) => a.request.get("tenant").and_then(Value::as_str),
        Op::Complete(c) => Some(&c.tenant),
        Op::Reconcile(r) => Some(&r.tenant),
        Op::Dispatch(_) | Op::SetDownstream(_) | Op::SwapPolicy(_) | Op::Inspect => None,
    }
}

/// Whether an answer matches every field an `expect` names.
fn matches_expect(op: &str, expect: &Map<String, Value>, actual: &Value) -> bool {
    expect.iter().all(|(field, want)| {
        let got = actual.get(field).unwrap_or(&Value::Null);
        match (op, field.as_str()) {
            ("swap_policy", "error_contains") => match (want, actual.get("error")) {
                (Value::String(w), Some(Value::String(e))) => e.contains(w.as_str()),
                _ => false,
            },
            ("inspect", "operations") => {
                let listed = got.as_array().cloned().unwrap_or_default();
                want.as_array().is_some_and(|wants| {
                    wants.iter().all(|w| {
                        listed.iter().any(|a| {
                            a.get("tenant") == w.get("tenant")
                                && a.get("key") == w.get("key")
                                && matches(w, a)
                        })
                    })
                })
            }
            ("dispatch", "expired") => {
                // Expiry order is not part of the contract.
                let sorted = |v: &Value| {
                    let mut xs: Vec<String> = v
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|x| json!({"tenant": x["tenant"], "key": x["key"]}).to_string())
                        .collect();
                    xs.sort();
                    xs
                };
                want.is_array() && sorted(want) == sorted(got)
            }
            _ => matches(want, got),
        }
    })
}

/// Partial matching: objects match on the keys expected, arrays element by element, numbers
/// by value or within `{"min", "max"}`, `null` against absent.
fn matches(want: &Value, got: &Value) -> bool {
    match want {
        Value::Object(w) if is_range(w) => {
            let Some(x) = got.as_f64() else { return false };
            w.get("min").and_then(Value::as_f64).is_none_or(|m| x >= m)
                && w.get("max").and_then(Value::as_f64).is_none_or(|m| x <= m)
        }
        Value::Object(w) => {
            got.is_object()
                && w.iter()
                    .all(|(k, v)| matches(v, got.get(k).unwrap_or(&Value::Null)))
        }
        Value::Array(w) => got
            .as_array()
            .is_some_and(|g| g.len() == w.len() && w.iter().zip(g).all(|(a, b)| matches(a, b))),
        Value::Number(n) => got.as_f64().is_some_and(|g| Some(g) == n.as_f64()),
        other => other == got,
    }
}

fn is_range(w: &Map<String, Value>) -> bool {
    !w.is_empty() && w.keys().all(|k| k == "min" || k == "max") && w.values().all(Value::is_number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_matching() {
        assert!(matches(&json!({"a": 1}), &json!({"a": 1.0, "b": 2})));
        assert!(!matches(&json!({"a": 1}), &json!({"b": 1})));
        assert!(matches(&json!({"min": 1, "max": 3}), &json!(3)));
        assert!(!matches(&json!({"min": 1, "max": 3}), &json!(4)));
        assert!(matches(&Value::Null, &Value::Null));
        assert!(!matches(&Value::Null, &json!(5)));
        assert!(!matches(&json!([1, 2]), &json!([1])));
    }
}
