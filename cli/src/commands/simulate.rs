//! `tollgate simulate FILE --out DIR [--policy P]...`: runs a simulation file
//! (docs/simulation.md) through the real engine in logical time, once per variant and
//! policy on the same arrivals, and writes the summary, the plots and the report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use tollgate::scenario;
use tollgate::simulate::{self, RunResult, Simulation};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// The simulation file.
    pub file: PathBuf,
    /// Folder for `summary.json`, the SVG plots and `report.html` (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// A policy to run (built-in name or `.wasm` file); repeat to compare policies on the
    /// same arrivals. Default: the configuration's `policy`.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Folder of test fixture components a policy may name.
    #[arg(long)]
    pub fixtures: Option<PathBuf>,
}

pub fn run(args: SimulateArgs) -> Result<ExitCode, String> {
    let sim = Simulation::load(&args.file)?;
    let plans = simulate::plans(&sim, &args.policies)?;
    let runtime = tollgate_cli::runtime::runtime()?;
    let fixtures = args.fixtures.unwrap_or_else(scenario::default_fixtures);
    let started = std::time::Instant::now();
    // Runs are independent (each its own engine and store): one thread per core, each
    // taking the next plan until none is left.
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(plans.len());
    let mut done: Vec<(usize, Result<RunResult, String>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(plan) = plans.get(i) else { break mine };
                        mine.push((i, simulate::run_plan(plan, &runtime, &fixtures)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    if done.len() < plans.len() {
        return Err("a run did not finish".into());
    }
    done.sort_by_key(|(i, _)| *i);
    let runs: Vec<RunResult> = done.into_iter().map(|(_, r)| r).collect::<Result<_, _>>()?;
    let written = crate::report::write(&args.out, &sim, &runs)?;
    let offered: u64 = runs.iter().map(|r| r.summary.overall.offered).sum();
    println!(
        "{} run(s), {offered} requests simulated in {:.1} s",
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    for r in &runs {
        let o = &r.summary.overall;
        println!(
            "  {}: offered {}, completed {}, refused {}, expired {}, past deadline {}, Jain {}",
            r.summary.name,
            o.offered,
            o.completed,
            o.refused,
            o.expired,
            o.past_deadline,
            o.jain_fairness_tokens
                .map_or("-".into(), |j| format!("{j:.3}"))
        );
    }
    println!(
        "wrote {} files to {} (open report.html)",
        written.len(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
