//! The fingerprint that makes two requests with one key "the same" request (a duplicate)
//! or a conflict. Stored operations compare it, so its text never changes.

use crate::model::Request;
use crate::runtime;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The fingerprint that makes two requests "the same" (docs/contract.md section 2).
pub(crate) fn fingerprint(req: &Request) -> String {
    if let Some(f) = &req.fingerprint {
        return format!("caller:{f}");
    }
    // A JSON array, compact: the same text as `json!([...]).to_string()`, without the tree.
    let mut canonical = serde_json::to_vec(&(
        req.route,
        req.input_tokens,
        req.optional_context_tokens,
        req.max_output_tokens,
        &req.body_ref,
    ))
    .unwrap_or_default();
    // Model, priority and labels follow only when one is given, so the fingerprint of a
    // request without them is the text operations stored before they existed compare with.
    if req.model.is_some() || !req.priority.is_standard() || !req.labels.is_empty() {
        #[derive(Serialize)]
        struct Extra<'a> {
            model: &'a Option<String>,
            priority: crate::model::Priority,
            labels: &'a std::collections::BTreeMap<String, String>,
        }
        let extra = Extra {
            model: &req.model,
            priority: req.priority,
            labels: &req.labels,
        };
        canonical.extend_from_slice(&serde_json::to_vec(&extra).unwrap_or_default());
    }
    format!("sha256:{}", runtime::hex(&Sha256::digest(&canonical)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Route;

    fn request(body_ref: Option<&str>, fingerprint: Option<&str>) -> Request {
        Request {
            tenant: "acme".into(),
            key: "k".into(),
            route: Route::Durable,
            input_tokens: 120,
            optional_context_tokens: 30,
            max_output_tokens: 400,
            deadline_ms: 5_000,
            size_bytes: 0,
            body_ref: body_ref.map(String::from),
            fingerprint: fingerprint.map(String::from),
            model: None,
            priority: crate::model::Priority::Standard,
            labels: Default::default(),
            fallback: true,
            trace_context: None,
        }
    }

    #[test]
    fn fingerprints_are_stable_across_versions() {
        // Stored operations compare fingerprints: this text may never change.
        let canonical = r#"["durable",120,30,400,"blob/1"]"#;
        let expected: String = Sha256::digest(canonical.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            fingerprint(&request(Some("blob/1"), None)),
            format!("sha256:{expected}")
        );
        assert_ne!(
            fingerprint(&request(Some("blob/2"), None)),
            fingerprint(&request(Some("blob/1"), None))
        );
        assert_eq!(
            fingerprint(&request(None, Some("abc"))),
            "caller:abc".to_string()
        );
        // Model, priority and labels make another request; saying "standard" does not.
        let plain = fingerprint(&request(Some("blob/1"), None));
        let mut r = request(Some("blob/1"), None);
        r.priority = crate::model::Priority::Standard;
        assert_eq!(fingerprint(&r), plain);
        r.model = Some("gpt-4o".into());
        let with_model = fingerprint(&r);
        assert_ne!(with_model, plain);
        r.priority = crate::model::Priority::Sheddable;
        assert_ne!(fingerprint(&r), with_model);
        let mut l = request(Some("blob/1"), None);
        l.labels.insert("tier".into(), "free".into());
        assert_ne!(fingerprint(&l), plain);
    }
}
