//! [`ReadBody`]: the body the inner service gets from a layer that reads bodies.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service of a layer that reads bodies gets: the bytes the
    /// layer read (then the trailers that came with them), or the body as it came, streaming,
    /// for a request no policy needed the body of. Its frames are `Bytes` (a chunk of `Bytes`
    /// is handed on without a copy).
    pub struct ReadBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Read { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Streaming { #[pin] body: B },
    }
}

impl<B> ReadBody<B> {
    /// The body `bytes`, then `trailers`.
    pub(crate) fn read(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        let data = (!bytes.is_empty()).then_some(bytes);
        ReadBody {
            kind: Kind::Read { data, trailers },
        }
    }

    /// `body` as it comes.
    pub fn streaming(body: B) -> Self {
        ReadBody {
            kind: Kind::Streaming { body },
        }
    }

    /// Whether the layer read this body (else it streams as it came).
    pub fn was_read(&self) -> bool {
        matches!(self.kind, Kind::Read { .. })
    }
}

impl<B: Body> Body for ReadBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Read { data, trailers } => {
                let frame = match data.take() {
                    Some(data) => Some(Frame::data(data)),
                    None => trailers.take().map(Frame::trailers),
                };
                Poll::Ready(frame.map(Ok))
            }
            KindProj::Streaming { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|r| r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Read { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Read { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Streaming { body } => body.size_hint(),
        }
    }
}

impl<B> std::fmt::Debug for ReadBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Read { data, trailers } => f
                .debug_struct("ReadBody")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            Kind::Streaming { .. } => f.write_str("ReadBody(streaming)"),
        }
    }
}

/// The chunks of a body as they are read: the first kept as it came, later ones joined.
#[derive(Default)]
pub(super) struct Collected {
    first: Option<Bytes>,
    rest: Option<bytes::BytesMut>,
    len: usize,
    /// The bytes the body says it has (its exact size, within the limit): the joined buffer
    /// grows to twice what came, and to this size once that is near (the whole body in one
    /// buffer of its size, while a client that declares much and sends little is held what
    /// it sent).
    expected: usize,
}

impl Collected {
    /// Ready for a body whose size, by its hint, is exactly `exact` bytes (if known), read
    /// within `limit`.
    pub(super) fn expecting(exact: Option<u64>, limit: usize) -> Self {
        let expected = exact.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX).min(limit));
        Collected {
            expected,
            ..Collected::default()
        }
    }

    /// Bytes read so far.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds `chunk`.
    pub(super) fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.len += chunk.len();
        if self.first.is_none() && self.rest.is_none() {
            self.first = Some(chunk);
            return;
        }
        let rest = self.rest.get_or_insert_with(bytes::BytesMut::new);
        // Grown by hand: `BytesMut` would double past the declared size.
        if self.len > rest.capacity() {
            let doubled = self.len.saturating_mul(2);
            let capacity = match self.len <= self.expected && doubled >= self.expected {
                true => self.expected,
                false => doubled,
            };
            let mut grown = bytes::BytesMut::with_capacity(capacity);
            let first = self.first.take();
            grown.extend_from_slice(first.as_deref().unwrap_or(&rest[..]));
            *rest = grown;
        }
        rest.extend_from_slice(&chunk);
    }

    /// The whole body.
    pub(super) fn finish(self) -> Bytes {
        match self.rest {
            Some(rest) => rest.freeze(),
            None => self.first.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Collected;
    use bytes::Bytes;

    #[test]
    fn one_chunk_is_kept_and_more_are_joined() {
        let one = Bytes::from_static(b"abc");
        let mut c = Collected::default();
        c.push(one.clone());
        let whole = c.finish();
        assert_eq!(whole.as_ptr(), one.as_ptr(), "no copy of a single chunk");
        let mut c = Collected::default();
        for part in ["ab", "", "c", "de"] {
            c.push(Bytes::from(part));
        }
        assert_eq!(c.len(), 5);
        assert_eq!(c.finish(), "abcde");
    }

    #[test]
    fn a_body_of_unknown_size_in_tiny_chunks_is_copied_a_few_times_only() {
        let mut c = Collected::default();
        let mut grown = 0;
        let mut capacity = 0;
        for _ in 0..65_536 {
            c.push(Bytes::from_static(b"x"));
            let now = c.rest.as_ref().map_or(0, |r| r.capacity());
            grown += usize::from(now != capacity);
            capacity = now;
        }
        assert!(
            grown <= 17,
            "grown {grown} times: by doubling, never by each chunk"
        );
        assert_eq!(c.finish().len(), 65_536);
    }

    #[test]
    fn a_body_of_known_size_is_joined_in_one_buffer_of_that_size() {
        let chunk = Bytes::from(vec![b'x'; 1_000]);
        let mut c = Collected::expecting(Some(65_000), 64 * 1024);
        for _ in 0..65 {
            c.push(chunk.clone());
        }
        let rest = c.rest.as_ref().expect("joined");
        assert_eq!(rest.capacity(), 65_000, "never grown past its size");
        // A client that declares 65,000 bytes and sends two is held what it sent.
        let mut c = Collected::expecting(Some(65_000), 64 * 1024);
        c.push(Bytes::from_static(b"{"));
        c.push(Bytes::from_static(b"\""));
        assert_eq!(c.rest.as_ref().map(|r| r.capacity()), Some(4));
        // A size over the limit grows to the limit at most: the read is refused past it.
        let mut c = Collected::expecting(Some(u64::MAX), 4_096);
        c.push(chunk.clone());
        for _ in 0..2 {
            c.push(chunk.clone());
        }
        assert_eq!(c.rest.as_ref().map(|r| r.capacity()), Some(4_000));
    }
}
