//! The routes a policy applies to: a method and a path pattern, matched against axum's route
//! template when there is one.

use http::Method;

use crate::key::RequestRef;

/// A method and path pattern a policy applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Route {
    method: Option<Method>,
    path: String,
}

impl Route {
    pub(super) fn new(method: Option<Method>, path: String) -> Self {
        Route { method, path }
    }

    /// Matches the request's route: axum's matched route template when there is one (so
    /// `/users/{id}` matches every user), else the URI path. A pattern ending in `*` matches by
    /// prefix.
    pub(super) fn matches(&self, request: &RequestRef<'_>) -> bool {
        if let Some(m) = &self.method
            && m != request.method()
        {
            return false;
        }
        let path = matched_path(request).unwrap_or_else(|| request.uri().path());
        match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.path,
        }
    }
}

#[cfg(feature = "axum")]
fn matched_path<'a>(request: &RequestRef<'a>) -> Option<&'a str> {
    request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str())
}

#[cfg(not(feature = "axum"))]
fn matched_path<'a>(_: &RequestRef<'a>) -> Option<&'a str> {
    None
}
