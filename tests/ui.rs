//! The dashboard (`/ui`) in a real browser: tests/ui/dashboard.mjs drives Debian's
//! headless Chromium through playwright-core against a `tollgate serve` under load. The
//! browser and the driver are installed here when missing (`.ci/run` installs them first,
//! so that an install failure is reported as such).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Debian's Chromium, installed with apt when missing.
fn chromium() -> PathBuf {
    let path = PathBuf::from(std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into()));
    if !path.exists() {
        let installed = Command::new("sh")
            .args([
                "-c",
                "apt-get update -qq && apt-get install -y -qq chromium",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get runs");
        assert!(installed.success(), "installing Debian's chromium failed");
    }
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// playwright-core from npm, in target/ui-node (installed again when package.json changes).
fn node_modules() -> PathBuf {
    let dir = repo().join("target/ui-node");
    let wanted = std::fs::read(repo().join("tests/ui/package.json")).unwrap();
    let stamp = dir.join("package.json");
    let ready = std::fs::read(&stamp).ok().as_ref() == Some(&wanted)
        && dir.join("node_modules/playwright-core").exists();
    if !ready {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&stamp, &wanted).unwrap();
        let installed = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .expect("npm runs");
        assert!(installed.success(), "npm install playwright-core failed");
    }
    dir.join("node_modules")
}

#[test]
fn the_dashboard_in_headless_chromium_shows_the_servers_numbers() {
    let shots = repo().join("target/ui-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let out = Command::new("node")
        .arg(repo().join("tests/ui/dashboard.mjs"))
        .env("TOLLGATE_BIN", env!("CARGO_BIN_EXE_tollgate"))
        .env("UI_NODE_MODULES", node_modules())
        .env("CHROMIUM", chromium())
        .env("UI_SCREENSHOT_DIR", &shots)
        .env(
            "SWAP_POLICY",
            tollgate::scenario::default_fixtures().join("quiet-hours.wasm"),
        )
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("decisions seen"), "{stdout}");
    for width in [800, 1400, 1900] {
        let png = std::fs::read(shots.join(format!("dashboard-{width}.png")))
            .expect("a screenshot was saved at each width");
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    }
}
