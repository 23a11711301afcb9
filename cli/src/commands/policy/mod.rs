//! `tollgate policy`: make, build and test a policy project; list the built-in policies,
//! check a component as activation would, and swap or roll back the policy of a running
//! server.

mod build;
mod scaffold;

use super::engine_with;
use std::path::PathBuf;
use std::process::ExitCode;
use tollgate::runtime::builtin;
use tollgate::scenario::ScenarioVerifier;
use tollgate::store::{AnyStore, SqliteStore};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a new policy project (SDK, world, an example rule, a scenario file, a README) into NAME.
    New {
        /// The project's folder; its last part names the policy.
        name: PathBuf,
        /// The policy's language: rust, python (componentize-py), typescript (tsc, then
        /// componentize-js) or javascript (componentize-js).
        #[arg(long, default_value = "rust")]
        lang: String,
    },
    /// Build a policy project into a component and print its path, size, world and SHA-256.
    Build {
        /// The project's folder.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Where to write the component (default: DIR/target/NAME.wasm).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
        /// Run the toolchain even when the sources, SDK and toolchain are those the
        /// component was built from.
        #[arg(long)]
        force: bool,
    },
    /// Check a policy as `policy check` does, then run scenario files with it, ending "N passed, M failed".
    Test {
        /// A project folder (built first) or a `.wasm` component.
        #[arg(default_value = ".")]
        target: PathBuf,
        /// Scenario files or folders (default: the project's `scenarios/`).
        scenarios: Vec<PathBuf>,
        /// The configuration the checks run with (default: the defaults).
        #[arg(long)]
        config: Option<PathBuf>,
    },
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
        Command::New { name, lang } => {
            let written = scaffold::new_project(&name, &lang)?;
            for path in written {
                println!("{path}");
            }
            println!(
                "next: tollgate policy build {0} && tollgate policy test {0}",
                name.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Build { dir, out, force } => {
            let reuse = if force {
                build::Reuse::Never
            } else {
                build::Reuse::WhenUnchanged
            };
            build::build(&dir, out.as_deref(), reuse)?.print();
            Ok(ExitCode::SUCCESS)
        }
        Command::Test {
            target,
            scenarios,
            config,
        } => test(&target, scenarios, config),
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
            super::directory::answer(response)
        }
        Command::Rollback { server, key } => {
            let url = format!("{}/v1/admin/policy/rollback", server.trim_end_matches('/'));
            let response = ureq::post(&url)
                .set("Authorization", &format!("Bearer {key}"))
                .call();
            super::directory::answer(response)
        }
    }
}

/// The built-in policies: what production may select.
fn list() -> Result<ExitCode, String> {
    let runtime = tollgate_cli::runtime::runtime()?;
    for name in builtin::names() {
        let bytes = builtin::get(name).unwrap();
        match runtime.load(bytes, tollgate::runtime::PolicyLimits::DEFAULT.any_size()) {
            Ok(p) => println!(
                "{name}\t{}\tworld {}\t{}",
                p.info.version, p.world, p.digest
            ),
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
            let world = p.world().map_or("native".into(), |w| w.to_string());
            println!(
                "ok\t{}\t{}\tworld {world}\t{}",
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

/// `policy test`: the checks of `policy check`, then the scenarios, counted together.
fn test(
    target: &std::path::Path,
    mut scenarios: Vec<PathBuf>,
    config: Option<PathBuf>,
) -> Result<ExitCode, String> {
    let component = if target.is_dir() {
        let built = build::build(target, None, build::Reuse::WhenUnchanged)?;
        built.print();
        if scenarios.is_empty() && target.join("scenarios").is_dir() {
            scenarios.push(target.join("scenarios"));
        }
        built.path
    } else {
        target.to_path_buf()
    };
    let component =
        std::fs::canonicalize(&component).map_err(|e| format!("{}: {e}", component.display()))?;
    let bytes = std::fs::read(&component).map_err(|e| format!("{}: {e}", component.display()))?;
    let (mut passed, mut failed) = (0, 0);
    let file = super::load_config(config.as_deref())?;
    let store = SqliteStore::in_memory().map_err(|e| e.to_string())?;
    let engine = engine_with(file.engine, AnyStore::Sqlite(store), "standard")?;
    match engine.check_candidate(&bytes) {
        Ok(_) => passed += 1,
        Err(e) => {
            failed += 1;
            println!("FAIL policy check: {e}");
        }
    }
    let files = tollgate::scenario::collect(&scenarios)?;
    let runtime = tollgate_cli::runtime::runtime()?;
    let mut runner = tollgate::scenario::Runner::new(runtime);
    runner.default_policy = component.display().to_string();
    let (p, f) = super::conformance::run_files(&runner, files, None, 1);
    println!("{} passed, {} failed", passed + p, failed + f);
    Ok(if failed + f == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
