//! [`LimitedStream`]: any stream whose items are decided, its caller answering.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::decide::{Decided, Deciding};
use super::lifetime::Lifetime;
use super::limited::{Answer, Limited};
use super::limiter::Connection;
use super::message::Direction;

pin_project! {
    /// A stream whose items a [`Connection`]'s limits decide, each at the size its function
    /// gives (`None`: not counted): an item admitted is `Ok(item)`; one over the limit waits
    /// when its answer waits, else it is dropped and `Err(Limited)` comes in its place, for
    /// the caller to answer as its protocol does (a tonic stream's `RESOURCE_EXHAUSTED`, an
    /// SSE event). After an answer that closes ([`Answer::Close`]) the stream ends. Made by
    /// [`Connection::stream`].
    pub struct LimitedStream<S, F> where S: Stream {
        #[pin]
        stream: S,
        connection: Connection,
        size: F,
        deciding: Option<(S::Item, Deciding)>,
        ended: bool,
        direction: Direction,
        // The end of the connection's lifetime.
        ends: Option<Lifetime>,
    }
}

impl<S: Stream, F> fmt::Debug for LimitedStream<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedStream")
            .field("connection", &self.connection)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// `stream`, each item decided at the size `size` says (`None`: not counted; `|_| Some(1)`
    /// when the policies count messages): an item over the limit waits or is answered
    /// `Err(Limited)`; after an answer that closes, the stream ends.
    pub fn stream<S, F>(self, stream: S, size: F) -> LimitedStream<S, F>
    where
        S: Stream,
        F: FnMut(&S::Item) -> Option<usize>,
    {
        LimitedStream::new(self, stream, size)
    }
}

impl<S: Stream, F> LimitedStream<S, F> {
    fn new(connection: Connection, stream: S, size: F) -> Self {
        LimitedStream {
            stream,
            size,
            deciding: None,
            ended: false,
            direction: Direction::Inbound,
            ends: Lifetime::of(&connection),
            connection,
        }
    }

    /// Its items are what the server sends ([`Direction::Outbound`] in the [`Message`] the
    /// policies read), not what the client sends.
    ///
    /// [`Message`]: super::Message
    #[must_use]
    pub fn outbound(mut self) -> Self {
        self.direction = Direction::Outbound;
        self
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The connection's limits.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }
}

impl<S, F> Stream for LimitedStream<S, F>
where
    S: Stream,
    F: FnMut(&S::Item) -> Option<usize>,
{
    type Item = Result<S::Item, Limited>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if *this.ended {
                return Poll::Ready(None);
            }
            if (this.ends.as_mut()).is_some_and(|ends| ends.ended(cx, false)) {
                *this.ends = None;
                *this.ended = true;
                return Poll::Ready(Some(Err(Limited::lifetime_ended())));
            }
            if let Some((_, decision)) = this.deciding {
                let decided = ready!(decision.as_mut().poll(cx));
                let (item, _) = this.deciding.take().expect("deciding");
                return Poll::Ready(Some(match decided {
                    Ok(()) => Ok(item),
                    Err(limited) => {
                        *this.ended = matches!(limited.answer(), Answer::Close(_));
                        Err(limited)
                    }
                }));
            }
            let item = match this.stream.as_mut().poll_next(cx) {
                // Nothing to read: the lifetime's timer wakes the task when it ends.
                Poll::Pending if (this.ends.as_mut()).is_some_and(|e| e.ended(cx, true)) => {
                    continue;
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(item) => item,
            };
            let Some(item) = item else {
                *this.ended = true;
                return Poll::Ready(None);
            };
            match (this.size)(&item) {
                Some(bytes) if this.connection.decides_messages() => {
                    match this.connection.decide(bytes, *this.direction) {
                        Decided::Now(Ok(())) => return Poll::Ready(Some(Ok(item))),
                        Decided::Now(Err(limited)) => {
                            *this.ended = matches!(limited.answer(), Answer::Close(_));
                            return Poll::Ready(Some(Err(limited)));
                        }
                        Decided::Later(decision) => *this.deciding = Some((item, decision)),
                    }
                }
                _ => return Poll::Ready(Some(Ok(item))),
            }
        }
    }
}
