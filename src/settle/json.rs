//! A cost read from a response's JSON body at a pointer ([`Settle::json`](super::Settle::json)):
//! the body's JSON, or in a stream of server-sent events the last event whose JSON has it, as
//! the LLM APIs report their usage.

use serde_json::Value;

use super::Reading;

/// The most bytes of a JSON body, or of one event, kept to be parsed (a larger one reports no
/// cost).
const MOST: usize = 1 << 20;

/// What is read of a response body for a cost at a JSON pointer, as it streams.
pub(crate) struct JsonCost {
    pointer: std::sync::Arc<str>,
    /// The body is a stream of server-sent events.
    events: bool,
    /// The body so far (whole JSON), or the event being received.
    kept: Vec<u8>,
    /// More than [`MOST`] bytes came for one document.
    over: bool,
    /// The last event's reading that had the pointer.
    last: Reading,
}

impl JsonCost {
    /// Reads `pointer` of a body that is JSON, or server-sent events when `events`.
    pub(crate) fn new(pointer: std::sync::Arc<str>, events: bool) -> Self {
        JsonCost {
            pointer,
            events,
            kept: Vec::new(),
            over: false,
            last: Reading::Missing,
        }
    }

    /// Takes the next `data` of the body.
    pub(crate) fn observe(&mut self, data: &[u8]) {
        if self.over && !self.events {
            return;
        }
        self.kept.extend_from_slice(data);
        if self.events {
            while let Some(end) = event_end(&self.kept) {
                let event: Vec<u8> = self.kept.drain(..end.1).collect();
                self.event(&event[..end.0]);
            }
        }
        if self.kept.len() > MOST {
            // An event (or a body) larger than anyone reports usage in: skipped.
            self.over = true;
            self.kept = Vec::new();
        }
    }

    /// The cost the body reported: its JSON's, or its last event's with the pointer.
    pub(crate) fn finish(mut self) -> Reading {
        if !self.events {
            if self.over {
                return Reading::Missing;
            }
            return match serde_json::from_slice::<Value>(&self.kept) {
                Ok(json) => reading(json.pointer(&self.pointer)),
                Err(_) => Reading::Missing,
            };
        }
        let rest = std::mem::take(&mut self.kept);
        self.event(&rest);
        self.last
    }

    /// An event's lines: its `data` read as JSON, its cost kept when the pointer is there.
    fn event(&mut self, event: &[u8]) {
        let Ok(text) = std::str::from_utf8(event) else {
            return;
        };
        let data: Vec<&str> = (text.lines())
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| data.strip_prefix(' ').unwrap_or(data))
            .collect();
        if data.is_empty() {
            return;
        }
        if let Ok(json) = serde_json::from_str::<Value>(&data.join("\n")) {
            let found = reading(json.pointer(&self.pointer));
            if found != Reading::Missing {
                self.last = found;
            }
        }
    }
}

/// Where the first event of `kept` ends (before its blank line) and the next begins.
fn event_end(kept: &[u8]) -> Option<(usize, usize)> {
    let at = |sep: &[u8]| {
        kept.windows(sep.len())
            .position(|w| w == sep)
            .map(|i| (i, i + sep.len()))
    };
    match (at(b"\n\n"), at(b"\r\n\r\n")) {
        (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The cost `value` reports: a whole number, a negative one (none), anything else invalid.
fn reading(value: Option<&Value>) -> Reading {
    match value {
        None => Reading::Missing,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(units), _) => Reading::Cost(units),
            (None, Some(f)) if f < 0.0 => Reading::Negative,
            (None, Some(f)) if f.fract() == 0.0 => Reading::Cost(f as u64),
            _ => Reading::Invalid,
        },
        Some(_) => Reading::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::{JsonCost, MOST, Reading};

    fn read(events: bool, chunks: &[&str]) -> Reading {
        let mut cost = JsonCost::new("/usage/total_tokens".into(), events);
        for chunk in chunks {
            cost.observe(chunk.as_bytes());
        }
        cost.finish()
    }

    #[test]
    fn a_json_body_reports_its_cost_however_it_is_cut() {
        let body = r#"{"id": 1, "usage": {"total_tokens": 42}}"#;
        assert_eq!(read(false, &[body]), Reading::Cost(42));
        let (a, b) = body.split_at(17);
        assert_eq!(read(false, &[a, b]), Reading::Cost(42));
        assert_eq!(read(false, &[r#"{"usage": {}}"#]), Reading::Missing);
        assert_eq!(read(false, &["not json"]), Reading::Missing);
        assert_eq!(
            read(false, &[r#"{"usage": {"total_tokens": -3}}"#]),
            Reading::Negative
        );
        assert_eq!(
            read(false, &[r#"{"usage": {"total_tokens": "x"}}"#]),
            Reading::Invalid
        );
        assert_eq!(
            read(false, &[r#"{"usage": {"total_tokens": 2.5}}"#]),
            Reading::Invalid
        );
    }

    #[test]
    fn a_stream_of_events_reports_its_last_usage() {
        let events = "data: {\"delta\": \"a\"}\n\n\
                      event: message\ndata: {\"usage\": {\"total_tokens\": 7}}\n\n\
                      data: {\"usage\": {\"total_tokens\": 12}}\n\n\
                      data: [DONE]\n\n";
        assert_eq!(read(true, &[events]), Reading::Cost(12));
        // Cut anywhere, in CRLF, without the last blank line.
        let chunks: Vec<String> = events.chars().map(String::from).collect();
        let chunks: Vec<&str> = chunks.iter().map(String::as_str).collect();
        assert_eq!(read(true, &chunks), Reading::Cost(12));
        let crlf = "data: {\"usage\": {\"total_tokens\": 5}}\r\n\r\ndata: {\"usage\":\r\ndata: {\"total_tokens\": 9}}";
        assert_eq!(read(true, &[crlf]), Reading::Cost(9));
        assert_eq!(read(true, &["data: {\"delta\": 1}\n\n"]), Reading::Missing);
    }

    #[test]
    fn a_document_too_large_reports_nothing() {
        let pad = "x".repeat(MOST);
        let big = format!(r#"{{"usage": {{"total_tokens": 1}}, "pad": "{pad}"}}"#);
        assert_eq!(read(false, &[&big]), Reading::Missing);
        // An event over the bound, cut before its end: skipped; the next ones are read.
        let head = format!(r#"data: {{"usage": {{"total_tokens": 100}}, "pad": "{pad}"#);
        assert_eq!(read(true, &[&head, "\"}\n\n"]), Reading::Missing);
        let next = "data: {\"usage\": {\"total_tokens\": 3}}\n\n";
        assert_eq!(read(true, &[&head, "\"}\n\n", next]), Reading::Cost(3));
    }
}
