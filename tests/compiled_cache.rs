//! Compiled components kept on disk across commands (`TOLLGATE_COMPILED_CACHE`): written
//! by the first, read by the next, a damaged entry replaced, `off` keeping nothing.

use std::path::Path;
use std::process::Command;

fn check(cache: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["policy", "check", "standard"])
        .env("TOLLGATE_COMPILED_CACHE", cache)
        .output()
        .unwrap()
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn commands_share_compiled_components_and_replace_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("compiled");
    let first = check(cache.to_str().unwrap());
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let kept = entries(&cache);
    assert_eq!(kept.len(), 1, "{kept:?}");
    let written = std::fs::read(&kept[0]).unwrap();
    assert!(written.len() > 1000);

    // The next command reads it as it is.
    let second = check(cache.to_str().unwrap());
    assert!(second.status.success());
    assert_eq!(std::fs::read(&kept[0]).unwrap(), written);

    // Garbage in its place is refused, the component compiled again and kept anew.
    std::fs::write(
        &kept[0],
        b"tollgate-compiled-1\nnot machine code at all, not at all....",
    )
    .unwrap();
    let third = check(cache.to_str().unwrap());
    assert!(
        third.status.success(),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
    assert_eq!(
        std::fs::read(&kept[0]).unwrap(),
        written,
        "the same code, rewritten"
    );

    let off = dir.path().join("off");
    std::env::set_current_dir(dir.path()).unwrap();
    assert!(check("off").status.success());
    assert!(
        !off.exists() && entries(dir.path()).len() == 1,
        "off keeps nothing"
    );
}
