//! The fuzz targets' way into a layer that reads bodies: a body's status, and a body's status
//! once its client's limit is spent.

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
}

/// The policies of `layer`, the body spending them, and whether `calls` may pass after it.
fn exhausting(
    layer: u8,
    calls: &[serde_json::Value],
) -> (Vec<crate::Policy>, serde_json::Value, bool) {
    use crate::Policy;
    use crate::key::{self, HeaderKey};
    use crate::settle::Settle;
    use serde_json::{Value, json};

    match layer % 4 {
        0 => (
            vec![Policy::fixed_window("1/min").key(key::jsonrpc())],
            json!({"method": "m"}),
            !calls.iter().any(|c| c.get("method") == Some(&json!("m"))),
        ),
        1 => {
            let n = |c: &Value| c.get("n").and_then(Value::as_u64);
            (
                vec![Policy::fixed_window("3/min").cost_json("/n")],
                json!({"n": 2}),
                calls.len() == 1 && n(&calls[0]).is_some_and(|n| n <= 1),
            )
        }
        2 => (
            vec![Policy::token_bucket("1/min").cost_graphql(6)],
            json!({"query": "{ a }"}),
            false,
        ),
        _ => (
            vec![
                Policy::fixed_window("2/min")
                    .name("client")
                    .key(HeaderKey::try_new("x-client").expect("a header")),
                (Policy::fixed_window("500/s").key(key::jsonrpc()))
                    .settle(Settle::json("/usage/total_tokens")),
            ],
            json!([{"method": "m"}, {"method": "n"}]),
            false,
        ),
    }
}

/// The status a layer that reads bodies answers `body` with once a first request spent most
/// of a limit, and whether a correct layer may admit it (an oracle of its own, read from the
/// body as JSON): `layer` picks the limit. A JSON-RPC method's 1 a minute, `m` spent: no
/// call of `m` passes, in a batch or alone. A cost at `/n`, 3 a minute, 2 spent: only one
/// call of `n` 0 or 1 passes (a cost counts at least 1; a batch's calls add up). A GraphQL
/// query's cost, 1 a minute, or a client's 2 a minute (a batch counts each call) beside a
/// batch settled from the response's JSON (`/usage/total_tokens`, which the inner service
/// reports), spent by a batch of two: nothing.
pub fn body_after_exhausted(body: &[u8], layer: u8) -> (u16, bool) {
    use crate::RateLimitLayer;
    use crate::request_body::BodyLimits;
    use serde_json::Value;
    use tower_layer::Layer;
    use tower_service::Service;

    let calls: Option<Vec<Value>> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(calls)) => Some(calls),
        Ok(call) => Some(vec![call]),
        Err(_) => None,
    };
    let calls = calls.unwrap_or_default();
    let (policies, spend, admissible) = exhausting(layer, &calls);
    let built = RateLimitLayer::builder()
        .clock(crate::ManualClock::new())
        .policies(policies)
        .read_bodies(BodyLimits::new())
        .build()
        .expect("a valid layer");
    let inner = |_: http::Request<_>| async {
        let usage = r#"{"usage": {"total_tokens": 7}}"#;
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from(usage)))
    };
    let mut service = built.layer(tower_service_fn(inner));
    let request = |body: &[u8]| {
        http::Request::post("/")
            .header("x-client", "fuzz")
            .extension(std::net::SocketAddr::from(([127, 0, 0, 1], 1)))
            .body(FullBody(Some(bytes::Bytes::copy_from_slice(body))))
            .expect("a request")
    };
    let spend = spend.to_string();
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let first = service.call(request(spend.as_bytes())).await;
            let first = first.expect("infallible");
            assert_eq!(
                first.status(),
                200,
                "the request spending the limit ({layer})"
            );
            // Read to its end: a cost settled from the response is charged there.
            let mut read = std::pin::pin!(first.into_body());
            while std::future::poll_fn(|cx| http_body::Body::poll_frame(read.as_mut(), cx))
                .await
                .is_some()
            {}
            let response = service.call(request(body)).await.expect("infallible");
            (response.status().as_u16(), admissible)
        })
    })
}

/// The status a layer that reads bodies answers `body` with, `POST`ed: `layer` picks its
/// policy (keyed by a JSON-RPC call's method and a value at a pointer; costing a number at a
/// pointer; costing a GraphQL query). A batch's calls are each keyed and costed.
pub fn body_status(body: &[u8], layer: u8) -> u16 {
    use crate::key;
    use crate::request_body::{BodyLimits, Read};
    use crate::{Policy, RateLimitLayer};
    use tower_layer::Layer;
    use tower_service::Service;

    type Built = RateLimitLayer<crate::MemoryStore, crate::body::Wrapped, Read>;
    thread_local! {
        static LAYERS: Vec<Built> = {
            let policies = [
                Policy::fixed_window("5/s").key(key::all((
                    key::jsonrpc(),
                    key::json("/params/name").expect("a pointer"),
                ))),
                Policy::fixed_window("500/s").cost_json("/n"),
                Policy::token_bucket("500/s").cost_graphql(6),
            ];
            let limits = BodyLimits::new();
            (policies.into_iter())
                .map(|p| RateLimitLayer::builder().policy(p).read_bodies(limits).build())
                .collect::<Result<_, _>>()
                .expect("valid layers")
        };
    }
    let inner = |_: http::Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    };
    let mut service = LAYERS.with(|layers| {
        let built = &layers[usize::from(layer) % layers.len()];
        built.layer(tower_service_fn(inner))
    });
    let request = http::Request::post("/")
        .extension(std::net::SocketAddr::from(([127, 0, 0, 1], 1)))
        .body(FullBody(Some(bytes::Bytes::copy_from_slice(body))))
        .expect("a request");
    RUNTIME.with(|rt| {
        rt.block_on(async { service.call(request).await })
            .expect("infallible")
            .status()
            .as_u16()
    })
}

/// A service of a closure (tower's `service_fn`, which the crate does not depend on).
fn tower_service_fn<F>(f: F) -> ServiceFn<F> {
    ServiceFn(f)
}

#[derive(Clone)]
struct ServiceFn<F>(F);

impl<F, R, Fut, S> tower_service::Service<R> for ServiceFn<F>
where
    F: FnMut(R) -> Fut,
    Fut: std::future::Future<Output = Result<S, std::convert::Infallible>>,
{
    type Response = S;
    type Error = std::convert::Infallible;
    type Future = Fut;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Fut {
        (self.0)(request)
    }
}

/// A body of one chunk.
struct FullBody(Option<bytes::Bytes>);

impl http_body::Body for FullBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }
}
