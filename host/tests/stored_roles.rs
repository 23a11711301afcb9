//! A key's role as the store keeps it: a word this release does not know (a store written
//! by a later release, or edited by hand) stops the start with an error that names the key
//! and the word. It is never read as some other role, least of all as an admin.

use tollgate::config::ConfigFile;
use tollgate::engine::{EngineBuilder, StartError};
use tollgate::store::SqliteStore;

#[test]
fn an_unknown_stored_role_is_an_error_never_an_admin() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("roles.db");
    let file = ConfigFile::from_json(&serde_json::json!({
        "tenants": {"acme": {}},
        "auth": {"admins": ["admin-key"], "callers": {"acme-key": "acme"}}
    }))
    .unwrap();
    let started = EngineBuilder::new(file.clone())
        .start(SqliteStore::open(&db).unwrap(), 0)
        .unwrap();
    assert!(started.applied.seeded);
    assert_eq!(
        started.engine.role_of("admin-key"),
        Some(tollgate::config::Role::Admin)
    );
    drop(started);

    // A later release's role, written beside the others.
    let sha256 = "ab".repeat(32);
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "INSERT INTO api_keys (id, sha256, role, subject) VALUES ('key_future', ?1, 'auditor', '')",
            [&sha256],
        )
        .unwrap();

    let refused = EngineBuilder::new(file)
        .start(SqliteStore::open(&db).unwrap(), 0)
        .err()
        .expect("the start is refused");
    assert!(matches!(refused, StartError::Directory(_)), "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("key_future") && message.contains("\"auditor\""),
        "{message}"
    );
}
