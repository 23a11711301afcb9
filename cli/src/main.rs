//! The `tollgate` command line: one module per subcommand under `cli/`.

mod commands;
mod report;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Requests allocate many small blocks on the runtime's threads that the writer thread
/// frees, and the writer allocates for every decision: mimalloc is markedly cheaper at both
/// than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Admission control and fair scheduling for expensive provider calls"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Conformance scenarios (docs/scenarios.md).
    Conformance {
        #[command(subcommand)]
        command: commands::conformance::Command,
    },
    /// Decide one admission read as JSON from standard input, and print the decision.
    Decide(commands::inspect::DecideArgs),
    /// Queue depth per tenant in a store.
    Queue {
        #[command(flatten)]
        engine: commands::EngineArgs,
    },
    /// Operations in a store, with the hash of the policy that decided each.
    Ops {
        #[command(flatten)]
        engine: commands::EngineArgs,
    },
    /// Spend in a store's ledger, summed by tenant, group, model or day (JSON, or CSV).
    Spend(commands::inspect::SpendArgs),
    /// Serve the engine over HTTP (docs/http-api.md) until SIGTERM or SIGINT.
    Serve(commands::serve::ServeArgs),
    /// Tenants of a running server: list, get, put (create or change), delete.
    Tenants {
        #[command(subcommand)]
        command: commands::directory::TenantsCommand,
    },
    /// Keys of a running server: create (shown once), list, revoke.
    Keys {
        #[command(subcommand)]
        command: commands::directory::KeysCommand,
    },
    /// Simulate load, provider and callers through the real engine in logical time, and
    /// write a summary, plots and a report (docs/simulation.md).
    Simulate(commands::simulate::SimulateArgs),
    /// Policy components: list, check, and swap or roll back on a running server.
    Policy {
        #[command(subcommand)]
        command: commands::policy::Command,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Conformance { command } => commands::conformance::run(command),
        Command::Decide(args) => commands::inspect::decide(args),
        Command::Queue { engine } => commands::inspect::queue(&engine),
        Command::Ops { engine } => commands::inspect::ops(&engine),
        Command::Spend(args) => commands::inspect::spend(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Simulate(args) => commands::simulate::run(args),
        Command::Policy { command } => commands::policy::run(command),
        Command::Tenants { command } => commands::directory::tenants(command),
        Command::Keys { command } => commands::directory::keys(command),
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("tollgate: {message}");
            ExitCode::from(2)
        }
    }
}
