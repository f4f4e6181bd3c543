//! The response body: the inner service's, or the limiter's own short one.
//!
//! [`MakeBody`] says how a response carries it: by default in a [`ResponseBody`]; behind axum,
//! in axum's own body ([`AxumBody`](crate::axum::AxumBody)), which axum does not box again.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::adaptive::{AdaptivePermit, Permits};
use crate::settle::meter::Meter;

/// How [`RateLimit`](crate::RateLimit)'s responses carry their bodies: the inner service's
/// body `B`, or a short complete body written by the limiter (a 429, a rejected key, an
/// unavailable store). Chosen with [`RateLimitLayer::body`](crate::RateLimitLayer::body).
///
/// [`Wrapped`] (the default) works with every inner service; a framework with a body type of
/// its own can take responses in it directly, as [`AxumBody`](crate::axum::AxumBody) does.
pub trait MakeBody<B> {
    /// The response body.
    type Body;

    /// The body of the inner service's response.
    fn inner(body: B) -> Self::Body;

    /// The limiter's own body.
    fn full(data: Bytes) -> Self::Body;

    /// The body of the inner service's response to a request that holds slots of a
    /// concurrency limit ([`Policy::concurrency`](crate::Policy::concurrency)): the slots
    /// must be given back (`held` dropped) once the body has sent its last frame, or is
    /// dropped, whichever comes first.
    fn held(body: B, held: BodyGuard) -> Self::Body;
}

/// What a response body holds until it ends, as one list: the slots a request holds in a store
/// (of a concurrency limit, held until its response body ends), the places of the adaptive
/// concurrency limits that admitted it, and the count of what the body really cost, for a
/// policy that settles from it ([`Settle`](crate::settle::Settle)). Dropping it gives the slots and
/// places back and settles the count (without waiting for the store's answer); a
/// [`MakeBody`] keeps it with the body.
pub struct BodyGuard {
    holds: Vec<Hold>,
}

/// One thing a response body holds.
enum Hold {
    /// Given back (called) when the guard is dropped.
    Release(Box<dyn FnOnce() + Send + Sync>),
    /// A place in an adaptive limit, which learns from the response.
    Permit(AdaptivePermit),
    /// The count of the body, for a policy that settles from it.
    Meter(Meter),
}

impl BodyGuard {
    /// What `release` gives back, when dropped.
    pub(crate) fn new(release: impl FnOnce() + Send + Sync + 'static) -> Self {
        BodyGuard {
            holds: vec![Hold::Release(Box::new(release))],
        }
    }

    /// Keeps what the guard holds: nothing is given back.
    pub(crate) fn keep(mut self) {
        self.holds.clear();
    }

    /// `held` (if any) holding `holds` too.
    fn with(held: Option<BodyGuard>, holds: impl IntoIterator<Item = Hold>) -> Self {
        let mut held = held.unwrap_or(BodyGuard { holds: Vec::new() });
        held.holds.extend(holds);
        held
    }

    /// What the response body of an admitted request holds: `held`, and the `permits` of the
    /// adaptive limits that admitted it (none, the usual case: `held` as it is).
    #[inline(always)]
    pub(crate) fn held_with(held: Option<BodyGuard>, permits: Permits) -> Option<BodyGuard> {
        if permits.is_empty() {
            return held;
        }
        Some(BodyGuard::holding(held, permits))
    }

    /// `held` (if any) holding `permits` too.
    pub(crate) fn holding(held: Option<BodyGuard>, permits: Permits) -> Self {
        Self::with(held, permits.into_iter().map(Hold::Permit))
    }

    /// `held` (if any) with `meter` counting the body.
    pub(crate) fn metered(held: Option<BodyGuard>, meter: Meter) -> Self {
        Self::with(held, [Hold::Meter(meter)])
    }

    /// The response came: the adaptive limits it holds places of learn from it, a failure
    /// when `failed` (a `5xx`, or the inner service's error) when their places are given back.
    pub(crate) fn responded(&mut self, failed: bool) {
        for hold in &mut self.holds {
            if let Hold::Permit(permit) = hold {
                permit.responded(failed);
            }
        }
    }

    /// The request went on with its booked time: what it would give back is spent.
    pub(crate) fn spend(mut self) {
        self.holds.retain(|hold| !matches!(hold, Hold::Release(_)));
    }

    /// Counts one frame of the body, for a policy that settles from it.
    pub(crate) fn observe(&mut self, frame: &Frame<Bytes>) {
        for hold in &mut self.holds {
            if let Hold::Meter(meter) = hold {
                meter.observe(frame);
            }
        }
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        for hold in self.holds.drain(..) {
            if let Hold::Release(release) = hold {
                release();
            }
        }
    }
}

impl std::fmt::Debug for BodyGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyGuard")
    }
}

/// The default [`MakeBody`]: responses carry a [`ResponseBody<B>`] around the inner service's
/// body `B`, whatever it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wrapped;

impl<B> MakeBody<B> for Wrapped {
    type Body = ResponseBody<B>;

    fn inner(body: B) -> Self::Body {
        ResponseBody::inner(body)
    }

    fn full(data: Bytes) -> Self::Body {
        ResponseBody::full(data)
    }

    fn held(body: B, held: BodyGuard) -> Self::Body {
        ResponseBody::held(body, held)
    }
}

pin_project! {
    /// The body of a response from [`RateLimit`](crate::RateLimit): either the inner service's
    /// body, untouched, or a small complete body written by the limiter (a 429, a rejected key,
    /// an unavailable store).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // Slots of a concurrency limit, given back at the end of the body (or when dropped).
        held: Option<BodyGuard>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            held: None,
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            held: None,
        }
    }

    /// The limiter's own body's bytes (none for the inner service's), dropping what it holds.
    pub(crate) fn into_data(self) -> Bytes {
        match self.kind {
            Kind::Full { data } => data.unwrap_or_default(),
            Kind::Inner { .. } => Bytes::new(),
        }
    }

    /// Whether the limiter wrote this body (its own answer), not the inner service.
    pub(crate) fn is_limiters(&self) -> bool {
        matches!(self.kind, Kind::Full { .. })
    }

    /// The inner service's body, holding `held` until its last frame.
    pub(crate) fn held(body: B, held: BodyGuard) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            held: Some(held),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f
                .debug_struct("ResponseBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = body.as_mut().poll_frame(cx);
                if let Some(held) = this.held {
                    // The last frame sent (or an error, which ends the body): the slots go
                    // back, the cost is settled.
                    let ended = match &frame {
                        Poll::Ready(None | Some(Err(_))) => true,
                        Poll::Ready(Some(Ok(frame))) => {
                            held.observe(frame);
                            body.is_end_stream()
                        }
                        Poll::Pending => false,
                    };
                    if ended {
                        this.held.take();
                    }
                }
                frame
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
