//! Scenario files (docs/scenarios.md): a configuration, a policy and steps in logical time,
//! each with an optional `expect`. Files are read strictly: an unknown field anywhere is an
//! error of the file, so a typo in a fixture cannot pass silently.
//!
//! This file reads a scenario; `runner` runs one and matches its answers; `files` finds
//! scenario files and the policies they name; `verifier` runs them against a candidate
//! policy before a swap.

mod files;
mod runner;
mod verifier;

pub use files::{collect, default_fixtures, resolve_policy};
pub use runner::{Mismatch, Runner};
pub use verifier::ScenarioVerifier;

use crate::config::Config;
use crate::model::{CallResult, Resolution, Usage};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

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
            "waited_ms",
            "answered_at_ms",
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
    /// Time passes to the step's `at_ms`: waiting calls whose time comes are answered.
    Advance,
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
                "advance" => args::<NoArgs>(rest).map(|_| Op::Advance),
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
