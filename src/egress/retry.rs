//! Calls sent again after their upstream's `429` (or `503`), at the time it named, within a
//! budget: [`RetryLayer`], outside an [`EgressLayer`](super::EgressLayer).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::{Method, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::upstream;

/// How many retries an instance may make: a share of its calls, and a few a second whatever
/// the calls (as Finagle's and tower's retry budgets do), so that an upstream refusing
/// everything is not sent every call twice.
#[derive(Debug)]
pub struct RetryBudget {
    /// Retries each call earns.
    ratio: f64,
    /// Retries earned each second, calls or not.
    per_second: f64,
    /// Retries that can be saved up.
    most: f64,
    state: Mutex<(f64, Instant)>,
}

impl RetryBudget {
    /// A retry for every `1 / ratio` calls (`0.2`: one in five), and `per_second` a second
    /// whatever the calls; at most ten seconds' worth of either saved up.
    pub fn new(ratio: f64, per_second: u32) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1000.0)
        } else {
            0.0
        };
        let per_second = f64::from(per_second);
        RetryBudget {
            ratio,
            per_second,
            most: (per_second * 10.0).max(ratio * 100.0).max(1.0),
            state: Mutex::new((per_second, Instant::now())),
        }
    }

    /// The tokens as of now, with a call's deposit.
    fn deposit(&self, calls: f64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = &mut *state;
        let now = Instant::now();
        let earned = self.per_second * (now - *since).as_secs_f64() + self.ratio * calls;
        *tokens = (*tokens + earned).min(self.most);
        *since = now;
    }

    /// Takes one retry, if there is one.
    fn withdraw(&self) -> bool {
        self.deposit(0.0);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            return true;
        }
        false
    }
}

impl Default for RetryBudget {
    /// One retry in five calls, and one a second.
    fn default() -> Self {
        RetryBudget::new(0.2, 1)
    }
}

/// Sends a call again when its upstream answers `429` or `503` and names when to come back
/// (`Retry-After`, `RateLimit`, `X-RateLimit-*`): after that time, at most `attempts` times
/// more, within a [`RetryBudget`] shared by the layer's services. Only calls of an idempotent
/// method (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) unless
/// [`non_idempotent`](Self::non_idempotent) says otherwise: a `POST` refused may still have
/// been done. The request body must be `Clone` to be sent again.
///
/// Put it outside the [`EgressLayer`](super::EgressLayer): the call sent again takes its place
/// in the policies again (after the pause the upstream asked for, which the egress layer keeps
/// for every instance).
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_ratelimit::Policy;
/// use tower_ratelimit::egress::{EgressLayer, RetryBudget, RetryLayer};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// # let client = tower::service_fn(|_: http::Request<String>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// # });
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(RetryBudget::new(0.1, 1)).attempts(2))
///     .layer(EgressLayer::builder().policy(Policy::gcra("100/min")).build()?)
///     .service(client);
/// # let _ = client;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RetryLayer {
    budget: Arc<RetryBudget>,
    attempts: u32,
    non_idempotent: bool,
    longest: Duration,
}

impl RetryLayer {
    /// Retries within `budget`: once a call, after at most a minute.
    pub fn new(budget: RetryBudget) -> Self {
        RetryLayer {
            budget: Arc::new(budget),
            attempts: 1,
            non_idempotent: false,
            longest: Duration::from_secs(60),
        }
    }

    /// How many times a call may be sent again (default 1).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// Whether calls of a method that is not idempotent (`POST`, `PATCH`) are sent again too
    /// (default no).
    pub fn non_idempotent(mut self, yes: bool) -> Self {
        self.non_idempotent = yes;
        self
    }

    /// The longest time named by the upstream that a retry waits for (default a minute): a
    /// call told to come back later is answered with the upstream's refusal.
    pub fn longest_wait(mut self, longest: Duration) -> Self {
        self.longest = longest;
        self
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retrying<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retrying {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`RetryLayer`].
#[derive(Clone, Debug)]
pub struct Retrying<S> {
    inner: S,
    layer: RetryLayer,
}

/// Whether `method` may be sent twice with the effect of once (RFC 9110, 9.2.2).
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Retrying<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Clone + Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let layer = self.layer.clone();
        layer.budget.deposit(1.0);
        let retries = match layer.non_idempotent || idempotent(request.method()) {
            true => layer.attempts,
            false => 0,
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let mut request = request;
            let mut left = retries;
            loop {
                let again = (left > 0).then(|| request.clone());
                let response = inner.call(request).await?;
                let status = response.status();
                let refused = upstream::refused(status, response.headers());
                let Some(again) = again.filter(|_| refused) else {
                    return Ok(response);
                };
                let named = upstream::pause(status, response.headers(), SystemTime::now());
                match named {
                    Some((after, _)) if after <= layer.longest && layer.budget.withdraw() => {
                        metrics::counter!("ratelimit_egress_retries_total").increment(1);
                        drop(response);
                        tokio::time::sleep(after).await;
                    }
                    _ => return Ok(response),
                }
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                (request, left) = (again, left - 1);
            }
        })
    }
}
