//! A JavaScript project: `policy.js` exporting `decide`, built by componentize-js (the
//! builder `jco componentize` wraps) against the project's `wit/0.2.0`.
//!
//! The component leaves out WASI's HTTP client (`fetch`): a policy has no network, and the
//! sealed host does not offer it.

use super::{check_layout, finish, name_and_output, run, Built};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The module componentize-js builds.
pub const SOURCE: &str = "policy.js";
/// The package that builds it, under a `node_modules` folder.
const PACKAGE: &str = "@bytecodealliance/componentize-js";

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

/// Builds the JavaScript project in `dir`.
pub fn build(dir: &Path, out: Option<&Path>) -> Result<Built, String> {
    check_layout(dir, "sdk/tollgate-policy.js")?;
    let (_, path) = name_and_output(dir, out)?;
    let full = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let entry = componentize_js(&full)?;
    let mut command = Command::new("node");
    command
        .current_dir(&full)
        .args(["--input-type=module", "-e", BUILD])
        .arg(format!("file://{}", entry.display()))
        .arg(full.join(SOURCE))
        .arg(full.join("wit/0.2.0"))
        .arg(std::path::absolute(&path).map_err(|e| format!("{}: {e}", path.display()))?);
    run(command, "componentize-js (node)")?;
    finish(&path)
}

/// componentize-js's module: from `TOLLGATE_NODE_MODULES`, else the project's
/// `node_modules`, else installed there by `npm install` from its package.json.
fn componentize_js(dir: &Path) -> Result<PathBuf, String> {
    let entry_in = |modules: &Path| -> Option<PathBuf> {
        let package = modules.join(PACKAGE);
        let manifest = std::fs::read_to_string(package.join("package.json")).ok()?;
        let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
        let entry = manifest["exports"]["import"]
            .as_str()
            .or(manifest["main"].as_str())?;
        Some(package.join(entry))
    };
    if let Some(modules) = std::env::var_os("TOLLGATE_NODE_MODULES") {
        let modules = PathBuf::from(modules);
        return entry_in(&modules).ok_or_else(|| {
            format!(
                "TOLLGATE_NODE_MODULES={}: no {PACKAGE} there",
                modules.display()
            )
        });
    }
    let modules = dir.join("node_modules");
    if let Some(entry) = entry_in(&modules) {
        return Ok(entry);
    }
    if !dir.join("package.json").is_file() {
        return Err(format!(
            "{}: no package.json naming {PACKAGE} (`tollgate policy new --lang javascript` writes one)",
            dir.display()
        ));
    }
    eprintln!("{PACKAGE} not found: npm install in {}", dir.display());
    let mut install = Command::new("npm");
    install
        .current_dir(dir)
        .args(["install", "--no-audit", "--no-fund"]);
    run(
        install,
        "npm install (Node.js 20 or later and npm are needed)",
    )?;
    entry_in(&modules).ok_or_else(|| format!("npm install did not install {PACKAGE}"))
}
