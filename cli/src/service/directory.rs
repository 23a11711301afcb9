//! The operators' endpoints for the directory: tenants and keys, changed at run time and
//! kept in the store (every replica on it takes a change up within a second). Groups have
//! theirs in `groups.rs`.

use super::Shared;
use crate::http::auth::admin;
use crate::http::body::{read_body, OpKey};
use crate::http::refusal::{refuse, Refusal, Rejection};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tollgate::config::Role;
use tollgate::engine::DirectoryError;
use tollgate::engine::Engine;
use tollgate::store::AnyStore;

/// A directory refusal: its status, reason word and message.
pub(super) fn refused(e: DirectoryError) -> Response {
    let (status, reason) = match &e {
        DirectoryError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        DirectoryError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        DirectoryError::Busy(_) => (StatusCode::CONFLICT, "tenant_busy"),
        DirectoryError::GroupInUse(..) => (StatusCode::CONFLICT, "group_in_use"),
        DirectoryError::LastAdmin => (StatusCode::CONFLICT, "last_admin_key"),
        DirectoryError::OwnedByConfiguration(_) => (StatusCode::CONFLICT, "owned_by_configuration"),
        DirectoryError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
    };
    if matches!(e, DirectoryError::Store(_)) {
        tracing::warn!(error = %e, "directory change failed");
    }
    let message = format!("{reason}: {e}");
    let body = json!({"outcome": "rejected", "reason": reason, "error": e.to_string(), "message": message});
    (status, axum::Json(body)).into_response()
}

/// Runs a directory change off the async workers (it takes the store's lock).
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DirectoryError> + Send + 'static,
) -> Result<Result<T, DirectoryError>, Refusal> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| refuse(Rejection::Internal))
}

/// A tenant as listed: as written, and with the defaults applied.
fn tenant_view(engine: &Engine<AnyStore>, name: &str) -> Option<Value> {
    let config = engine.config();
    let effective = config.tenant(name)?;
    Some(json!({
        "name": name,
        "config": config.written_tenants().get(name).cloned().unwrap_or(json!({})),
        "effective": effective,
    }))
}

/// A directory entry's settings as written: a JSON object within the request size bound.
pub(super) async fn written_object(
    s: &Shared,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, Refusal> {
    let bytes = read_body(headers, body, s.engine.config().max_request_bytes).await?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(written) if written.is_object() => Ok(written),
        _ => Err(refuse(Rejection::InvalidRequest)),
    }
}

/// A tenant or group name from the path: UTF-8 of 1 to 255 bytes.
pub(super) fn tenant_name(name: OpKey) -> Result<String, Refusal> {
    match name.0 {
        Some(n) if (1..=255).contains(&n.len()) => Ok(n),
        _ => Err(refuse(Rejection::InvalidRequest)),
    }
}

pub(super) async fn tenants_list(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let names: Vec<String> = s.engine.config().tenants.keys().cloned().collect();
    let tenants: Vec<Value> = names
        .iter()
        .filter_map(|n| tenant_view(&s.engine, n))
        .collect();
    Ok(axum::Json(json!({ "tenants": tenants })).into_response())
}

pub(super) async fn tenant_get(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    match tenant_view(&s.engine, &name) {
        Some(view) => Ok(axum::Json(view).into_response()),
        None => Err(refuse(Rejection::NotFound)),
    }
}

pub(super) async fn tenant_put(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    let written = written_object(&s, &headers, body).await?;
    let engine = s.engine.clone();
    let tenant = name.clone();
    let now_ms = s.clock.now_ms();
    match blocking(move || engine.put_tenant(&tenant, &written, now_ms)).await? {
        Ok(()) => {
            tracing::info!(tenant = %name, "tenant written");
            s.take_up_changes().await;
            Ok(axum::Json(tenant_view(&s.engine, &name)).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}

pub(super) async fn tenant_delete(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    let engine = s.engine.clone();
    let tenant = name.clone();
    match blocking(move || engine.delete_tenant(&tenant)).await? {
        Ok(revoked) => {
            tracing::info!(tenant = %name, revoked_keys = revoked.len(), "tenant deleted");
            s.take_up_changes().await;
            Ok(axum::Json(json!({"deleted": name, "revoked_keys": revoked})).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}

/// `POST /v1/admin/keys`: the role of the key to make.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, tag = "role", rename_all = "snake_case")]
enum NewKey {
    Caller { tenant: String },
    Worker { name: String },
    Admin,
}

pub(super) async fn keys_create(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let bytes = read_body(&headers, body, s.engine.config().max_request_bytes).await?;
    let asked: NewKey =
        serde_json::from_slice(&bytes).map_err(|_| refuse(Rejection::InvalidRequest))?;
    let role = match asked {
        NewKey::Caller { tenant } => Role::Caller { tenant },
        NewKey::Worker { name } => Role::Worker { name },
        NewKey::Admin => Role::Admin,
    };
    let engine = s.engine.clone();
    let made = blocking(move || engine.create_key(&role)).await?;
    match made {
        Ok((id, key)) => {
            // The key itself is never logged: only its id.
            tracing::info!(id = %id, "key created");
            s.take_up_changes().await;
            let info = s.engine.keys().into_iter().find(|k| k.id == id);
            let mut body = json!({"id": id, "key": key});
            if let Some(info) = info {
                body["role"] = json!(info.role);
                body["tenant"] = json!(info.tenant);
                body["name"] = json!(info.name);
            }
            Ok(axum::Json(body).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}

pub(super) async fn keys_list(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    Ok(axum::Json(json!({"keys": s.engine.keys()})).into_response())
}

pub(super) async fn key_delete(
    State(s): State<Shared>,
    headers: HeaderMap,
    id: OpKey,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let id = tenant_name(id)?;
    let engine = s.engine.clone();
    let key = id.clone();
    match blocking(move || engine.revoke_key(&key)).await? {
        Ok(()) => {
            tracing::info!(id = %id, "key revoked");
            s.take_up_changes().await;
            Ok(axum::Json(json!({"revoked": id})).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}
