//! [`Policy::route`] and [`Policy::path`]: the requests a policy applies to.

use http::Method;

use super::builder::Policy;
use super::route::Route;

impl Policy {
    /// Applies the policy only to requests with this method (`None`: any method, as
    /// [`path`](Self::path) says it) and path pattern; may be called several times. The
    /// pattern is compared with axum's matched route (e.g. `/users/{id}`) when there is one,
    /// else with the URI path; a trailing `*` matches by prefix. Without any route, the policy
    /// applies to every request.
    ///
    /// ```
    /// use http::Method;
    /// use tower_ratelimit::Policy;
    ///
    /// let writes = Policy::gcra("10/s").route(Some(Method::POST), "/users/{id}");
    /// let search = Policy::gcra("5/s").path("/search/*");
    /// # let _ = (writes, search);
    /// ```
    #[must_use]
    pub fn route(mut self, method: Option<Method>, path: impl Into<String>) -> Self {
        self.routes.push(Route::new(method, path.into()));
        self
    }

    /// Applies the policy only to requests of this path pattern, whatever their method: the
    /// same as [`route`](Self::route) with `None`.
    #[must_use]
    pub fn path(self, path: impl Into<String>) -> Self {
        self.route(None, path)
    }
}
