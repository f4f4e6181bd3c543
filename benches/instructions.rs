//! The driver of `scripts/instructions.sh`: a loop of in-process requests (or `check` calls) to
//! count under callgrind, where instruction counts are the same from run to run whatever else
//! the machine does (wall-clock figures on a shared 2-core machine are not).
//!
//! ```text
//! instructions MODE N    # MODE: bare, identity, headers, none, axum_body, defaults, governor,
//!                         # governor_headers, check, check_fixed, check_two, check_two_gcra,
//!                         # governor_check, hot, hot_lease, lists, lists_given, message,
//!                         # egress_bare, egress or egress_blind
//! ```
//!
//! It makes 10,240 requests to warm up, then `N` more in `measured`, the only function
//! callgrind counts (`--toggle-collect`), each polled once and answered at once.
//!
//! `bare` is an axum hello-world router, `identity` the same with `tower`'s layer that does
//! nothing. The other router modes add our layer (memory store, GCRA of one unit a minute with
//! a burst of 1,000,000 per peer IP: it never limits here, and a key's state outlives the run,
//! as governor's entries do, so nothing counted is a key dropped and inserted again), each
//! beside the `tower_governor` mode that does the same work:
//!
//! - `headers`: `X-RateLimit-*` headers, no `Decision` in the request's extensions (as
//!   `governor_headers`: `tower_governor`'s layer with its headers, the same quota per peer IP);
//! - `none`: neither headers nor the extension (as `governor`, without headers);
//! - `axum_body`: as `none`, answering in axum's own body;
//! - `defaults`: the builder's defaults, `X-RateLimit-*` headers and the `Decision` extension
//!   (which `tower_governor` has no counterpart of).
//!
//! `check` is `RateLimitLayer::check` on 10,000 keys, `governor_check` governor's keyed
//! `check_key` on the same keys; `check_fixed` is `check` of a fixed window (its packed state
//! decided with its word claimed); `check_two` is `check` on a layer of both policies, GCRA and
//! the fixed window, and `check_two_gcra` on a layer of two GCRAs (decided together under the
//! key's shard's shared lock, each word claimed). Peers cycle through
//! 10,240 addresses, but in `hot` (as `defaults`) and `hot_lease` (the same with
//! `Policy::lease(20)`: the requests the leases admit without a store call), where every
//! request comes from one peer. `lists` is `headers` with allow and deny lists (a network on
//! each, no request on either: what the lists cost a request they do not decide), entries
//! added at runtime kept in the store (none is added: in memory they are then not looked at);
//! `lists_given`, the same lists alone (`Lists::kept_in_store(false)`). `message` is a
//! message of a connection decided by a `StreamLimiter` (`Connection::admit`) on the same
//! policy, keyed by the peer IP of the request that opened it: what each message of a
//! WebSocket pays. `egress_bare` is a call to an in-process upstream (a `service_fn`
//! answering at once), `egress` the same call through an `EgressLayer` on the same policy
//! keyed by the upstream's host (learning from the answer), `egress_blind` without learning.

use std::net::SocketAddr;

use axum::{Router, body::Body, routing::get};
use http::Request;
use tower::ServiceExt;
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::egress::EgressLayer;
use tower_ratelimit::key::{Key, PeerIp};
use tower_ratelimit::lists::Lists;
use tower_ratelimit::streams::{Direction, StreamLimiter};
use tower_ratelimit::{Policy, RateLimitLayer, headers::HeaderStyle};

#[path = "common/ready.rs"]
mod ready;
use ready::now;

/// Requests made before counting: every peer (or key) seen once, so tables are warm and
/// nothing counted is a first insert or a table's growth.
const WARM_UP: u64 = 10_240;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--bench") {
        eprintln!("a driver of scripts/instructions.sh; run that script to count with it");
        return;
    }
    let mode = args.first().map_or("", String::as_str).to_owned();
    let n: u64 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10_000);
    // Some layers look for a runtime (none of these requests waits on it).
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let _entered = rt.enter();
    let mut request = requests(&mode);
    for i in 0..WARM_UP {
        request(i);
    }
    measured(WARM_UP, WARM_UP + n, &mut *request);
}

/// The requests callgrind counts (`--toggle-collect` names this function): the start-up (the
/// clock's calibration, building the layer, the warm-up) is not counted, so the figure is the
/// same from run to run.
#[inline(never)]
fn measured(from: u64, to: u64, request: &mut dyn FnMut(u64)) {
    for i in from..to {
        request(i);
    }
}

