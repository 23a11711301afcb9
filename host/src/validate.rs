//! Validation of an admission request (docs/contract.md section 4): strict types, bounded sizes,
//! and the tenant check. It runs before anything is read or spent. The bounds are the
//! model's (`model`), the shape every JSON body must have is `shape`'s; both are named here
//! too, where a caller validating a request looks for them.

use crate::config::Config;
use crate::model::{Priority, Request, Route};
use crate::reason::Reason;
use serde_json::{Map, Value};

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
];

/// Turns a request object into a [`Request`], or the reason it is refused.
pub fn request(raw: &Value, config: &Config) -> Result<Request, Reason> {
    let obj = raw.as_object().ok_or(Reason::InvalidRequest)?;
    // The order of docs/contract.md: unknown_tenant, then invalid_request, then too_large.
    let tenant = string(obj, "tenant")?.ok_or(Reason::InvalidRequest)?;
    if config.tenant(&tenant).is_none() {
        return Err(Reason::UnknownTenant);
    }
    if obj.keys().any(|k| !FIELDS.contains(&k.as_str())) {
        return Err(Reason::InvalidRequest);
    }
    let key = string(obj, "key")?.ok_or(Reason::InvalidRequest)?;
    let route = match string(obj, "route")?.as_deref() {
        Some("interactive") => Route::Interactive,
        Some("durable") => Route::Durable,
        _ => return Err(Reason::InvalidRequest),
    };
    let input_tokens = integer(obj, "input_tokens")?.ok_or(Reason::InvalidRequest)?;
    let max_output_tokens = integer(obj, "max_output_tokens")?.ok_or(Reason::InvalidRequest)?;
    let optional_context_tokens = integer(obj, "optional_context_tokens")?.unwrap_or(0);
    let size_bytes = integer(obj, "size_bytes")?.unwrap_or(0);
    let deadline_ms = match obj.get("deadline_ms") {
        Some(Value::Number(n)) => n.as_i64().ok_or(Reason::InvalidRequest)?,
        _ => return Err(Reason::InvalidRequest),
    };
    let body_ref = string(obj, "body_ref")?;
    let fingerprint = string(obj, "fingerprint")?;
    let model = string(obj, "model")?;
    if let Some(m) = &model {
        if m.is_empty() || m.len() > MAX_MODEL_BYTES {
            return Err(Reason::InvalidRequest);
        }
        // With a `models` section, a model must be one of it: its budgets are the point.
        if config.models.as_ref().is_some_and(|ms| !ms.contains_key(m)) {
            return Err(Reason::InvalidRequest);
        }
    }
    let priority = match string(obj, "priority")?.as_deref() {
        None | Some("standard") => Priority::Standard,
        Some("critical") => Priority::Critical,
        Some("sheddable") => Priority::Sheddable,
        Some(_) => return Err(Reason::InvalidRequest),
    };
    let labels = labels(obj.get("labels"))?;

    let key_chars = key.chars().count();
    if !(1..=MAX_KEY_CHARS).contains(&key_chars)
        || input_tokens < 1
        || max_output_tokens < 1
        || body_ref.as_ref().is_some_and(|s| s.len() > MAX_REF_BYTES)
        || fingerprint.as_ref().is_some_and(|s| s.len() > MAX_REF_BYTES)
        // Token counts beyond 2^53 cannot be meant and would overflow sums downstream.
        || [input_tokens, max_output_tokens, optional_context_tokens].iter().any(|&t| t > 1 << 53)
    {
        return Err(Reason::InvalidRequest);
    }
    if size_bytes > config.max_request_bytes {
        return Err(Reason::TooLarge);
    }
    Ok(Request {
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
    })
}

/// `labels`: absent, or an object of at most [`MAX_LABELS`] string values with bounded keys
/// and values.
fn labels(raw: Option<&Value>) -> Result<std::collections::BTreeMap<String, String>, Reason> {
    let Some(raw) = raw else {
        return Ok(Default::default());
    };
    let obj = raw.as_object().ok_or(Reason::InvalidRequest)?;
    if obj.len() > MAX_LABELS {
        return Err(Reason::InvalidRequest);
    }
    obj.iter()
        .map(|(k, v)| match v {
            Value::String(v)
                if (1..=MAX_LABEL_KEY_BYTES).contains(&k.len())
                    && v.len() <= MAX_LABEL_VALUE_BYTES =>
            {
                Ok((k.clone(), v.clone()))
            }
            _ => Err(Reason::InvalidRequest),
        })
        .collect()
}

/// An optional string field; any other type is invalid.
fn string(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, Reason> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Reason::InvalidRequest),
    }
}

/// An optional non-negative integer field; fractions, strings and negatives are invalid.
fn integer(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, Reason> {
    match obj.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or(Reason::InvalidRequest),
        Some(_) => Err(Reason::InvalidRequest),
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

    #[test]
    fn a_body_is_one_object_with_each_member_name_once() {
        let members = object(br#"{"key": "a", "route": "durable"}"#).unwrap();
        assert_eq!(members["key"], "a");
        for bad in [
            &br#"{"key": "a", "key": "b"}"#[..],
            br#"{"key": "a", "route": "durable", "key": "a"}"#,
            br#"[{"key": "a"}]"#,
            b"\"key\"",
            b"null",
            b"{\"key\": \"a\"",
            b"",
        ] {
            assert_eq!(
                object(bad),
                Err(Reason::InvalidRequest),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Inside a member's value, names are the field's own parser's to check (every
        // admission field is a scalar, so an object there is refused as a wrong type).
        assert!(object(br#"{"key": {"a": 1, "a": 2}}"#).is_ok());
    }

    #[test]
    fn structs_are_read_from_objects_only() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Pair {
            a: u32,
            #[serde(default)]
            b: Option<u32>,
        }
        let read = |text: &str| {
            let mut de = serde_json::Deserializer::from_str(text);
            from_object::<_, Pair>(&mut de).map_err(|e| e.to_string())
        };
        assert_eq!(read(r#"{"a": 1, "b": 2}"#), Ok(Pair { a: 1, b: Some(2) }));
        assert_eq!(read(r#"{"a": 1}"#), Ok(Pair { a: 1, b: None }));
        // The derive alone would take these arrays.
        assert_eq!(
            serde_json::from_str::<Pair>("[1, 2]").ok(),
            Some(Pair { a: 1, b: Some(2) })
        );
        for bad in [
            "[1, 2]",
            "[1]",
            "1",
            "null",
            r#"{"a": 1, "c": 3}"#,
            r#"{"a": 1, "a": 2}"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    fn with(field: &str, value: Value) -> Value {
        let mut v = base();
        v[field] = value;
        v
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
