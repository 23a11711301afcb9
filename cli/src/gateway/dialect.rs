//! The dialects the gateway speaks, and what differs between them: which upstreams serve
//! them, where a call goes upstream, how its prompt is counted and its output limit read,
//! which field carries the limit upstream, and where the provider reports usage (a plain
//! answer's `usage`, a chat stream's last chunk, a Responses stream's `response.completed`
//! event, a Messages stream's `message_start` and `message_delta` events).
//!
//! - **Chat completions** (`POST /v1/chat/completions`): `messages`, the limit in
//!   `max_completion_tokens` or `max_tokens`, usage `prompt_tokens`/`completion_tokens`.
//! - **Responses** (`POST /v1/responses`): `input` and `instructions`, the limit in
//!   `max_output_tokens`, usage `input_tokens`/`output_tokens`.
//! - **Embeddings** (`POST /v1/embeddings`): `input` as a string, strings or token arrays,
//!   counted exactly; no output (one token reserved, the least an admission holds, given
//!   back by the usage), usage `prompt_tokens`.
//! - **Anthropic Messages** (`POST /v1/messages`): `messages` and `system`, estimated (no
//!   published tokenizer), the limit in `max_tokens`, usage `input_tokens` (plus the cache's
//!   `cache_creation_input_tokens` and `cache_read_input_tokens`) and `output_tokens`.

use super::openai::ApiError;
use super::tokens::Counter;
use serde_json::{Map, Value};
use tollgate::config::UpstreamKind;
use tollgate::model::Usage;

/// One OpenAI dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Chat completions.
    Chat,
    /// The Responses API.
    Responses,
    /// Embeddings.
    Embeddings,
    /// Anthropic's Messages.
    Messages,
}

/// What a call's body says, as the admission needs it.
pub struct Shape {
    /// The prompt's tokens, counted before the call.
    pub input_tokens: u64,
    /// The output reserved.
    pub max_output: u64,
    /// The field that carries the output limit upstream (none: the dialect has no output).
    pub limit_field: Option<&'static str>,
    /// Whether the answer is a stream.
    pub stream: bool,
    /// Whether the caller asked for a chat stream's usage chunk.
    pub caller_wants_usage: bool,
}

/// The largest embeddings `input` array OpenAI takes.
const MAX_EMBEDDING_INPUTS: usize = 2048;

