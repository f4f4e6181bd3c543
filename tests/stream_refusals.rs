//! A connection answered with an error over its limit (`OverLimit::error`, the socket stays
//! open) refuses its next messages itself until the time it was given, without a store call:
//! a client that sends on past its limit costs the store nothing per message. Counted with
//! the decisions the layer reports (`ratelimit_decisions_total`), in memory, on Redis and on
//! the cluster, on an injected clock.

#[macro_use]
mod support;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws::Message as WsMessage;
use http::Request;
use support::{RedisCluster, RedisServer};
use tower_ratelimit::streams::{OverLimit, StreamLimiter};
use tower_ratelimit::{ManualClock, MemoryStore, Policy, Store};

/// Counts the counters the layer increments, by name and labels.
#[derive(Default)]
struct Counted(Mutex<HashMap<String, Arc<Count>>>);

#[derive(Default)]
struct Count(AtomicU64);

impl metrics::CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl Counted {
    /// The count of `name` with the label `label`.
    fn get(&self, name: &str, label: (&str, &str)) -> u64 {
        let wanted = format!("{name}|{}={}", label.0, label.1);
        let counts = self.0.lock().unwrap();
        (counts.iter())
            .filter(|(key, _)| key.starts_with(name) && key.contains(&wanted[name.len()..]))
            .map(|(_, count)| count.0.load(Ordering::Relaxed))
            .sum()
    }
}

impl metrics::Recorder for Counted {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let mut name = key.name().to_owned();
        for label in key.labels() {
            name.push_str(&format!("|{}={}", label.key(), label.value()));
        }
        let count = self.0.lock().unwrap().entry(name).or_default().clone();
        metrics::Counter::from_arc(count)
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// A socket that has `incoming` to read, then ends, and keeps what it is sent.
struct Scripted {
    incoming: VecDeque<WsMessage>,
    sent: Vec<WsMessage>,
}

impl Scripted {
    fn new(messages: usize) -> Self {
        let incoming = (0..messages).map(|i| WsMessage::text(i.to_string()));
        Scripted {
            incoming: incoming.collect(),
            sent: Vec::new(),
        }
    }
}

impl futures_util::Stream for Scripted {
    type Item = Result<WsMessage, std::convert::Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.incoming.pop_front().map(Ok))
    }
}

impl futures_util::Sink<WsMessage> for Scripted {
    type Error = std::convert::Infallible;

    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(mut self: Pin<&mut Self>, item: WsMessage) -> Result<(), Self::Error> {
        self.sent.push(item);
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
}

/// Runs `scenario` on a current-thread runtime, where this thread's recorder sees every
/// task (the store's connection's included), with what it counted.
fn counting<F: Future<Output = ()>>(scenario: impl FnOnce(Arc<Counted>) -> F) {
    let counted = Arc::new(Counted::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let recorder = counted.clone();
    metrics::with_local_recorder(&*recorder, || runtime.block_on(scenario(counted)));
}

/// How many error messages a socket was `sent`, each checked to be a rate limit's naming
/// `messages` with a retry time (in milliseconds) in `retry_ms`.
fn errors(sent: &[WsMessage], retry_ms: std::ops::RangeInclusive<u64>) -> usize {
    for message in sent {
        let WsMessage::Text(text) = message else {
            panic!("an error message, not {message:?}");
        };
        let error: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
        assert_eq!(error["error"], "rate_limited");
        assert_eq!(error["policy"], "messages");
        let retry = error["retry_after_ms"].as_u64().unwrap();
        assert!(retry_ms.contains(&retry), "{retry}");
    }
    sent.len()
}

/// The retry time of a key allowed 3 an hour, in milliseconds.
const TWENTY_MINUTES: std::ops::RangeInclusive<u64> = 1_199_000..=1_200_000;

/// Ten messages of a key allowed 3 an hour, answered with an error past it: 3 admitted, 7
/// refused, one of them by the store and 6 by the connection; 19 minutes on, still refused
/// without a store call; 20 minutes on (the time given), the store is asked again.
async fn refused_locally<St: Store>(store: St, clock: ManualClock, counted: Arc<Counted>) {
    let limiter: StreamLimiter =
        support::stream_limiter(store, Some(&clock), Policy::gcra("3/h"), OverLimit::error());
    let head = Request::builder().header("x-key", "k").body(()).unwrap();
    let connection = limiter.open_head(head).await.unwrap();
    let limited = || counted.get("ratelimit_decisions_total", ("outcome", "limited"));
    let refused = || counted.get("ratelimit_messages_limited_total", ("answer", "error"));
    let mut socket = connection.clone().socket(Scripted::new(10));
    let mut admitted = 0;
    while let Some(Ok(_)) = socket.recv().await {
        admitted += 1;
    }
    assert_eq!(admitted, 3);
    assert_eq!(errors(&socket.get_ref().sent, TWENTY_MINUTES), 7);
    assert_eq!((limited(), refused()), (1, 7), "one store call refused");
    clock.advance(Duration::from_secs(19 * 60));
    let mut socket = connection.clone().socket(Scripted::new(2));
    assert!(socket.recv().await.is_none(), "both refused");
    // Told the time left.
    assert_eq!(errors(&socket.get_ref().sent, 60_000..=60_000), 2);
    assert_eq!((limited(), refused()), (1, 9), "no store call");
    clock.advance(Duration::from_secs(60));
    let mut socket = connection.socket(Scripted::new(3));
    assert!(socket.recv().await.is_some(), "the time given came");
    assert!(socket.recv().await.is_none());
    assert_eq!(errors(&socket.get_ref().sent, TWENTY_MINUTES), 2);
    assert_eq!(
        (limited(), refused()),
        (2, 11),
        "the store asked again once"
    );
}

#[test]
fn an_error_answer_refuses_locally_until_its_time_in_memory() {
    counting(async |counted| {
        let clock = ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        refused_locally(store, clock, counted).await;
    });
}

#[test]
fn an_error_answer_refuses_locally_until_its_time_on_redis() {
    let server = RedisServer::start();
    counting(async |counted| {
        let clock = ManualClock::new();
        let store = server.store("refused-locally:", &clock).await;
        let calls = server.calls("fcall") + server.calls("evalsha");
        refused_locally(store, clock, counted).await;
        let calls = server.calls("fcall") + server.calls("evalsha") - calls;
        assert_eq!(calls, 3 + 1 + 1 + 1, "a call per decision the store made");
    });
    support::assert_no_key_without_ttl(&server, "refused-locally:");
}

#[test]
fn an_error_answer_refuses_locally_until_its_time_on_the_cluster() {
    let cluster = RedisCluster::start();
    counting(async |counted| {
        let clock = ManualClock::new();
        let store = cluster.store("refused-locally:", &clock).await;
        refused_locally(store, clock, counted).await;
    });
}
