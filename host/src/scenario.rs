//! Scenario files (docs/scenarios.md): a configuration, a policy and steps in logical time,
//! each with an optional `expect`. Files are read strictly: an unknown field anywhere is an
//! error of the file, so a typo in a fixture cannot pass silently.

use crate::config::Config;
use crate::engine::{Completion, Engine, Reconciliation, Verifier};
use crate::model::{CallResult, Resolution, Usage};
use crate::runtime::{builtin, Decider, Runtime};
use crate::store::{SqliteStore, Store};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A scenario file that cannot be run as written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ScenarioError {
    /// The file.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    policy: Option<String>,
    steps: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdmitArgs {
    request: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteArgs {
    tenant: String,
    key: String,
    result: CallResult,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    failure: Option<String>,
    #[serde(default)]
    provider_retry_after_ms: Option<u64>,
    #[serde(default)]
    result_ref: Option<String>,
    #[serde(default)]
    attempt: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileArgs {
    tenant: String,
    key: String,
    resolution: Resolution,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    result_ref: Option<String>,
    #[serde(default)]
    attempt: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DispatchArgs {
    worker: String,
    count: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DownstreamArgs {
    available: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwapArgs {
    policy: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// The `expect` fields each op may name.
fn expect_fields(op: &str) -> &'static [&'static str] {
    match op {
        "admit" => &[
            "outcome",
            "reason",
            "http",
            "retry_after_ms",
            "attempt",
            "reserved_tokens",
            "max_output_tokens",
            "optional_context_tokens",
            "degraded",
            "state",
            "result_ref",
            "message",
            "policy_message",
            "limit",
            "requested",
            "available",
        ],
        "complete" => &["ok", "error", "retry"],
        "reconcile" => &["ok", "error"],
        "dispatch" => &[
            "claimed",
            "claimed_count",
            "claimed_by_tenant",
            "expired",
            "reason",
        ],
        "swap_policy" => &["ok", "error_contains"],
        "inspect" => &["buckets", "slots", "queues", "operations"],
        _ => &[],
    }
}

/// One parsed step.
#[derive(Debug)]
enum Op {
    Admit(AdmitArgs),
    Complete(CompleteArgs),
    Reconcile(ReconcileArgs),
    Dispatch(DispatchArgs),
    SetDownstream(DownstreamArgs),
    SwapPolicy(SwapArgs),
    Inspect,
}

#[derive(Debug)]
struct Step {
    at_ms: i64,
    op_name: String,
    op: Op,
    expect: Option<Map<String, Value>>,
}

/// A parsed scenario, ready to run.
#[derive(Debug)]
pub struct Scenario {
    /// The scenario's name.
    pub name: String,
    /// Where it was read from.
    pub path: PathBuf,
    config: Config,
    policy: Option<String>,
    steps: Vec<Step>,
}

fn args<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

impl Scenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let err = |message: String| ScenarioError {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: File = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        let config = Config::from_json(&file.config.unwrap_or_else(|| json!({})))
            .map_err(|e| err(e.to_string()))?;
        let mut steps = Vec::new();
        let mut last_at = i64::MIN;
        for (i, raw) in file.steps.into_iter().enumerate() {
            let step_err = |m: String| err(format!("step {i}: {m}"));
            let Value::Object(mut obj) = raw else {
                return Err(step_err("a step is an object".into()));
            };
            let at_ms = obj
                .remove("at_ms")
                .and_then(|v| v.as_i64())
                .ok_or_else(|| step_err("at_ms (integer) is required".into()))?;
            if at_ms < last_at {
                return Err(step_err("at_ms must not decrease".into()));
            }
            last_at = at_ms;
            let op_name = match obj.remove("op") {
                Some(Value::String(s)) => s,
                _ => return Err(step_err("op (string) is required".into())),
            };
            let expect = match obj.remove("expect") {
                None | Some(Value::Null) => None,
                Some(Value::Object(m)) => {
                    let allowed = expect_fields(&op_name);
                    if let Some(bad) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
                        return Err(step_err(format!(
                            "expect field {bad:?} is not one of {allowed:?} for {op_name}"
                        )));
                    }
                    Some(m)
                }
                Some(_) => return Err(step_err("expect is an object".into())),
            };
            let rest = Value::Object(obj);
            let op = match op_name.as_str() {
                "admit" => args(rest).map(Op::Admit),
                "complete" => args(rest).map(Op::Complete),
                "reconcile" => args(rest).map(Op::Reconcile),
                "dispatch" => args(rest).map(Op::Dispatch),
                "set_downstream" => args(rest).map(Op::SetDownstream),
                "swap_policy" => args(rest).map(Op::SwapPolicy),
                "inspect" => args::<NoArgs>(rest).map(|_| Op::Inspect),
                other => Err(format!("unknown op {other:?}")),
            }
            .map_err(step_err)?;
            steps.push(Step {
                at_ms,
                op_name,
                op,
                expect,
            });
        }
        Ok(Scenario {
            name: file.name,
            path: path.to_path_buf(),
            config,
            policy: file.policy,
            steps,
        })
    }
}

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

/// The folder of test fixture components (`policies/fixtures/`, built beside the binary's
/// own policies but not carried in it): `TOLLGATE_FIXTURES` when set, else where this build
/// wrote them.
pub fn default_fixtures() -> PathBuf {
    std::env::var_os("TOLLGATE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("TOLLGATE_BUILD_FIXTURES")))
}

/// Resolves a policy a scenario names: a built-in policy, a `.wasm` path (tried beside the
/// scenario file, then from the working directory), or a test fixture's name, read from
/// `fixtures`.
pub fn resolve_policy(spec: &str, base: Option<&Path>, fixtures: &Path) -> Result<Vec<u8>, String> {
    builtin::resolve(spec, base).or_else(|not_found| fixture(spec, fixtures).ok_or(not_found))
}

/// A test fixture's component by name (lower-case letters, digits and `-`: never a path).
fn fixture(name: &str, fixtures: &Path) -> Option<Vec<u8>> {
    let is_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    is_name
        .then(|| std::fs::read(fixtures.join(format!("{name}.wasm"))).ok())
        .flatten()
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
        let engine = Engine::new(s.config.clone(), store, self.runtime.clone(), policy);
        let mut mismatches = Vec::new();
        for (i, step) in s.steps.iter().enumerate() {
            let actual = self
                .step(&engine, step, base)
                .map_err(|m| self.err(s, format!("step {i}: {m}")))?;
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

/// Scenario files under `paths` (files as given, folders searched for `*.json`), sorted.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|e| format!("{}: {e}", p.display()))?;
            found.sort();
            out.extend(found);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(format!("{}: no such file or folder", p.display()));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// Runs scenario files against a candidate policy before it is activated (policy authors'
/// CI uses the same runner). Scenarios that do not name a policy use the candidate; those
/// that name a fixture keep it. Every failure is listed.
pub struct ScenarioVerifier {
    paths: Vec<PathBuf>,
}

impl ScenarioVerifier {
    /// Every scenario file under `paths` (none: every candidate passes).
    pub fn new(paths: Vec<PathBuf>) -> Self {
        ScenarioVerifier { paths }
    }
}

impl Verifier for ScenarioVerifier {
    fn verify(&self, runtime: &Runtime, candidate: Arc<dyn Decider>) -> Result<(), String> {
        if self.paths.is_empty() {
            return Ok(());
        }
        let files = collect(&self.paths)?;
        let mut runner = Runner::new(runtime.clone());
        runner.default_decider = Some(candidate);
        let mut failures = Vec::new();
        for file in &files {
            match Scenario::load(file).and_then(|s| runner.run(&s).map(|m| (s.name, m))) {
                Ok((_, m)) if m.is_empty() => {}
                Ok((name, m)) => failures.extend(m.iter().map(|m| format!("{name}: {m}"))),
                Err(e) => failures.push(e.to_string()),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} scenario step(s) failed against the candidate:\n{}",
                failures.len(),
                failures.join("\n")
            ))
        }
    }
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
