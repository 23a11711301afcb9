//! The scenario files as a check on a policy swap: production code, handed to the engine's
//! swap as its [`Verifier`] (`--verify-with`), which itself knows nothing of scenario files.

use super::{collect, Runner, Scenario};
use crate::engine::Verifier;
use crate::runtime::{Decider, Runtime};
use std::path::PathBuf;
use std::sync::Arc;

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
