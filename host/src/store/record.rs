//! How an operation is written in its row: packed, the record's fields in a binary form
//! with digests as their 32 bytes and field names and common words as one byte each, about
//! a quarter of its JSON. Finished operations are most of a store (they are kept for
//! idempotency and answer replay), and a record written small from its first version leaves
//! no gaps behind when it is rewritten (SQLite appends rows and keeps a shrunk row's page).
//! Records written by earlier releases are JSON; they read as before and are packed when
//! next written.
//!
//! The packed form is the JSON tree written compactly, so every field of [`Operation`],
//! present or future, round-trips: a field name or word missing from the tables below is
//! written out in full. The tables only ever grow at their ends; a code once given keeps its
//! meaning, since records written with it stay in stores.
//!
//! SQLite keeps the packed bytes as a BLOB; PostgreSQL's `record` column is text, so there
//! they are base64 behind a `~`. Readers tell the forms apart by their first byte.

use serde_json::{Map, Number, Value};

mod packer;

use super::StoreError;
use crate::model::Operation;
use crate::runtime;

/// The first byte of a packed record (a JSON record starts with `{`).
const PACKED_V1: u8 = 1;
/// What starts a packed record in a text column.
const TEXT_MARK: char = '~';

/// Field names, by code (append only).
const FIELDS: &[&str] = &[
    "fingerprint",
    "route",
    "state",
    "attempt",
    "deadline_ms",
    "input_tokens",
    "max_output_tokens",
    "optional_context_tokens",
    "reserved_tokens",
    "estimated_exec_ms",
    "degraded",
    "body_ref",
    "holds_slot",
    "holds_tenant_slot",
    "tokens_reserved",
    "not_before_ms",
    "result_ref",
    "worker",
    "last_result",
    "last_retry",
    "policy_digest",
    "model",
    "priority",
    "reserved_cost_microusd",
    "state_since_ms",
    "usage",
    "deployment",
    "holds_deployment_slot",
    "asked_model",
    "trace_context",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "eligible",
    "reason",
];

/// String values common enough to take one byte, by code (append only): the states, routes,
/// results and bands, and the prefixes fingerprints carry before their digest.
const WORDS: &[&str] = &[
    "",
    "interactive",
    "durable",
    "queued",
    "active",
    "succeeded",
    "unknown",
    "retry_pending",
    "failed_final",
    "expired",
    "failed",
    "critical",
    "standard",
    "sheddable",
    "caller:gateway:",
    "caller:",
    "sha256:",
];

// Value tags.
const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UINT: u8 = 3;
/// A negative integer n, written as the varint of -(n + 1).
const NEG: u8 = 4;
const FLOAT: u8 = 5;
const STR: u8 = 6;
const WORD: u8 = 7;
/// A string ending in 64 lowercase hex digits: its prefix (a value), then the 32 bytes.
const DIGEST: u8 = 8;
const ARRAY: u8 = 9;
const OBJECT: u8 = 10;
/// A field name not in [`FIELDS`], written in full after this code.
const NAMED: u8 = 0xFF;

/// Reads a record from a SQLite row, either form.
pub fn from_sqlite(
    tenant: String,
    key: String,
    record: rusqlite::types::ValueRef<'_>,
) -> Result<Operation, StoreError> {
    use rusqlite::types::ValueRef;
    match record {
        ValueRef::Text(t) => {
            let text = std::str::from_utf8(t).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            Ok(Operation::from_record(tenant, key, text)?)
        }
        ValueRef::Blob(b) => unpack(tenant, key, b),
        other => Err(StoreError::Corrupt(format!(
            "an operation record of type {:?}",
            other.data_type()
        ))),
    }
}

/// A record as a text column keeps it (PostgreSQL): `~` and the base64 of its packed bytes.
pub fn to_text(op: &Operation) -> Result<String, StoreError> {
    use base64::Engine as _;
    let mut out = String::from(TEXT_MARK);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode_string(pack(op)?, &mut out);
    Ok(out)
}

