//! Watching a policy file (or the newest `.wasm` in a folder): a changed module is
//! activated once it has stopped changing (debounced), after the same validation as any
//! swap; each activation and refusal is logged.

use super::set_policy_gauge;
use crate::http::Metrics;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tollgate::engine::Engine;
use tollgate::runtime::PolicyDigest;
use tollgate::store::AnyStore;

/// How often the file is looked at; a change must hold still for one interval.
pub const POLL: Duration = Duration::from_millis(250);

/// The module the watched path designates now, with its modification time and size.
fn current(path: &Path) -> Option<(PathBuf, SystemTime, u64)> {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((p.to_path_buf(), m.modified().ok()?, m.len())))
    };
    if path.is_dir() {
        std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .filter_map(|p| stamp(&p))
            .max_by_key(|(_, t, _)| *t)
    } else {
        stamp(path)
    }
}

/// The file's bytes, reading no more than one byte past `limit`: whatever lands in the
/// watched folder, a file larger than any policy may be is never read whole.
fn read_at_most(file: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Watches `path` until `stop` is set.
pub fn spawn(
    engine: Arc<Engine<AnyStore>>,
    metrics: Metrics,
    path: PathBuf,
    verifier: std::sync::Arc<tollgate::scenario::ScenarioVerifier>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut seen = current(&path);
        let mut settled = seen.clone();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(POLL);
            let now = current(&path);
            if now != seen {
                // Changed since the last look: wait until it holds still.
                seen = now;
                continue;
            }
            if now == settled {
                continue;
            }
            settled = now.clone();
            let Some((file, _, size)) = now else { continue };
            let limit = engine.config().max_policy_bytes;
            let Ok(bytes) = read_at_most(&file, limit) else {
                continue;
            };
            if bytes.len() as u64 > limit {
                tracing::warn!(file = %file.display(), size, limit, "watched policy refused: over limits.max_policy_bytes");
                continue;
            }
            if PolicyDigest::of(&bytes) == *engine.active_policy().digest() {
                continue;
            }
            match engine.swap_policy_verified(&bytes, verifier.as_ref()) {
                Ok(id) => {
                    tracing::info!(file = %file.display(), name = %id.name, version = %id.version, sha256 = %id.sha256, "watched policy activated");
                    set_policy_gauge(&engine, &metrics);
                }
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "watched policy refused")
                }
            }
        }
    })
}
