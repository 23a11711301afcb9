//! Compiled components kept on disk, so that a restart, or a swap back to a component seen
//! before, deserializes machine code instead of compiling again (77 ms for the standard
//! policy; seconds for an interpreter's component).
//!
//! An entry is named by the component's digest, the release, and the engine's compilation
//! settings and wasmtime version, and carries the SHA-256 of its own bytes. It is checked before
//! use: a damaged, truncated or foreign entry is removed and the component compiled again,
//! never loaded. Entries are written to a temporary file and renamed, so a reader never sees
//! half an entry. The folder must be writable only by tollgate's own user, like its store:
//! machine code read from it runs in the process.

use super::digest::{hex, PolicyDigest};
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::Engine;

const MAGIC: &[u8] = b"tollgate-compiled-1\n";

/// A folder of compiled components.
#[derive(Clone, Debug)]
pub struct CompiledCache {
    dir: PathBuf,
}

impl CompiledCache {
    /// The cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompiledCache { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry of `digest` for `engine` lives.
    fn path(&self, engine: &Engine, digest: &PolicyDigest) -> PathBuf {
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut settings);
        let mut key = Sha256::new();
        key.update(digest.0);
        // The engine's settings hash covers the wasmtime version; this release's own version
        // keeps releases apart besides.
        key.update(env!("CARGO_PKG_VERSION").as_bytes());
        key.update(settings.finish().to_le_bytes());
        self.dir
            .join(format!("{}.cwasm", hex(&key.finalize()[..20])))
    }

    /// The compiled component of `digest`, when a sound entry is there.
    pub fn get(&self, engine: &Engine, digest: &PolicyDigest) -> Option<Component> {
        let path = self.path(engine, digest);
        let bytes = std::fs::read(&path).ok()?;
        let checked = bytes
            .strip_prefix(MAGIC)
            .filter(|rest| rest.len() > 32)
            .and_then(|rest| {
                let (sum, code) = rest.split_at(32);
                (Sha256::digest(code).as_slice() == sum).then_some(code)
            });
        let component = checked.and_then(|code| {
            // SAFETY: the bytes are an entry this cache wrote with `Component::serialize`
            // for this wasmtime version and these settings (the name says so), and they are
            // unchanged since (their SHA-256 matches). wasmtime checks its own header, version
            // and settings again and refuses what does not match.
            unsafe { Component::deserialize(engine, code) }.ok()
        });
        if component.is_none() {
            tracing::warn!(path = %path.display(), "a damaged compiled-cache entry was removed; compiling again");
            let _ = std::fs::remove_file(&path);
        }
        component
    }

    /// Keeps `component` (compiled from the bytes of `digest`); a failure to write costs
    /// only the next compilation, so it is logged and otherwise ignored.
    pub fn put(&self, engine: &Engine, digest: &PolicyDigest, component: &Component) {
        if let Err(e) = self.write(engine, digest, component) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not keep a compiled component");
        }
    }

    fn write(
        &self,
        engine: &Engine,
        digest: &PolicyDigest,
        component: &Component,
    ) -> Result<(), String> {
        let code = component.serialize().map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let path = self.path(engine, digest);
        let tmp = path.with_extension(format!(
            "tmp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut bytes = Vec::with_capacity(MAGIC.len() + 32 + code.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&Sha256::digest(&code));
        bytes.extend_from_slice(&code);
        std::fs::write(&tmp, &bytes).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            e.to_string()
        })
    }
}
