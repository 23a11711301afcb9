//! The configuration file every command reads: the engine's configuration (see
//! [`Config`]) plus `auth` (keys and their roles), the `policy` to load and the server's
//! `limits.max_connections`. A command validates every field, including those it does not use.

use super::Config;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Why a configuration file could not be used. Each says which file and what is wrong; an
/// invalid field is named in the message (`gateway.models.gpt-4o: …`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Where the JSON breaks.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is not a valid configuration.
    #[error("{}{message}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    Invalid {
        /// The file, when it was read from one.
        path: Option<PathBuf>,
        /// What is wrong, naming the field.
        message: String,
    },
}

/// Who a key belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A caller acting for one tenant.
    Caller {
        /// The tenant the key acts for.
        tenant: String,
    },
    /// A dispatch worker with its own name.
    Worker {
        /// The worker's name, recorded with its claims.
        name: String,
    },
    /// An operator: policy, downstream status, inspection.
    Admin,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthInput {
    #[serde(default)]
    callers: BTreeMap<String, String>,
    #[serde(default)]
    workers: WorkersInput,
    #[serde(default)]
    admins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WorkersInput {
    /// Each key is its own worker name.
    List(Vec<String>),
    /// key → worker name.
    Map(BTreeMap<String, String>),
}

impl Default for WorkersInput {
    fn default() -> Self {
        WorkersInput::List(Vec::new())
    }
}

/// A whole configuration file, validated.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    /// The engine's part, shared with scenario files.
    pub engine: Config,
    /// Every key and its role.
    pub keys: HashMap<String, Role>,
    /// Built-in policy name or `.wasm` path (default `standard`).
    pub policy: String,
    /// Connections served at once (`limits.max_connections`).
    pub max_connections: usize,
    /// Connections one client address may hold (`limits.max_connections_per_address`;
    /// by default `max_connections`, since a sidecar's callers all share one address).
    pub max_connections_per_address: usize,
    /// The OpenAI-compatible gateway, when configured.
    pub gateway: Option<super::GatewayConfig>,
    /// Workers given as bare keys: each key and the name it now has. Earlier releases named
    /// such a worker by its key, so claims recorded then are renamed when the store's
    /// directory is seeded (a key is never kept in clear).
    pub worker_renames: Vec<(String, String)>,
    /// Where traces go, and what share of them (`telemetry`).
    pub telemetry: super::TelemetryConfig,
}

/// The name of a worker given as a bare key: derived from the key's hash, so that the key
/// itself is never stored, logged or shown.
pub fn bare_worker_name(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("worker-{hex}")
}

/// `limits.max_connections` when the configuration leaves it out: under the common default
/// of 1,024 open files per process, with room for the store's files and the log.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
/// The largest `limits.max_connections` accepted.
const MOST_CONNECTIONS: u64 = 1_000_000;

