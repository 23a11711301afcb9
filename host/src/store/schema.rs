//! The schema every backend creates, written once. Only the queue's sequence column differs
//! between dialects; `BIGINT` has integer affinity in SQLite, as it is in PostgreSQL.

use super::StoreError;

/// The schema version this host writes; a database with another is refused.
pub const VERSION: i64 = 1;

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

/// What to do with the `schema_version` found in `meta`: `Ok(true)` to record ours (a new
/// database), `Ok(false)` when it matches, an error for any other version.
pub fn check_version(found: Option<String>) -> Result<bool, StoreError> {
    match found.map(|v| v.parse::<i64>()) {
        None => Ok(true),
        Some(Ok(VERSION)) => Ok(false),
        Some(other) => Err(StoreError::Schema(format!(
            "database schema version {other:?} is not {VERSION}, which this build of tollgate writes"
        ))),
    }
}
