//! Running a scenario: each step against a fresh engine on an in-memory store (or against
//! writer shards' engines on one shared store), its answer matched against the step's
//! `expect` (partially: the fields named, numbers by value or range).

use super::{default_fixtures, resolve_policy, Op, Scenario, ScenarioError, Step};
use crate::engine::{
    frees_at, given_up, waiter_for, waits_for, Completion, Engine, Reconciliation, WaitingRoom,
};
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
        let mut waiting = Waiting::default();
        for (i, step) in s.steps.iter().enumerate() {
            let failed = |m: String| self.err(s, format!("step {i}: {m}"));
            // Time passes to this step: waiting calls whose give-up or refill comes first.
            waiting
                .settle(&engines, s, step.at_ms, &mut mismatches)
                .map_err(failed)?;
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
            if let Op::Admit(a) = &step.op {
                if let Some(max_wait) = a.request.get("max_wait_ms") {
                    let Some(max_wait) = max_wait.as_u64() else {
                        return Err(failed("max_wait_ms is a whole number of ms".into()));
                    };
                    let waited = waiting.admit(engine, s, i, &a.request, max_wait, step.at_ms);
                    if let Some(actual) = waited.map_err(failed)? {
                        check(step, i, actual, &mut mismatches);
                    }
                    continue;
                }
            }
            let actual = self.step(engine, step, base).map_err(failed)?;
            waiting.saw(step, &actual);
            if matches!(step.op, Op::Complete(_) | Op::Reconcile(_)) {
                waiting
                    .serve(&engines, s, step.at_ms, true, &mut mismatches)
                    .map_err(failed)?;
            }
            if matches!(step.op, Op::SwapPolicy(_)) {
                for other in &engines[1..] {
                    other.sync_policy().map_err(|e| failed(e.to_string()))?;
                }
            }
            check(step, i, actual, &mut mismatches);
        }
        // A call still waiting at the end was never answered.
        for i in waiting.left() {
            let step = &s.steps[i];
            if let Some(expect) = &step.expect {
                mismatches.push(Mismatch {
                    step: i,
                    op: step.op_name.clone(),
                    expected: Value::Object(expect.clone()),
                    actual: json!({"waiting": true}),
                });
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
            Op::Advance => Ok(json!({})),
        }
    }
}

/// Matches a step's answer against its `expect`, if it has one.
fn check(step: &Step, i: usize, actual: Value, mismatches: &mut Vec<Mismatch>) {
    if let Some(expect) = &step.expect {
        if !matches_expect(&step.op_name, expect, &actual) {
            mismatches.push(Mismatch {
                step: i,
                op: step.op_name.clone(),
                expected: Value::Object(expect.clone()),
                actual,
            });
        }
    }
}

/// The waiting room of a scenario, on its logical clock: an `admit` step whose request has
/// `max_wait_ms` waits, as a gateway call does in `tollgate serve`, in the engine's
/// [`WaitingRoom`]; its answer is matched when it comes (with `waited_ms` and
/// `answered_at_ms`, the logical time it was answered).
#[derive(Default)]
struct Waiting {
    room: WaitingRoom<Parked>,
}

/// A waiting `admit` step: its index and its request (without `max_wait_ms`).
struct Parked {
    step: usize,
    request: Value,
}

impl Waiting {
    /// Runs an admit step that may wait: its answer now, or `None` while it waits.
    fn admit<S: Store>(
        &mut self,
        engine: &Engine<S>,
        s: &Scenario,
        step: usize,
        raw: &Value,
        max_wait_ms: u64,
        now: i64,
    ) -> Result<Option<Value>, String> {
        let mut request = raw.clone();
        if let Some(obj) = request.as_object_mut() {
            obj.remove("max_wait_ms");
        }
        let checked = crate::validate::parse(&request, &s.config);
        let behind = checked.as_ref().is_ok_and(|r| {
            r.route == crate::model::Route::Interactive
                && self.room.would_pass(r.model.as_deref(), r.priority)
        });
        let model = checked.as_ref().ok().and_then(|r| r.model.clone());
        let d = if let Some(last) = self.room.refusal_for(model.as_deref()).filter(|_| behind) {
            last.clone()
        } else {
            let d = engine.admit(&request, now).map_err(|e| e.to_string())?;
            let interactive = checked
                .as_ref()
                .is_ok_and(|r| r.route == crate::model::Route::Interactive);
            if !interactive || !waits_for(&d) || !s.config.waiting.enabled {
                if d.authorises_call() {
                    if let Ok(r) = &checked {
                        self.room.started(&r.tenant);
                    }
                }
                return Ok(Some(answered(&d, now)));
            }
            d
        };
        let Ok(r) = checked else {
            return Ok(Some(answered(&d, now)));
        };
        let (per_tenant, total) = crate::engine::waiting_bounds(&s.config, &r.tenant, 1);
        let parked = Parked { step, request };
        match waiter_for(&s.config, &r, d, (now, r.deadline_ms), max_wait_ms, parked) {
            Err((_, d)) => Ok(Some(answered(&d, now))),
            Ok(w) => match self.room.enter(w, per_tenant, total) {
                Ok(_) => Ok(None),
                Err((w, full)) => {
                    let mut d =
                        crate::engine::Decision::rejected(crate::reason::Reason::QueueFull, None);
                    d.message = Some(full.message(&w.tenant));
                    Ok(Some(answered(&d, now)))
                }
            },
        }
    }

