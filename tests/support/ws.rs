//! A WebSocket client of the tests' echo servers (`/ws`), keyed by the header `x-key`.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A socket of `key` on `/ws` at `addr`.
pub async fn connect(addr: SocketAddr, key: &str) -> Client {
    try_connect(addr, key).await.expect("upgraded")
}

/// A socket of `key`, or the response that refused it.
pub async fn try_connect(
    addr: SocketAddr,
    key: &str,
) -> Result<Client, http::Response<Option<Vec<u8>>>> {
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    request.headers_mut().insert("x-key", key.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((client, _)) => Ok(client),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(*response),
        Err(e) => panic!("{e}"),
    }
}

/// Sends `text` and returns what comes back first.
pub async fn say(client: &mut Client, text: &str) -> Message {
    client.send(Message::text(text)).await.unwrap();
    next(client).await
}

/// The next message, within 20 s.
pub async fn next(client: &mut Client) -> Message {
    tokio::time::timeout(Duration::from_secs(20), client.next())
        .await
        .expect("an answer within 20 s")
        .expect("the socket open")
        .expect("a message")
}
