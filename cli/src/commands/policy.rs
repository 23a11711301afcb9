//! `tollgate policy`: list the built-in policies, check a component as activation would,
//! and swap or roll back the policy of a running server.

use super::engine_with;
use std::path::PathBuf;
use std::process::ExitCode;
use tollgate::runtime::{builtin, Runtime};
use tollgate::scenario::ScenarioVerifier;
use tollgate::store::{AnyStore, SqliteStore};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Check a component as activation would (world, self-check, smoke decisions) and print its identity.
    Check {
        /// Built-in name or `.wasm` file.
        policy: String,
        #[arg(long)]
        config: Option<PathBuf>,
        /// Scenario files or folders the policy must pass (for scenarios that name no policy).
        #[arg(long)]
        verify_with: Vec<PathBuf>,
    },
    /// List the built-in policies with their identities.
    List,
    /// Activate a policy on a running `tollgate serve` (validated there; refused modules change nothing).
    Swap {
        /// Built-in name or `.wasm` file.
        policy: String,
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        /// An admin key of that server.
        #[arg(long, env = "TOLLGATE_ADMIN_KEY")]
        key: String,
    },
    /// Switch a running `tollgate serve` back to its previous policy.
    Rollback {
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        #[arg(long, env = "TOLLGATE_ADMIN_KEY")]
        key: String,
    },
}

pub fn run(command: Command) -> Result<ExitCode, String> {
    match command {
        Command::List => list(),
        Command::Check {
            policy,
            config,
            verify_with,
        } => check(&policy, config, &verify_with),
        Command::Swap {
            policy,
            server,
            key,
        } => {
            let bytes = builtin::resolve(&policy, None)?;
            let url = format!("{}/v1/admin/policy", server.trim_end_matches('/'));
            let response = ureq::put(&url)
                .set("Authorization", &format!("Bearer {key}"))
                .set("Content-Type", "application/wasm")
                .send_bytes(&bytes);
            print_admin_answer(response)
        }
        Command::Rollback { server, key } => {
            let url = format!("{}/v1/admin/policy/rollback", server.trim_end_matches('/'));
            let response = ureq::post(&url)
                .set("Authorization", &format!("Bearer {key}"))
                .call();
            print_admin_answer(response)
        }
    }
}

/// The built-in policies: what production may select.
fn list() -> Result<ExitCode, String> {
    let runtime = Runtime::new().map_err(|e| format!("starting wasmtime: {e:#}"))?;
    for name in builtin::names() {
        let bytes = builtin::get(name).unwrap();
        match runtime.load(bytes, u64::MAX) {
            Ok(p) => println!("{name}\t{}\t{}", p.info.version, p.digest),
            Err(e) => println!("{name}\trefused: {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check(
    policy: &str,
    config: Option<PathBuf>,
    verify_with: &[PathBuf],
) -> Result<ExitCode, String> {
    let file = super::load_config(config.as_deref())?;
    let store = SqliteStore::in_memory().map_err(|e| e.to_string())?;
    let engine = engine_with(file.engine, AnyStore::Sqlite(store), "standard")?;
    let bytes = builtin::resolve(policy, None)?;
    let verifier = ScenarioVerifier::new(verify_with.to_vec());
    let checked = engine
        .check_verified(&bytes, &verifier)
        .map_err(|e| e.to_string());
    match checked {
        Ok(p) => {
            if !verify_with.is_empty() {
                println!("verified against the scenarios in {verify_with:?}");
            }
            println!(
                "ok\t{}\t{}\t{}",
                p.info().name,
                p.info().version,
                p.digest()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("refused\t{e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn print_admin_answer(response: Result<ureq::Response, ureq::Error>) -> Result<ExitCode, String> {
    match response {
        Ok(r) => {
            println!("{}", r.into_string().unwrap_or_default());
            Ok(ExitCode::SUCCESS)
        }
        Err(ureq::Error::Status(code, r)) => {
            println!("{code} {}", r.into_string().unwrap_or_default());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.to_string()),
    }
}