impl ConfigFile {
    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    /// [`ConfigFileError`]: the file unreadable, not JSON, or a field invalid; each names
    /// the file and what is wrong.
    pub fn load(path: &std::path::Path) -> Result<ConfigFile, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ConfigFileError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        ConfigFile::parse(&value).map_err(|message| ConfigFileError::Invalid {
            path: Some(path.to_path_buf()),
            message,
        })
    }

    /// Validates a configuration given as JSON.
    ///
    /// # Errors
    /// [`ConfigFileError::Invalid`], naming the field and what is wrong with it.
    pub fn from_json(value: &serde_json::Value) -> Result<ConfigFile, ConfigFileError> {
        ConfigFile::parse(value).map_err(|message| ConfigFileError::Invalid {
            path: None,
            message,
        })
    }

    fn parse(value: &serde_json::Value) -> Result<ConfigFile, String> {
        let mut obj = value
            .as_object()
            .cloned()
            .ok_or("the configuration must be a JSON object")?;
        let auth: AuthInput = match obj.remove("auth") {
            Some(a) => serde_json::from_value(a).map_err(|e| format!("auth: {e}"))?,
            None => AuthInput::default(),
        };
        let policy = match obj.remove("policy") {
            None => "standard".to_string(),
            Some(serde_json::Value::String(s)) => s,
            Some(_) => {
                return Err("policy must be a string (a built-in name or a .wasm path)".into())
            }
        };
        let max_connections =
            take_connections(&mut obj, "max_connections", DEFAULT_MAX_CONNECTIONS)?;
        let max_connections_per_address =
            take_connections(&mut obj, "max_connections_per_address", max_connections)?;
        let telemetry = match obj.remove("telemetry") {
            Some(t) => super::TelemetryConfig::from_json(t)?,
            None => super::TelemetryConfig::default(),
        };
        let gateway = match obj.remove("gateway") {
            Some(g) => Some(super::GatewayConfig::from_json(g)?),
            None => None,
        };
        let mut engine =
            Config::from_json(&serde_json::Value::Object(obj)).map_err(|e| e.to_string())?;
        if let Some(g) = &gateway {
            engine.routing = g.routing();
            // By default a finished operation is kept as long as its answer is replayed.
            let replay_ms = g.replay_ttl_s.saturating_mul(1000);
            if engine.written.retention.operations_days.is_none() && g.replay {
                engine.retention_ms = engine.retention_ms.map(|ms| ms.max(replay_ms));
            }
        }
        // One model name means one model: the gateway's routes and the `models` budgets.
        if let (Some(g), Some(models)) = (&gateway, &engine.models) {
            if let Some(m) = g.models.keys().find(|m| !models.contains_key(*m)) {
                return Err(format!(
                    "gateway.models.{m}: not a model of the `models` section (list it there, with {{}} for no limits)"
                ));
            }
        }
        if let Some(m) = gateway
            .iter()
            .flat_map(|g| g.models.keys())
            .find(|m| m.len() > crate::model::MAX_MODEL_BYTES)
        {
            return Err(format!(
                "gateway.models: {m:?} is over {} bytes",
                crate::model::MAX_MODEL_BYTES
            ));
        }
        let mut keys = HashMap::new();
        let mut add = |key: String, role: Role| -> Result<(), String> {
            if key.is_empty() {
                return Err("auth: keys must not be empty".into());
            }
            if keys.insert(key, role).is_some() {
                return Err("auth: a key is listed twice".into());
            }
            Ok(())
        };
        for (key, tenant) in auth.callers {
            if engine.tenant(&tenant).is_none() {
                return Err(format!("auth.callers: tenant {tenant:?} is not configured"));
            }
            add(key, Role::Caller { tenant })?;
        }
        let mut worker_renames = Vec::new();
        match auth.workers {
            WorkersInput::List(list) => {
                for key in list {
                    let name = bare_worker_name(&key);
                    worker_renames.push((key.clone(), name.clone()));
                    add(key, Role::Worker { name })?;
                }
            }
            WorkersInput::Map(map) => {
                for (key, name) in map {
                    add(key, Role::Worker { name })?;
                }
            }
        }
        for key in auth.admins {
            add(key, Role::Admin)?;
        }
        Ok(ConfigFile {
            engine,
            keys,
            policy,
            max_connections,
            max_connections_per_address,
            gateway,
            worker_renames,
            telemetry,
        })
    }
}

