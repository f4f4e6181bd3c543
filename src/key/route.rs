use std::fmt;
use std::marker::PhantomData;

use http::{Method, StatusCode};

use super::{Key, KeyExtractor, KeyRejection, RequestRef};

/// Keys requests by the route pattern the router matched (`/users/{id}`, not `/users/42`) and
/// the method, so one layer gives every route its own bucket; see [`matched_route`].
pub struct MatchedRoute<P, F> {
    path: F,
    method: bool,
    _type: PhantomData<fn(&P)>,
}

/// Keys requests by the matched route: `path` reads the pattern from a `P` the router put in
/// the extensions. With axum, `P` is `axum::extract::MatchedPath`:
///
/// ```
/// use axum::extract::MatchedPath;
/// use tower_ratelimit::key::{self, ClientIp};
///
/// // Each route its own bucket:
/// let per_route = key::matched_route(MatchedPath::as_str);
/// // Each route its own bucket per client:
/// let per_route_and_client =
///     key::all((key::matched_route(MatchedPath::as_str), ClientIp::new(["10.0.0.0/8"])?));
/// # let _ = (per_route, per_route_and_client);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// (axum's `MatchedPath` needs axum's `matched-path` feature, which is on by default; this crate
/// does not enable it for you, hence the closure.)
///
/// The key is the method and the pattern, e.g. `GET /users/{id}`; methods other than the nine
/// standard ones all count as `OTHER`, since a client can invent any number of them. Use
/// [`ignore_method`](MatchedRoute::ignore_method) to share one bucket between a route's
/// methods.
///
/// A request without a matched route is rejected with `404 Not Found`, code
/// `no_matched_route`: that is an unmatched path under `Router::layer` (under
/// `Router::route_layer` unmatched paths never reach the layer), or a router that does not
/// record the matched route. The raw URI path is never used: the client writes it, so it
/// would give each client an unbounded number of fresh buckets. To keep unmatched paths
/// reaching the app's own fallback, share one bucket between them:
/// `key::first_of((key::matched_route(MatchedPath::as_str), GlobalKey))`.
pub fn matched_route<P, F>(path: F) -> MatchedRoute<P, F>
where
    P: Send + Sync + 'static,
    F: Fn(&P) -> &str + Send + Sync + 'static,
{
    MatchedRoute {
        path,
        method: true,
        _type: PhantomData,
    }
}

impl<P, F> MatchedRoute<P, F> {
    /// Keys by the route pattern alone: every method of a route shares its bucket.
    #[must_use]
    pub fn ignore_method(mut self) -> Self {
        self.method = false;
        self
    }
}

/// The method's name if it is one of the nine standard ones, else `OTHER`.
fn method_name(method: &Method) -> &str {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::CONNECT,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ];
    if STANDARD.contains(method) {
        method.as_str()
    } else {
        "OTHER"
    }
}

impl<P, F: Clone> Clone for MatchedRoute<P, F> {
    fn clone(&self) -> Self {
        MatchedRoute {
            path: self.path.clone(),
            method: self.method,
            _type: PhantomData,
        }
    }
}

impl<P, F> fmt::Debug for MatchedRoute<P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatchedRoute")
            .field("from", &std::any::type_name::<P>())
            .field("method", &self.method)
            .finish()
    }
}

impl<P, F> KeyExtractor for MatchedRoute<P, F>
where
    P: Send + Sync + 'static,
    F: Fn(&P) -> &str + Send + Sync + 'static,
{
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        let matched = request.extensions().get::<P>().ok_or_else(|| {
            KeyRejection::new(
                StatusCode::NOT_FOUND,
                "no_matched_route",
                "no route matched this request",
            )
        })?;
        let path = (self.path)(matched);
        if !self.method {
            return Ok(Key::from(path));
        }
        let method = method_name(request.method());
        let mut key = Vec::with_capacity(method.len() + 1 + path.len());
        key.extend_from_slice(method.as_bytes());
        key.push(b' ');
        key.extend_from_slice(path.as_bytes());
        Ok(Key::from(key))
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    #[derive(Clone)]
    struct Pattern(&'static str);

    fn pattern(p: &Pattern) -> &str {
        p.0
    }

    fn extract(
        route: &impl KeyExtractor,
        method: &str,
        p: Option<&'static str>,
    ) -> Result<Key, KeyRejection> {
        let mut req = Request::builder()
            .method(method)
            .uri("/users/42")
            .body(())
            .unwrap();
        if let Some(p) = p {
            req.extensions_mut().insert(Pattern(p));
        }
        route.extract(&RequestRef::new(&req))
    }

    #[test]
    fn keys_by_method_and_pattern() {
        let route = matched_route(pattern);
        assert_eq!(
            extract(&route, "GET", Some("/users/{id}")).unwrap(),
            Key::from("GET /users/{id}")
        );
        assert_eq!(
            extract(&route, "PATCH", Some("/users/{id}")).unwrap(),
            Key::from("PATCH /users/{id}")
        );
        assert_eq!(
            extract(&route, "FROBNICATE", Some("/users/{id}")).unwrap(),
            Key::from("OTHER /users/{id}")
        );
        assert_eq!(
            extract(&route, "X", Some("/users/{id}")).unwrap(),
            Key::from("OTHER /users/{id}")
        );
        let err = extract(&route, "GET", None).unwrap_err();
        assert_eq!(
            (err.status(), err.code()),
            (StatusCode::NOT_FOUND, "no_matched_route")
        );
        let any_method = matched_route(pattern).ignore_method();
        assert_eq!(
            extract(&any_method, "POST", Some("/users/{id}")).unwrap(),
            Key::from("/users/{id}")
        );
    }
}
