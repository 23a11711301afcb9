//! Starting an engine the way `tollgate serve` does: the policy loaded and checked, the
//! store's own policy and directory taken up. A program that embeds the engine on a store
//! that outlives it uses this rather than [`Engine::new`], so that a swap made earlier
//! survives its restart, and its replicas agree with each other.

use super::{Adopted, DirectoryApplied, DirectoryError, Engine, NoVerifier, SwapError, Verifier};
use crate::config::ConfigFile;
use crate::runtime::{builtin, Runtime};
use crate::store::{Store, StoreError};
use std::sync::Arc;

/// Why an engine could not start; nothing was written to the store before a policy or a
/// runtime failure.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// wasmtime could not start.
    #[error("starting wasmtime: {0}")]
    Runtime(String),
    /// The configured policy could not be found, loaded, or did not pass its checks.
    #[error("policy {name}: {message}")]
    Policy {
        /// The policy as the configuration names it.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The store's policy could not be read or taken up.
    #[error("the store's policy: {0}")]
    StoredPolicy(#[source] SwapError),
    /// The configuration's tenants and keys could not be applied.
    #[error("applying the configuration's tenants and keys: {0}")]
    Directory(#[source] DirectoryError),
    /// The store could not be asked whether other engines share it.
    #[error("the store: {0}")]
    Store(#[source] StoreError),
}

/// A started engine, and what its start found in the store.
pub struct Started<S: Store> {
    /// The engine, ready to serve.
    pub engine: Engine<S>,
    /// Whose policy is active: the configuration's, or one swapped in earlier and kept by
    /// the store.
    pub adopted: Adopted,
    /// The configuration's tenants and keys, as applied beside those the store has.
    pub applied: DirectoryApplied,
}

/// Starts an engine from a configuration file, as `tollgate serve` starts:
///
/// 1. the runtime (yours, or a default one) loads the configuration's policy (or the one
///    given), within the configuration's limits;
/// 2. the policy passes the checks a swapped-in one must pass, the verifier's included;
/// 3. the store's policy wins over the file's when the file's is unchanged since the last
///    start (a swap survives restarts; replicas agree);
/// 4. the file's tenants and keys are applied beside those made through the admin API.
///
/// ```
/// use tollgate::config::ConfigFile;
/// use tollgate::engine::EngineBuilder;
/// use tollgate::store::SqliteStore;
///
/// let file = ConfigFile::from_json(&serde_json::json!({"tenants": {"acme": {}}})).unwrap();
/// let started = EngineBuilder::new(file)
///     .start(SqliteStore::in_memory().unwrap(), 0)
///     .unwrap();
/// assert_eq!(started.engine.active_policy().info().name, "standard");
/// ```
pub struct EngineBuilder {
    file: ConfigFile,
    runtime: Option<Runtime>,
    policy: Option<Vec<u8>>,
    verifier: Arc<dyn Verifier + Send + Sync>,
}

impl EngineBuilder {
    /// An engine for `file`: its engine configuration, policy, tenants and keys.
    pub fn new(file: ConfigFile) -> Self {
        EngineBuilder {
            file,
            runtime: None,
            policy: None,
            verifier: Arc::new(NoVerifier),
        }
    }

    /// Uses `runtime` (a compiled cache, a call observer, a smaller pool) rather than
    /// [`Runtime::new`].
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Uses this policy component rather than the one the file names.
    pub fn policy(mut self, component: Vec<u8>) -> Self {
        self.policy = Some(component);
        self
    }

    /// Checks the policy with `verifier` too (scenario files, say), as a swap would.
    pub fn verifier(mut self, verifier: Arc<dyn Verifier + Send + Sync>) -> Self {
        self.verifier = verifier;
        self
    }

    /// Starts the engine on `store` at `now_ms` (the time the directory is applied at).
    ///
    /// # Errors
    /// [`StartError`]: the runtime, the policy, the store's policy or the directory.
    pub fn start<S: Store>(self, store: S, now_ms: i64) -> Result<Started<S>, StartError> {
        let name = self.file.policy.clone();
        let policy_error = |message: String| StartError::Policy {
            name: name.clone(),
            message,
        };
        let runtime = match self.runtime {
            Some(r) => r,
            None => Runtime::new().map_err(|e| StartError::Runtime(format!("{e:#}")))?,
        };
        let bytes = match self.policy {
            Some(bytes) => bytes,
            None => builtin::resolve(&self.file.policy, None).map_err(policy_error)?,
        };
        let config = self.file.engine;
        let policy = runtime
            .load(&bytes, config.policy_limits())
            .map_err(|e| policy_error(e.to_string()))?;
        let engine = Engine::new(config, store, runtime, Arc::new(policy));
        engine.hold_leases_if_shared().map_err(StartError::Store)?;
        // The configured policy must pass the same checks as a swapped-in one; it is
        // already active, so nothing is switched (and there is nothing to roll back to).
        engine
            .check_verified(&bytes, self.verifier.as_ref())
            .map_err(|e| policy_error(e.to_string()))?;
        let adopted = engine
            .adopt_stored_policy(&bytes)
            .map_err(StartError::StoredPolicy)?;
        let applied = engine
            .adopt_directory(&self.file.keys, &self.file.worker_renames, now_ms)
            .map_err(StartError::Directory)?;
        Ok(Started {
            engine,
            adopted,
            applied,
        })
    }
}