/// Takes `limits.<field>` (a connection count) out of the configuration: it belongs to the
/// server, and the engine's configuration (shared with scenario files) would refuse it.
fn take_connections(
    obj: &mut serde_json::Map<String, serde_json::Value>,
    field: &str,
    default: usize,
) -> Result<usize, String> {
    let Some(limits) = obj.get_mut("limits").and_then(|l| l.as_object_mut()) else {
        return Ok(default);
    };
    match limits.remove(field) {
        None => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n @ 1..=MOST_CONNECTIONS) => Ok(n as usize),
            _ => Err(format!(
                "limits.{field} must be an integer from 1 to {MOST_CONNECTIONS}, not {v}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_and_checks() {
        let c = ConfigFile::from_json(&json!({
            "tenants": {"acme": {}},
            "auth": {"callers": {"ck": "acme"}, "workers": {"wk": "w1"}, "admins": ["ak"]},
            "policy": "deny-all"
        }))
        .unwrap();
        assert_eq!(
            c.keys["ck"],
            Role::Caller {
                tenant: "acme".into()
            }
        );
        assert_eq!(c.keys["wk"], Role::Worker { name: "w1".into() });
        assert_eq!(c.keys["ak"], Role::Admin);
        assert_eq!(c.policy, "deny-all");
        let unknown = ConfigFile::from_json(&json!({"auth": {"callers": {"k": "nobody"}}}));
        assert!(unknown.unwrap_err().to_string().contains("nobody"));
        let twice = ConfigFile::from_json(
            &json!({"tenants": {"a": {}}, "auth": {"callers": {"k": "a"}, "admins": ["k"]}}),
        );
        assert!(twice.is_err());
        assert!(ConfigFile::from_json(&json!({"auth": {"callerz": {}}})).is_err());
    }

    #[test]
    fn the_gateway_and_the_models_section_name_the_same_models() {
        let gateway = json!({
            "upstreams": {"local": {"base_url": "http://127.0.0.1:9000/v1", "api_key_env": "K"}},
            "models": {"gpt-4o-mini": {"upstream": "local", "tokenizer": "o200k_base"}}
        });
        // Without a `models` section, any gateway model.
        assert!(ConfigFile::from_json(&json!({"gateway": gateway})).is_ok());
        let listed = json!({"gateway": gateway, "models": {"gpt-4o-mini": {}}});
        assert!(ConfigFile::from_json(&listed).is_ok());
        let missing = json!({"gateway": gateway, "models": {"gpt-4o": {}}});
        let err = ConfigFile::from_json(&missing).unwrap_err().to_string();
        assert!(err.contains("gateway.models.gpt-4o-mini"), "{err}");
    }

    #[test]
    fn max_connections_is_a_server_limit() {
        let default = ConfigFile::from_json(&json!({"limits": {"max_request_bytes": 10}}));
        assert_eq!(default.unwrap().max_connections, DEFAULT_MAX_CONNECTIONS);
        let set = ConfigFile::from_json(&json!({"limits": {"max_connections": 8}})).unwrap();
        assert_eq!(set.max_connections, 8);
        for bad in [
            json!(0),
            json!(-1),
            json!(2.5),
            json!("8"),
            json!(2_000_000),
        ] {
            let err = ConfigFile::from_json(&json!({"limits": {"max_connections": bad}}));
            let err = err.unwrap_err().to_string();
            assert!(err.contains("limits.max_connections"), "{bad}: {err}");
        }
        // Scenario files (the engine's configuration alone) do not know it.
        assert!(Config::from_json(&json!({"limits": {"max_connections": 8}})).is_err());
    }

    #[test]
    fn loading_says_which_file_and_whether_it_was_unreadable_not_json_or_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let err = ConfigFile::load(&missing).unwrap_err();
        assert!(matches!(&err, ConfigFileError::Read { path, .. } if *path == missing));
        assert!(err.to_string().starts_with(&missing.display().to_string()));

        let broken = dir.path().join("broken.json");
        std::fs::write(&broken, "{\"tenants\": ").unwrap();
        let err = ConfigFile::load(&broken).unwrap_err();
        assert!(matches!(&err, ConfigFileError::Json { path, .. } if *path == broken));

        let invalid = dir.path().join("invalid.json");
        std::fs::write(&invalid, r#"{"limits": {"max_connections": 0}}"#).unwrap();
        let err = ConfigFile::load(&invalid).unwrap_err();
        let ConfigFileError::Invalid { path, message } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(path.as_deref(), Some(invalid.as_path()));
        assert!(message.contains("limits.max_connections"), "{message}");
        assert_eq!(err.to_string(), format!("{}: {message}", invalid.display()));
    }
}
