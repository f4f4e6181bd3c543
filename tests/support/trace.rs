//! A tracing subscriber for the tests: every span with its fields, and every event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A span or an event, as the test subscriber saw it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub name: String,
    pub level: String,
    pub fields: HashMap<String, String>,
}

/// A subscriber keeping every span with its fields, and every event.
#[derive(Clone, Default)]
pub struct Recorder {
    spans: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut seen = Seen {
            name: attrs.metadata().name().into(),
            level: attrs.metadata().level().to_string(),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push(seen);
        tracing::span::Id::from_u64(spans.len() as u64)
    }
    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        values.record(&mut Fields(&mut spans[span.into_u64() as usize - 1].fields));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut seen = Seen {
            name: event.metadata().name().into(),
            level: event.metadata().level().to_string(),
            ..Seen::default()
        };
        event.record(&mut Fields(&mut seen.fields));
        self.events.lock().unwrap().push(seen);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Recorder {
    /// The `rate_limit` spans: each one's fields, without the empty ones.
    pub fn decisions(&self) -> Vec<HashMap<String, String>> {
        let spans = self.spans.lock().unwrap();
        let decisions = spans.iter().filter(|s| s.name == "rate_limit");
        decisions
            .inspect(|s| assert_eq!(s.level, "DEBUG"))
            .map(|s| s.fields.clone())
            .collect()
    }

    /// The events at `info` or above.
    pub fn loud(&self) -> Vec<Seen> {
        let events = self.events.lock().unwrap();
        let loud = events
            .iter()
            .filter(|e| matches!(e.level.as_str(), "INFO" | "WARN" | "ERROR"));
        loud.cloned().collect()
    }
}

impl Recorder {
    /// Forgets every span and event seen so far.
    #[allow(dead_code)]
    pub fn clear(&self) {
        self.spans.lock().unwrap().clear();
        self.events.lock().unwrap().clear();
    }

    /// The events whose message is `message`: their fields.
    #[allow(dead_code)]
    pub fn events(&self, message: &str) -> Vec<HashMap<String, String>> {
        let events = self.events.lock().unwrap();
        let named = events
            .iter()
            .filter(|e| e.fields.get("message").is_some_and(|m| m == message));
        named.map(|e| e.fields.clone()).collect()
    }

    /// Every field of every span and event, as text.
    pub fn everything(&self) -> String {
        let spans = self.spans.lock().unwrap();
        let events = self.events.lock().unwrap();
        spans
            .iter()
            .chain(events.iter())
            .map(|s| format!("{s:?}\n"))
            .collect()
    }
}
