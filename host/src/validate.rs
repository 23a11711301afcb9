//! Validation of an admission request (docs/contract.md section 4): strict types, bounded sizes,
//! and the tenant check. It runs before anything is read or spent. The bounds are the
//! model's (`model`), the shape every JSON body must have is `shape`'s; both are named here
//! too, where a caller validating a request looks for them.

use crate::config::Config;
use crate::model::{Priority, Request, Route};
use crate::reason::Reason;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub use crate::model::{
    MAX_KEY_CHARS, MAX_LABELS, MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES, MAX_MODEL_BYTES,
    MAX_REF_BYTES,
};
pub use crate::shape::{from_object, object};

const FIELDS: &[&str] = &[
    "tenant",
    "key",
    "route",
    "input_tokens",
    "max_output_tokens",
    "deadline_ms",
    "optional_context_tokens",
    "size_bytes",
    "body_ref",
    "fingerprint",
    "model",
    "priority",
    "labels",
    "fallback",
];

/// Why a request is refused before anything is read or spent: the field and what is wrong
/// with it. [`RequestError::reason`] is the refusal's reason in the contract's terms.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `tenant` names no configured tenant (`unknown_tenant`).
    #[error("tenant {0:?} is not configured")]
    UnknownTenant(String),
    /// A field is missing, of the wrong type or out of its bounds (`invalid_request`).
    #[error("{field}: {problem}")]
    Invalid {
        /// The field, as the request names it (`labels.team` for one label).
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `size_bytes` is over `limits.max_request_bytes` (`too_large`).
    #[error("size_bytes: {size} is over the limit of {limit}")]
    TooLarge {
        /// The request's size.
        size: u64,
        /// `limits.max_request_bytes`.
        limit: u64,
    },
}

impl RequestError {
    /// The refusal's reason: `unknown_tenant`, `invalid_request` or `too_large`.
    pub fn reason(&self) -> Reason {
        match self {
            RequestError::UnknownTenant(_) => Reason::UnknownTenant,
            RequestError::Invalid { .. } => Reason::InvalidRequest,
            RequestError::TooLarge { .. } => Reason::TooLarge,
        }
    }

    /// The field at fault.
    pub fn field(&self) -> &str {
        match self {
            RequestError::UnknownTenant(_) => "tenant",
            RequestError::Invalid { field, .. } => field,
            RequestError::TooLarge { .. } => "size_bytes",
        }
    }
}

fn invalid(field: &str, problem: impl Into<String>) -> RequestError {
    RequestError::Invalid {
        field: field.to_string(),
        problem: problem.into(),
    }
}

/// Turns a request object into a [`Request`], or the reason it is refused.
pub fn request(raw: &Value, config: &Config) -> Result<Request, Reason> {
    parse(raw, config).map_err(|e| e.reason())
}

/// Turns a request object into a [`Request`], or says which field is wrong and how.
///
/// # Errors
/// [`RequestError`], in the order of docs/contract.md: an unknown tenant first, then an
/// invalid field, then a request too large.
pub fn parse(raw: &Value, config: &Config) -> Result<Request, RequestError> {
    let obj = raw
        .as_object()
        .ok_or_else(|| invalid("request", "must be a JSON object"))?;
    let tenant = string(obj, "tenant")?.ok_or_else(|| invalid("tenant", "is required"))?;
    if config.tenant(&tenant).is_none() {
        return Err(RequestError::UnknownTenant(tenant));
    }
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid(unknown, "is not a field of a request"));
    }
    let key = string(obj, "key")?.ok_or_else(|| invalid("key", "is required"))?;
    let route = match string(obj, "route")?.as_deref() {
        Some("interactive") => Route::Interactive,
        Some("durable") => Route::Durable,
        Some(_) => return Err(invalid("route", "must be `interactive` or `durable`")),
        None => return Err(invalid("route", "is required")),
    };
    let required = |name: &str| integer(obj, name)?.ok_or_else(|| invalid(name, "is required"));
    let input_tokens = required("input_tokens")?;
    let max_output_tokens = required("max_output_tokens")?;
    let optional_context_tokens = integer(obj, "optional_context_tokens")?.unwrap_or(0);
    let size_bytes = integer(obj, "size_bytes")?.unwrap_or(0);
    let deadline_ms = match obj.get("deadline_ms") {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| invalid("deadline_ms", "must be an integer (Unix ms)"))?,
        Some(_) => return Err(invalid("deadline_ms", "must be an integer (Unix ms)")),
        None => return Err(invalid("deadline_ms", "is required")),
    };
    let body_ref = string(obj, "body_ref")?;
    let fingerprint = string(obj, "fingerprint")?;
    let model = string(obj, "model")?;
    let priority = match string(obj, "priority")?.as_deref() {
        None | Some("standard") => Priority::Standard,
        Some("critical") => Priority::Critical,
        Some("sheddable") => Priority::Sheddable,
        Some(_) => {
            return Err(invalid(
                "priority",
                "must be `critical`, `standard` or `sheddable`",
            ))
        }
    };
    let labels = labels(obj.get("labels"))?;
    let fallback = match obj.get("fallback") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("fallback", "must be true or false")),
    };
    let request = Request {
        tenant,
        key,
        route,
        input_tokens,
        optional_context_tokens,
        max_output_tokens,
        deadline_ms,
        size_bytes,
        body_ref,
        fingerprint,
        model,
        priority,
        labels,
        fallback,
        trace_context: None,
    };
    check(&request, config)?;
    Ok(request)
}

