//! `GET /v1/admin/spend`: the spend ledger summed by tenant, group, model or day over a span
//! of hours, as JSON, or as CSV with `Accept: text/csv`.

use super::directory::blocking;
use super::Shared;
use crate::http::auth::admin;
use crate::http::refusal::{refuse_until, Refusal, Rejection};
use crate::http::STORE_RETRY_AFTER_MS;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use tollgate::engine::DirectoryError;
use tollgate::spend::{self, SpendQuery};

/// The query's words, each optional (`group_by`, `from`, `to`); others are refused.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct SpendParams(HashMap<String, String>);

/// A 400 that says which parameter is wrong and why.
fn invalid(message: String) -> Response {
    let body = json!({"outcome": "rejected", "reason": "invalid_request",
                      "message": format!("invalid_request: {message}")});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

pub(super) async fn spend(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(SpendParams(params)): Query<SpendParams>,
) -> Result<Response, Refusal> {
    admin(&s, &headers)?;
    if let Some(k) = params
        .keys()
        .find(|k| !["group_by", "from", "to"].contains(&k.as_str()))
    {
        return Ok(invalid(format!(
            "{k}: not a parameter (group_by, from, to)"
        )));
    }
    let get = |k: &str| params.get(k).map(String::as_str);
    let query = match SpendQuery::parse(get("group_by"), get("from"), get("to"), s.clock.now_ms()) {
        Ok(q) => q,
        Err(e) => return Ok(invalid(e)),
    };
    let engine = s.engine.clone();
    let rows = blocking(move || {
        engine
            .spend(query.from_ms, query.to_ms)
            .map_err(DirectoryError::Store)
    })
    .await?;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "spend report failed");
            return Err(refuse_until(
                Rejection::StoreUnavailable,
                STORE_RETRY_AFTER_MS,
            ));
        }
    };
    let lines = spend::report(&rows, query.group_by);
    let wants_csv = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    if wants_csv {
        let body = spend::csv(&lines, query.group_by);
        return Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response());
    }
    Ok(axum::Json(query.json(&lines)).into_response())
}
