//! A message decided as a request: the connection's head carrying the [`Message`]
//! (`RequestRef::message`), through the engine of a [`RateLimit`] around [`Admit`], so that
//! every part of the engine (keys, lanes, leases, the deny cache, the lists, the failure
//! policy, metrics) decides messages as it decides requests. The engine's answer is taken at
//! once when it decides at once; anything that waits goes on through the service.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::limited::Limited;
use super::message::{Direction, Message};
use super::refusals::Refusals;
use crate::adaptive::Permits;
use crate::body::{ResponseBody, Wrapped};
use crate::future::ResponseFuture;
use crate::key::RequestRef;
use crate::layer::RateLimitLayer;
use crate::limiter::{Keyed, Next};
use crate::refusal::Refused;
use crate::service::RateLimit;
use crate::store::Store;

/// The head of the request that opened a connection.
pub(super) type Head = Request<()>;

/// A copy of `request`'s head.
pub(super) fn head(request: &RequestRef<'_>) -> Head {
    let mut head = Request::new(());
    *head.method_mut() = request.method().clone();
    *head.uri_mut() = request.uri().clone();
    *head.version_mut() = request.version();
    *head.headers_mut() = request.headers().clone();
    *head.extensions_mut() = request.extensions().clone();
    head
}

/// The request that opened a connection, and its messages' key when the engine takes it once
/// ([`Limiter::keyed`](crate::limiter::Limiter::keyed)).
pub(super) struct Opened {
    pub(super) head: Head,
    keyed: Option<Keyed>,
    /// The refusals its messages are answered with locally until their time.
    pub(super) refused: Refusals,
}

impl Opened {
    /// A connection opened by `head` whose messages are not decided.
    pub(super) fn new(head: Head) -> Self {
        Opened {
            head,
            keyed: None,
            refused: Refusals::default(),
        }
    }
}

/// The service a message reaches when its policies admit it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Admit;

impl Service<Head> for Admit {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Head) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

/// The answer to a connection refused when it opens: the connections' layer's own response
/// (`429` with `Retry-After` and the rate-limit headers, a problem+json body), to send instead
/// of upgrading.
pub type Refusal = http::Response<bytes::Bytes>;

/// The layer's answer to a message (or to a connection).
pub(super) type Answered = Response<ResponseBody<()>>;

/// The layer's answer on its way.
pub(super) type Answering = Pin<Box<dyn Future<Output = Answered> + Send>>;

/// The engine's answer to a message: at once (`None`: admitted, else what refused it), or on
/// its way (the store's answer, a wait for a booked time or another's lease).
pub(super) enum Asked {
    Now(Option<Limited>),
    Later(Answering),
}

/// A [`RateLimit`] around [`Admit`], whatever its store.
pub(super) trait Admitting: Send + Sync {
    /// The layer's answer to `request`.
    fn ask(&self, request: Head) -> Answering;

    /// The connection opened by `head`, its messages' key taken now when the engine can.
    fn open(&self, head: Head) -> Opened;

    /// The engine's answer to `message` of the connection `opened`: at once when it decides
    /// at once (the head borrowed, nothing allocated), else through the service.
    fn ask_message(&self, opened: &Opened, message: Message) -> Asked;

    /// The layer's time, in microseconds.
    fn now_us(&self) -> u64;

    /// What names the layer's present policy set (changed by a reload).
    fn policies_id(&self) -> usize;
}

impl<St: Store> Admitting for RateLimit<Admit, St> {
    fn ask(&self, request: Head) -> Answering {
        let answer = self.clone().call(request);
        Box::pin(async move {
            match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    }

    fn open(&self, head: Head) -> Opened {
        let keyed = self.limiter().keyed(&RequestRef::new(&head));
        Opened {
            head,
            keyed,
            refused: Refusals::default(),
        }
    }

    fn now_us(&self) -> u64 {
        self.limiter().now_micros()
    }

    fn policies_id(&self) -> usize {
        self.limiter().policies_id()
    }

    fn ask_message(&self, opened: &Opened, message: Message) -> Asked {
        let limiter = self.limiter();
        let mut permits = Permits::new();
        let head = &opened.head;
        let request = RequestRef::new(head).with_message(message);
        let next = match &opened.keyed {
            Some(keyed) => match limiter.begin_keyed(keyed, &request, &mut permits) {
                None => return Asked::Now(None),
                Some(next) => next,
            },
            None => limiter.begin(&request, &mut permits),
        };
        let next = match next.settled() {
            Ok(Ok(go)) if !go.charges_after() => return Asked::Now(None),
            Ok(Err(refusal)) => {
                let refused = refusal.refused(limiter.limited_status());
                return Asked::Now(Some(Limited::of(&refused, message.direction)));
            }
            Ok(Ok(go)) => Next::Call(go),
            Err(next) => next,
        };
        let mut request = Head::clone(head);
        request.extensions_mut().insert(message);
        let answer = ResponseFuture::<Admit, (), St, Wrapped>::next(
            limiter, next, request, &mut Admit, permits,
        );
        Asked::Later(Box::pin(async move {
            match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }))
    }
}

/// `layer` around [`Admit`].
pub(super) fn admitting<St: Store>(layer: RateLimitLayer<St>) -> Arc<dyn Admitting> {
    Arc::new(layer.layer(Admit))
}

/// Whether the layer let `response`'s request through.
pub(super) fn admitted(response: &Answered) -> bool {
    response.extensions().get::<Refused>().is_none()
}

/// `answer`, a refusal, with its body's bytes, and a `Retry-After` (of a second when the
/// layer gave none).
pub(super) fn refusal(answer: Answered) -> Refusal {
    let (mut parts, body) = answer.into_parts();
    // A connection refused for want of a slot is told when to try again: no one knows when a
    // slot frees, and clients that reconnect at once make a storm.
    if parts.status == StatusCode::TOO_MANY_REQUESTS {
        (parts.headers.entry(http::header::RETRY_AFTER))
            .or_insert(http::HeaderValue::from_static("1"));
    }
    Response::from_parts(parts, body.into_data())
}

/// What refused a message, when the layer did not let it through.
pub(super) fn refused<B>(response: &Response<B>, direction: Direction) -> Option<Limited> {
    let refused = response.extensions().get::<Refused>()?;
    Some(Limited::of(refused, direction))
}

/// Counts a connection refused `at` the listener or the upgrade
/// (`ratelimit_connections_refused_total`).
pub(super) fn connection_refused(answer: &Answered, at: &'static str) {
    let refused = answer.extensions().get::<Refused>();
    let policy = match refused.map(Refused::policy) {
        None | Some("") => "none".to_owned(),
        Some(policy) => policy.to_owned(),
    };
    metrics::counter!("ratelimit_connections_refused_total", "policy" => policy, "at" => at)
        .increment(1);
}