/// Checks a typed request's bounds against `config`: what [`parse`] checks once the types
/// are right, for a request made in code.
///
/// # Errors
/// [`RequestError`], naming the first field out of its bounds.
pub fn check(req: &Request, config: &Config) -> Result<(), RequestError> {
    if config.tenant(&req.tenant).is_none() {
        return Err(RequestError::UnknownTenant(req.tenant.clone()));
    }
    let key_chars = req.key.chars().count();
    if !(1..=MAX_KEY_CHARS).contains(&key_chars) {
        return Err(invalid(
            "key",
            format!("must be 1 to {MAX_KEY_CHARS} characters, not {key_chars}"),
        ));
    }
    // Token counts beyond 2^53 cannot be meant and would overflow sums downstream.
    for (field, tokens, least) in [
        ("input_tokens", req.input_tokens, 1),
        ("max_output_tokens", req.max_output_tokens, 1),
        ("optional_context_tokens", req.optional_context_tokens, 0),
    ] {
        if tokens < least || tokens > 1 << 53 {
            return Err(invalid(
                field,
                format!("must be from {least} to 2^53, not {tokens}"),
            ));
        }
    }
    for (field, value) in [
        ("body_ref", &req.body_ref),
        ("fingerprint", &req.fingerprint),
    ] {
        if value.as_ref().is_some_and(|s| s.len() > MAX_REF_BYTES) {
            return Err(invalid(field, format!("is over {MAX_REF_BYTES} bytes")));
        }
    }
    if let Some(m) = &req.model {
        if m.is_empty() || m.len() > MAX_MODEL_BYTES {
            return Err(invalid(
                "model",
                format!("must be 1 to {MAX_MODEL_BYTES} bytes"),
            ));
        }
        // With a `models` section, a model must be one of it: its budgets are the point.
        if config.models.as_ref().is_some_and(|ms| !ms.contains_key(m)) {
            return Err(invalid(
                "model",
                format!("{m:?} is not a model of the configuration"),
            ));
        }
    }
    if req.labels.len() > MAX_LABELS {
        return Err(invalid(
            "labels",
            format!("at most {MAX_LABELS}, not {}", req.labels.len()),
        ));
    }
    for (k, v) in &req.labels {
        if !(1..=MAX_LABEL_KEY_BYTES).contains(&k.len()) {
            return Err(invalid(
                "labels",
                format!("a label's name must be 1 to {MAX_LABEL_KEY_BYTES} bytes"),
            ));
        }
        if v.len() > MAX_LABEL_VALUE_BYTES {
            return Err(invalid(
                &format!("labels.{k}"),
                format!("is over {MAX_LABEL_VALUE_BYTES} bytes"),
            ));
        }
    }
    if req.size_bytes > config.max_request_bytes {
        return Err(RequestError::TooLarge {
            size: req.size_bytes,
            limit: config.max_request_bytes,
        });
    }
    Ok(())
}

