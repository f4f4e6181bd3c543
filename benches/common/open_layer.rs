//! The layer the axum benches put in front of their hello-world router (included by path, as
//! the rest of `common` needs the `redis` feature).

use tower_ratelimit::{Policy, RateLimitLayer, headers::HeaderStyle};

/// Our layer on the memory store: GCRA 1,000,000/s per peer IP with a burst of a billion, which
/// never limits (one key is decided more than a million times a second by criterion), with
/// `headers` and with or without the `Decision` in the request's extensions.
pub(crate) fn open_layer(headers: HeaderStyle, extension: bool) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::gcra("1000000/s").burst(1_000_000_000))
        .headers(headers)
        .decision_extension(extension)
        .build()
        .expect("a valid layer")
}
