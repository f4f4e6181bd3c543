//! [`LimitedSocket`]: a WebSocket whose messages are decided.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use futures_sink::Sink;
use pin_project_lite::pin_project;

use super::decide::{Decided, Deciding};
use super::frame::Frame;
use super::lifetime::Lifetime;
use super::limited::{Answer, Limited};
use super::limiter::Connection;
use super::message::Direction;

/// Where the reading side is.
enum Reading<M> {
    /// Reading the next message.
    Idle,
    /// `message` read, decided by `decision`.
    Deciding { message: M, decision: Deciding },
    /// A frame owed to the client (an error message or a close frame; `None` once sent, then
    /// flushed), after which the reading goes on, or ends (`end`).
    Owing { frame: Option<M>, end: bool },
    /// Closed by an answer, or by the socket.
    Ended,
}

/// Where the sending side is (messages the server sends, when they are decided).
enum Sending<M> {
    /// Nothing held.
    Idle,
    /// `message` sent by the application, decided by `decision`.
    Deciding { message: M, decision: Deciding },
    /// `frame` to be handed to the socket: the message admitted, or a close frame.
    Ready { frame: M },
}

pin_project! {
    /// A WebSocket (any [`Stream`] of `Result<M, E>` and [`Sink`] of `M`: axum's `WebSocket`,
    /// tokio-tungstenite's `WebSocketStream`) whose messages a [`Connection`]'s limits decide:
    /// a message the client sends is handed on when admitted, and answered as its policy says
    /// when not (the socket sends the error message or the close frame itself: the application
    /// only sees the messages admitted, and the end of the stream after a close). Control
    /// frames are never counted. Made by [`Connection::socket`].
    ///
    /// As a [`Sink`], it sends what the application sends; when the limiter decides the
    /// server's messages too, a message is sent once admitted (`poll_ready` and `poll_flush`
    /// wait for it), dropped when answered with an error, and replaced by a close frame when
    /// answered with a close.
    pub struct LimitedSocket<S, M> {
        #[pin]
        socket: S,
        connection: Connection,
        reading: Reading<M>,
        sending: Sending<M>,
        // The end of the connection's lifetime.
        ends: Option<Lifetime>,
    }
}

impl<S, M> fmt::Debug for LimitedSocket<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedSocket")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// `socket`, its messages decided: the client's as it reads them, and the server's as it
    /// sends them when the limiter decides those
    /// ([`StreamLimiterBuilder::outbound`](super::StreamLimiterBuilder::outbound)).
    pub fn socket<S, M: Frame>(self, socket: S) -> LimitedSocket<S, M> {
        LimitedSocket::new(self, socket)
    }
}

impl<S, M: Frame> LimitedSocket<S, M> {
    fn new(connection: Connection, socket: S) -> Self {
        let ends = Lifetime::of(&connection);
        LimitedSocket {
            socket,
            connection,
            reading: Reading::Idle,
            sending: Sending::Idle,
            ends,
        }
    }

    /// The socket inside.
    pub fn get_ref(&self) -> &S {
        &self.socket
    }

    /// The socket inside, mutably (what is sent through it is not decided).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.socket
    }

    /// The connection's limits.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Decides `message`, read from the client: `Some` when it goes on at once, else what
    /// `reading` does with it (waits for its decision, or owes the client its answer).
    #[inline]
    fn read(connection: &Connection, reading: &mut Reading<M>, message: M) -> Option<M> {
        let bytes = message
            .counted_size()
            .filter(|_| connection.decides_messages());
        let Some(bytes) = bytes else {
            return Some(message);
        };
        match connection.decide(bytes, Direction::Inbound) {
            Decided::Now(Ok(())) => return Some(message),
            Decided::Now(Err(limited)) => *reading = Self::owing(connection, &limited),
            Decided::Later(decision) => *reading = Reading::Deciding { message, decision },
        }
        None
    }

    /// What a message the server sends becomes when `limited`: nothing (an error answer drops
    /// it), or a close frame, after which nothing more is read.
    fn sending_refused(
        connection: &Connection,
        reading: &mut Reading<M>,
        limited: &Limited,
    ) -> Sending<M> {
        match Self::answer(connection, limited) {
            (frame, true) => {
                *reading = Reading::Ended;
                Sending::Ready { frame }
            }
            (_, false) => Sending::Idle,
        }
    }

    /// The reading that owes the client the frame answering `limited`.
    fn owing(connection: &Connection, limited: &Limited) -> Reading<M> {
        let (frame, end) = Self::answer(connection, limited);
        Reading::Owing {
            frame: Some(frame),
            end,
        }
    }

    /// The frame that answers `limited`, and whether the reading ends after it.
    fn answer(connection: &Connection, limited: &Limited) -> (M, bool) {
        match limited.answer() {
            Answer::Error => (M::text(connection.error_message(limited)), false),
            Answer::Close(code) => (M::close(code, limited.close_reason()), true),
        }
    }
}

impl<S, M, E> LimitedSocket<S, M>
where
    S: Stream<Item = Result<M, E>> + Sink<M, Error = E> + Unpin,
    M: Frame,
{
    /// The next message the client sent that its limits admit (`None` once the socket is
    /// closed), as axum's `WebSocket::recv`.
    pub async fn recv(&mut self) -> Option<Result<M, E>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    /// Sends `message` (decided first when the server's messages are) and flushes it, as
    /// axum's `WebSocket::send`.
    pub async fn send(&mut self, message: M) -> Result<(), E> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_ready(cx)).await?;
        Pin::new(&mut *self).start_send(message)?;
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_flush(cx)).await
    }
}

