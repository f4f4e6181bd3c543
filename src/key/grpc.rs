use std::fmt;
use std::sync::Arc;

use http::StatusCode;

use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// Keys gRPC requests by their full method name, `/package.Service/Method`, which gRPC sends as
/// the request's path: each method its own bucket.
///
/// The client writes the path, and a gRPC server answers an unknown method with
/// `UNIMPLEMENTED` only after the limiter has counted it; so that a client cannot open any
/// number of buckets, name the services you serve with [`services`](Self::services): the
/// methods of any other service then share one bucket, keyed `OTHER`. A path that is not a
/// method name (two segments of letters, digits, `_` and `.`, at most 256 bytes) is rejected
/// with `400` (`INVALID_ARGUMENT` in the gRPC form), code `not_a_grpc_method`.
///
/// Combine it with a client key for a budget per method and client, and give one method its
/// own policy with [`Policy::route`](crate::Policy::route):
///
/// ```
/// use tower_ratelimit::key::{self, GrpcMethod, HeaderKey};
/// use tower_ratelimit::{Policy, RateLimitLayer};
///
/// let per_method_and_caller = key::all((
///     GrpcMethod::new().services(["shop.v1.Orders", "grpc.health.v1.Health"]),
///     HeaderKey::try_new("x-api-key")?, // metadata is a header
/// ));
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::gcra("100/s").key(per_method_and_caller))
///     .policy(
///         Policy::fixed_window("10/min")
///             .name("place-order")
///             .path("/shop.v1.Orders/PlaceOrder"),
///     )
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Default)]
pub struct GrpcMethod {
    services: Option<Arc<[Box<str>]>>,
}

/// The longest method name keyed by name.
const MAX_METHOD: usize = 256;

impl GrpcMethod {
    /// Keys by the method name, whatever the service.
    pub fn new() -> Self {
        GrpcMethod::default()
    }

    /// Keys by method name only the methods of these services (full names, such as
    /// `grpc.health.v1.Health`); the methods of any other service share one bucket, `OTHER`.
    pub fn services<I, S>(mut self, services: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.services = Some(
            services
                .into_iter()
                .map(|s| s.into().into_boxed_str())
                .collect(),
        );
        self
    }
}

impl fmt::Debug for GrpcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcMethod")
            .field("services", &self.services)
            .finish()
    }
}

/// The service of a gRPC method path, `/service/method`, if the path is one.
fn service_of(path: &str) -> Option<&str> {
    let name = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    };
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (path.len() <= MAX_METHOD && name(service) && name(method)).then_some(service)
}

impl KeyExtractor for GrpcMethod {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let path = request.uri().path();
        let service = service_of(path).ok_or_else(|| {
            KeyRejection::new(
                StatusCode::BAD_REQUEST,
                "not_a_grpc_method",
                "the request's path is not a gRPC method name (/package.Service/Method)",
            )
        })?;
        match &self.services {
            Some(known) if !known.iter().any(|s| **s == *service) => Ok(Key::from("OTHER")),
            _ => Ok(Key::from(path)),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn extract(key: &GrpcMethod, path: &str) -> Result<Key, KeyRejection> {
        let req = Request::post(path).body(()).unwrap();
        key.extract(&RequestRef::new(&req))
    }

    #[test]
    fn keys_by_method() {
        let key = GrpcMethod::new();
        assert_eq!(
            extract(&key, "/grpc.health.v1.Health/Check").unwrap(),
            Key::from("/grpc.health.v1.Health/Check")
        );
        for bad in ["/", "/a", "/a/", "//b", "/a/b/c", "/a-b/c", "/a/b%20"] {
            let err = extract(&key, bad).unwrap_err();
            assert_eq!(err.code(), "not_a_grpc_method", "{bad}");
        }
        let long = format!("/s/{}", "m".repeat(MAX_METHOD));
        assert!(extract(&key, &long).is_err());
    }

    #[test]
    fn other_services_share_a_bucket() {
        let key = GrpcMethod::new().services(["grpc.health.v1.Health"]);
        assert_eq!(
            extract(&key, "/grpc.health.v1.Health/Watch").unwrap(),
            Key::from("/grpc.health.v1.Health/Watch")
        );
        assert_eq!(extract(&key, "/x.Y/Z").unwrap(), Key::from("OTHER"));
        assert_eq!(extract(&key, "/x.Z/Z").unwrap(), Key::from("OTHER"));
    }
}