/// The `i`th request of `mode`, made and answered synchronously (every service here is ready
/// at once).
fn requests(mode: &str) -> Box<dyn FnMut(u64)> {
    let layer = |style| {
        let mut policy = Policy::gcra("1/min").burst(1_000_000).name("g");
        if mode == "hot_lease" {
            policy = policy.lease(20);
        }
        let mut builder = RateLimitLayer::builder()
            .policy(policy)
            .key(PeerIp::new())
            .headers(style)
            .decision_extension(matches!(mode, "defaults" | "hot" | "hot_lease"));
        if mode.starts_with("lists") {
            let lists = Lists::new()
                .deny(["203.0.113.0/24"])
                .allow(["198.51.100.0/24"])
                .kept_in_store(mode == "lists");
            builder = builder.lists(lists);
        }
        builder.build().expect("a valid layer")
    };
    let keys: Vec<Key> = (0..10_000u64).map(Key::from).collect();
    let base = Router::new().route("/", get(|| async { "hello" }));
    let app = match mode {
        "message" => {
            let limiter = StreamLimiter::builder().messages(layer(HeaderStyle::Legacy));
            let limiter = limiter.build().expect("a valid limiter");
            let mut head = Request::get("/ws").body(()).expect("a request");
            let peer = SocketAddr::from(([10, 0, 0, 1], 1000));
            head.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let connection = now(limiter.open_head(head)).expect("a connection");
            return Box::new(move |_| {
                let admitted = now(connection.admit(100, Direction::Inbound));
                assert!(std::hint::black_box(admitted).is_ok(), "admitted");
            });
        }
        "egress" | "egress_bare" | "egress_blind" => {
            // A call to an in-process upstream, through an egress layer (learning from the
            // answer, or not) or straight.
            let upstream = tower::service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            });
            let call = || Request::get("http://api.partner.example/v1").body(());
            if mode == "egress_bare" {
                return Box::new(move |_| {
                    let response = now(upstream.oneshot(call().expect("a call")));
                    std::hint::black_box(response.expect("a response"));
                });
            }
            let egress = EgressLayer::builder()
                .policy(Policy::gcra("1/min").burst(1_000_000).name("g"))
                .learn_from_upstream(mode == "egress")
                .build()
                .expect("a valid egress layer");
            let client = tower::Layer::layer(&egress, upstream);
            return Box::new(move |_| {
                let response = now(client.clone().oneshot(call().expect("a call")));
                std::hint::black_box(response.expect("a response"));
            });
        }
        "check" => {
            let limiter = layer(HeaderStyle::Legacy);
            return Box::new(move |i| {
                let decision = now(limiter.check(&keys[(i % 10_000) as usize], 1));
                std::hint::black_box(decision.expect("a decision"));
            });
        }
        "check_two" | "check_two_gcra" | "check_fixed" => {
            // Two policies decided at once, under the shared lock; or the fixed window alone
            // (the second policy of `check_two`, on its own).
            let gcra = |name| Policy::gcra("1/min").burst(1_000_000).name(name);
            let fixed = Policy::fixed_window("1000000/h").name("b");
            let mut builder = RateLimitLayer::builder();
            builder = match mode {
                "check_two" => builder.policy(gcra("a")).policy(fixed),
                "check_two_gcra" => builder.policy(gcra("a")).policy(gcra("b")),
                _ => builder.policy(fixed),
            };
            let limiter = builder.build().expect("a valid layer");
            return Box::new(move |i| {
                let decision = now(limiter.check(&keys[(i % 10_000) as usize], 1));
                std::hint::black_box(decision.expect("a decision"));
            });
        }
        "governor_check" => {
            let burst = std::num::NonZeroU32::new(1_000_000).unwrap();
            let quota = governor::Quota::per_minute(std::num::NonZeroU32::MIN).allow_burst(burst);
            let limiter = governor::RateLimiter::keyed(quota);
            return Box::new(move |i| {
                std::hint::black_box(limiter.check_key(&keys[(i % 10_000) as usize]).is_ok());
            });
        }
        "governor" | "governor_headers" => {
            use tower_governor::GovernorLayer;
            use tower_governor::governor::GovernorConfigBuilder;
            let mut config = GovernorConfigBuilder::default();
            config.per_second(60).burst_size(1_000_000);
            if mode == "governor" {
                base.layer(GovernorLayer::new(config.finish().expect("a valid config")))
            } else {
                let config = config.use_headers().finish().expect("a valid config");
                base.layer(GovernorLayer::new(config))
            }
        }
        "bare" => base,
        "identity" => base.layer(tower::layer::util::Identity::new()),
        "headers" | "defaults" | "hot" | "hot_lease" | "lists" | "lists_given" => {
            base.layer(layer(HeaderStyle::Legacy))
        }
        "none" => base.layer(layer(HeaderStyle::None)),
        "axum_body" => base.layer(layer(HeaderStyle::None).body::<AxumBody>()),
        other => panic!("unknown mode {other:?}: see the file's documentation"),
    };
    let hot = matches!(mode, "hot" | "hot_lease");
    let mode = mode.to_owned();
    Box::new(move |i| {
        let peer = if hot {
            SocketAddr::from(([10, 0, 0, 1], 1000))
        } else {
            SocketAddr::from(([10, 0, (i / 256 % 40) as u8, (i % 256) as u8], 1000))
        };
        let mut req = Request::get("/").body(Body::empty()).expect("a request");
        // How axum's `into_make_service_with_connect_info` hands over the peer; both layers
        // read it.
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let response = now(app.clone().oneshot(req)).expect("a response");
        assert!(
            response.status().is_success(),
            "{mode}: {}",
            response.status()
        );
        std::hint::black_box(response);
    })
}