impl Dialect {
    /// The path below an upstream's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "chat/completions",
            Dialect::Responses => "responses",
            Dialect::Embeddings => "embeddings",
            Dialect::Messages => "v1/messages",
        }
    }

    /// Its operation as GenAI's conventions name it (`gen_ai.operation.name`).
    pub fn operation(self) -> &'static str {
        match self {
            Dialect::Chat | Dialect::Messages => "chat",
            Dialect::Responses => "generate_content",
            Dialect::Embeddings => "embeddings",
        }
    }

    /// The kind of upstream that serves it.
    pub fn kind(self) -> UpstreamKind {
        match self {
            Dialect::Messages => UpstreamKind::Anthropic,
            _ => UpstreamKind::Openai,
        }
    }

    /// The route callers use, for messages.
    pub fn route(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Responses => "/v1/responses",
            Dialect::Embeddings => "/v1/embeddings",
            Dialect::Messages => "/v1/messages",
        }
    }

    /// Reads a call's body: its prompt counted by `counter`, its output limit (the
    /// model's `default_max_output` when it gives none), its stream flag.
    pub fn read(
        self,
        body: &Map<String, Value>,
        counter: &Counter,
        default_max_output: u64,
    ) -> Result<Shape, ApiError> {
        let invalid = |message: &str| ApiError::new(400, "invalid_request", message);
        let positive = |name: &str| match body.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Ok(Some(n)),
                _ => Err(invalid(&format!("`{name}` must be a positive integer"))),
            },
        };
        let stream = match body.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("`stream` must be a boolean")),
        };
        match self {
            Dialect::Chat => {
                let messages = match body.get("messages") {
                    Some(Value::Array(m)) if !m.is_empty() => m,
                    _ => return Err(invalid("`messages` must be a non-empty array")),
                };
                let (field, max_output) =
                    match (positive("max_completion_tokens")?, positive("max_tokens")?) {
                        (Some(n), _) => ("max_completion_tokens", n),
                        (None, Some(n)) => ("max_tokens", n),
                        (None, None) => ("max_completion_tokens", default_max_output),
                    };
                // Several choices would multiply the output past what was reserved for one.
                if positive("n")?.is_some_and(|n| n > 1) {
                    return Err(invalid("`n` above 1 is not served through the gateway"));
                }
                let caller_wants_usage = body
                    .get("stream_options")
                    .and_then(|o| o.get("include_usage"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                Ok(Shape {
                    input_tokens: counter.prompt(messages, body.get("tools")),
                    max_output,
                    limit_field: Some(field),
                    stream,
                    caller_wants_usage,
                })
            }
            Dialect::Responses => {
                let input = body.get("input").filter(|v| !v.is_null());
                let previous = body.get("previous_response_id").filter(|v| !v.is_null());
                match input {
                    Some(Value::String(_) | Value::Array(_)) => {}
                    // The conversation so far is the provider's: admitted on what is sent.
                    None if previous.is_some() => {}
                    _ => {
                        return Err(invalid(
                            "`input` must be a string or an array of input items",
                        ))
                    }
                }
                if previous.is_some_and(|p| !p.is_string()) {
                    return Err(invalid("`previous_response_id` must be a string"));
                }
                let instructions = match body.get("instructions") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.as_str()),
                    Some(_) => return Err(invalid("`instructions` must be a string")),
                };
                let max_output = positive("max_output_tokens")?.unwrap_or(default_max_output);
                Ok(Shape {
                    input_tokens: counter.responses_input(input, instructions, body.get("tools")),
                    max_output,
                    limit_field: Some("max_output_tokens"),
                    stream,
                    caller_wants_usage: false,
                })
            }
            Dialect::Messages => {
                let messages = match body.get("messages") {
                    Some(Value::Array(m)) if !m.is_empty() => m,
                    _ => return Err(invalid("`messages` must be a non-empty array")),
                };
                let mut all = Vec::with_capacity(messages.len() + 1);
                match body.get("system") {
                    None | Some(Value::Null) => {}
                    Some(system @ (Value::String(_) | Value::Array(_))) => {
                        all.push(serde_json::json!({"role": "system", "content": system}))
                    }
                    Some(_) => return Err(invalid("`system` must be a string or text blocks")),
                }
                all.extend(messages.iter().cloned());
                let max_output = positive("max_tokens")?.unwrap_or(default_max_output);
                Ok(Shape {
                    input_tokens: counter.prompt(&all, body.get("tools")),
                    max_output,
                    limit_field: Some("max_tokens"),
                    stream,
                    caller_wants_usage: false,
                })
            }
            Dialect::Embeddings => {
                if stream {
                    return Err(invalid("embeddings are not streamed"));
                }
                let tokens = embedding_tokens(body.get("input"), counter).ok_or_else(|| {
                    invalid(&format!(
                        "`input` must be a non-empty string, an array of up to \
                         {MAX_EMBEDDING_INPUTS} non-empty strings, or of token arrays"
                    ))
                })?;
                Ok(Shape {
                    input_tokens: tokens,
                    max_output: 1,
                    limit_field: None,
                    stream: false,
                    caller_wants_usage: false,
                })
            }
        }
    }

    /// Writes what the gateway decides into the body sent upstream: the planned output
    /// limit, and on a chat stream the usage chunk.
    pub fn prepare(self, body: &mut Map<String, Value>, shape: &CallLimit, stream: bool) {
        if let Some(field) = shape.field {
            body.insert(field.into(), Value::from(shape.planned));
        }
        if self == Dialect::Chat && stream {
            let options = body
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(o) = options {
                o.insert("include_usage".into(), Value::Bool(true));
            } else {
                *options = serde_json::json!({"include_usage": true});
            }
        }
    }

    /// The usage a plain answer (or a chat chunk, or a Responses event's `response`)
    /// reports.
    pub fn usage_of(self, body: &Value) -> Option<Usage> {
        let usage = body.get("usage")?;
        let read = |field: &str| usage.get(field).and_then(Value::as_u64);
        // A detail's count (`input_tokens_details.cached_tokens`, say), 0 when absent.
        let detail = |details: &str, field: &str| {
            usage
                .get(details)
                .and_then(|d| d.get(field))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        let mut u = match self {
            Dialect::Chat => Usage {
                cached_input_tokens: detail("prompt_tokens_details", "cached_tokens"),
                reasoning_tokens: detail("completion_tokens_details", "reasoning_tokens"),
                ..Usage::new(read("prompt_tokens")?, read("completion_tokens")?)
            },
            Dialect::Responses => Usage {
                cached_input_tokens: detail("input_tokens_details", "cached_tokens"),
                reasoning_tokens: detail("output_tokens_details", "reasoning_tokens"),
                ..Usage::new(read("input_tokens")?, read("output_tokens")?)
            },
            Dialect::Embeddings => Usage::new(read("prompt_tokens")?, 0),
            // Anthropic's input_tokens leaves out what the cache wrote and read.
            Dialect::Messages => {
                let written = read("cache_creation_input_tokens").unwrap_or(0);
                let cached = read("cache_read_input_tokens").unwrap_or(0);
                Usage {
                    cached_input_tokens: cached,
                    cache_write_tokens: written,
                    ..Usage::new(
                        read("input_tokens")?
                            .saturating_add(written)
                            .saturating_add(cached),
                        read("output_tokens")?,
                    )
                }
            }
        };
        // A provider's classes are parts of its totals; one that says otherwise is held to them.
        u.cached_input_tokens = u.cached_input_tokens.min(u.input_tokens);
        u.cache_write_tokens = u
            .cache_write_tokens
            .min(u.input_tokens - u.cached_input_tokens);
        u.reasoning_tokens = u.reasoning_tokens.min(u.output_tokens);
        Some(u)
    }

    /// Whether a stream that ends after its usage (and before its regular end) is whole:
    /// a chat stream's usage chunk is its last; elsewhere usage comes before the end.
    pub fn usage_ends_stream(self) -> bool {
        self == Dialect::Chat
    }

    /// The usage so far of a stream, with an event's report merged in: each count the
    /// larger (Anthropic's `message_delta` counts are cumulative, its `message_start`
    /// output a first token or so; elsewhere one event carries the usage whole).
    pub fn merge(self, so_far: Option<Usage>, event: Option<Usage>) -> Option<Usage> {
        match (so_far, event) {
            (Some(a), Some(b)) => Some(Usage {
                input_tokens: a.input_tokens.max(b.input_tokens),
                output_tokens: a.output_tokens.max(b.output_tokens),
                cached_input_tokens: a.cached_input_tokens.max(b.cached_input_tokens),
                cache_write_tokens: a.cache_write_tokens.max(b.cache_write_tokens),
                reasoning_tokens: a.reasoning_tokens.max(b.reasoning_tokens),
            }),
            (a, b) => b.or(a),
        }
    }

    /// What one stream event's data says: whether it ends the stream regularly, its usage,
    /// and whether it carries only usage (a chat usage chunk the caller did not ask for).
    pub fn read_event(self, data: &str) -> (bool, Option<Usage>, bool) {
        match self {
            Dialect::Chat | Dialect::Embeddings => {
                if data.trim() == "[DONE]" {
                    return (true, None, false);
                }
                let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                    return (false, None, false);
                };
                let usage = self.usage_of(&chunk);
                let usage_only = usage.is_some()
                    && chunk
                        .get("choices")
                        .and_then(Value::as_array)
                        .is_some_and(Vec::is_empty);
                (false, usage, usage_only)
            }
            Dialect::Responses => {
                let Ok(event) = serde_json::from_str::<Value>(data) else {
                    return (false, None, false);
                };
                // The response's last event carries it whole, its usage included.
                let last = matches!(
                    event.get("type").and_then(Value::as_str),
                    Some("response.completed" | "response.incomplete")
                );
                let usage = event.get("response").and_then(|r| self.usage_of(r));
                (last, usage, false)
            }
            Dialect::Messages => {
                let Ok(event) = serde_json::from_str::<Value>(data) else {
                    return (false, None, false);
                };
                match event.get("type").and_then(Value::as_str) {
                    Some("message_start") => {
                        let usage = event.get("message").and_then(|m| self.usage_of(m));
                        (false, usage, false)
                    }
                    // Its usage has the output so far, and (on newer versions) the input.
                    Some("message_delta") => {
                        let usage = event.get("usage").and_then(|u| {
                            let read = |f: &str| u.get(f).and_then(Value::as_u64).unwrap_or(0);
                            let (written, cached) = (
                                read("cache_creation_input_tokens"),
                                read("cache_read_input_tokens"),
                            );
                            Some(Usage {
                                cached_input_tokens: cached,
                                cache_write_tokens: written,
                                ..Usage::new(
                                    read("input_tokens")
                                        .saturating_add(written)
                                        .saturating_add(cached),
                                    u.get("output_tokens")?.as_u64()?,
                                )
                            })
                        });
                        (false, usage, false)
                    }
                    Some("message_stop") => (true, None, false),
                    _ => (false, None, false),
                }
            }
        }
    }
}

