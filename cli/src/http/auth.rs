//! Who is asking: the bearer key's role (401 when missing or unknown), and what that role
//! may act for (403 otherwise).

use super::refusal::{refuse, Refusal, Rejection};
use super::AppState;
use axum::http::{header, HeaderMap};
use tollgate::config::Role;

/// The role of the request's bearer key: 401 when missing, unknown, of another scheme, or
/// given in more than one `Authorization` header.
pub(crate) fn role(s: &AppState, headers: &HeaderMap) -> Result<Role, Refusal> {
    // With two headers, a proxy in front might have checked the other key.
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let key = match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok().and_then(bearer),
        _ => None,
    };
    key.and_then(|k| s.engine.role_of(k))
        .ok_or_else(|| refuse(Rejection::Unauthorized))
}

/// The token of a `Bearer <token>` credential; the scheme is case-insensitive (RFC 9110).
pub(crate) fn bearer(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Who may complete or reconcile: a caller for its own tenant, or a worker naming the tenant
/// in the body (and then only for jobs it claimed).
pub(crate) fn acting_for(
    role: Role,
    body_tenant: Option<String>,
) -> Result<(String, Option<String>), Refusal> {
    match role {
        Role::Caller { tenant } => match body_tenant {
            Some(t) if t != tenant => Err(refuse(Rejection::Forbidden)),
            _ => Ok((tenant, None)),
        },
        Role::Worker { name } => Ok((
            body_tenant.ok_or_else(|| refuse(Rejection::InvalidRequest))?,
            Some(name),
        )),
        Role::Admin => Err(refuse(Rejection::Forbidden)),
    }
}

pub(crate) fn admin(s: &AppState, headers: &HeaderMap) -> Result<(), Refusal> {
    match role(s, headers)? {
        Role::Admin => Ok(()),
        _ => Err(refuse(Rejection::Forbidden)),
    }
}
