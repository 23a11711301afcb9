//! The operators' endpoints for groups (`/v1/admin/groups/{g}`): teams and organisations
//! above tenants, each with budgets its tenants' calls draw on. Kept in the store with the
//! rest of the directory, so every replica enforces the same groups.

use super::directory::{blocking, refused, tenant_name, written_object};
use super::Shared;
use crate::http::auth::admin;
use crate::http::body::OpKey;
use crate::http::refusal::{refuse, Refusal, Rejection};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tollgate::engine::Engine;
use tollgate::store::AnyStore;

/// A group as listed: as written, its parents up to the top, and its tenants.
fn group_view(engine: &Engine<AnyStore>, name: &str) -> Option<Value> {
    let config = engine.config();
    config.groups.get(name)?;
    let tenants: Vec<&String> = config
        .tenants
        .iter()
        .filter(|(_, t)| t.group.as_deref() == Some(name))
        .map(|(n, _)| n)
        .collect();
    Some(json!({
        "name": name,
        "config": config.written_groups().get(name).cloned().unwrap_or(json!({})),
        "chain": config.group_chain_of(Some(name)),
        "tenants": tenants,
    }))
}

pub(super) async fn groups_list(
    State(s): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let names: Vec<String> = s.engine.config().groups.keys().cloned().collect();
    let groups: Vec<Value> = names
        .iter()
        .filter_map(|n| group_view(&s.engine, n))
        .collect();
    Ok(axum::Json(json!({ "groups": groups })).into_response())
}

pub(super) async fn group_get(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    match group_view(&s.engine, &name) {
        Some(view) => Ok(axum::Json(view).into_response()),
        None => Err(refuse(Rejection::NotFound)),
    }
}

pub(super) async fn group_put(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
    body: Body,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    let written = written_object(&s, &headers, body).await?;
    let engine = s.engine.clone();
    let group = name.clone();
    let now_ms = s.clock.now_ms();
    match blocking(move || engine.put_group(&group, &written, now_ms)).await? {
        Ok(()) => {
            tracing::info!(group = %name, "group written");
            s.take_up_changes().await;
            Ok(axum::Json(group_view(&s.engine, &name)).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}

pub(super) async fn group_delete(
    State(s): State<Shared>,
    headers: HeaderMap,
    name: OpKey,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    let name = tenant_name(name)?;
    let engine = s.engine.clone();
    let group = name.clone();
    match blocking(move || engine.delete_group(&group)).await? {
        Ok(()) => {
            tracing::info!(group = %name, "group deleted");
            s.take_up_changes().await;
            Ok(axum::Json(json!({ "deleted": name })).into_response())
        }
        Err(e) => Ok(refused(e)),
    }
}
