//! [`ReadBodies`]: the service of a layer that reads bodies, and its future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::replay::{Collected, ReadBody};
use super::{BodyLimits, Reader, RequestBody};
use crate::body::{MakeBody, Wrapped};
use crate::error::KeyRejection;
use crate::future::{ResponseFuture, rendered};
use crate::key::RequestRef;
use crate::limiter::{Charged, Head, Limiter, Looking, Ticket};
use crate::refusal::Refusal;
use crate::service::RateLimit;
use crate::store::Store;

/// The service of a layer built with
/// [`read_bodies`](crate::RateLimitLayerBuilder::read_bodies): reads the body of a request
/// whose policies need it, then hands the request, its body a [`ReadBody`], to the
/// [`RateLimit`] inside, which decides as it always does. See the
/// [module](crate::request_body).
pub struct ReadBodies<S, St, M = Wrapped> {
    inner: RateLimit<S, St, M>,
}

impl<S, St, M> ReadBodies<S, St, M> {
    pub(crate) fn new(inner: S, limiter: Arc<Limiter<St>>) -> Self {
        ReadBodies {
            inner: RateLimit::new(inner, limiter),
        }
    }

    /// The [`RateLimit`] inside.
    pub fn get_ref(&self) -> &RateLimit<S, St, M> {
        &self.inner
    }
}

impl<S: Clone, St, M> Clone for ReadBodies<S, St, M> {
    fn clone(&self) -> Self {
        ReadBodies {
            inner: self.inner.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St: std::fmt::Debug, M> std::fmt::Debug for ReadBodies<S, St, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ReadBodies").field(&self.inner).finish()
    }
}

impl<S, St, M, B, ResB> Service<Request<B>> for ReadBodies<S, St, M>
where
    S: Service<Request<ReadBody<B>>, Response = Response<ResB>> + Clone,
    St: Store,
    M: MakeBody<ResB>,
    B: Body,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ReadFuture<S, B, St, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Request<ReadBody<B>>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (wanted, reader) = match self.inner.limiter().before_body(&RequestRef::new(&request)) {
            Head::Read(wanted, reader) => (wanted, reader),
            Head::Stream => {
                let future = self.inner.call(request.map(ReadBody::streaming));
                return ReadFuture {
                    state: State::Calling { future },
                };
            }
            Head::Refuse(refusal) => {
                let request = RequestRef::new(&request);
                let response = rendered(self.inner.limiter(), refusal, &request);
                return ReadFuture {
                    state: State::Answered {
                        response: Some(response),
                    },
                };
            }
        };
        // The inner service was made ready: that one waits with the body, a clone stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = request.into_parts();
        let hint = body.size_hint();
        let collected = Collected::expecting(hint.exact(), wanted.get_limit());
        let reading = Reading {
            too_long: hint.lower() > wanted.get_limit() as u64,
            parts: Some(parts),
            body,
            collected,
            trailers: None,
            started: tokio::time::Instant::now(),
            deadline: None,
            wanted,
            looking: None,
            _reader: reader,
            inner: Some(inner),
        };
        ReadFuture {
            state: State::Reading {
                reading: Box::pin(reading),
            },
        }
    }
}

