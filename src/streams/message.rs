//! What a message is to its policies.

/// Which way a message goes, in the [`Message`] a policy reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client: a message the connection reads.
    Inbound,
    /// To the client: a message the server sends (with
    /// [`StreamLimiterBuilder::outbound`](crate::streams::StreamLimiterBuilder::outbound)).
    Outbound,
}

/// The message being decided, which the head its policies read carries
/// ([`RequestRef::message`](crate::key::RequestRef::message)): its size and direction.
/// [`message_bytes`](super::message_bytes) is the cost that reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its payload's size in bytes.
    pub bytes: usize,
    /// Which way it goes.
    pub direction: Direction,
}
