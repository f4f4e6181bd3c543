//! The egress layer as reqwest-middleware's [`Middleware`]: a reqwest client's calls take
//! their place in the layer's policies before they are sent, and its upstream's answers teach
//! them, as the tower service's do.
//!
//! reqwest-middleware hands a middleware the rest of the chain borrowed for one call, which a
//! tower service cannot hold. So the call runs the layer's own service on its head (method,
//! URI, headers): that service's inner client is a hand-off, which tells this call it may go,
//! waits for the response's head this call gets, and answers with it, so that the layer reads
//! the upstream's pause (and a settled cost) from it as from any client's response.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use http::{Extensions, Request, Response};
use reqwest_middleware::{Error, Middleware, Next};
use tokio::sync::oneshot;
use tower_service::Service;

use super::{Egress, EgressError, EgressLayer};
use crate::store::{MemoryStore, Store};

/// An [`EgressLayer`] as reqwest-middleware's [`Middleware`], made by
/// [`EgressLayer::middleware`].
///
/// A call the layer gives up fails with [`reqwest_middleware::Error::Middleware`] holding a
/// [`GaveUp`](super::GaveUp) (`error.downcast_ref::<GaveUp>()`); the client's own errors come
/// back as they are. The layer reads the response's head: a pause it asks for, a cost settled
/// from its headers ([`Policy::settle`](crate::Policy::settle) on a header). A concurrency
/// limit's slot is given back when the head comes, and a cost counted from the body is not
/// settled: the body is the application's.
///
/// ```
/// use tower_ratelimit::Policy;
/// use tower_ratelimit::egress::EgressLayer;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = EgressLayer::builder().policy(Policy::gcra("10/s")).build()?;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(layer.middleware())
///     .build();
/// # drop(client);
/// # Ok(()) }
/// ```
pub struct EgressMiddleware<St = MemoryStore> {
    service: Egress<HandOff, St>,
}

impl<St> Clone for EgressMiddleware<St> {
    fn clone(&self) -> Self {
        EgressMiddleware {
            service: self.service.clone(),
        }
    }
}

impl<St> std::fmt::Debug for EgressMiddleware<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressMiddleware").finish_non_exhaustive()
    }
}

impl<St: Store> EgressLayer<St> {
    /// The layer as reqwest-middleware's [`Middleware`] (feature `reqwest`), sharing its
    /// store, policies and pauses with the layer's services.
    pub fn middleware(&self) -> EgressMiddleware<St> {
        EgressMiddleware {
            service: tower_layer::Layer::layer(self, HandOff),
        }
    }
}

/// What the layer's service carries in place of a body: how it tells the call it may go, and
/// where it gets the response's head (`None`: the client failed).
struct Carrier {
    go: oneshot::Sender<()>,
    head: oneshot::Receiver<Option<Response<()>>>,
}

/// The inner client of the layer's service: hands the call back to the middleware.
#[derive(Clone, Debug)]
struct HandOff;

/// The client failed (its error goes back to the caller as it is).
#[derive(Debug)]
struct Failed;

impl Service<Request<Carrier>> for HandOff {
    type Response = Response<()>;
    type Error = Failed;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, Failed>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Carrier>) -> Self::Future {
        let Carrier { go, head } = request.into_body();
        Box::pin(async move {
            go.send(()).map_err(|_| Failed)?;
            head.await.ok().flatten().ok_or(Failed)
        })
    }
}

#[async_trait::async_trait]
impl<St: Store> Middleware for EgressMiddleware<St> {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let (go, mut gone) = oneshot::channel();
        let (answer, head) = oneshot::channel();
        let mut view = Request::new(Carrier { go, head });
        *view.method_mut() = request.method().clone();
        *view.uri_mut() = request.url().as_str().parse().map_err(Error::middleware)?;
        *view.headers_mut() = request.headers().clone();
        let mut service = self.service.clone();
        poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(given_up)?;
        let mut call = pin!(service.call(view));
        // Until the layer lets the call go, or answers without it.
        let answered = poll_fn(|cx| match Pin::new(&mut gone).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(None),
            _ => call.as_mut().poll(cx).map(Some),
        })
        .await;
        if let Some(answered) = answered {
            return Err(answered.map_or_else(given_up, |_| unsent()));
        }
        let response = next.run(request, extensions).await;
        let _ = answer.send(response.as_ref().ok().map(head_of));
        match call.await {
            Err(EgressError::GaveUp(gave_up)) => Err(Error::middleware(gave_up)),
            _ => response,
        }
    }
}

/// The error of a call the layer did not send (or a client's failure, already returned).
fn given_up(error: EgressError<Failed>) -> Error {
    match error {
        EgressError::GaveUp(gave_up) => Error::middleware(gave_up),
        EgressError::Upstream(Failed) => unsent(),
    }
}

/// A call the layer answered without letting it go, and without giving up: never made.
fn unsent() -> Error {
    Error::Middleware(std::io::Error::other("the egress layer answered without the call").into())
}

/// The head of `response`, which the layer learns from.
fn head_of(response: &reqwest::Response) -> Response<()> {
    let mut head = Response::new(());
    *head.status_mut() = response.status();
    *head.headers_mut() = response.headers().clone();
    head
}
