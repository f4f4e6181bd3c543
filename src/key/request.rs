//! [`RequestRef`]: what a key extractor sees of a request.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A borrowed view of a request's head, whatever its body type.
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestRef<'a> {
    /// Borrows the head of `request`.
    pub fn new<B>(request: &'a Request<B>) -> Self {
        RequestRef {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The request method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The request URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The request headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The request extensions (peer address, authenticated user, matched route, ...).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}
