//! The TCP settings of every connection to Redis: keepalive and a user timeout, so that a peer
//! gone without a word (a host down, a NAT that forgot the flow) is found by TCP within
//! seconds even when no decision is waiting on it, and a connection whose data stays
//! unacknowledged is closed. A connection that is acknowledged but silent (a proxy that stopped
//! forwarding) is found by the store's own check after a missed deadline (`redial.rs`,
//! `cluster.rs`).

use std::time::Duration;

use redis::io::tcp::socket2::{SockRef, TcpKeepalive};

/// Keepalive idle time, probe interval and probes, and the user timeout (Linux).
const KEEPALIVE: (Duration, Duration, u32, Duration) = (
    Duration::from_secs(10),
    Duration::from_secs(2),
    3,
    Duration::from_secs(10),
);

fn keepalive_probes() -> TcpKeepalive {
    let (idle, interval, probes, _) = KEEPALIVE;
    TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(probes)
}

/// The settings redis-rs connects with, with `TCP_NODELAY`.
pub(super) fn settings() -> redis::io::tcp::TcpSettings {
    let settings = redis::io::tcp::TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive_probes());
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(KEEPALIVE.3);
    settings
}

/// The same settings on a socket the store dials itself.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(super) fn keepalive(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
    let socket = SockRef::from(tcp);
    socket.set_tcp_keepalive(&keepalive_probes())?;
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(Some(KEEPALIVE.3))?;
    Ok(())
}
