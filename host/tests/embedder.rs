//! The library as an embedding team takes it: `examples/embedder`, a cargo project of its
//! own outside the workspace, depends on the library with its `postgres` feature off. It
//! must link no PostgreSQL driver, rustls or ring, build, and run from tokio: a
//! `postgres://` store refused with a clear error; the engine started by the builder on a
//! SQLite file; a call admitted and completed through the writer's async handle, the same
//! key answered from its operation; a hand-built request refused naming its field; a
//! hundred tasks admitted at once through the writer; the engine used directly beside its
//! maintenance task; and the file readable afterwards by this build.

use std::path::{Path, PathBuf};
use std::process::Command;
use tollgate::model::OpState;
use tollgate::store::{SqliteStore, Store};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cargo` for the embedder's project, with nothing of the outer build leaking in.
fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args)
        .arg("--manifest-path")
        .arg(root().join("examples/embedder/Cargo.toml"));
    for var in [
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn a_sqlite_only_program_outside_the_workspace_links_no_postgres_and_runs() {
    let tree = cargo(&["tree", "-e", "normal", "--prefix", "none"])
        .output()
        .unwrap();
    let tree_text = String::from_utf8_lossy(&tree.stdout);
    assert!(
        tree.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let crates: Vec<&str> = tree_text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"rusqlite"), "{tree_text}");
    for absent in [
        "postgres",
        "tokio-postgres",
        "rustls",
        "ring",
        "webpki-roots",
    ] {
        assert!(
            !crates.contains(&absent),
            "{absent} is linked without the postgres feature:\n{tree_text}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("embedder.db");
    let target = root().join("target/embedder");
    let run = cargo(&["run", "--quiet", "--target-dir", target.to_str().unwrap()])
        .arg("--")
        .arg(&db)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the embedder failed:\n{out}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        out.contains("postgres: this build of tollgate has no PostgreSQL store"),
        "{out}"
    );
    assert!(out.contains(r#"admit: {"outcome":"accepted""#), "{out}");
    assert!(
        out.contains(r#"complete: {"ok":true,"state":"succeeded"}"#),
        "{out}"
    );
    assert!(
        out.contains(r#"again: {"outcome":"duplicate_completed""#),
        "{out}"
    );
    assert!(out.contains("policy: Seeded"), "{out}");
    assert!(
        out.contains("refused: max_output_tokens: is required"),
        "{out}"
    );
    assert!(out.contains("concurrent: 100 of 100 accepted"), "{out}");
    assert!(out.contains("direct: Accepted"), "{out}");

    // What it wrote is the same store this build reads.
    let mut store = SqliteStore::open(&db).unwrap();
    let op = store
        .transaction(|tx| tx.operation("acme", "req-1"))
        .unwrap()
        .expect("the embedder's operation is stored");
    assert_eq!(op.state, OpState::Succeeded);
}
