//! Gateway mode: `POST /v1/chat/completions`, `POST /v1/responses`, `POST /v1/embeddings`
//! and `GET /v1/models` in OpenAI's shape and `POST /v1/messages` in Anthropic's, so that an
//! OpenAI or Anthropic SDK pointed at tollgate gets its limits applied (`docs/gateway.md`);
//! what differs between the dialects is in `dialect`, Anthropic's words at the boundary in
//! `anthropic`, stored responses (each its tenant's) in `owned`, the calls that cost nothing
//! in `passthrough`.
//!
//! A call is admitted by the engine before anything goes upstream (the prompt counted with
//! the model's tokenizer), sent to the model's upstream with the upstream's key (never the
//! caller's), and completed with the usage the provider reports. Refusals before any answer
//! are retried here, once per policy verdict; an answer cut off leaves the operation
//! `unknown`, its slot held, never retried.

mod anthropic;
mod call;
mod completion;
mod dialect;
mod openai;
mod owned;
mod passthrough;
mod replay;
mod sse;
mod tokens;
pub(crate) mod upstream;

use crate::http::auth::role;
use crate::http::body::read_body;
use crate::http::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tollgate::config::{ConfigFile, GatewayConfig, Role, UpstreamKind};

use dialect::Dialect;
use openai::ApiError;
pub use upstream::HttpClient;

/// What the gateway knows of one model.
struct ModelRoute {
    /// The API its upstreams speak (one per model, checked at start).
    kind: UpstreamKind,
    counter: tokens::Counter,
    default_max_output_tokens: u64,
    /// Where each deployment sends a call, by deployment name.
    deployments: BTreeMap<String, DeploymentRoute>,
}

/// Where one deployment sends a call.
struct DeploymentRoute {
    /// The API its upstream speaks.
    kind: UpstreamKind,
    /// The upstream's base URL, without a trailing `/` (a dialect's path follows it).
    base_url: String,
    /// The upstream's key, read from its environment variable at start.
    api_key: Option<String>,
    /// The model's name at this deployment, when it differs.
    upstream_model: Option<String>,
}

/// The gateway's state, built once at start.
pub struct Gateway {
    models: BTreeMap<String, ModelRoute>,
    client: HttpClient,
    default_timeout_ms: u64,
    max_attempts: u32,
    /// Answer replay, when on.
    replay: Option<replay::Replay>,
}

/// The timeout an official SDK sends with every request, in ms: `x-stainless-read-timeout`
/// (OpenAI's) or `x-stainless-timeout` (Anthropic's), in seconds; `None` when neither is
/// there or readable.
fn sdk_timeout_ms(headers: &HeaderMap) -> Option<u64> {
    ["x-stainless-read-timeout", "x-stainless-timeout"]
        .iter()
        .find_map(|name| {
            let s: f64 = headers.get(*name)?.to_str().ok()?.trim().parse().ok()?;
            (s.is_finite() && s > 0.0)
                .then(|| ((s * 1000.0).ceil() as u64).clamp(1, MAX_TIMEOUT_MS))
        })
}

/// Longest `x-tollgate-timeout-ms` a caller may ask for: one day.
const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Largest answer read whole from an upstream (a plain, non-streamed answer).
const MAX_ANSWER_BYTES: usize = 64 << 20;

impl Gateway {
    /// The gateway of `config`, when it has a `gateway` section. Reads the upstreams'
    /// keys from the environment: a variable named but not set is an error at start.
    pub fn from_config(config: &ConfigFile) -> Result<Option<Gateway>, String> {
        let Some(g) = &config.gateway else {
            return Ok(None);
        };
        Gateway::new(g).map(Some)
    }

    fn new(g: &GatewayConfig) -> Result<Gateway, String> {
        let mut keys = BTreeMap::new();
        for (name, u) in &g.upstreams {
            let key = match &u.api_key_env {
                Some(var) => Some(std::env::var(var).map_err(|_| {
                    format!("gateway.upstreams.{name}.api_key_env: {var} is not set")
                })?),
                None => None,
            };
            keys.insert(name.clone(), key);
        }
        let models = g
            .models
            .iter()
            .map(|(name, m)| {
                let deployments = m
                    .deployments()
                    .into_iter()
                    .map(|d| {
                        let upstream = &g.upstreams[&d.upstream];
                        let route = DeploymentRoute {
                            kind: upstream.kind,
                            base_url: upstream.base_url.trim_end_matches('/').to_string(),
                            api_key: keys[&d.upstream].clone(),
                            upstream_model: d.upstream_model.clone(),
                        };
                        (d.name, route)
                    })
                    .collect();
                let route = ModelRoute {
                    kind: g.kind_of(name).unwrap_or_default(),
                    counter: tokens::Counter::new(
                        m.tokenizer.as_deref(),
                        m.estimate_bytes_per_token,
                    ),
                    default_max_output_tokens: m.default_max_output_tokens,
                    deployments,
                };
                (name.clone(), route)
            })
            .collect();
        Ok(Gateway {
            models,
            client: upstream::client(),
            default_timeout_ms: g.default_timeout_ms,
            max_attempts: g.max_attempts,
            replay: g.replay.then(|| replay::Replay {
                ttl_ms: (g.replay_ttl_s * 1000) as i64,
                max_bytes: g.replay_max_answer_bytes as usize,
            }),
        })
    }
}

