//! `tollgate simulate`: a discrete-event simulation in logical time that drives the real
//! engine, store and policy with generated or recorded load, a modelled provider, workers
//! and callers (docs/simulation.md).
//!
//! - [`file`]: the simulation file, read strictly.
//! - [`arrivals`]: the load, generated once per file and seed so that every run compared
//!   sees the same requests.
//! - [`run`]: the event loop over one engine.
//! - `deployment`: a provider deployment with limits of its own, as the run enforces it.
//! - `recorder`: the run's books, kept as the loop goes and closed into its summary.
//! - [`summary`]: what a run measured, the fairness measures included.
//!
//! Drawing (plots, the HTML report) belongs to the command line; this module only
//! computes.

pub mod arrivals;
mod deployment;
mod events;
pub mod file;
mod recorder;
mod rng;
pub mod run;
pub mod summary;

pub use arrivals::Load;
pub use file::Simulation;
pub use run::RunResult;

use crate::config::ConfigFile;
use crate::runtime::{Decider, Runtime};
use crate::scenario::resolve_policy;
use crate::store::SqliteStore;
use crate::Engine;
use std::path::Path;
use std::sync::Arc;

/// One run to make: a variant of the simulation with a policy.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The run's name in the report.
    pub name: String,
    /// The simulation as the variant makes it.
    pub sim: Simulation,
    /// Its configuration, read and checked.
    pub config: ConfigFile,
    /// The policy: a built-in name or a `.wasm` path.
    pub policy: String,
}

/// The runs of `sim`: every variant (or the file as written) with every policy of
/// `policies` (or the configuration's own), in that order.
pub fn plans(sim: &Simulation, policies: &[String]) -> Result<Vec<Plan>, String> {
    let variants: Vec<(Option<String>, Simulation)> = if sim.variants.is_empty() {
        vec![(None, sim.clone())]
    } else {
        sim.variants
            .iter()
            .map(|v| Ok((Some(v.name.clone()), sim.with_variant(v)?)))
            .collect::<Result<_, String>>()?
    };
    let mut out = Vec::new();
    for (variant, sim) in variants {
        let file = ConfigFile::from_json(&sim.config).map_err(|e| match &variant {
            Some(v) => format!("variants.{v}: config: {e}"),
            None => format!("config: {e}"),
        })?;
        let specs: Vec<String> = if policies.is_empty() {
            vec![file.policy.clone()]
        } else {
            policies.to_vec()
        };
        for spec in specs {
            let name = match (&variant, policies.len() > 1) {
                (Some(v), true) => format!("{v} · {spec}"),
                (Some(v), false) => v.clone(),
                (None, _) => spec.clone(),
            };
            out.push(Plan {
                name,
                sim: sim.clone(),
                config: file.clone(),
                policy: spec,
            });
        }
    }
    Ok(out)
}

/// Makes one run of `plan`: its load generated from its seed, a fresh in-memory store,
/// the policy loaded by `runtime` (a test fixture's name found in `fixtures`).
pub fn run_plan(plan: &Plan, runtime: &Runtime, fixtures: &Path) -> Result<RunResult, String> {
    let sim = &plan.sim;
    let load = Load::generate(sim)?;
    let bytes = resolve_policy(&plan.policy, sim.path.parent(), fixtures)?;
    let policy: Arc<dyn Decider> = Arc::new(
        runtime
            .load(&bytes, plan.config.engine.policy_limits())
            .map_err(|e| format!("policy {}: {e}", plan.policy))?,
    );
    let store = SqliteStore::in_memory_file().map_err(|e| e.to_string())?;
    let engine = Engine::new(plan.config.engine.clone(), store, runtime.clone(), policy);
    run::run(sim, &load, &engine, &plan.name)
}