/// `labels`: absent, or an object of string values (their bounds are [`check`]'s).
fn labels(raw: Option<&Value>) -> Result<BTreeMap<String, String>, RequestError> {
    let Some(raw) = raw else {
        return Ok(Default::default());
    };
    let obj = raw
        .as_object()
        .ok_or_else(|| invalid("labels", "must be an object of strings"))?;
    obj.iter()
        .map(|(k, v)| match v {
            Value::String(v) => Ok((k.clone(), v.clone())),
            _ => Err(invalid(&format!("labels.{k}"), "must be a string")),
        })
        .collect()
}

/// An optional string field; any other type is invalid.
fn string(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, RequestError> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(name, "must be a string")),
    }
}

/// An optional non-negative integer field; fractions, strings and negatives are invalid.
fn integer(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, RequestError> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(name, "must be a whole number ≥ 0")),
        Some(_) => Err(invalid(name, "must be a whole number ≥ 0")),
    }
}

/// A request made in code, checked as a JSON one is when it is built: the way to hand
/// [`crate::Engine::admit_request`] a request without writing its thirteen fields.
///
/// ```
/// use tollgate::config::Config;
/// use tollgate::model::Route;
/// use tollgate::validate::RequestBuilder;
///
/// let config = Config::with_tenants(&["acme"]);
/// let request = RequestBuilder::new("acme", "req-1", Route::Interactive)
///     .input_tokens(300)
///     .max_output_tokens(500)
///     .deadline_ms(60_000)
///     .label("team", "search")
///     .build(&config)
///     .unwrap();
/// assert_eq!(request.labels["team"], "search");
///
/// // A zero token count is refused, naming the field.
/// let refused = RequestBuilder::new("acme", "req-2", Route::Interactive)
///     .input_tokens(0)
///     .max_output_tokens(500)
///     .deadline_ms(60_000)
///     .build(&config)
///     .unwrap_err();
/// assert_eq!(refused.field(), "input_tokens");
/// ```
#[derive(Clone, Debug)]
pub struct RequestBuilder {
    request: Request,
    /// The required fields not set yet.
    missing: Vec<&'static str>,
}

impl RequestBuilder {
    /// A request of `tenant` under operation `key`; `input_tokens`, `max_output_tokens`
    /// and `deadline_ms` must be set before [`RequestBuilder::build`].
    pub fn new(tenant: impl Into<String>, key: impl Into<String>, route: Route) -> Self {
        RequestBuilder {
            request: Request {
                tenant: tenant.into(),
                key: key.into(),
                route,
                input_tokens: 0,
                optional_context_tokens: 0,
                max_output_tokens: 0,
                deadline_ms: 0,
                size_bytes: 0,
                body_ref: None,
                fingerprint: None,
                model: None,
                priority: Priority::Standard,
                labels: BTreeMap::new(),
                fallback: true,
                trace_context: None,
            },
            missing: vec!["input_tokens", "max_output_tokens", "deadline_ms"],
        }
    }

    /// Marks a required field as set.
    fn given(mut self, field: &str) -> Self {
        self.missing.retain(|m| *m != field);
        self
    }

    /// Prompt tokens (at least 1).
    pub fn input_tokens(mut self, n: u64) -> Self {
        self.request.input_tokens = n;
        self.given("input_tokens")
    }

    /// Most output tokens the call may generate (at least 1).
    pub fn max_output_tokens(mut self, n: u64) -> Self {
        self.request.max_output_tokens = n;
        self.given("max_output_tokens")
    }

    /// The absolute deadline, in the clock the engine is given.
    pub fn deadline_ms(mut self, at: i64) -> Self {
        self.request.deadline_ms = at;
        self.given("deadline_ms")
    }

    /// Context tokens the policy may drop under pressure.
    pub fn optional_context_tokens(mut self, n: u64) -> Self {
        self.request.optional_context_tokens = n;
        self
    }

    /// The request body's size, checked against `limits.max_request_bytes`.
    pub fn size_bytes(mut self, n: u64) -> Self {
        self.request.size_bytes = n;
        self
    }