pin_project! {
    /// The response future of [`ReadBodies`]: the body read (when the request's policies need
    /// it), then the [`RateLimit`]'s own future.
    pub struct ReadFuture<S, B, St, M = Wrapped>
    where
        S: Service<Request<ReadBody<B>>>,
        St: Store,
    {
        #[pin]
        state: State<S, B, St, M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, St, M>
    where
        S: Service<Request<ReadBody<B>>>,
        St: Store,
    {
        Reading { reading: Pin<Box<Reading<S, B, St, M>>> },
        Calling { #[pin] future: ResponseFuture<S, ReadBody<B>, St, M> },
        // A refused body's charge to the head's keys, being decided.
        Charging { charging: Box<Charging<St>> },
        Answered { response: Option<Response<bytes::Bytes>> },
    }
}

pin_project! {
    /// A body being read, with what the request goes on with once it is.
    struct Reading<S, B, St, M>
    where
        St: Store,
    {
        parts: Option<http::request::Parts>,
        #[pin]
        body: B,
        collected: Collected,
        trailers: Option<http::HeaderMap>,
        too_long: bool,
        started: tokio::time::Instant,
        // Made once the body makes the request wait: most bodies have come with the head.
        #[pin]
        deadline: Option<tokio::time::Sleep>,
        wanted: BodyLimits,
        // The store's look at the head's keys, while a slow body is awaited.
        looking: Option<Box<Looking<St::Future>>>,
        // Counts this body among its key's being read, until it is.
        _reader: Option<Reader>,
        // Taken when the body is read and the request goes on.
        inner: Option<RateLimit<S, St, M>>,
    }
}

impl<S, B, St, M, ResB> Future for ReadFuture<S, B, St, M>
where
    S: Service<Request<ReadBody<B>>, Response = Response<ResB>> + Clone,
    St: Store,
    M: MakeBody<ResB>,
    B: Body,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Calling { future } => return future.poll(cx),
                StateProj::Answered { response } => {
                    let response = response.take().expect("polled after its answer");
                    return Poll::Ready(Ok(response.map(M::full)));
                }
                StateProj::Charging { charging } => {
                    return charging
                        .poll_charged(cx)
                        .map(|response| Ok(response.map(M::full)));
                }
                StateProj::Reading { reading } => {
                    let read = ready!(reading.as_mut().poll_read(cx));
                    let this = reading.as_mut().project();
                    let mut inner = this.inner.take().expect("polled after its call");
                    let charge = match read {
                        Ok(request) => Ok(State::Calling {
                            future: inner.call(request),
                        }),
                        Err(Refused::Limited(refusal)) => {
                            let parts = this.parts.as_ref().expect("the head stays while read");
                            let request = RequestRef::from_parts(parts);
                            Err(rendered(inner.limiter(), refusal, &request))
                        }
                        Err(Refused::Rejected(rejection)) => {
                            let parts = this.parts.as_ref().expect("the head stays while read");
                            Charging::begin(inner.limiter(), parts, rejection)
                                .map(|charging| State::Charging { charging })
                        }
                    };
                    match charge {
                        Ok(state) => state,
                        Err(response) => return Poll::Ready(Ok(response.map(M::full))),
                    }
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// A refused body's charge to the head's keys, while the store decides it.
struct Charging<St: Store> {
    future: St::Future,
    ticket: Option<Ticket>,
    rejection: Option<KeyRejection>,
    /// The request's head, which its answer is rendered for.
    head: Request<()>,
    limiter: Arc<Limiter<St>>,
}

impl<St: Store> Charging<St> {
    /// Charges a refused body to the head's keys: the refusal (or `429`) at once, or the
    /// charge while the store decides it.
    // The response is moved once, to be the request's answer: boxing it would cost an
    // allocation for nothing.
    #[allow(clippy::result_large_err)]
    fn begin(
        limiter: &Arc<Limiter<St>>,
        parts: &http::request::Parts,
        rejection: KeyRejection,
    ) -> Result<Box<Self>, Response<bytes::Bytes>> {
        let request = RequestRef::from_parts(parts);
        match limiter.rejected(&request, rejection) {
            Charged::Answer(refusal) => Err(rendered(limiter, refusal, &request)),
            Charged::Deciding(future, ticket, rejection) => Ok(Box::new(Charging {
                future,
                ticket: Some(ticket),
                rejection: Some(rejection),
                head: head_of(parts),
                limiter: limiter.clone(),
            })),
        }
    }

    /// The refusal, or `429`, once the store decided the charge.
    fn poll_charged(&mut self, cx: &mut Context<'_>) -> Poll<Response<bytes::Bytes>> {
        let result = ready!(Pin::new(&mut self.future).poll(cx));
        let ticket = self.ticket.take().expect("polled after its answer");
        let rejection = self.rejection.take().expect("polled after its answer");
        let refusal = self.limiter.charged(ticket, result, rejection);
        Poll::Ready(rendered(
            &self.limiter,
            refusal,
            &RequestRef::new(&self.head),
        ))
    }
}

/// Why a body was not read: refused, or its key out of budget (the store's look, while the
/// body was awaited).
enum Refused {
    Rejected(KeyRejection),
    Limited(Refusal),
}

impl From<KeyRejection> for Refused {
    fn from(rejection: KeyRejection) -> Self {
        Refused::Rejected(rejection)
    }
}

impl<S, B: Body, St: Store, M> Reading<S, B, St, M> {
    /// Reads the body to its end, within the limits: the request to go on with, its body
    /// read and parsed, or why it was not.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Request<ReadBody<B>>, Refused>> {
        let mut this = self.project();
        let limit = this.wanted.get_limit();
        if *this.too_long {
            return Poll::Ready(Err(too_large(limit).into()));
        }
        loop {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    let limiter = this.inner.as_ref().expect("read before its call").limiter();
                    if this.deadline.is_none() {
                        let end = *this.started + this.wanted.get_deadline();
                        this.deadline.set(Some(tokio::time::sleep_until(end)));
                        let parts = this.parts.as_ref().expect("the head stays while read");
                        *this.looking = limiter.look_while_reading(&RequestRef::from_parts(parts));
                    }
                    if let Some(looking) = this.looking.as_mut()
                        && let Poll::Ready(result) = looking.poll(cx)
                    {
                        let limited = limiter.looked(looking, result);
                        *this.looking = None;
                        if let Some(refusal) = limited {
                            return Poll::Ready(Err(Refused::Limited(refusal)));
                        }
                    }
                    let deadline = this.deadline.as_mut().as_pin_mut().expect("set above");
                    ready!(deadline.poll(cx));
                    return Poll::Ready(Err(timed_out(this.wanted.get_deadline()).into()));
                }
                Poll::Ready(None) => break,
                Poll::Ready(Some(Err(_))) => {
                    return Poll::Ready(Err(KeyRejection::bad_request(
                        "body_unreadable",
                        "the request body was broken off or could not be read",
                    )
                    .into()));
                }
                Poll::Ready(Some(Ok(frame))) => keep(frame, this.collected, this.trailers, limit)?,
            }
        }
        let bytes = std::mem::take(this.collected).finish();
        let body = RequestBody::parse(bytes.clone(), this.wanted)?;
        let mut parts = this.parts.take().expect("read once");
        parts.extensions.insert(body);
        let body = ReadBody::read(bytes, this.trailers.take());
        Poll::Ready(Ok(Request::from_parts(parts, body)))
    }
}

