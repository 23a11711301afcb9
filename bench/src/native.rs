//! Deciders that run as ordinary Rust instead of wasm, through the same interface
//! ([`Decider`]): the standard rules compiled from the guest SDK's own source
//! (`guest/src/standard.rs`), and a fixed decision that asks nothing (the store's floor).
//! They exist to measure the sandbox's cost; the service always runs wasm policies.

use std::cell::RefCell;
use tollgate::runtime::{
    Admission, BucketKind, BucketLevel, Decider, DecisionView, FailureReport, Plan, PolicyDigest,
    PolicyFault, PolicyInfo, Request, RetryDecision, SlotLevel, SlotScope,
};

// The names `standard.rs` imports from its parent module.
#[allow(unused_imports)]
use tollgate::runtime::{Failure, GiveUpReason, LogLevel, Priority, Refusal, RefusalReason, Route};

/// The host imports, served from the decision's view (set for the length of one call).
/// Every import of the world is here, whether or not the standard rules use it.
#[allow(dead_code)]
pub mod host {
    use super::*;

    thread_local! {
        pub(super) static VIEW: RefCell<Option<DecisionView>> = const { RefCell::new(None) };
    }

    fn with<T>(f: impl FnOnce(&mut DecisionView) -> T) -> T {
        VIEW.with(|v| {
            f(v.borrow_mut()
                .as_mut()
                .expect("a native decision is running"))
        })
    }

    pub fn now_ms() -> i64 {
        with(|v| v.now_ms)
    }

    pub fn param(name: &str) -> Option<f64> {
        with(|v| v.params.numbers.get(name).copied())
    }

    pub fn param_string(name: &str) -> Option<String> {
        with(|v| v.params.strings.get(name).cloned())
    }

    pub fn log(_level: LogLevel, _message: &str) {}

    pub fn tenant_weight() -> u32 {
        with(|v| v.weight)
    }

    pub fn bucket(kind: BucketKind) -> Option<BucketLevel> {
        with(|v| v.bucket(kind))
    }

    pub fn slots(scope: SlotScope) -> Option<SlotLevel> {
        with(|v| v.slots(scope))
    }

    pub fn random(upper: u64) -> u64 {
        with(|v| v.jitter.below_inclusive(upper))
    }
}

#[path = "../../guest/src/standard.rs"]
#[allow(dead_code, clippy::all)]
pub mod standard;

fn with_view<T>(view: DecisionView, f: impl FnOnce() -> T) -> T {
    host::VIEW.with(|v| *v.borrow_mut() = Some(view));
    let out = f();
    host::VIEW.with(|v| *v.borrow_mut() = None);
    out
}

/// The standard rules, compiled natively.
pub struct NativeStandard {
    digest: PolicyDigest,
    info: PolicyInfo,
}

impl Default for NativeStandard {
    fn default() -> Self {
        NativeStandard {
            digest: PolicyDigest::of(b"native:standard"),
            info: PolicyInfo {
                name: "standard (native)".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
        }
    }
}

impl Decider for NativeStandard {
    fn digest(&self) -> &PolicyDigest {
        &self.digest
    }
    fn info(&self) -> &PolicyInfo {
        &self.info
    }
    fn admit(&self, view: DecisionView, req: &Request) -> Result<Admission, PolicyFault> {
        Ok(with_view(view, || standard::admit(req)))
    }
    fn on_failure(
        &self,
        view: DecisionView,
        report: &FailureReport,
    ) -> Result<RetryDecision, PolicyFault> {
        Ok(with_view(view, || standard::on_failure(report)))
    }
    fn self_check(&self, view: DecisionView) -> Result<Result<(), String>, PolicyFault> {
        Ok(with_view(view, standard::self_check))
    }
}

/// Admits every request exactly as asked: no policy work at all.
pub struct Fixed {
    digest: PolicyDigest,
    info: PolicyInfo,
}

impl Default for Fixed {
    fn default() -> Self {
        Fixed {
            digest: PolicyDigest::of(b"native:fixed"),
            info: PolicyInfo {
                name: "fixed".into(),
                version: "0".into(),
            },
        }
    }
}

impl Decider for Fixed {
    fn digest(&self) -> &PolicyDigest {
        &self.digest
    }
    fn info(&self) -> &PolicyInfo {
        &self.info
    }
    fn admit(&self, _view: DecisionView, req: &Request) -> Result<Admission, PolicyFault> {
        Ok(Admission::Admit(Plan {
            max_output_tokens: req.max_output_tokens,
            optional_context_tokens: req.optional_context_tokens,
            estimated_exec_ms: 0,
            busy_retry_after_ms: None,
        }))
    }
    fn on_failure(
        &self,
        view: DecisionView,
        _report: &FailureReport,
    ) -> Result<RetryDecision, PolicyFault> {
        Ok(RetryDecision::Retry(view.now_ms))
    }
    fn self_check(&self, _view: DecisionView) -> Result<Result<(), String>, PolicyFault> {
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use tollgate::runtime::Runtime;
    use tollgate::scenario::{collect, Runner, Scenario};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    #[test]
    fn native_build_of_the_standard_rules_passes_the_same_scenarios() {
        // The same `standard.rs`, compiled natively: the benchmark's native figure measures
        // the very rules the wasm policy runs.
        let mut runner = Runner::new(Runtime::new().unwrap());
        runner.default_decider = Some(std::sync::Arc::new(NativeStandard::default()));
        let mut folders = vec![root().join("tests/scenarios")];
        if root().join("../shared/scenarios").is_dir() {
            folders.push(root().join("../shared/scenarios"));
        }
        let mut failures = Vec::new();
        for file in collect(&folders).unwrap() {
            match Scenario::load(&file).and_then(|s| runner.run(&s)) {
                Ok(m) => failures.extend(m.iter().map(|m| format!("{}: {m}", file.display()))),
                Err(e) => failures.push(e.to_string()),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