impl<S, M, E> LimitedSocket<S, M>
where
    S: Sink<M, Error = E>,
    M: Frame,
{
    /// Sends and flushes the frame `reading` owes the client, then reads on or ends.
    fn poll_owed(
        mut socket: Pin<&mut S>,
        reading: &mut Reading<M>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), E>> {
        let Reading::Owing { frame, end } = reading else {
            return Poll::Ready(Ok(()));
        };
        if frame.is_some() {
            ready!(socket.as_mut().poll_ready(cx))?;
            socket.as_mut().start_send(frame.take().expect("owed"))?;
        }
        ready!(socket.as_mut().poll_flush(cx))?;
        *reading = if *end { Reading::Ended } else { Reading::Idle };
        Poll::Ready(Ok(()))
    }
}

impl<S, M, E> Stream for LimitedSocket<S, M>
where
    S: Stream<Item = Result<M, E>> + Sink<M, Error = E>,
    M: Frame,
{
    type Item = Result<M, E>;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if !matches!(this.reading, Reading::Ended)
                && (this.ends.as_mut()).is_some_and(|ends| ends.ended(cx, false))
            {
                *this.ends = None;
                *this.reading = Self::owing(this.connection, &Limited::lifetime_ended());
            }
            match this.reading {
                Reading::Ended => return Poll::Ready(None),
                Reading::Idle => match this.socket.as_mut().poll_next(cx) {
                    // Nothing to read: the lifetime's timer wakes the task when it ends.
                    Poll::Pending if (this.ends.as_mut()).is_some_and(|e| e.ended(cx, true)) => {}
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        *this.reading = Reading::Ended;
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Some(Ok(message))) => {
                        if let Some(message) = Self::read(this.connection, this.reading, message) {
                            return Poll::Ready(Some(Ok(message)));
                        }
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                },
                Reading::Deciding { decision, .. } => {
                    let decided = ready!(decision.as_mut().poll(cx));
                    let Reading::Deciding { message, .. } =
                        std::mem::replace(this.reading, Reading::Idle)
                    else {
                        unreachable!("the state matched above")
                    };
                    match decided {
                        Ok(()) => return Poll::Ready(Some(Ok(message))),
                        Err(limited) => *this.reading = Self::owing(this.connection, &limited),
                    }
                }
                Reading::Owing { .. } => {
                    if let Err(e) = ready!(Self::poll_owed(this.socket.as_mut(), this.reading, cx))
                    {
                        *this.reading = Reading::Ended;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
            }
        }
    }
}

impl<S, M, E> LimitedSocket<S, M>
where
    S: Sink<M, Error = E>,
    M: Frame,
{
    /// Ends the decision on a message the application sent, and hands what it gives to the
    /// socket; ready when nothing is held.
    fn poll_sending(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        let mut this = self.project();
        loop {
            match this.sending {
                Sending::Idle => return Poll::Ready(Ok(())),
                Sending::Deciding { decision, .. } => {
                    let decided = ready!(decision.as_mut().poll(cx));
                    let Sending::Deciding { message, .. } =
                        std::mem::replace(this.sending, Sending::Idle)
                    else {
                        unreachable!("the state matched above")
                    };
                    match decided {
                        Ok(()) => *this.sending = Sending::Ready { frame: message },
                        Err(limited) => {
                            *this.sending =
                                Self::sending_refused(this.connection, this.reading, &limited);
                        }
                    }
                }
                Sending::Ready { .. } => {
                    ready!(this.socket.as_mut().poll_ready(cx))?;
                    let Sending::Ready { frame } = std::mem::replace(this.sending, Sending::Idle)
                    else {
                        unreachable!("the state matched above")
                    };
                    this.socket.as_mut().start_send(frame)?;
                }
            }
        }
    }
}

impl<S, M, E> Sink<M> for LimitedSocket<S, M>
where
    S: Sink<M, Error = E>,
    M: Frame,
{
    type Error = E;

    #[inline]
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        if !matches!(self.sending, Sending::Idle) {
            ready!(self.as_mut().poll_sending(cx))?;
        }
        self.project().socket.poll_ready(cx)
    }

    #[inline]
    fn start_send(self: Pin<&mut Self>, message: M) -> Result<(), E> {
        let this = self.project();
        match message.counted_size() {
            Some(bytes) if this.connection.decides_outbound() => {
                *this.sending = match this.connection.decide(bytes, Direction::Outbound) {
                    Decided::Now(Ok(())) => Sending::Ready { frame: message },
                    Decided::Now(Err(limited)) => {
                        Self::sending_refused(this.connection, this.reading, &limited)
                    }
                    Decided::Later(decision) => Sending::Deciding { message, decision },
                };
                Ok(())
            }
            _ => this.socket.start_send(message),
        }
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        if !matches!(self.sending, Sending::Idle) {
            ready!(self.as_mut().poll_sending(cx))?;
        }
        self.project().socket.poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        ready!(self.as_mut().poll_sending(cx))?;
        self.project().socket.poll_close(cx)
    }
}
