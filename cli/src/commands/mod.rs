//! The subcommands, one module each, and what they share: how a command opens an engine
//! from the configuration file, a store and a policy.

pub mod conformance;
pub mod directory;
pub mod inspect;
pub mod policy;
pub mod serve;
pub mod simulate;

use std::path::PathBuf;
use std::sync::Arc;
use tollgate::config::{Config, ConfigFile};
use tollgate::runtime::builtin;
use tollgate::store::{AnyStore, SqliteStore};
use tollgate::Engine;

/// Where a command finds its engine: the configuration file, the store and the policy.
#[derive(clap::Args)]
pub struct EngineArgs {
    /// Configuration file (the same file `serve` reads, docs/configuration.md); default:
    /// the defaults with no tenants.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// SQLite database file (created if missing) or `postgres://` URL; default: a private in-memory store.
    #[arg(long)]
    pub db: Option<String>,
    /// Built-in policy name or `.wasm` file; default: the configuration's `policy`.
    #[arg(long)]
    pub policy: Option<String>,
}

/// The configuration file at `path`, or the defaults with no tenants.
pub fn load_config(path: Option<&std::path::Path>) -> Result<ConfigFile, String> {
    match path {
        Some(path) => ConfigFile::load(path),
        None => ConfigFile::from_json(&serde_json::json!({})),
    }
    .map_err(|e| e.to_string())
}

/// An engine on the store and policy `args` name.
pub fn open_engine(args: &EngineArgs) -> Result<Engine<AnyStore>, String> {
    let file = load_config(args.config.as_deref())?;
    let store = match &args.db {
        Some(db) => AnyStore::open(db),
        None => SqliteStore::in_memory().map(AnyStore::Sqlite),
    }
    .map_err(|e| e.to_string())?;
    let spec = args.policy.as_deref().unwrap_or(&file.policy);
    let engine = engine_with(file.engine, store, spec)?;
    // A store a server wrote has its own tenants: those are the ones in force.
    engine.sync_directory().map_err(|e| e.to_string())?;
    Ok(engine)
}

/// An engine on `store` deciding with the policy `spec` (a built-in name or a `.wasm` path).
pub fn engine_with(
    config: Config,
    store: AnyStore,
    spec: &str,
) -> Result<Engine<AnyStore>, String> {
    let runtime = tollgate_cli::runtime::runtime()?;
    let bytes = builtin::resolve(spec, None)?;
    let policy = runtime
        .load(&bytes, config.policy_limits())
        .map_err(|e| e.to_string())?;
    Ok(Engine::new(config, store, runtime, Arc::new(policy)))
}

/// Milliseconds since the Unix epoch.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