/// Reads a record from a text column, either form.
pub fn from_text(tenant: String, key: String, record: &str) -> Result<Operation, StoreError> {
    use base64::Engine as _;
    match record.strip_prefix(TEXT_MARK) {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(b64)
                .map_err(|e| StoreError::Corrupt(format!("packed record: {e}")))?;
            unpack(tenant, key, &bytes)
        }
        None => Ok(Operation::from_record(tenant, key, record)?),
    }
}

/// The packed bytes of `op`'s record.
pub fn pack(op: &Operation) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(160);
    out.push(PACKED_V1);
    serde::Serialize::serialize(op, packer::Packer { out: &mut out })?;
    Ok(out)
}

/// An operation from its packed bytes; `tenant` and `key` come from their columns.
pub fn unpack(tenant: String, key: String, bytes: &[u8]) -> Result<Operation, StoreError> {
    let corrupt =
        |what: &str| StoreError::Corrupt(format!("packed record of {tenant}/{key}: {what}"));
    let Some((&PACKED_V1, rest)) = bytes.split_first() else {
        return Err(corrupt("unknown version"));
    };
    let mut reader = Reader {
        bytes: rest,
        depth: 0,
    };
    let tree = reader.value().map_err(corrupt)?;
    if !reader.bytes.is_empty() {
        return Err(corrupt("bytes after the record"));
    }
    let mut op: Operation = serde_json::from_value(tree)?;
    (op.tenant, op.key) = (tenant, key);
    Ok(op)
}

