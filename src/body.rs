//! The response body: the inner service's, or the limiter's own short one.
//!
//! [`MakeBody`] says how a response carries it: by default in a [`ResponseBody`]; behind axum,
//! in axum's own body ([`AxumBody`](crate::axum::AxumBody)), which axum does not box again.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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
}

pin_project! {
    /// The body of a response from [`RateLimit`](crate::RateLimit): either the inner service's
    /// body, untouched, or a small complete body written by the limiter (a 429, a rejected key,
    /// an unavailable store).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
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
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
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
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
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
