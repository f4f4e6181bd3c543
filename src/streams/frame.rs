//! What a connection's messages must be for [`LimitedSocket`](super::LimitedSocket).

use std::fmt;

/// A WebSocket close code the limits answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CloseCode(u16);

impl CloseCode {
    /// `1008`: the message broke a policy; the client should not simply try again.
    pub const POLICY_VIOLATION: CloseCode = CloseCode(1008);
    /// `1013`: the server is overloaded; the client may try again later.
    pub const TRY_AGAIN_LATER: CloseCode = CloseCode(1013);

    /// The code `code`, when a server may send it: 1000 to 1014 but 1004 to 1006 (which no
    /// frame carries), or 3000 to 4999 (registered and private codes).
    pub const fn new(code: u16) -> Option<CloseCode> {
        match code {
            1004..=1006 => None,
            1000..=1014 | 3000..=4999 => Some(CloseCode(code)),
            _ => None,
        }
    }

    /// Its number.
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A message of a WebSocket, as the limits see it: implemented for axum's and
/// tokio-tungstenite's messages (feature `ws`), and for your own frames.
pub trait Frame: Sized {
    /// The size of the message's payload when it is counted, `None` for a control frame (ping,
    /// pong, close), which always goes through.
    fn counted_size(&self) -> Option<usize>;

    /// A text message (the error message an [`OverLimit::error`](super::OverLimit::error)
    /// answer sends).
    fn text(text: String) -> Self;

    /// A close frame with `code` and `reason` (at most 123 bytes).
    fn close(code: CloseCode, reason: String) -> Self;
}