impl Dialect {
    /// The event a caller gets when the upstream's stream was cut off: the outcome is
    /// unknown and the call is not retried (an `error` event, as each dialect writes one).
    pub fn cut_off_event(self) -> String {
        let message =
            "the upstream stream was cut off; the outcome is unknown and the call is not retried";
        match self {
            Dialect::Responses => {
                let error = serde_json::json!({"type": "error", "code": "unknown_outcome",
                                               "message": message, "param": null});
                format!("event: error\ndata: {error}\n\n")
            }
            Dialect::Chat | Dialect::Embeddings => {
                let error = serde_json::json!({"error": {"message": message, "type": "api_error",
                                                         "code": "unknown_outcome"}});
                format!("data: {error}\n\n")
            }
            Dialect::Messages => {
                let error = serde_json::json!({"type": "error",
                                               "error": {"type": "api_error", "message": message}});
                format!("event: error\ndata: {error}\n\n")
            }
        }
    }
}

/// The output limit an attempt sends upstream, and where.
pub struct CallLimit {
    /// The field (none: the dialect has no output).
    pub field: Option<&'static str>,
    /// The limit the plan allows.
    pub planned: u64,
}

/// The tokens of an embeddings `input`: strings counted with the tokenizer (no framing),
/// token arrays by their length. `None` when it is not one of the shapes OpenAI takes.
fn embedding_tokens(input: Option<&Value>, counter: &Counter) -> Option<u64> {
    let tokens = |v: &Value| -> Option<u64> {
        match v {
            Value::String(s) if !s.is_empty() => Some(counter.text(s)),
            Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                Some(ids.len() as u64)
            }
            _ => None,
        }
    };
    match input? {
        Value::Array(items) if items.is_empty() || items.len() > MAX_EMBEDDING_INPUTS => None,
        // One token array.
        Value::Array(items) if items.iter().all(Value::is_u64) => tokens(input?),
        Value::Array(items) => items.iter().map(tokens).sum(),
        one => tokens(one),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn counter() -> Counter {
        Counter::new(Some("o200k_base"), 4.0)
    }

    fn read(d: Dialect, body: Value) -> Result<Shape, ApiError> {
        d.read(body.as_object().unwrap(), &counter(), 64)
    }

    #[test]
    fn embeddings_count_strings_and_token_arrays_exactly() {
        let c = counter();
        let one = read(Dialect::Embeddings, json!({"input": "hello world"})).unwrap();
        assert_eq!(one.input_tokens, c.text("hello world"));
        assert_eq!((one.max_output, one.limit_field), (1, None));
        let many = read(Dialect::Embeddings, json!({"input": ["a b", "c"]})).unwrap();
        assert_eq!(many.input_tokens, c.text("a b") + c.text("c"));
        let ids = read(Dialect::Embeddings, json!({"input": [1, 2, 3]})).unwrap();
        assert_eq!(ids.input_tokens, 3);
        let arrays = read(Dialect::Embeddings, json!({"input": [[1, 2], [3]]})).unwrap();
        assert_eq!(arrays.input_tokens, 3);
        for bad in [
            json!({}),
            json!({"input": ""}),
            json!({"input": []}),
            json!({"input": [1, "a"]}),
            json!({"input": {"a": 1}}),
            json!({"input": "a", "stream": true}),
        ] {
            assert!(read(Dialect::Embeddings, bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn responses_count_input_and_instructions_and_reserve_the_output_limit() {
        let plain = read(Dialect::Responses, json!({"input": "hello"})).unwrap();
        let told = read(
            Dialect::Responses,
            json!({"input": "hello", "instructions": "be brief", "max_output_tokens": 20}),
        )
        .unwrap();
        assert!(told.input_tokens > plain.input_tokens);
        assert_eq!((plain.max_output, told.max_output), (64, 20));
        assert_eq!(told.limit_field, Some("max_output_tokens"));
        let items = read(
            Dialect::Responses,
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}]}),
        )
        .unwrap();
        assert!(items.input_tokens >= plain.input_tokens);
        assert!(read(
            Dialect::Responses,
            json!({"previous_response_id": "resp_1"})
        )
        .is_ok());
        assert!(read(Dialect::Responses, json!({})).is_err());
        assert!(read(Dialect::Responses, json!({"input": 3})).is_err());
        assert!(read(
            Dialect::Responses,
            json!({"input": "a", "max_output_tokens": 0})
        )
        .is_err());
    }

    #[test]
    fn a_messages_stream_books_the_start_input_and_the_last_delta_output() {
        let d = Dialect::Messages;
        let start = json!({"type": "message_start", "message": {"usage": {
            "input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2,
            "output_tokens": 1}}})
        .to_string();
        let delta = json!({"type": "message_delta", "usage": {"output_tokens": 7}}).to_string();
        let (_, a, _) = d.read_event(&start);
        let (_, b, _) = d.read_event(&delta);
        let merged = d.merge(d.merge(None, a), b).unwrap();
        assert_eq!((merged.input_tokens, merged.output_tokens), (17, 7));
        assert!(d.read_event(r#"{"type":"message_stop"}"#).0);
        assert!(!d.usage_ends_stream());
        let plain = read(
            d,
            json!({"messages": [{"role": "user", "content": "hi"}], "system": "be brief",
                   "max_tokens": 30}),
        )
        .unwrap();
        assert_eq!(
            (plain.max_output, plain.limit_field),
            (30, Some("max_tokens"))
        );
        assert!(read(d, json!({"messages": []})).is_err());
        assert!(read(
            d,
            json!({"messages": [{"role": "user", "content": "hi"}], "system": 3})
        )
        .is_err());
    }

    const ALL: [Dialect; 4] = [
        Dialect::Chat,
        Dialect::Responses,
        Dialect::Embeddings,
        Dialect::Messages,
    ];

    proptest::proptest! {
        /// Any body a provider may send: never a panic, and the classes never above the
        /// totals they are parts of, whatever the numbers (huge ones included).
        #[test]
        fn any_usage_body_reads_without_panic_and_within_its_totals(
            numbers in proptest::collection::vec(proptest::prelude::any::<u64>(), 8),
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let n = |i: usize| numbers[i];
            let usage = json!({"usage": {
                "prompt_tokens": n(0), "completion_tokens": n(1), "input_tokens": n(0),
                "output_tokens": n(1), "cache_creation_input_tokens": n(2),
                "cache_read_input_tokens": n(3),
                "prompt_tokens_details": {"cached_tokens": n(4)},
                "input_tokens_details": {"cached_tokens": n(4)},
                "completion_tokens_details": {"reasoning_tokens": n(5)},
                "output_tokens_details": {"reasoning_tokens": n(5)}}});
            let event = json!({"type": "message_delta", "usage": usage["usage"]}).to_string();
            for d in ALL {
                let u = d.usage_of(&usage).unwrap();
                proptest::prop_assert!(
                    u.cached_input_tokens.saturating_add(u.cache_write_tokens) <= u.input_tokens
                );
                proptest::prop_assert!(u.reasoning_tokens <= u.output_tokens);
                let _ = d.read_event(&event);
                let _ = d.read_event(&String::from_utf8_lossy(&bytes));
                if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                    let _ = d.usage_of(&v);
                }
            }
        }
    }

    #[test]
    fn usage_is_read_where_each_dialect_puts_it() {
        let responses = json!({"usage": {"input_tokens": 7, "output_tokens": 3}});
        let u = Dialect::Responses.usage_of(&responses).unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (7, 3));
        let e = Dialect::Embeddings
            .usage_of(&json!({"usage": {"prompt_tokens": 5, "total_tokens": 5}}))
            .unwrap();
        assert_eq!((e.input_tokens, e.output_tokens), (5, 0));
        assert!(Dialect::Chat.usage_of(&responses).is_none());
        let done = json!({"type": "response.completed", "response": responses}).to_string();
        let (last, usage, _) = Dialect::Responses.read_event(&done);
        assert!(last);
        assert_eq!(usage.unwrap().output_tokens, 3);
        let delta = json!({"type": "response.output_text.delta", "delta": "Hi"}).to_string();
        assert_eq!(Dialect::Responses.read_event(&delta), (false, None, false));
        assert!(Dialect::Chat.read_event("[DONE]").0);
    }
}