    /// Where a durable job's body is.
    pub fn body_ref(mut self, at: impl Into<String>) -> Self {
        self.request.body_ref = Some(at.into());
        self
    }

    /// The caller's own fingerprint, replacing the computed one.
    pub fn fingerprint(mut self, fp: impl Into<String>) -> Self {
        self.request.fingerprint = Some(fp.into());
        self
    }

    /// The model the call is for.
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.request.model = Some(name.into());
        self
    }

    /// How important the call is.
    pub fn priority(mut self, p: Priority) -> Self {
        self.request.priority = p;
        self
    }

    /// One label, for policies to key rules on.
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.labels.insert(name.into(), value.into());
        self
    }

    /// The request, checked against `config` as [`parse`] checks a JSON one.
    ///
    /// # Errors
    /// [`RequestError`]: a required field not set, a tenant not configured, a field out of
    /// its bounds, or a size over the limit; each names the field.
    pub fn build(self, config: &Config) -> Result<Request, RequestError> {
        if let Some(field) = self.missing.first() {
            return Err(invalid(field, "is required"));
        }
        check(&self.request, config)?;
        Ok(self.request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> Config {
        Config::with_tenants(&["acme"])
    }

    fn base() -> Value {
        json!({"tenant": "acme", "key": "k", "route": "interactive", "input_tokens": 1,
               "max_output_tokens": 1, "deadline_ms": 10})
    }

    fn with(field: &str, value: Value) -> Value {
        let mut v = base();
        v[field] = value;
        v
    }

    #[test]
    fn every_refusal_names_its_field() {
        let c = config();
        for (raw, field, reason) in [
            (json!([1]), "request", Reason::InvalidRequest),
            (
                with("tenant", json!("globex")),
                "tenant",
                Reason::UnknownTenant,
            ),
            (with("tenant", json!(7)), "tenant", Reason::InvalidRequest),
            (
                with("colour", json!("red")),
                "colour",
                Reason::InvalidRequest,
            ),
            (
                with("route", json!("express")),
                "route",
                Reason::InvalidRequest,
            ),
            (
                with("input_tokens", json!(0)),
                "input_tokens",
                Reason::InvalidRequest,
            ),
            (
                with("input_tokens", json!(-1)),
                "input_tokens",
                Reason::InvalidRequest,
            ),
            (
                with("max_output_tokens", json!("9")),
                "max_output_tokens",
                Reason::InvalidRequest,
            ),
            (
                with("deadline_ms", json!(1.5)),
                "deadline_ms",
                Reason::InvalidRequest,
            ),
            (with("key", json!("")), "key", Reason::InvalidRequest),
            (
                with("priority", json!("urgent")),
                "priority",
                Reason::InvalidRequest,
            ),
            (
                with("labels", json!({"team": 1})),
                "labels.team",
                Reason::InvalidRequest,
            ),
            (
                with("labels", json!({"team": "x".repeat(300)})),
                "labels.team",
                Reason::InvalidRequest,
            ),
            (with("model", json!("")), "model", Reason::InvalidRequest),
            (
                with("size_bytes", json!(1u64 << 40)),
                "size_bytes",
                Reason::TooLarge,
            ),
        ] {
            let e = parse(&raw, &c).unwrap_err();
            assert_eq!((e.field(), e.reason()), (field, reason), "{raw}: {e}");
            assert!(e.to_string().contains(field), "{e}");
            // The reason alone is what `request` gives.
            assert_eq!(request(&raw, &c).unwrap_err(), reason);
        }
        let mut missing = base();
        missing.as_object_mut().unwrap().remove("deadline_ms");
        let e = parse(&missing, &c).unwrap_err();
        assert_eq!(e.to_string(), "deadline_ms: is required");
    }

    #[test]
    fn a_built_request_is_the_parsed_one_and_is_checked_the_same_way() {
        let c = config();
        let built = RequestBuilder::new("acme", "k", Route::Interactive)
            .input_tokens(1)
            .max_output_tokens(1)
            .deadline_ms(10)
            .build(&c)
            .unwrap();
        assert_eq!(built, parse(&base(), &c).unwrap());
        let without_deadline = RequestBuilder::new("acme", "k", Route::Durable)
            .input_tokens(1)
            .max_output_tokens(1)
            .build(&c)
            .unwrap_err();
        assert_eq!(without_deadline.field(), "deadline_ms");
        let unknown = RequestBuilder::new("globex", "k", Route::Interactive)
            .input_tokens(1)
            .max_output_tokens(1)
            .deadline_ms(10)
            .build(&c)
            .unwrap_err();
        assert_eq!(unknown, RequestError::UnknownTenant("globex".into()));
        let too_many_tokens = RequestBuilder::new("acme", "k", Route::Interactive)
            .input_tokens(1 << 54)
            .max_output_tokens(1)
            .deadline_ms(10)
            .build(&c)
            .unwrap_err();
        assert_eq!(too_many_tokens.field(), "input_tokens");
    }

    #[test]
    fn accepts_a_minimal_request() {
        let r = request(&base(), &config()).unwrap();
        assert_eq!(r.optional_context_tokens, 0);
        assert_eq!(r.route, Route::Interactive);
    }

    #[test]
    fn model_priority_and_labels_are_optional_and_bounded() {
        let c = config();
        let r = request(&base(), &c).unwrap();
        assert_eq!(
            (r.model, r.priority, r.labels.len()),
            (None, Priority::Standard, 0)
        );
        let mut full = base();
        full["model"] = json!("gpt-4o");
        full["priority"] = json!("sheddable");
        full["labels"] = json!({"tier": "free", "team": "search"});
        let r = request(&full, &c).unwrap();
        assert_eq!(r.model.as_deref(), Some("gpt-4o"));
        assert_eq!(r.priority, Priority::Sheddable);
        assert_eq!(r.labels["tier"], "free");
        let many: serde_json::Map<String, Value> =
            (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        for (field, value) in [
            ("model", json!("")),
            ("model", json!("m".repeat(129))),
            ("model", json!(4)),
            ("priority", json!("urgent")),
            ("priority", json!(0)),
            ("labels", json!(["a", "b"])),
            ("labels", json!({"a": 1})),
            ("labels", json!({"": "v"})),
            ("labels", json!({"k".repeat(65): "v"})),
            ("labels", json!({"k": "v".repeat(257)})),
            ("labels", Value::Object(many)),
        ] {
            assert_eq!(
                request(&with(field, value.clone()), &c),
                Err(Reason::InvalidRequest),
                "{field}={value}"
            );
        }
        // With a `models` section, a model must be one of it.
        let c =
            Config::from_json(&json!({"tenants": {"acme": {}}, "models": {"small": {}}})).unwrap();
        assert!(request(&with("model", json!("small")), &c).is_ok());
        assert_eq!(
            request(&with("model", json!("large")), &c),
            Err(Reason::InvalidRequest)
        );
        assert!(request(&base(), &c).is_ok());
    }

    #[test]
    fn strict_types() {
        let c = config();
        for (field, value) in [
            ("input_tokens", json!("1")),
            ("input_tokens", json!(1.5)),
            ("input_tokens", json!(0)),
            ("max_output_tokens", json!(-1)),
            ("deadline_ms", json!("10")),
            ("deadline_ms", json!(1.5)),
            ("key", json!(7)),
            ("key", json!("")),
            ("key", json!("x".repeat(256))),
            ("route", json!("batch")),
            ("body_ref", json!(1)),
            ("unexpected", json!(1)),
        ] {
            assert_eq!(
                request(&with(field, value.clone()), &c),
                Err(Reason::InvalidRequest),
                "{field}={value}"
            );
        }
        assert!(request(&with("key", json!("é".repeat(255))), &c).is_ok());
    }

    #[test]
    fn tenant_then_size() {
        let c = config();
        assert_eq!(
            request(&with("tenant", json!("nobody")), &c),
            Err(Reason::UnknownTenant)
        );
        assert_eq!(
            request(&with("size_bytes", json!(65537)), &c),
            Err(Reason::TooLarge)
        );
        let mut missing = base();
        missing.as_object_mut().unwrap().remove("tenant");
        assert_eq!(request(&missing, &c), Err(Reason::InvalidRequest));
    }
}
