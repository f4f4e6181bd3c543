//! A cost read from a response's JSON body at a pointer ([`Settle::json`](super::Settle::json)):
//! the body's JSON, or in a stream of server-sent events the last event whose JSON has it, as
//! the LLM APIs report their usage.

use serde_json::Value;

use super::Reading;

/// The most bytes of a JSON body, or of one event, kept to be parsed (a larger one reports no
/// cost).
const MOST: usize = 1 << 20;

/// What is read of a response body for a cost at a JSON pointer, as it streams.
///
/// Each byte of a stream of events is looked at once in finding where its events end (the
/// search goes on where it stopped, a separator's length but one back), and an event is taken
/// from the front of what is kept without moving what follows it: reading a body costs its
/// length, however it is cut.
pub(crate) struct JsonCost {
    pointer: std::sync::Arc<str>,
    /// The body is a stream of server-sent events.
    events: bool,
    /// The body so far (whole JSON), or the event being received.
    kept: Vec<u8>,
    /// How far the search for the end of the event in `kept` went without finding it.
    searched: usize,
    /// More than [`MOST`] bytes came for the JSON body.
    over: bool,
    /// The event being received is over [`MOST`] bytes: its bytes are dropped (but the last
    /// few, which may begin its end) until it ends.
    skipping: bool,
    /// The last event's reading that had the pointer.
    last: Reading,
    /// The bytes looked at in finding the events' ends.
    #[cfg(test)]
    looked_at: usize,
}

/// The longest separator of events (`\r\n\r\n`) but one: how far back a search that stopped at
/// the end of what was kept goes on.
const BACK: usize = 3;

impl JsonCost {
    /// Reads `pointer` of a body that is JSON, or server-sent events when `events`.
    pub(crate) fn new(pointer: std::sync::Arc<str>, events: bool) -> Self {
        JsonCost {
            pointer,
            events,
            kept: Vec::new(),
            searched: 0,
            over: false,
            skipping: false,
            last: Reading::Missing,
            #[cfg(test)]
            looked_at: 0,
        }
    }

    /// The pointer read.
    pub(crate) fn pointer(&self) -> &str {
        &self.pointer
    }

    /// Takes the next `data` of the body.
    pub(crate) fn observe(&mut self, data: &[u8]) {
        if !self.events {
            if !self.over {
                self.kept.extend_from_slice(data);
                if self.kept.len() > MOST {
                    // A body larger than anyone reports usage in: skipped.
                    self.over = true;
                    self.kept = Vec::new();
                }
            }
            return;
        }
        self.kept.extend_from_slice(data);
        let kept = std::mem::take(&mut self.kept);
        let mut from = 0;
        loop {
            let search = from + self.searched.saturating_sub(BACK);
            let found = event_end(&kept, from, search);
            #[cfg(test)]
            {
                self.looked_at += found.map_or(kept.len(), |(_, next)| next) - search;
            }
            let Some((end, next)) = found else {
                self.searched = kept.len() - from;
                break;
            };
            if !std::mem::take(&mut self.skipping) && end - from <= MOST {
                self.event(&kept[from..end]);
            }
            (from, self.searched) = (next, 0);
        }
        self.kept = kept;
        self.kept.drain(..from);
        if self.kept.len() > MOST + BACK {
            // An event larger than anyone reports usage in (whatever follows, what is kept
            // before its end is more than MOST): skipped to its end.
            self.skipping = true;
            self.kept.drain(..self.kept.len() - BACK);
            self.searched = BACK;
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
        if !self.skipping && rest.len() <= MOST {
            self.event(&rest);
        }
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

    /// The bytes looked at in finding the events' ends so far.
    #[cfg(test)]
    fn looked_at(&self) -> usize {
        self.looked_at
    }
}

/// Where the first event of `kept[from..]` ends (before its blank line: `\n\n` or
/// `\r\n\r\n`) and the next begins, looking at the bytes from `search` on (none before it
/// ends one).
fn event_end(kept: &[u8], from: usize, search: usize) -> Option<(usize, usize)> {
    let at = |i: usize, sep: &[u8]| i >= from && kept.get(i..i + sep.len()) == Some(sep);
    let mut i = search;
    while let Some(n) = kept
        .get(i..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
    {
        i += n;
        // A `\r\n\r\n` has its first `\n` one after its start, a `\n\n` at it: in the order
        // of the `\n`s, the first found starts first.
        if i > 0 && at(i - 1, b"\r\n\r\n") {
            return Some((i - 1, i + 3));
        }
        if at(i, b"\n\n") {
            return Some((i, i + 2));
        }
        i += 1;
    }
    None
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
    use super::{BACK, JsonCost, MOST, Reading};

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

    #[test]
    fn an_event_of_a_mebibyte_fed_a_byte_at_a_time_is_looked_at_once() {
        let pad = "x".repeat(MOST - 100);
        let body = format!(
            "data: {{\"usage\": {{\"total_tokens\": 77}}, \"pad\": \"{pad}\"}}\r\n\r\ndata: [DONE]\n\n"
        );
        for chunk in [1, 7, 4096] {
            let mut cost = JsonCost::new("/usage/total_tokens".into(), true);
            for piece in body.as_bytes().chunks(chunk) {
                cost.observe(piece);
            }
            // Each byte once, and the few looked at again where a search went on.
            let most = body.len() + body.len().div_ceil(chunk) * BACK;
            assert!(
                cost.looked_at() <= most,
                "chunks of {chunk}: {} bytes looked at for {}",
                cost.looked_at(),
                body.len()
            );
            assert_eq!(cost.finish(), Reading::Cost(77), "chunks of {chunk}");
        }
    }

    #[test]
    fn many_small_events_in_one_chunk_are_looked_at_once() {
        let body = "data: {\"usage\": {\"total_tokens\": 1}}\n\n".repeat(20_000)
            + "data: {\"usage\": {\"total_tokens\": 2}}\n\n";
        let mut cost = JsonCost::new("/usage/total_tokens".into(), true);
        cost.observe(body.as_bytes());
        assert!(cost.looked_at() <= body.len(), "{}", cost.looked_at());
        assert_eq!(cost.finish(), Reading::Cost(2));
    }

    #[test]
    fn an_event_over_the_bound_is_skipped_however_it_is_cut() {
        let over = "x".repeat(MOST + 1);
        let at = "x".repeat(MOST - 40);
        let next = "data: {\"usage\": {\"total_tokens\": 5}}\n\n";
        for (event, expected) in [
            // Over: skipped, the next read.
            (
                format!("data: {{\"usage\": {{\"total_tokens\": 9}}}}\n{over}"),
                5,
            ),
            // At the bound: read (its own cost comes before the next's).
            (
                format!(": {at}\ndata: {{\"usage\": {{\"total_tokens\": 9}}}}"),
                5,
            ),
        ] {
            let body = format!("{event}\r\n\r\n{next}");
            let whole = read(true, &[&body]);
            assert_eq!(whole, Reading::Cost(expected));
            for chunk in [
                1 << 10,
                (1 << 20) - 1,
                1 << 20,
                (1 << 20) + 1,
                (1 << 20) + 3,
            ] {
                let pieces: Vec<&str> = (body.as_bytes().chunks(chunk))
                    .map(|c| std::str::from_utf8(c).unwrap())
                    .collect();
                assert_eq!(read(true, &pieces), whole, "chunks of {chunk}");
            }
        }
        // The last event, without its blank line: read when within the bound only.
        let last = format!("data: {{\"usage\": {{\"total_tokens\": 9}}}}\n: {over}");
        assert_eq!(read(true, &[next, &last]), Reading::Cost(5));
    }
}
