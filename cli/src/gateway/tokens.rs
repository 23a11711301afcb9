//! Counting a chat request's prompt tokens before the call, the way OpenAI counts chat
//! messages: each message costs 3 tokens of framing plus its fields' tokens (a `name` one
//! more), and the reply is primed with 3. Content given as parts counts its text parts;
//! other parts (images, audio) and `tools` count their JSON at the same rate, which
//! overestimates rather than under.

use serde_json::Value;
use tiktoken_rs::CoreBPE;

/// How a model's prompts are counted.
#[derive(Clone, Copy)]
pub enum Counter {
    /// A tiktoken BPE encoding.
    Bpe(&'static CoreBPE),
    /// No tokenizer: UTF-8 bytes over this many per token, rounded up.
    Estimate(f64),
}

const PER_MESSAGE: u64 = 3;
const PER_NAME: u64 = 1;
const REPLY_PRIMING: u64 = 3;
/// Framing per message when estimating (a little more than the tokenizer's).
const ESTIMATE_PER_MESSAGE: u64 = 4;

impl Counter {
    /// The counter for a configured tokenizer name (checked at start), or the estimate.
    pub fn new(tokenizer: Option<&str>, bytes_per_token: f64) -> Counter {
        match tokenizer {
            Some("o200k_base") => Counter::Bpe(tiktoken_rs::o200k_base_singleton()),
            Some("cl100k_base") => Counter::Bpe(tiktoken_rs::cl100k_base_singleton()),
            _ => Counter::Estimate(bytes_per_token),
        }
    }

    /// The tokens of one text, with no framing.
    pub fn text(&self, text: &str) -> u64 {
        match self {
            Counter::Bpe(bpe) => bpe.encode_with_special_tokens(text).len() as u64,
            Counter::Estimate(rate) => (text.len() as f64 / rate).ceil() as u64,
        }
    }

    /// The prompt tokens of a request's `messages` (and `tools`, when given).
    pub fn prompt(&self, messages: &[Value], tools: Option<&Value>) -> u64 {
        let framing = match self {
            Counter::Bpe(_) => PER_MESSAGE,
            Counter::Estimate(_) => ESTIMATE_PER_MESSAGE,
        };
        let mut total = REPLY_PRIMING;
        for message in messages {
            total += framing;
            let Some(fields) = message.as_object() else {
                total += self.text(&message.to_string());
                continue;
            };
            for (key, value) in fields {
                total += self.value(value);
                if key == "name" {
                    total += PER_NAME;
                }
            }
        }
        if let Some(tools) = tools {
            total += self.text(&tools.to_string());
        }
        total
    }

    /// The prompt tokens of a Responses call: `instructions` as a system message, `input`
    /// as one user message when a string, else each item as a message (its `content`
    /// string or parts counted, other fields as chat counts them), and `tools`.
    pub fn responses_input(
        &self,
        input: Option<&Value>,
        instructions: Option<&str>,
        tools: Option<&Value>,
    ) -> u64 {
        let mut messages = Vec::new();
        if let Some(i) = instructions {
            messages.push(serde_json::json!({"role": "system", "content": i}));
        }
        match input {
            Some(Value::String(s)) => {
                messages.push(serde_json::json!({"role": "user", "content": s}))
            }
            Some(Value::Array(items)) => messages.extend(items.iter().cloned()),
            _ => {}
        }
        self.prompt(&messages, tools)
    }

    fn value(&self, value: &Value) -> u64 {
        match value {
            Value::String(s) => self.text(s),
            Value::Array(parts) => parts
                .iter()
                .map(|part| match part.get("text").and_then(Value::as_str) {
                    // Chat's `text` parts; Responses' `input_text` and `output_text`.
                    Some(text)
                        if matches!(
                            part.get("type").and_then(Value::as_str),
                            Some("text" | "input_text" | "output_text")
                        ) =>
                    {
                        self.text(text)
                    }
                    _ => self.text(&part.to_string()),
                })
                .sum(),
            Value::Null => 0,
            other => self.text(&other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_messages_are_counted_as_openai_counts_them() {
        let o200k = Counter::new(Some("o200k_base"), 3.0);
        // "Hello world" is two tokens in both encodings; "user" is one.
        let messages = [json!({"role": "user", "content": "Hello world"})];
        assert_eq!(o200k.prompt(&messages, None), 3 + 3 + 1 + 2);
        let named = [json!({"role": "user", "name": "bob", "content": "Hello world"})];
        assert_eq!(o200k.prompt(&named, None), 3 + 3 + 1 + 2 + 1 + 1);
        let cl100k = Counter::new(Some("cl100k_base"), 3.0);
        assert_eq!(cl100k.prompt(&messages, None), 9);
        // Parts: text parts count their text.
        let parts = [json!({"role": "user", "content": [{"type": "text", "text": "Hello world"}]})];
        assert_eq!(o200k.prompt(&parts, None), 9);
    }

    #[test]
    fn the_estimate_is_never_below_the_tokenizer_on_ordinary_text() {
        let text = "The quick brown fox jumps over the lazy dog, again and again, 42 times.";
        let messages = [
            json!({"role": "system", "content": text}),
            json!({"role": "user", "content": text}),
        ];
        let exact = Counter::new(Some("o200k_base"), 3.0).prompt(&messages, None);
        let estimate = Counter::new(None, 3.0).prompt(&messages, None);
        assert!(estimate >= exact, "{estimate} < {exact}");
    }
}
