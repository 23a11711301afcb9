//! `tollgate conformance run`: scenario files against the engine, on in-memory SQLite or
//! on PostgreSQL, ending with "N passed, M failed".

use std::path::PathBuf;
use std::process::ExitCode;
use tollgate::scenario::{self, Runner, Scenario};
use tollgate::store::{PgStore, SharedStore, SqliteStore};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Run scenario files, or every `*.json` under folders.
    Run {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Policy (built-in name or `.wasm` file) for scenarios that do not name one.
        #[arg(long, default_value = "standard")]
        policy: String,
        /// A `postgres://` URL to run every scenario against PostgreSQL (each in a fresh
        /// schema of its own); default: a private in-memory SQLite store per scenario.
        #[arg(long)]
        db: Option<String>,
        /// Folder of test fixture components that scenarios may name (default: the
        /// `TOLLGATE_FIXTURES` variable, else the folder this build wrote them to).
        #[arg(long)]
        fixtures: Option<PathBuf>,
        /// Writer shards sharing the store, as `serve --writers N` runs them: each tenant's
        /// steps go to one; on PostgreSQL the budgets tenants share are leased between
        /// them, on SQLite the shards take turns on one connection.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
        writers: u16,
    },
}

pub fn run(command: Command) -> Result<ExitCode, String> {
    let Command::Run {
        paths,
        policy,
        db,
        fixtures,
        writers,
    } = command;
    let runtime = tollgate_cli::runtime::runtime()?;
    let files = scenario::collect(&paths)?;
    let mut runner = Runner::new(runtime);
    runner.default_policy = policy;
    if let Some(dir) = fixtures {
        runner.fixtures = dir;
    }
    if let Some(db) = &db {
        if !tollgate::store::is_postgres_url(db) {
            return Err(format!(
                "--db {db}: conformance runs take a postgres:// URL (SQLite runs in memory)"
            ));
        }
    }
    let (passed, failed) = run_files(&runner, files, db.as_deref(), usize::from(writers));
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs scenario files, printing each failure, and counts them: `(passed, failed)`. With a
/// `db`, each scenario runs on `writers` engines sharing a fresh schema of its own; without,
/// on `writers` engines sharing one private SQLite store.
pub fn run_files(
    runner: &Runner,
    files: Vec<PathBuf>,
    db: Option<&str>,
    writers: usize,
) -> (u32, u32) {
    let (mut passed, mut failed) = (0, 0);
    for (i, file) in files.into_iter().enumerate() {
        let outcome = Scenario::load(&file).and_then(|s| {
            let failed = |e: tollgate::store::StoreError| tollgate::scenario::ScenarioError {
                path: file.display().to_string(),
                message: e.to_string(),
            };
            let mismatches = match db {
                Some(url) => {
                    let schema = format!("tollgate_conformance_{}_{i}", std::process::id());
                    let mut stores = vec![PgStore::open_scratch(url, &schema).map_err(failed)?];
                    for _ in 1..writers.max(1) {
                        stores.push(PgStore::open_in_schema(url, &schema).map_err(failed)?);
                    }
                    runner.run_on_shards(&s, stores)?
                }
                None if writers > 1 => {
                    let store = SqliteStore::in_memory_file().map_err(failed)?;
                    runner.run_on_shards(&s, SharedStore::split(store, writers))?
                }
                None => runner.run(&s)?,
            };
            Ok((s.name, mismatches))
        });
        match outcome {
            Ok((_, mismatches)) if mismatches.is_empty() => passed += 1,
            Ok((name, mismatches)) => {
                failed += 1;
                for m in mismatches {
                    println!("FAIL {name} ({}) {m}", file.display());
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {e}");
            }
        }
    }
    (passed, failed)
}