fn write_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A field name: its code, or written in full after [`NAMED`].
fn write_name(out: &mut Vec<u8>, name: &str) {
    match FIELDS.iter().position(|f| *f == name) {
        Some(code) => out.push(code as u8),
        None => {
            out.push(NAMED);
            write_varint(out, name.len() as u64);
            out.extend_from_slice(name.as_bytes());
        }
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    if let Some(code) = WORDS.iter().position(|w| *w == s) {
        out.push(WORD);
        out.push(code as u8);
        return;
    }
    if let Some((prefix, tail)) = s.split_at_checked(s.len().saturating_sub(64)) {
        if let Some(digest) = runtime::unhex32(tail) {
            out.push(DIGEST);
            write_str(out, prefix);
            out.extend_from_slice(&digest);
            return;
        }
    }
    out.push(STR);
    write_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Reads packed values; every read is bounded by the bytes left, so a damaged record is an
/// error, never a panic or a runaway allocation.
struct Reader<'a> {
    bytes: &'a [u8],
    depth: u32,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, &'static str> {
        let (&b, rest) = self.bytes.split_first().ok_or("cut short")?;
        self.bytes = rest;
        Ok(b)
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], &'static str> {
        if n > self.bytes.len() as u64 {
            return Err("cut short");
        }
        let (head, rest) = self.bytes.split_at(n as usize);
        self.bytes = rest;
        Ok(head)
    }

    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("integer too long")
    }

    fn text(&mut self) -> Result<String, &'static str> {
        let n = self.varint()?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "text is not UTF-8")
    }

    fn string(&mut self, tag: u8) -> Result<String, &'static str> {
        match tag {
            STR => self.text(),
            WORD => WORDS
                .get(self.byte()? as usize)
                .map(|w| w.to_string())
                .ok_or("unknown word"),
            DIGEST => {
                let tag = self.byte()?;
                let prefix = self.string(tag)?;
                Ok(prefix + &runtime::hex(self.take(32)?))
            }
            _ => Err("not a string"),
        }
    }

    fn value(&mut self) -> Result<Value, &'static str> {
        let tag = self.byte()?;
        Ok(match tag {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            UINT => Value::from(self.varint()?),
            NEG => Value::from(!self.varint()? as i64),
            FLOAT => {
                let raw: [u8; 8] = self.take(8)?.try_into().map_err(|_| "cut short")?;
                Number::from_f64(f64::from_le_bytes(raw)).map_or(Value::Null, Value::Number)
            }
            STR | WORD | DIGEST => Value::String(self.string(tag)?),
            ARRAY | OBJECT => {
                self.depth += 1;
                if self.depth > 8 {
                    return Err("nested too deep");
                }
                let n = self.varint()?;
                // Each item takes at least one byte: a count beyond the bytes left is damage.
                if n > self.bytes.len() as u64 {
                    return Err("cut short");
                }
                let v = if tag == ARRAY {
                    Value::Array((0..n).map(|_| self.value()).collect::<Result<_, _>>()?)
                } else {
                    let mut fields = Map::new();
                    for _ in 0..n {
                        let code = self.byte()?;
                        let name = match code {
                            NAMED => self.text()?,
                            c => FIELDS.get(c as usize).ok_or("unknown field")?.to_string(),
                        };
                        fields.insert(name, self.value()?);
                    }
                    Value::Object(fields)
                };
                self.depth -= 1;
                v
            }
            _ => return Err("unknown tag"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallResult, OpState, Priority, RetryVerdict, Route, Usage};

    fn finished() -> Operation {
        let json = r#"{"fingerprint":"caller:gateway:01539122f8f2e01688f3cf58fe74891175b22160e4754a0c80b38da1920f1b19","route":"interactive","state":"succeeded","attempt":1,"deadline_ms":1796570223371,"input_tokens":9,"max_output_tokens":16,"reserved_tokens":25,"last_result":"succeeded","policy_digest":"9ee9ac2b6ca48100df728e28613070478c4f4303f9be25c40dbb2d96985eddea","model":"bench","state_since_ms":1796570163374,"usage":{"input_tokens":9,"output_tokens":2},"deployment":"stub"}"#;
        Operation::from_record("t00000".into(), "gw-e244322d2232fb23-0".into(), json).unwrap()
    }

    #[test]
    fn a_finished_gateway_call_packs_to_a_quarter_of_its_json_and_back() {
        let op = finished();
        let json = serde_json::to_string(&op).unwrap();
        let packed = pack(&op).unwrap();
        assert!(
            packed.len() * 3 < json.len(),
            "{} vs {}",
            packed.len(),
            json.len()
        );
        let back = unpack(op.tenant.clone(), op.key.clone(), &packed).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        assert_eq!((&back.tenant, &back.key), (&op.tenant, &op.key));
        let text = to_text(&op).unwrap();
        assert!(text.starts_with('~'));
        let again = from_text("t00000".into(), "k".into(), &text).unwrap();
        assert_eq!(serde_json::to_string(&again).unwrap(), json);
    }

    #[test]
    fn every_field_round_trips() {
        let mut op = finished();
        op.route = Route::Durable;
        op.state = OpState::FailedFinal;
        op.fingerprint = "sha256:ABCDEF".into(); // not a lowercase digest: written whole
        op.attempt = 300;
        op.deadline_ms = -5;
        op.optional_context_tokens = u64::MAX;
        op.estimated_exec_ms = 7;
        op.degraded = true;
        op.body_ref = Some("b".repeat(200));
        op.not_before_ms = Some(-1_000_000_000_000);
        op.result_ref = Some("réponse".into());
        op.worker = Some("worker-1".into());
        op.last_result = Some(CallResult::Failed);
        op.last_retry = Some(RetryVerdict {
            eligible: false,
            reason: Some("policy".into()),
            not_before_ms: Some(12),
        });
        op.priority = Priority::Sheddable;
        op.reserved_cost_microusd = 1 << 40;
        op.usage = Some(Usage::new(1, 2));
        op.holds_deployment_slot = true;
        op.asked_model = Some("gpt".into());
        op.trace_context = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        let json = serde_json::to_string(&op).unwrap();
        let back = unpack("t".into(), "k".into(), &pack(&op).unwrap()).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }

    /// The tree the reader finds in what `value` packs to.
    fn packed_tree<T: serde::Serialize>(value: &T) -> Value {
        let mut out = Vec::new();
        value.serialize(packer::Packer { out: &mut out }).unwrap();
        let mut reader = Reader {
            bytes: &out,
            depth: 0,
        };
        let tree = reader.value().unwrap();
        assert!(reader.bytes.is_empty());
        tree
    }

    #[test]
    fn what_is_packed_reads_back_as_the_json_tree_of_its_value() {
        #[derive(serde::Serialize)]
        enum Shape {
            Unit,
            Newtype(i64),
            Tuple(u8, String),
            Struct { negative: i32, float: f64 },
        }
        #[derive(serde::Serialize)]
        struct Everything {
            shapes: Vec<Shape>,
            by_number: std::collections::BTreeMap<u32, bool>,
            by_name: std::collections::HashMap<String, Option<char>>,
            #[serde(with = "serde_bytes_as_slice")]
            bytes: Vec<u8>,
            not_finite: f64,
            extremes: (i64, u64, i8),
            unit: (),
            nothing: Option<u8>,
            digest: String,
            word: &'static str,
        }
        mod serde_bytes_as_slice {
            pub fn serialize<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(b)
            }
        }
        let value = Everything {
            shapes: vec![
                Shape::Unit,
                Shape::Newtype(-7),
                Shape::Tuple(3, "three".into()),
                Shape::Struct {
                    negative: -1,
                    float: 0.5,
                },
            ],
            by_number: [(1, true), (200, false)].into(),
            by_name: [("a".to_string(), Some('é')), ("b".to_string(), None)].into(),
            bytes: vec![0, 255],
            not_finite: f64::NAN,
            extremes: (i64::MIN, u64::MAX, -128),
            unit: (),
            nothing: None,
            digest: format!("sha256:{}", "ab".repeat(32)),
            word: "succeeded",
        };
        assert_eq!(packed_tree(&value), serde_json::to_value(&value).unwrap());
        // Over 127 fields, an object's count takes two bytes.
        let wide: std::collections::BTreeMap<String, u32> =
            (0..300).map(|i| (format!("f{i}"), i)).collect();
        assert_eq!(packed_tree(&wide), serde_json::to_value(&wide).unwrap());
        let op = finished();
        assert_eq!(packed_tree(&op), serde_json::to_value(&op).unwrap());
        // A map key that JSON cannot name is an error, not a panic.
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let mut out = Vec::new();
        assert!(serde::Serialize::serialize(&bad, packer::Packer { out: &mut out }).is_err());
    }

    #[test]
    fn long_text_that_is_not_a_digest_is_written_whole() {
        let mut op = finished();
        // 64 bytes from the end falls inside a character here.
        op.body_ref = Some(format!("{}x", "é".repeat(40)));
        op.result_ref = Some("A".repeat(64));
        let back = unpack("t".into(), "k".into(), &pack(&op).unwrap()).unwrap();
        assert_eq!(
            (back.body_ref, back.result_ref),
            (op.body_ref, op.result_ref)
        );
    }

    #[test]
    fn json_records_of_earlier_releases_still_read() {
        let op = finished();
        let json = serde_json::to_string(&op).unwrap();
        let from_sqlite = from_sqlite(
            "t".into(),
            "k".into(),
            rusqlite::types::ValueRef::Text(json.as_bytes()),
        )
        .unwrap();
        let from_text = from_text("t".into(), "k".into(), &json).unwrap();
        for back in [from_sqlite, from_text] {
            assert_eq!(serde_json::to_string(&back).unwrap(), json);
        }
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        let packed = pack(&finished()).unwrap();
        for cut in 0..packed.len() {
            assert!(
                unpack("t".into(), "k".into(), &packed[..cut]).is_err(),
                "{cut}"
            );
        }
        let mut extra = packed.clone();
        extra.push(0);
        assert!(unpack("t".into(), "k".into(), &extra).is_err());
        for bad in [
            vec![2u8],
            vec![1, 99],
            vec![
                1, OBJECT, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,
            ],
            vec![1, OBJECT, 1, 200, NULL],
            vec![1, WORD, 250],
            [vec![1], [ARRAY, 1].repeat(20), vec![NULL]].concat(),
        ] {
            assert!(unpack("t".into(), "k".into(), &bad).is_err(), "{bad:?}");
        }
        assert!(from_text("t".into(), "k".into(), "~!!").is_err());
    }
}