/// What the gateway's handlers share: the floor's state and the gateway's own.
pub struct GatewayState {
    /// The engine, the writer, metrics and the clock, shared with the service.
    pub core: crate::http::Shared,
    /// The models, their upstreams and the gateway's settings.
    pub gateway: Gateway,
}

/// The floor's state is read through the gateway's (`s.engine`, `s.writer`, …).
impl std::ops::Deref for GatewayState {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.core
    }
}

/// The gateway's state, shared by its handlers.
pub type Shared = std::sync::Arc<GatewayState>;

/// The gateway's routes, merged beside the service's by the server when it is configured.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses))
        .route(
            "/v1/responses/{id}",
            get(owned::response).delete(owned::response),
        )
        .route(
            "/v1/responses/{id}/{part}",
            get(owned::response_part).post(owned::response_part),
        )
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(passthrough::count_tokens))
        .route("/v1/models", get(models))
        .with_state(state)
}

/// The caller's tenant, or an OpenAI-shaped 401/403.
fn caller(s: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    match role(s, headers) {
        Ok(Role::Caller { tenant }) => Ok(tenant),
        Ok(_) => Err(ApiError::new(
            403,
            "forbidden",
            "this key is not a caller's key",
        )),
        Err(_) => Err(ApiError::new(
            401,
            "invalid_api_key",
            "a caller key is required: Authorization: Bearer <key>",
        )),
    }
}

