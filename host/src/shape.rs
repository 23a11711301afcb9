//! The shape every JSON body must have: one object, each member named once, never an array
//! standing for an object. Checked before any field is read, by the request's validation,
//! the model's own types and the service's bodies alike.

use crate::reason::Reason;
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use std::marker::PhantomData;

/// Parses a body that must be one JSON object whose member names are all different.
///
/// RFC 8259 leaves a repeated name to the parser (serde_json keeps the last value, others
/// the first), so a proxy in front of the service could check one request while another
/// is admitted. A repeated name is refused like a wrong type, as the endpoints whose
/// bodies are parsed into structs already do.
pub fn object(bytes: &[u8]) -> Result<Map<String, Value>, Reason> {
    serde_json::from_slice::<UniqueMembers>(bytes)
        .map(|UniqueMembers(members)| members)
        .map_err(|_| Reason::InvalidRequest)
}

/// Deserializes a struct from a JSON object only. serde's derive also takes an array of the
/// fields in order (`[null, "succeeded"]` for a completion), which no client means and the
/// contract calls a wrong type.
pub fn from_object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Fields<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(members))
        }
    }
    d.deserialize_map(Fields(PhantomData))
}

struct UniqueMembers(Map<String, Value>);

impl<'de> Deserialize<'de> for UniqueMembers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Map<String, Value>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Self::Value, A::Error> {
                let mut out = Map::new();
                while let Some((name, value)) = members.next_entry::<String, Value>()? {
                    if out.contains_key(&name) {
                        return Err(A::Error::custom("a member name is repeated"));
                    }
                    out.insert(name, value);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Members).map(UniqueMembers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
