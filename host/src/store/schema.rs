//! The schema every backend creates, written once. Only the queue's sequence column differs
//! between dialects; `BIGINT` has integer affinity in SQLite, as it is in PostgreSQL.

use super::StoreError;

/// The schema version each dialect writes. SQLite's 2 added `bucket_log` (balances are
/// logged and folded now and then, see `bucket_log`): a host of version 1 would read stale
/// balances from such a database, so it refuses it. PostgreSQL writes balances in place.
/// SQLite's 3 and PostgreSQL's 2 added the queue's `priority` (dispatch bands). SQLite's 4
/// and PostgreSQL's 3 pack operations' records (`record`), which an earlier host could not
/// read: nothing else changes, so the upgrade is recording the version.
pub const SQLITE_VERSION: i64 = 4;
#[cfg(feature = "postgres")]
pub const POSTGRES_VERSION: i64 = 3;
/// The versions that added `queue.priority`, by dialect.
pub const SQLITE_PRIORITY_SINCE: i64 = 3;
#[cfg(feature = "postgres")]
pub const POSTGRES_PRIORITY_SINCE: i64 = 2;

/// Adds `queue.priority` to a queue made before it: every job queued then is `standard`.
const ADD_PRIORITY: &str = "ALTER TABLE queue ADD COLUMN priority BIGINT NOT NULL DEFAULT 1";
/// The index dispatch seeks per band: the next backlogged tenant, then its oldest job.
const BAND_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS queue_by_band ON queue (priority, tenant, seq)";

/// What brings a schema found at version `found` (none: just created) up to date, after
/// [`tables`] ran: columns added since, then the indexes that use them.
pub fn upgrades(found: Option<&str>, priority_since: i64) -> Vec<&'static str> {
    let mut out = Vec::new();
    if let Some(v) = found.and_then(|v| v.parse::<i64>().ok()) {
        if v < priority_since {
            out.push(ADD_PRIORITY);
        }
    }
    out.push(BAND_INDEX);
    out
}

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
    tokens BIGINT NOT NULL, not_before_ms BIGINT NOT NULL, expire_at_ms BIGINT NOT NULL,
    priority BIGINT NOT NULL DEFAULT 1);
CREATE UNIQUE INDEX IF NOT EXISTS queue_by_tenant ON queue (tenant, seq);
CREATE UNIQUE INDEX IF NOT EXISTS queue_by_key ON queue (tenant, key);
CREATE INDEX IF NOT EXISTS queue_by_expiry ON queue (expire_at_ms);
CREATE TABLE IF NOT EXISTS tenant_queues (
    tenant TEXT PRIMARY KEY, depth BIGINT NOT NULL, deficit BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS tenant_queues_backlogged ON tenant_queues (tenant) WHERE depth > 0;
CREATE INDEX IF NOT EXISTS operations_unknown ON operations (tenant, key) WHERE state = 'unknown';
CREATE TABLE IF NOT EXISTS policies (digest TEXT PRIMARY KEY, bytes {blob} NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (name TEXT PRIMARY KEY, written TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, role TEXT NOT NULL, subject TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    tenant TEXT NOT NULL, key TEXT NOT NULL, expires_ms BIGINT NOT NULL, size BIGINT NOT NULL,
    bytes {blob} NOT NULL, PRIMARY KEY (tenant, key));
CREATE INDEX IF NOT EXISTS answers_by_expiry ON answers (expires_ms);
CREATE TABLE IF NOT EXISTS spend (
    hour_ms BIGINT NOT NULL, tenant TEXT NOT NULL, group_chain TEXT NOT NULL, model TEXT NOT NULL,
    deployment TEXT NOT NULL, calls BIGINT NOT NULL, input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL, cached_input_tokens BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL, reasoning_tokens BIGINT NOT NULL,
    cost_microusd BIGINT NOT NULL,
    PRIMARY KEY (hour_ms, tenant, group_chain, model, deployment));
CREATE TABLE IF NOT EXISTS owned_objects (
    tenant TEXT NOT NULL, kind TEXT NOT NULL, id TEXT NOT NULL, model TEXT NOT NULL,
    deployment TEXT NOT NULL, created_ms BIGINT NOT NULL, PRIMARY KEY (tenant, kind, id));
CREATE INDEX IF NOT EXISTS owned_objects_by_age ON owned_objects (created_ms);
CREATE TABLE IF NOT EXISTS alerts (
    id TEXT PRIMARY KEY, budget TEXT NOT NULL, webhook TEXT NOT NULL, secret_env TEXT,
    payload TEXT NOT NULL, attempts BIGINT NOT NULL, next_ms BIGINT NOT NULL, sent_ms BIGINT);
CREATE INDEX IF NOT EXISTS alerts_due ON alerts (next_ms) WHERE sent_ms IS NULL;
";

/// The statements that create the schema, with the dialect's auto-incrementing key and
/// byte-string type. (`policies` keeps the components the store's policy state names,
/// `tenants` and `api_keys` the directory, `answers` the saved answers replayed to a repeated
/// call, `spend` the spend ledger, `alerts` the outbox of budget alerts,
/// `owned_objects` who made each stored object the gateway hands back: tables added without a version bump, since an earlier
/// host never reads them.)
pub fn tables(seq_column: &str, blob: &str) -> String {
    TABLES.replace("{seq}", seq_column).replace("{blob}", blob)
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

    #[test]
    fn the_priority_column_is_added_to_queues_made_before_it() {
        assert_eq!(upgrades(None, 3), vec![BAND_INDEX]);
        assert_eq!(upgrades(Some("3"), 3), vec![BAND_INDEX]);
        assert_eq!(upgrades(Some("2"), 3), vec![ADD_PRIORITY, BAND_INDEX]);
        assert_eq!(upgrades(Some("1"), 2), vec![ADD_PRIORITY, BAND_INDEX]);
    }
}
