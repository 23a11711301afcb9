//! The workers' endpoint: dispatch (claims of queued durable jobs).

use super::Shared;
use crate::http::auth::role;
use crate::http::body::{json_body, read_body};
use crate::http::refusal::{refuse, Refusal, Rejection};
use crate::service::operations::store_refusal;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tollgate::config::Role;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DispatchBody {
    #[serde(default)]
    worker: Option<String>,
    count: u32,
}

pub(super) async fn dispatch(
    State(s): State<Shared>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refusal> {
    let Role::Worker { name } = role(&s, &headers)? else {
        return Err(refuse(Rejection::Forbidden));
    };
    let bytes = read_body(&headers, body, s.engine.config().max_request_bytes).await?;
    let b: DispatchBody = json_body(&bytes)?;
    if b.worker.as_ref().is_some_and(|w| *w != name) {
        return Err(refuse(Rejection::Forbidden));
    }
    let count = b.count.min(1000);
    let started = std::time::SystemTime::now();
    let a = s
        .writer
        .dispatch(name.clone(), count, s.clock.now_ms())
        .await;
    let a = a.map_err(store_refusal)?;
    crate::telemetry::dispatched(&a.claimed, &name, started);
    Ok(axum::Json(json!(a)).into_response())
}
