//! A JavaScript project: `policy.js` exporting `decide`, built by componentize-js (the
//! builder `jco componentize` wraps) against the project's world (`wit/0.3.0`, or an
//! earlier project's `wit/0.2.0`).
//!
//! The component leaves out WASI's HTTP client (`fetch`): a policy has no network, and the
//! sealed host does not offer it. componentize-js reads the sources from inside its own
//! sandbox, which follows no link out of the folder: the project's sources (`.js`, `.mjs`,
//! `.json`) and world are copied, links resolved, into a staging folder first.

use super::{beside_executable, check_layout, finish, reusing, run, Built, Reuse};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The module componentize-js builds.
pub const SOURCE: &str = "policy.js";
/// The package that builds it, under a `node_modules` folder.
pub const PACKAGE: &str = "@bytecodealliance/componentize-js";

/// Calls componentize-js: `node -e BUILD ENTRY SOURCE WIT OUT`.
const BUILD: &str = r#"
const [entry, sourcePath, witPath, out] = process.argv.slice(1);
const { componentize } = await import(entry);
const { writeFile } = await import("node:fs/promises");
const { component } = await componentize({
  sourcePath, witPath, worldName: "policy", disableFeatures: ["http", "fetch-event"],
});
await writeFile(out, component);
"#;

/// Builds the JavaScript project in `dir` into `path` (both absolute).
pub fn build(dir: &Path, path: &Path, reuse: Reuse) -> Result<Built, String> {
    let world = check_layout(dir, "sdk/tollgate-policy.js")?;
    let modules = node_modules(dir, &[PACKAGE])?;
    reusing(dir, path, &toolchain(&modules, &[PACKAGE]), reuse, || {
        let stage = Stage::of(dir)?;
        componentize(&modules, &stage, world, path)
    })
}

/// What names the toolchain in `modules`: its folder and each package's manifest.
pub fn toolchain(modules: &Path, packages: &[&str]) -> String {
    let mut id = modules.display().to_string();
    for p in packages {
        let manifest = std::fs::read_to_string(modules.join(p).join("package.json"));
        let version = manifest
            .ok()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(&m).ok())
            .and_then(|m| m["version"].as_str().map(String::from))
            .unwrap_or_default();
        id.push_str(&format!(" {p}@{version}"));
    }
    id
}

/// Makes the component of the staged `policy.js` with componentize-js from `modules`,
/// against the world in the stage's `world` folder.
pub fn componentize(
    modules: &Path,
    stage: &Stage,
    world: &str,
    path: &Path,
) -> Result<Built, String> {
    let entry =
        entry_in(modules).ok_or_else(|| format!("no {PACKAGE} in {}", modules.display()))?;
    let mut command = Command::new("node");
    command
        .current_dir(&stage.0)
        .args(["--input-type=module", "-e", BUILD])
        .arg(format!("file://{}", entry.display()))
        .arg(stage.0.join(SOURCE))
        .arg(stage.0.join(world))
        .arg(path);
    run(command, "componentize-js (node)")?;
    finish(path)
}

/// A staging folder, removed when dropped.
pub struct Stage(pub PathBuf);

impl Stage {
    /// A staging copy of the project in `dir`.
    pub fn of(dir: &Path) -> Result<Self, String> {
        let stage = Stage::new()?;
        stage.copy(dir, &stage.0)?;
        Ok(stage)
    }

    fn new() -> Result<Self, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tollgate-build-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Stage(dir))
    }

    /// Copies the sources and world under `from` into `to`, following links, skipping
    /// `node_modules`, `target` and hidden folders.
    fn copy(&self, from: &Path, to: &Path) -> Result<(), String> {
        let error = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        for entry in std::fs::read_dir(from).map_err(|e| error(from, e))? {
            let entry = entry.map_err(|e| error(from, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let source = entry.path();
            // `metadata` follows links: a linked folder is copied as a folder.
            let meta = std::fs::metadata(&source).map_err(|e| error(&source, e))?;
            if meta.is_dir() {
                if name.starts_with('.') || name == "node_modules" || name == "target" {
                    continue;
                }
                let dest = to.join(&*name);
                std::fs::create_dir_all(&dest).map_err(|e| error(&dest, e))?;
                self.copy(&source, &dest)?;
            } else if [".js", ".mjs", ".ts", ".mts", ".json", ".wit"]
                .iter()
                .any(|ext| name.ends_with(ext))
            {
                let dest = to.join(&*name);
                std::fs::copy(&source, &dest).map_err(|e| error(&source, e))?;
            }
        }
        Ok(())
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// componentize-js's module in a `node_modules` folder.
fn entry_in(modules: &Path) -> Option<PathBuf> {
    let package = modules.join(PACKAGE);
    let manifest = std::fs::read_to_string(package.join("package.json")).ok()?;
    let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
    let entry = manifest["exports"]["import"]
        .as_str()
        .or(manifest["main"].as_str())?;
    Some(package.join(entry))
}

/// The `node_modules` folder holding every package of `packages`: `TOLLGATE_NODE_MODULES`,
/// else the project's `node_modules`, else the one this repository's setup installed beside
/// the executable (`target/polyglot-node`), else the project's after `npm install` from its
/// package.json.
pub fn node_modules(dir: &Path, packages: &[&str]) -> Result<PathBuf, String> {
    let holds = |modules: &Path| {
        packages
            .iter()
            .all(|p| modules.join(p).join("package.json").is_file())
    };
    let wanted = packages.join(", ");
    if let Some(modules) = std::env::var_os("TOLLGATE_NODE_MODULES") {
        let modules = PathBuf::from(modules);
        return if holds(&modules) {
            Ok(modules)
        } else {
            Err(format!(
                "TOLLGATE_NODE_MODULES={}: it lacks one of {wanted}",
                modules.display()
            ))
        };
    }
    let project = dir.join("node_modules");
    if holds(&project) {
        return Ok(project);
    }
    if let Some(modules) = beside_executable("polyglot-node/node_modules").filter(|m| holds(m)) {
        return Ok(modules);
    }
    if !dir.join("package.json").is_file() {
        return Err(format!(
            "{}: no package.json naming {wanted} (`tollgate policy new` writes one)",
            dir.display()
        ));
    }
    eprintln!("{wanted} not found: npm install in {}", dir.display());
    let mut install = Command::new("npm");
    install
        .current_dir(dir)
        .args(["install", "--no-audit", "--no-fund"]);
    run(
        install,
        "npm install (Node.js 20 or later and npm are needed)",
    )?;
    if holds(&project) {
        Ok(project)
    } else {
        Err(format!("npm install did not install {wanted}"))
    }
}
