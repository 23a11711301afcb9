//! `tollgate simulate FILE --out DIR [--policy P]...`: runs a simulation file
//! (docs/simulation.md) through the real engine in logical time, once per variant and
//! policy on the same arrivals, and writes the summary, the plots and the report.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
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
    // Runs are independent (each its own engine and store): one thread per core.
    let results: Vec<Mutex<Option<Result<RunResult, String>>>> =
        plans.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(plans.len());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = plans.get(i) else { break };
                let result = simulate::run_plan(plan, &runtime, &fixtures);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            });
        }
    });
    let runs: Vec<RunResult> = results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err("a run did not finish".into()))
        })
        .collect::<Result<_, _>>()?;
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
