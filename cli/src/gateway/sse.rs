//! Server-sent events as an OpenAI stream carries them: the upstream's bytes are cut into
//! whole events (each passed on unchanged, as soon as it is complete) and each is read for
//! the one thing the gateway needs, the final usage chunk.

use serde_json::Value;
use tollgate::model::Usage;

/// Longest event the splitter holds while waiting for its end: a stream that never ends an
/// event must not grow the gateway's memory without bound.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

/// Cuts a byte stream into events.
#[derive(Default)]
pub struct Splitter {
    pending: Vec<u8>,
}

/// One event, and what the gateway read in it.
pub struct Event {
    /// The event's bytes, its blank line included.
    pub raw: Vec<u8>,
    /// `data: [DONE]`: the stream's regular end.
    pub done: bool,
    /// The usage the event reports, if any.
    pub usage: Option<Usage>,
    /// A chunk that carries only usage (`choices` empty), as `include_usage` adds.
    pub usage_only: bool,
}

impl Splitter {
    /// Adds bytes; returns the events they complete. `Err` when one event is over
    /// [`MAX_EVENT_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            events.push(Event::read(raw));
        }
        if self.pending.len() > MAX_EVENT_BYTES {
            return Err(format!("an upstream event over {MAX_EVENT_BYTES} bytes"));
        }
        Ok(events)
    }

    /// Bytes of an event not yet ended.
    #[cfg(test)]
    pub fn leftover(&self) -> &[u8] {
        &self.pending
    }
}

/// Where the first event ends (after its blank line), for `\n\n` and `\r\n\r\n` alike.
fn event_end(bytes: &[u8]) -> Option<usize> {
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Event {
    fn read(raw: Vec<u8>) -> Event {
        let text = String::from_utf8_lossy(&raw);
        let data: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect::<Vec<_>>()
            .join("\n");
        let mut event = Event {
            done: data.trim() == "[DONE]",
            usage: None,
            usage_only: false,
            raw,
        };
        if let Ok(chunk) = serde_json::from_str::<Value>(&data) {
            event.usage = usage_of(&chunk);
            event.usage_only = event.usage.is_some()
                && chunk
                    .get("choices")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
        }
        event
    }
}

/// The `usage` object of an answer or chunk (`prompt_tokens`, `completion_tokens`).
pub fn usage_of(body: &Value) -> Option<Usage> {
    let usage = body.get("usage")?;
    Some(Usage {
        input_tokens: usage.get("prompt_tokens")?.as_u64()?,
        output_tokens: usage.get("completion_tokens")?.as_u64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_whole_and_the_usage_chunk_is_found() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\r\n\r\n",
            "data: [DONE]\n\n"
        );
        let mut s = Splitter::default();
        let mut events = Vec::new();
        // Byte by byte: an event is given only once it is whole.
        for b in stream.as_bytes() {
            events.extend(s.push(&[*b]).unwrap());
        }
        assert_eq!(events.len(), 3);
        assert!(s.leftover().is_empty());
        let raw: Vec<u8> = events.iter().flat_map(|e| e.raw.clone()).collect();
        assert_eq!(raw, stream.as_bytes(), "passed on unchanged");
        assert!(events[0].usage.is_none() && !events[0].done);
        let u = events[1].usage.unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (9, 2));
        assert!(events[1].usage_only);
        assert!(events[2].done);
    }

    #[test]
    fn an_event_that_never_ends_is_bounded() {
        let mut s = Splitter::default();
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(s.push(&big).is_err());
    }
}