async fn models(State(s): State<Shared>, headers: HeaderMap) -> Response {
    if let Err(e) = caller(&s, &headers) {
        return e.into_response();
    }
    let g = &s.gateway;
    let data: Vec<Value> = g
        .models
        .keys()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tollgate"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// One call of any dialect, as the caller asked for it.
pub(crate) struct GatewayCall {
    tenant: String,
    model: String,
    key: String,
    deadline_ms: i64,
    /// Chat completions, Responses or embeddings.
    dialect: Dialect,
    /// The caller's body, to be sent upstream (with the plan's limit and the upstream's
    /// model name written in).
    body: Map<String, Value>,
    /// Which field carries the output limit upstream (none: the dialect has no output).
    limit_field: Option<&'static str>,
    stream: bool,
    /// Whether the caller asked for the usage chunk of a stream.
    caller_wants_usage: bool,
    /// The caller's headers that go upstream (Anthropic's version and beta flags).
    upstream_headers: Vec<(axum::http::HeaderName, axum::http::HeaderValue)>,
    request: tollgate::model::Request,
    /// Whether the answer is kept for a repeat (the caller gave an `Idempotency-Key` and
    /// replay is on).
    replay: Option<replay::Replay>,
    /// The request's span (disabled when nothing is exported): a stream keeps it open to
    /// its end, and the completion is its child.
    span: tracing::Span,
}

async fn chat_completions(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    serve(s, headers, body, Dialect::Chat).await
}

async fn responses(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    serve(s, headers, body, Dialect::Responses).await
}

async fn embeddings(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    serve(s, headers, body, Dialect::Embeddings).await
}

async fn messages(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let headers = anthropic::caller_headers(headers);
    let answer = serve(s, headers, body, Dialect::Messages).await;
    anthropic::translate(answer).await
}

/// One call of `dialect`: the caller known, its body read and admitted, sent, completed.
async fn serve(s: Shared, headers: HeaderMap, body: Body, dialect: Dialect) -> Response {
    let tenant = match caller(&s, &headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let call = match read_call(&s, &headers, body, tenant.clone(), dialect).await {
        Ok(c) => c,
        Err(e) => {
            // The tenant is known: its rate-limit headers go with the refusal too.
            let mut response = e.into_response();
            if let Some(l) = call::levels(&s, &tenant).await {
                openai::rate_limit_headers(response.headers_mut(), &l);
            }
            openai::should_retry(response.headers_mut(), false);
            return response;
        }
    };
    // The call goes on if the caller goes away: its outcome must be learnt and recorded.
    // The call runs in a task of its own, inside the request's span.
    let span = call.span.clone();
    match tokio::spawn(tracing::Instrument::instrument(
        call::run(s.clone(), call),
        span,
    ))
    .await
    {
        Ok(response) => response,
        Err(_) => openai::error(500, "internal", "the call's task failed"),
    }
}

/// Reads and checks the caller's request, counts its prompt, and makes the admission
/// request of it.
async fn read_call(
    s: &GatewayState,
    headers: &HeaderMap,
    body: Body,
    tenant: String,
    dialect: Dialect,
) -> Result<GatewayCall, ApiError> {
    let g = &s.gateway;
    let limit = s.engine.config().max_request_bytes;
    let bytes: Bytes = read_body(headers, body, limit)
        .await
        .map_err(|r| ApiError::new(r.status.as_u16(), r.reason, "the request body was refused"))?;
    let invalid = |message: &str| ApiError::new(400, "invalid_request", message);
    let body: Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(Value::Object(o)) => o,
        _ => return Err(invalid("the body must be a JSON object")),
    };
    let model = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(invalid("`model` must be a string")),
    };
    let Some(route) = g.models.get(&model) else {
        return Err(ApiError::new(
            404,
            "model_not_found",
            format!("the model `{model}` does not exist or is not served here"),
        ));
    };
    if route.kind != dialect.kind() {
        return Err(invalid(&format!(
            "the model `{model}` is served by {} upstreams, which do not serve {}",
            route.kind.as_str(),
            dialect.route()
        )));
    }
    let shape = dialect.read(&body, &route.counter, route.default_max_output_tokens)?;
    let replay = g.replay.filter(|_| headers.contains_key("idempotency-key"));
    let key = match headers.get("idempotency-key") {
        None => fresh_key(),
        Some(v) => match v.to_str() {
            Ok(k) if (1..=tollgate::validate::MAX_KEY_CHARS).contains(&k.chars().count()) => {
                k.to_string()
            }
            _ => return Err(invalid("Idempotency-Key must be 1 to 255 characters")),
        },
    };
    let timeout_ms = match headers.get("x-tollgate-timeout-ms") {
        // The SDK's own timeout, in seconds, when it sends one.
        None => sdk_timeout_ms(headers).unwrap_or(g.default_timeout_ms),
        Some(v) => match v.to_str().ok().and_then(|t| t.trim().parse::<u64>().ok()) {
            Some(ms @ 1..=MAX_TIMEOUT_MS) => ms,
            _ => {
                return Err(invalid(
                    "x-tollgate-timeout-ms must be 1 to 86400000 milliseconds",
                ))
            }
        },
    };
    let priority = match headers.get("x-tollgate-priority").map(|v| v.to_str()) {
        None => "standard",
        Some(Ok(p @ ("critical" | "standard" | "sheddable"))) => p,
        Some(_) => {
            return Err(invalid(
                "x-tollgate-priority must be critical, standard or sheddable",
            ))
        }
    };
    let deadline_ms = s.clock.now_ms() + timeout_ms as i64;
    let input_tokens = shape.input_tokens.max(1);
    // The same key with another body is a conflict, on another route too; a chat call's
    // fingerprint is as earlier releases wrote it, so a repeat after an upgrade is the same.
    let fingerprint = match dialect {
        Dialect::Chat => format!("gateway:{}", sha256_hex(&bytes)),
        other => format!("gateway:{}:{}", other.path(), sha256_hex(&bytes)),
    };
    let mut admission = json!({
        "tenant": tenant, "key": key, "route": "interactive",
        "input_tokens": input_tokens, "max_output_tokens": shape.max_output,
        "deadline_ms": deadline_ms, "size_bytes": bytes.len(), "priority": priority,
        "fingerprint": fingerprint,
    });
    // The same name as the top-level `models` section's: its budgets apply, and policies
    // see which model a call is for.
    admission["model"] = json!(model);
    match headers.get("x-tollgate-fallback").map(|v| v.to_str()) {
        None | Some(Ok("any")) => {}
        Some(Ok("none")) => admission["fallback"] = json!(false),
        Some(_) => return Err(invalid("x-tollgate-fallback must be none or any")),
    }
    if let Some(labels) = headers.get("x-tollgate-labels") {
        admission["labels"] = labels_header(labels).ok_or_else(|| {
            invalid("x-tollgate-labels must be key=value pairs separated by commas")
        })?;
    }
    let request = tollgate::validate::parse(&admission, &s.engine.config()).map_err(|e| {
        let reason = e.reason();
        ApiError::new(
            reason.http(),
            reason.as_str(),
            format!("the request cannot be admitted: {e}"),
        )
    })?;
    Ok(GatewayCall {
        tenant,
        model,
        key,
        deadline_ms,
        dialect,
        body,
        limit_field: shape.limit_field,
        stream: shape.stream,
        caller_wants_usage: shape.caller_wants_usage,
        upstream_headers: anthropic::upstream_headers(dialect, headers),
        request,
        replay,
        span: tracing::Span::current(),
    })
}

/// `x-tollgate-labels: tier=free, team=search` as the labels object of an admission (whose
/// validation bounds their number and sizes).
fn labels_header(value: &axum::http::HeaderValue) -> Option<Value> {
    let mut labels = serde_json::Map::new();
    for pair in value.to_str().ok()?.split(',') {
        let (k, v) = pair.split_once('=')?;
        if labels
            .insert(k.trim().to_string(), json!(v.trim()))
            .is_some()
        {
            return None;
        }
    }
    Some(Value::Object(labels))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    tollgate::runtime::hex(&Sha256::digest(bytes))
}

/// An operation key for a call that brought none: unique in this process and across
/// restarts (the start time is in it).
fn fresh_key() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: OnceLock<String> = OnceLock::new();
    let start = START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        sha256_hex(format!("{nanos}:{}", std::process::id()).as_bytes())[..16].to_string()
    });
    format!("gw-{start}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
