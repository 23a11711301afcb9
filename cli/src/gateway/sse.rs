//! Server-sent events as an OpenAI stream carries them: the upstream's bytes are cut into
//! whole events (each passed on unchanged, as soon as it is complete) and each is read, as
//! its dialect says, for the one thing the gateway needs: the usage, and the regular end.

use super::dialect::Dialect;
use tollgate::model::Usage;

/// Longest event the splitter holds while waiting for its end: a stream that never ends an
/// event must not grow the gateway's memory without bound.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

/// Cuts a byte stream into events.
pub struct Splitter {
    dialect: Dialect,
    pending: Vec<u8>,
}

/// One event, and what the gateway read in it.
pub struct Event {
    /// The event's bytes, its blank line included.
    pub raw: Vec<u8>,
    /// The stream's regular end (`data: [DONE]`, `response.completed`).
    pub done: bool,
    /// The usage the event reports, if any.
    pub usage: Option<Usage>,
    /// A chunk that carries only usage (`choices` empty), as `include_usage` adds.
    pub usage_only: bool,
}

impl Splitter {
    /// A splitter for a stream of `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        Splitter {
            dialect,
            pending: Vec::new(),
        }
    }

    /// Adds bytes; returns the events they complete. `Err` when one event is over
    /// [`MAX_EVENT_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            events.push(Event::read(raw, self.dialect));
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
    fn read(raw: Vec<u8>, dialect: Dialect) -> Event {
        let text = String::from_utf8_lossy(&raw);
        let data: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect::<Vec<_>>()
            .join("\n");
        let (done, usage, usage_only) = dialect.read_event(&data);
        Event {
            done,
            usage,
            usage_only,
            raw,
        }
    }
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
        let mut s = Splitter::new(Dialect::Chat);
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
        let mut s = Splitter::new(Dialect::Chat);
        let big = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(s.push(&big).is_err());
    }

    #[test]
    fn a_responses_stream_ends_with_its_completed_event_and_its_usage() {
        let stream = concat!(
            "event: response.created\n",
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n",
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",",
            "\"usage\":{\"input_tokens\":9,\"output_tokens\":2}}}\n\n",
        );
        let mut s = Splitter::new(Dialect::Responses);
        let mut events = Vec::new();
        for b in stream.as_bytes() {
            events.extend(s.push(&[*b]).unwrap());
        }
        assert_eq!(events.len(), 3);
        assert!(!events[0].done && events[0].usage.is_none());
        assert!(!events[1].done);
        let u = events[2].usage.unwrap();
        assert!(events[2].done && !events[2].usage_only);
        assert_eq!((u.input_tokens, u.output_tokens), (9, 2));
    }

    /// One whole stream of each dialect, and where its usage is complete: after the byte
    /// at which the stream counts as ended with its usage.
    fn sample(d: Dialect) -> (&'static str, &'static str) {
        match d {
            Dialect::Chat | Dialect::Embeddings => (
                concat!(
                    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n",
                    "data: [DONE]\n\n"
                ),
                "\"completion_tokens\":2}}\n\n",
            ),
            Dialect::Responses => (
                concat!(
                    "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
                    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
                    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":2}}}\n\n"
                ),
                "\"output_tokens\":2}}}\n\n",
            ),
            Dialect::Messages => (
                concat!(
                    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n",
                    "event: ping\ndata: {\"type\":\"ping\"}\n\n",
                    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
                    "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\n\n",
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
                ),
                "{\"type\":\"message_stop\"}\n\n",
            ),
        }
    }

    const DIALECTS: [Dialect; 3] = [Dialect::Chat, Dialect::Responses, Dialect::Messages];

    /// What the gateway learns from `pieces` pushed in order: the events' bytes, the usage
    /// merged, whether the stream counts as ended with its usage, and whether it failed.
    fn read_all(d: Dialect, pieces: &[&[u8]]) -> (Vec<u8>, Option<Usage>, bool, bool) {
        let mut s = Splitter::new(d);
        let (mut raw, mut usage, mut done, mut failed) = (Vec::new(), None, false, false);
        for p in pieces {
            match s.push(p) {
                Ok(events) => {
                    for e in events {
                        raw.extend_from_slice(&e.raw);
                        done |= e.done;
                        usage = d.merge(usage, e.usage);
                    }
                }
                Err(_) => failed = true,
            }
        }
        let whole = done || (usage.is_some() && d.usage_ends_stream());
        (raw, usage, whole, failed)
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_at_any_split_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            cut in 0usize..2048,
        ) {
            for d in DIALECTS {
                let (a, b) = bytes.split_at(cut.min(bytes.len()));
                let _ = read_all(d, &[a, b]);
            }
        }

        #[test]
        fn a_stream_split_anywhere_reads_as_it_does_whole(
            which in 0usize..3,
            mut cuts in proptest::collection::vec(0usize..1024, 0..12),
        ) {
            let d = DIALECTS[which];
            let (stream, _) = sample(d);
            let bytes = stream.as_bytes();
            cuts.iter_mut().for_each(|c| *c %= bytes.len() + 1);
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts {
                pieces.push(&bytes[from..c]);
                from = c;
            }
            pieces.push(&bytes[from..]);
            let whole = read_all(d, &[bytes]);
            let split = read_all(d, &pieces);
            proptest::prop_assert_eq!(&split, &whole);
            // Passed on unchanged, and the usage booked once, as reported.
            proptest::prop_assert_eq!(&split.0[..], bytes);
            let u = split.1.unwrap();
            proptest::prop_assert_eq!((u.input_tokens, u.output_tokens), (9, 2));
            proptest::prop_assert!(split.2);
        }

        #[test]
        fn a_stream_cut_before_its_usage_is_complete_never_counts_as_ended(
            which in 0usize..3,
            at in 0usize..1024,
        ) {
            let d = DIALECTS[which];
            let (stream, tail) = sample(d);
            let complete = stream.find(tail).unwrap() + tail.len();
            let at = at % complete;
            let (_, _, whole, _) = read_all(d, &[&stream.as_bytes()[..at]]);
            proptest::prop_assert!(!whole, "cut at {} of {}", at, complete);
        }

        #[test]
        fn an_event_repeated_books_its_usage_once(which in 0usize..3, times in 1usize..4) {
            let d = DIALECTS[which];
            let (stream, _) = sample(d);
            let repeated = stream.repeat(times);
            let (_, usage, _, _) = read_all(d, &[repeated.as_bytes()]);
            let u = usage.unwrap();
            proptest::prop_assert_eq!((u.input_tokens, u.output_tokens), (9, 2));
        }
    }
}
