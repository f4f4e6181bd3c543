//! The demo server's own routes, beside `GET /`: what each shows of the layer.

/// `POST /login`: 401 unless the header `x-password` is `letmein` (for a policy that counts
/// failed logins, `charge_if_status = [401]`).
pub(crate) async fn login(
    headers: axum::http::HeaderMap,
) -> (axum::http::StatusCode, &'static str) {
    match headers.get("x-password").map(|v| v.as_bytes()) {
        Some(b"letmein") => (axum::http::StatusCode::OK, "welcome\n"),
        _ => (axum::http::StatusCode::UNAUTHORIZED, "wrong password\n"),
    }
}

/// `GET /slow?ms=<n>`: answers after `n` milliseconds (at most 10,000).
pub(crate) async fn slow(
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<String, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "ms must be a number of milliseconds from 0 to 10000\n",
    );
    let ms: u64 = match q.get("ms") {
        None => 1000,
        Some(ms) => ms.parse().map_err(|_| bad)?,
    };
    if ms > 10_000 {
        return Err(bad);
    }
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    Ok(format!("answered after {ms} ms\n"))
}

/// `GET /spend?cost=<n>`: 200 with the header `name` set to n.
pub(crate) async fn spend(
    name: String,
    q: std::collections::HashMap<String, String>,
) -> Result<axum::response::Response, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "cost must be a whole number of units\n",
    );
    let cost: u64 = q.get("cost").ok_or(bad)?.parse().map_err(|_| bad)?;
    let mut response = axum::response::IntoResponse::into_response(format!("spent {cost}\n"));
    let name = axum::http::HeaderName::try_from(name).expect("checked at start");
    response
        .headers_mut()
        .insert(name, axum::http::HeaderValue::from(cost));
    Ok(response)
}

/// `GET /stream?bytes=<n>`: n bytes, in chunks of 1,000 sent one at a time.
pub(crate) async fn stream(
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<axum::body::Body, (axum::http::StatusCode, &'static str)> {
    let bad = (
        axum::http::StatusCode::BAD_REQUEST,
        "bytes must be a number from 0 to 10000000\n",
    );
    let bytes: u64 = q.get("bytes").ok_or(bad)?.parse().map_err(|_| bad)?;
    if bytes > 10_000_000 {
        return Err(bad);
    }
    Ok(axum::body::Body::new(Chunks { left: bytes }))
}

/// A body of `left` bytes, sent in chunks of at most 1,000.
struct Chunks {
    left: u64,
}

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let chunk = self.left.min(1_000);
        self.left -= chunk;
        std::task::Poll::Ready((chunk > 0).then(|| {
            Ok(http_body::Frame::data(bytes::Bytes::from(vec![
                b'.';
                chunk
                    as usize
            ])))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}
