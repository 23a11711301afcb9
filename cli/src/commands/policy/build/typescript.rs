//! A TypeScript project: `policy.ts` exporting `decide`, type-checked and compiled by the
//! TypeScript compiler as the project's `tsconfig.json` says, then built as a JavaScript
//! project (componentize-js). The compiler writes `policy.js` only into the build's staging
//! copy, so the project folder holds no generated code.

use super::javascript::{self, Stage};
use super::{check_layout, reusing, run, Built, Reuse};
use std::path::Path;
use std::process::Command;

/// The module the author writes.
pub const SOURCE: &str = "policy.ts";
/// The compiler's package, under a `node_modules` folder.
const COMPILER: &str = "typescript";

/// Builds the TypeScript project in `dir` into `path` (both absolute).
pub fn build(dir: &Path, path: &Path, reuse: Reuse) -> Result<Built, String> {
    let world = check_layout(dir, "sdk/tollgate-policy.d.ts")?;
    if !dir.join("tsconfig.json").is_file() {
        return Err(format!(
            "{}: no tsconfig.json, which says how the compiler checks {SOURCE} \
             (`tollgate policy new NAME --lang typescript` writes one)",
            dir.display()
        ));
    }
    let packages = [javascript::PACKAGE, COMPILER];
    let modules = javascript::node_modules(dir, &packages)?;
    let toolchain = javascript::toolchain(&modules, &packages);
    reusing(dir, path, &toolchain, reuse, || {
        compile(dir, &modules, world, path)
    })
}

/// Type-checks and compiles a staged copy of `dir`, then builds it as JavaScript against
/// `world`.
fn compile(dir: &Path, modules: &Path, world: &str, path: &Path) -> Result<Built, String> {
    let stage = Stage::of(dir)?;
    // Whatever `policy.js` the project holds is not what is built: the compiler's is.
    let _ = std::fs::remove_file(stage.0.join(javascript::SOURCE));
    let mut tsc = Command::new("node");
    tsc.current_dir(&stage.0)
        .arg(modules.join(COMPILER).join("bin/tsc"))
        .args(["-p", "tsconfig.json"]);
    run(tsc, "tsc, the TypeScript compiler (its messages are above)")?;
    if !stage.0.join(javascript::SOURCE).is_file() {
        return Err(format!(
            "{}: tsc wrote no {} beside {SOURCE}: the build expects tsconfig.json to compile \
             {SOURCE} in place (no outDir, noEmit off)",
            dir.display(),
            javascript::SOURCE
        ));
    }
    javascript::componentize(modules, &stage, world, path)
}