    /// Counts the calls a step started and ended, for the room's order.
    fn saw(&mut self, step: &Step, actual: &Value) {
        match &step.op {
            Op::Admit(a) if actual["outcome"] == "accepted" => {
                if let Some(t) = a.request.get("tenant").and_then(Value::as_str) {
                    self.room.started(t);
                }
            }
            Op::Complete(c)
                if actual["ok"] == true && c.result != crate::model::CallResult::Unknown =>
            {
                self.room.ended(&c.tenant)
            }
            Op::Reconcile(r) if actual["ok"] == true => self.room.ended(&r.tenant),
            _ => {}
        }
    }

    /// Answers what comes due up to `until`, in time order: give-ups, and refills (the
    /// calls they may let in are tried at that time).
    fn settle<S: Store>(
        &mut self,
        engines: &[Engine<S>],
        s: &Scenario,
        until: i64,
        mismatches: &mut Vec<Mismatch>,
    ) -> Result<(), String> {
        let mut now = i64::MIN;
        while let Some(at) = self.room.next_due(now).filter(|at| *at <= until) {
            for w in self.room.due(at) {
                let (d, _) = given_up(&w, at);
                check(
                    &s.steps[w.payload.step],
                    w.payload.step,
                    answered(&d, at),
                    mismatches,
                );
            }
            self.serve(engines, s, at, false, mismatches)?;
            now = at;
        }
        Ok(())
    }

    /// Tries the waiting calls in the room's order at `now` (every tenant's first when
    /// something was `freed`), round after round while some are admitted.
    fn serve<S: Store>(
        &mut self,
        engines: &[Engine<S>],
        s: &Scenario,
        now: i64,
        freed: bool,
        mismatches: &mut Vec<Mismatch>,
    ) -> Result<(), String> {
        loop {
            let mut admitted = 0;
            for id in self.room.candidates(now, usize::MAX, freed) {
                let Some(w) = self.room.get_mut(id) else {
                    continue;
                };
                let engine = &engines[shard_of(&w.tenant, engines.len())];
                let d = engine
                    .admit(&w.payload.request, now)
                    .map_err(|e| e.to_string())?;
                if waits_for(&d) {
                    w.retry_at_ms = frees_at(&d, now);
                    w.last = d;
                    continue;
                }
                let w = self.room.take(id).expect("found above");
                let mut d = d;
                d.waited_ms = Some((now - w.entered_ms).max(0) as u64);
                if d.authorises_call() {
                    self.room
                        .admitted(&w, d.reserved_tokens.unwrap_or(w.tokens));
                    self.room.started(&w.tenant);
                    admitted += 1;
                }
                let step = w.payload.step;
                check(&s.steps[step], step, answered(&d, now), mismatches);
            }
            if admitted == 0 {
                return Ok(());
            }
        }
    }

    /// The steps still waiting, in order.
    fn left(&mut self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .room
            .drain()
            .into_iter()
            .map(|w| w.payload.step)
            .collect();
        out.sort_unstable();
        out
    }
}

/// An answer as a scenario sees it: the decision, with the logical time it was given.
fn answered(d: &crate::engine::Decision, now: i64) -> Value {
    let mut v = json!(d);
    v["answered_at_ms"] = json!(now);
    v
}

/// The tenant a step acts for, if it acts for one.
fn step_tenant(op: &Op) -> Option<&str> {
    match op {
        Op::Admit(a) => a.request.get("tenant").and_then(Value::as_str),
        Op::Complete(c) => Some(&c.tenant),
        Op::Reconcile(r) => Some(&r.tenant),
        Op::Dispatch(_) | Op::SetDownstream(_) | Op::SwapPolicy(_) | Op::Inspect | Op::Advance => {
            None
        }
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
