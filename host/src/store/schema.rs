//! The schema every backend creates, written once. Only the queue's sequence column differs
//! between dialects; `BIGINT` has integer affinity in SQLite, as it is in PostgreSQL.

use super::StoreError;

/// The schema version each dialect writes. SQLite's 2 added `bucket_log` (balances are
/// logged and folded now and then, see `bucket_log`): a host of version 1 would read stale
/// balances from such a database, so it refuses it. PostgreSQL writes balances in place.
pub const SQLITE_VERSION: i64 = 2;
pub const POSTGRES_VERSION: i64 = 1;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY, balance_micro BIGINT NOT NULL, updated_ms BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS slots (scope TEXT PRIMARY KEY, in_use BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS operations (
    tenant TEXT NOT NULL, key TEXT NOT NULL, state TEXT NOT NULL, worker TEXT,
    record TEXT NOT NULL, PRIMARY KEY (tenant, key));
CREATE INDEX IF NOT EXISTS operations_by_worker ON operations (worker, state)
    WHERE worker IS NOT NULL;
CREATE TABLE IF NOT EXISTS queue (
    seq {seq}, tenant TEXT NOT NULL, key TEXT NOT NULL,
    tokens BIGINT NOT NULL, not_before_ms BIGINT NOT NULL, expire_at_ms BIGINT NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS queue_by_tenant ON queue (tenant, seq);
CREATE UNIQUE INDEX IF NOT EXISTS queue_by_key ON queue (tenant, key);
CREATE INDEX IF NOT EXISTS queue_by_expiry ON queue (expire_at_ms);
CREATE TABLE IF NOT EXISTS tenant_queues (
    tenant TEXT PRIMARY KEY, depth BIGINT NOT NULL, deficit BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS tenant_queues_backlogged ON tenant_queues (tenant) WHERE depth > 0;
";

/// The statements that create the schema, with the dialect's auto-incrementing key.
pub fn tables(seq_column: &str) -> String {
    TABLES.replace("{seq}", seq_column)
}

/// What to do with the `schema_version` found in `meta`, for a host writing `ours`:
/// `Ok(true)` to record ours (a new database, or an older version, whose upgrade is the
/// tables the caller has just created `IF NOT EXISTS`), `Ok(false)` when it matches, an
/// error for a newer version or anything else (the caller's transaction then rolls back).
pub fn check_version(found: Option<String>, ours: i64) -> Result<bool, StoreError> {
    match found.as_deref().map(str::parse::<i64>) {
        None => Ok(true),
        Some(Ok(v)) if v == ours => Ok(false),
        Some(Ok(v)) if (1..ours).contains(&v) => Ok(true),
        _ => Err(StoreError::Schema(format!(
            "database schema version {} is not {ours}, which this build of tollgate writes",
            found.unwrap_or_default()
        ))),
    }
}

/// Reads the recorded schema version from `meta` (no row in a new database).
pub const READ_VERSION_SQL: &str = "SELECT value FROM meta WHERE name = 'schema_version'";

/// Records `version` in `meta` (the dialects share the upsert syntax); `$1`/`?1` is spelled
/// by the caller.
pub fn record_version_sql(placeholder: &str) -> String {
    format!(
        "INSERT INTO meta (name, value) VALUES ('schema_version', {placeholder})
         ON CONFLICT (name) DO UPDATE SET value = excluded.value"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_versions_are_upgraded_and_newer_or_garbled_ones_refused() {
        assert!(check_version(None, 2).unwrap());
        assert!(check_version(Some("1".into()), 2).unwrap());
        assert!(!check_version(Some("2".into()), 2).unwrap());
        for bad in ["3", "0", "-1", "two", ""] {
            let e = check_version(Some(bad.into()), 2).unwrap_err();
            assert!(e.to_string().contains("is not 2"), "{e}");
        }
        assert!(check_version(Some("2".into()), 1).is_err());
    }
}
