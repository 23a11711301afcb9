//! Every SQL statement the PostgreSQL store runs, prepared once per connection and named
//! by field, so a misspelt name is a compile error rather than a panic at run time.

use crate::store::StoreError;
use postgres::{Client, Statement};

/// Declares [`Statements`] and its `prepare` from one list of `name = sql` pairs.
macro_rules! statements {
    ($($name:ident = $sql:expr;)*) => {
        /// The store's prepared statements, one field each.
        pub(super) struct Statements {
            $(pub(super) $name: Statement,)*
        }

        impl Statements {
            /// Prepares every statement on `client`.
            pub(super) fn prepare(client: &mut Client) -> Result<Self, StoreError> {
                Ok(Statements {
                    $($name: client.prepare($sql)?,)*
                })
            }
        }
    };
}

statements! {
    bucket = "SELECT balance_micro, updated_ms FROM buckets WHERE name = $1";
    slots = "SELECT in_use FROM slots WHERE scope = $1";
    flush_operations = "INSERT INTO operations (tenant, key, state, worker, record)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        ON CONFLICT (tenant, key) DO UPDATE SET state = EXCLUDED.state,
        worker = EXCLUDED.worker, record = EXCLUDED.record";
    prefetch = "SELECT 0::int2, name, NULL::text, balance_micro, updated_ms, NULL::text
            FROM buckets WHERE name = ANY($1)
        UNION ALL SELECT 1::int2, scope, NULL::text, in_use, NULL::bigint, NULL::text
            FROM slots WHERE scope = ANY($2)
        UNION ALL SELECT 2::int2, tenant, key, NULL::bigint, NULL::bigint, record
            FROM operations WHERE tenant = ANY($3) AND key = ANY($4)
        UNION ALL SELECT 3::int2, name, NULL::text, NULL::bigint, NULL::bigint, value
            FROM meta WHERE name = ANY($5)
        UNION ALL SELECT 4::int2, '', NULL::text,
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint, NULL::bigint, NULL::text";
    flush = "WITH o AS (INSERT INTO operations (tenant, key, state, worker, record)
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
            ON CONFLICT (tenant, key) DO UPDATE SET state = EXCLUDED.state,
            worker = EXCLUDED.worker, record = EXCLUDED.record),
        b AS (INSERT INTO buckets (name, balance_micro, updated_ms)
            SELECT * FROM unnest($6::text[], $7::bigint[], $8::bigint[])
            ON CONFLICT (name) DO UPDATE SET balance_micro = EXCLUDED.balance_micro,
            updated_ms = EXCLUDED.updated_ms),
        s AS (INSERT INTO slots (scope, in_use) SELECT * FROM unnest($9::text[], $10::bigint[])
            ON CONFLICT (scope) DO UPDATE SET in_use = EXCLUDED.in_use)
        SELECT 1";
    clock = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    try_lock = "SELECT pg_try_advisory_xact_lock($1, $2)";
    try_locks = "SELECT count(*) FILTER (WHERE NOT pg_try_advisory_xact_lock(a, b))
        FROM unnest($1::int4[], $2::int4[]) AS t(a, b)";
    operation = "SELECT record FROM operations WHERE tenant = $1 AND key = $2";
    operations = "SELECT tenant, key, record FROM operations ORDER BY tenant, key";
    operations_after = "SELECT tenant, key, record FROM operations
        WHERE (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3";
    unknown_after = "SELECT tenant, key, record FROM operations
        WHERE state = 'unknown' AND (tenant, key) > ($1, $2) ORDER BY tenant, key LIMIT $3";
    delete_operation = "DELETE FROM operations WHERE tenant = $1 AND key = $2";
    delete_operation_answer = "DELETE FROM answers WHERE tenant = $1 AND key = $2";
    claimed_by = "SELECT tenant, key, record FROM operations WHERE worker = $1";
    count_unknown = "SELECT COUNT(*) FROM operations WHERE state = 'unknown'";
    unfinished = "SELECT COUNT(*) FROM operations WHERE worker = $1 AND state IN ('active', 'unknown')";
    meta = "SELECT value FROM meta WHERE name = $1";
    set_meta = "INSERT INTO meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = $2";
    enqueue = "INSERT INTO queue (tenant, key, tokens, not_before_ms, expire_at_ms, priority) VALUES ($1, $2, $3, $4, $5, $6)";
    depth_up = "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES ($1, 1, 0)
        ON CONFLICT (tenant) DO UPDATE SET depth = tenant_queues.depth + 1";
    dequeue = "DELETE FROM queue WHERE tenant = $1 AND key = $2";
    depth_down = "UPDATE tenant_queues SET depth = depth - $2 WHERE tenant = $1";
    depth = "SELECT depth FROM tenant_queues WHERE tenant = $1";
    ready_head = "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
        WHERE priority = $3 AND tenant = $1 AND not_before_ms <= $2 ORDER BY seq LIMIT 1";
    next_after = "SELECT tenant FROM queue WHERE priority = $2 AND tenant > $1 ORDER BY tenant LIMIT 1";
    next_first = "SELECT tenant FROM queue WHERE priority = $1 ORDER BY tenant LIMIT 1";
    band_has_jobs = "SELECT EXISTS (SELECT 1 FROM queue WHERE priority = $2 AND tenant = $1)";
    infeasible = "SELECT tenant, key, tokens, not_before_ms, expire_at_ms, priority FROM queue
        WHERE expire_at_ms <= $1 ORDER BY expire_at_ms, seq";
    deficit = "SELECT deficit FROM tenant_queues WHERE tenant = $1";
    policy_component = "SELECT bytes FROM policies WHERE digest = $1";
    answer = "SELECT bytes FROM answers WHERE tenant = $1 AND key = $2 AND expires_ms > $3";
    put_answer = "INSERT INTO answers (tenant, key, expires_ms, size, bytes) VALUES ($1, $2, $3, $4, $5) \
        ON CONFLICT (tenant, key) DO UPDATE SET expires_ms = EXCLUDED.expires_ms, size = EXCLUDED.size, bytes = EXCLUDED.bytes";
    delete_answers = "DELETE FROM answers WHERE ctid IN \
        (SELECT ctid FROM answers WHERE expires_ms <= $1 ORDER BY expires_ms LIMIT $2)";
    owned_object = "SELECT model, deployment, created_ms FROM owned_objects
        WHERE tenant = $1 AND kind = $2 AND id = $3";
    put_owned_object = "INSERT INTO owned_objects (tenant, kind, id, model, deployment, created_ms)
        VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, kind, id) DO UPDATE SET
        model = EXCLUDED.model, deployment = EXCLUDED.deployment, created_ms = EXCLUDED.created_ms";
    delete_owned_object = "DELETE FROM owned_objects WHERE tenant = $1 AND kind = $2 AND id = $3";
    delete_owned_objects = "DELETE FROM owned_objects WHERE ctid IN \
        (SELECT ctid FROM owned_objects WHERE created_ms < $1 ORDER BY created_ms LIMIT $2)";
    answer_bytes = "SELECT COALESCE(SUM(size), 0)::BIGINT FROM answers";
    put_policy_component = "INSERT INTO policies (digest, bytes) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING";
    written_tenants = "SELECT name, written FROM tenants ORDER BY name";
    put_written_tenant = "INSERT INTO tenants (name, written) VALUES ($1, $2)
        ON CONFLICT (name) DO UPDATE SET written = $2";
    delete_written_tenant = "DELETE FROM tenants WHERE name = $1";
    tenant_has_work = "SELECT EXISTS (SELECT 1 FROM operations WHERE tenant = $1
        AND state IN ('queued', 'active', 'unknown', 'retry_pending'))";
    api_keys = "SELECT id, sha256, role, subject FROM api_keys ORDER BY id";
    put_api_key = "INSERT INTO api_keys (id, sha256, role, subject) VALUES ($1, $2, $3, $4)";
    delete_api_key = "DELETE FROM api_keys WHERE id = $1";
    retain_policy_components = "DELETE FROM policies WHERE digest NOT IN ($1, $2, $3)";
    add_spend = &crate::store::ledger_sql::pg(crate::store::ledger_sql::ADD);
    spend_rows = &crate::store::ledger_sql::pg(crate::store::ledger_sql::ROWS);
    put_alert = &crate::store::ledger_sql::pg(crate::store::ledger_sql::PUT_ALERT);
    due_alerts = &crate::store::ledger_sql::pg(crate::store::ledger_sql::DUE_ALERTS);
    alert_tried = &crate::store::ledger_sql::pg(crate::store::ledger_sql::ALERT_TRIED);
    pending_alerts = crate::store::ledger_sql::PENDING_ALERTS;
    delete_sent_alerts = "DELETE FROM alerts WHERE ctid IN \
        (SELECT ctid FROM alerts WHERE sent_ms IS NOT NULL AND sent_ms < $1 LIMIT $2)";
    delete_spend = "DELETE FROM spend WHERE ctid IN \
        (SELECT ctid FROM spend WHERE hour_ms < $1 LIMIT $2)";
    set_deficit = "INSERT INTO tenant_queues (tenant, depth, deficit) VALUES ($1, 0, $2)
        ON CONFLICT (tenant) DO UPDATE SET deficit = $2";
}
