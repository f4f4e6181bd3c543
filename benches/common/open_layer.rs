//! The layer the axum benches put in front of their hello-world router (included by path, as
//! the rest of `common` needs the `redis` feature).

use tower_ratelimit::{HeaderStyle, Policy, RateLimitLayer};

/// Our layer on the memory store: GCRA 1,000,000 a millisecond per peer IP, which never limits
/// (one key decided faster than a million times a second would reach 1,000,000/s), with
/// `headers` and with or without the `Decision` in the request's extensions.
pub(crate) fn open_layer(headers: HeaderStyle, extension: bool) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::gcra("1000000/ms"))
        .headers(headers)
        .decision_extension(extension)
        .build()
        .expect("a valid layer")
}