/// Adds `frame` to what was read of a body: its data (within `limit` bytes in all), or its
/// trailers.
fn keep<D: Buf>(
    frame: http_body::Frame<D>,
    collected: &mut Collected,
    trailers: &mut Option<http::HeaderMap>,
    limit: usize,
) -> Result<(), KeyRejection> {
    match frame.into_data() {
        Ok(mut data) => {
            if collected.len() + data.remaining() > limit {
                return Err(too_large(limit));
            }
            collected.push(data.copy_to_bytes(data.remaining()));
        }
        Err(frame) => {
            if let Ok(more) = frame.into_trailers() {
                trailers.get_or_insert_with(Default::default).extend(more);
            }
        }
    }
    Ok(())
}

/// A copy of the head of the request of `parts`, which its answer is rendered for.
fn head_of(parts: &http::request::Parts) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = parts.method.clone();
    *head.uri_mut() = parts.uri.clone();
    *head.headers_mut() = parts.headers.clone();
    head
}

/// The rejection of a body that did not arrive within `deadline`.
fn timed_out(deadline: std::time::Duration) -> KeyRejection {
    let ms = deadline.as_millis();
    let detail = format!("the request body did not arrive within {ms} ms");
    KeyRejection::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", detail)
}

/// The rejection of a body over `limit` bytes.
fn too_large(limit: usize) -> KeyRejection {
    KeyRejection::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is over the {limit} bytes a rate-limited request may send"),
    )
}
