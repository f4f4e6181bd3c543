//! The demo server: an axum app behind a `RateLimitLayer`, configured by environment variables.
//!
//! ```text
//! cargo run --example server
//! for i in $(seq 1 15); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! ```
//!
//! Run `cargo run --example server -- --help` for the variables.
//!
//! `GET /metrics` (Prometheus) and `GET /admin/top` (the keys limited most) are never rate
//! limited, and are served on `ADMIN_BIND` instead of `BIND` when it is set.
//!
//! `config.rs` reads the variables, `routes.rs` has the routes that show the layer at work
//! (`/login`, `/slow`, `/spend`, `/stream`); this file builds the layer and serves.

mod abuse;
mod bodies;
mod config;
mod limits;
mod overload;
mod routes;
mod serve;

use std::process::ExitCode;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_ratelimit::admin::AdminGuardLayer;
use tower_ratelimit::axum::AxumBody;
use tower_ratelimit::body::Wrapped;
use tower_ratelimit::key::Cidr;
use tower_ratelimit::request_body::Read;
use tower_ratelimit::top::TopLimited;
use tower_ratelimit::{Policy, RateLimitLayer, RedisStore, Store, policy::Reserve};

use config::{Config, config, key_extractor, read_limits, source};
use routes::{login, slow, spend, stream};

const HELP: &str = "\
tower-ratelimit demo server

Environment variables:
  BIND        address to listen on                  (default 127.0.0.1:3000)
  ADMIN_BIND  address of /metrics and /admin/top, to keep them off the public address
                                                    (default unset: served on BIND)
  ADMIN_TOKEN the bearer token /admin/* ask for (16 or more of letters, digits and
              -._~+/=); without it they answer loopback clients only, and the server
              will not start with them on an address other machines reach
                                                    (default unset)
  CONFIG      a TOML file of policies, e.g. examples/limits.toml, instead of ALGORITHM,
              RATE_LIMIT, KEY, TRUSTED_PROXIES, LEASE, WAIT_MS, CONCURRENCY, PRIORITY_HEADER,
              RESERVE, DENY, ALLOW, NEAR_LIMIT and BLOCK_* (which it replaces; setting both
              is an error). Reloaded on SIGHUP, keeping every key's
              usage; a file with a mistake is rejected and the old limits stay.
                                                    (default unset)
  REDIS_URL   unset: in-memory store; set: Redis (the server starts while Redis is down;
              ON_STORE_ERROR answers until it is up), e.g. redis://127.0.0.1:6379,
              redis+cluster://127.0.0.1:7000,127.0.0.1:7001 for a Redis Cluster, or
              redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster for the primary
              Redis Sentinel names; rediss://, rediss+cluster:// and rediss+sentinel://
              are TLS, trusting the system's roots unless REDIS_CA is set
                                                    (default unset)
  REDIS_USERNAME, REDIS_PASSWORD
              with REDIS_URL: the Redis ACL user and its password (or REDIS_PASSWORD
              alone, for requirepass), kept out of the URL (default unset)
  REDIS_CA    with a TLS REDIS_URL: a PEM file of the CA that signed Redis's certificate
                                                    (default unset: the system's roots)
  REDIS_CLIENT_CERT, REDIS_CLIENT_KEY
              with a TLS REDIS_URL: PEM files of the certificate and key this server
              presents to a Redis that asks for one (mutual TLS)  (default unset)
  PREFIX      key prefix in Redis                   (default rl:)
  PER_THREAD_READS
              without REDIS_URL: true gives the memory store's shards a reader lock per
              thread group, for hot keys decided on many cores; false one lock each
              (default unset: the layer chooses; true for one GCRA, or for two
              to four GCRAs and fixed windows)
  PRIORITY_HEADER, RESERVE
              a request header naming a request's priority, and the percent of each
              RATE_LIMIT policy kept for requests whose header says critical: the
              others are refused once they used the rest (e.g. PRIORITY_HEADER=x-priority
              RESERVE=20: the others get 80%)                (default unset)
  WORK_CAPACITY
              adds GET /work?ms=M (M defaults to 20): a backend that serves this many
              requests at a time, each taking M ms, the others queueing, so that its
              latency grows with its load as a database's does   (default unset)
  ADAPTIVE    gradient2 | aimd: an adaptive concurrency limit on GET /work, moved by
              the latency it sees; over it, 503 (temporary-reduced-capacity)
                                                    (default unset)
  ADAPTIVE_MIN, ADAPTIVE_MAX
              the adaptive limit's bounds                   (default 4 and 1000)
  ADAPTIVE_TIMEOUT_MS
              with ADAPTIVE=aimd: a request slower than this counts as a failure
              (default: twice the unloaded round trip AIMD learns)
  MAX_KEYS    without REDIS_URL: the most keys the memory store holds (default 100000)
  ON_STORE_ERROR
              what to do when Redis fails or is slow: open (let requests through),
              closed (503), local (decide in memory, each instance with the full limit)
                                                    (default open)
  STORE_TIMEOUT_MS
              the deadline of one decision in Redis, in milliseconds (default 50)
  ALGORITHM   gcra | token_bucket | leaky_bucket | fixed_window | sliding_window | sliding_log
              (default gcra; fixed_window with TIME_ZONE or a monthly RATE_LIMIT)
  RATE_LIMIT  a quota such as 10/s, 100/min, 20/10s, 2000/week, 10000/month, or several
              separated by commas, all enforced at once, e.g. 10/s,1000/h (default 10/s)
  POLICY_NAME the name of the RATE_LIMIT policy (of one quota), as 429 bodies, metrics
              and /admin/limits name it (default ALGORITHM:QUOTA, e.g. gcra:10/s)
  TIME_ZONE   every RATE_LIMIT policy of a day, a week or a month counts the calendar
              periods of this IANA zone, e.g. Europe/Paris: a day from local midnight, a
              month from the 1st (default unset: windows from the Unix epoch; a month
              in UTC)
  WEEK_STARTS, MONTH_STARTS
              the day calendar weeks start on (e.g. sunday; default monday) and the
              day of the month months start on (1 to 31; default 1)
  LEASE       with REDIS_URL: units each instance takes of a key at once and admits
              from without asking Redis, until spent or a lease ends (default unset:
              every request asks Redis)
  WAIT_MS     a request over the limit that a time within this many milliseconds
              admits waits for it instead of getting 429 (at most 3600000; default
              unset: never wait; not with LEASE)
  CONCURRENCY at most this many requests per key in flight at once, across every
              instance (default unset: no concurrency limit)
  CONCURRENCY_MAX_MS
              with CONCURRENCY: how long a slot is held at most, so that the slots of an
              instance that died are freed (default 60000)
  COST_HEADER every RATE_LIMIT policy admits a request on an estimate of 1 unit, then
              settles it at what the response header of this name says it cost (GET
              /spend sets it), past the limit if need be: a key in debt gets 429 until
              time pays it back              (default unset: a request costs 1)
  COST_BODY   bytes: the same, settled at the bytes the response body sent (GET
              /stream sends them), counted as it streams; json:<pointer>, e.g.
              json:/usage/total_tokens: at the number there in the response's JSON, or
              in its last server-sent event's (GET /llm sends them)
              (default unset; not with COST_HEADER)
  HEADERS     legacy (X-RateLimit-*) | ietf (RateLimit-Policy, RateLimit) | both
                                                    (default legacy)
  KEY         ip | client_ip | global | header:<name> (default ip)
              ip: the socket peer; client_ip: the client behind TRUSTED_PROXIES
  TRUSTED_PROXIES
              with KEY=client_ip, DENY or ALLOW: comma-separated networks or addresses of
              the proxies in front of the server, e.g. 10.0.0.0/8,2001:db8::/32;
              X-Forwarded-For is read only from them, from the right
                                                    (default empty: trust no proxy)
  DENY        comma-separated networks, addresses or keys answered 403 (problem+json),
              e.g. 203.0.113.0/24,2001:db8:bad::/48,scraper-7; a network is matched
              against the client's address (behind TRUSTED_PROXIES), a key against the
              key of KEY                                    (default unset)
  ALLOW       the same, never limited nor counted; a request on both lists is denied
                                                    (default unset)
  BLOCK_FOR   a key a RATE_LIMIT policy denies is blocked this long (e.g. 10s), denied
              whatever its state; each new block within a day doubles it (default unset)
  BLOCK_AFTER with BLOCK_FOR: block at this many denials within a minute (default 1)
  BLOCK_MAX   with BLOCK_FOR: the longest block (default 1h)
  BODY_KEY    a JSON pointer, e.g. /params/name: the value there in the request's JSON
              body joins KEY's key (KEY=ip BODY_KEY=/params/name: per client and tool);
              a body without it is keyed (missing), limited as any other (default unset)
  BODY_COST   a JSON pointer, e.g. /max_tokens: every RATE_LIMIT policy charges the
              number there in the request's JSON body; absent, negative or fractional
              is answered 400 (problem+json), charged nothing       (default unset)
  JSONRPC     true: the JSON-RPC method joins KEY's key (tools/call:<name> for an MCP
              tool call); a batch is charged per call in one decision, all or none,
              and a denied batch names its calls over       (default false)
  GRAPHQL_COST
              true: every RATE_LIMIT policy charges the calculated cost of the GraphQL
              query in the JSON body (every field 1; first or last multiply their
              field's selection; fragments expanded): { viewer { repositories(first: 10)
              { nodes { name stars } } } } costs 32; a query that does not parse, or
              is deeper than GRAPHQL_MAX_DEPTH fields, is answered 400 (default false)
  GRAPHQL_MAX_DEPTH
              with GRAPHQL_COST: the deepest query allowed, in fields (default 10)
  BODY_LIMIT  the most bytes of a body read for BODY_KEY, BODY_COST, JSONRPC and
              GRAPHQL_COST; more is answered 413, a body not all there within 10 s
              408, a body that is not JSON 400, none of them charged (default 65536)
  NEAR_LIMIT  warn when a key has used this percent of a RATE_LIMIT policy, e.g. 80:
              once per key and window, counted in ratelimit_near_limit_total on /metrics,
              the key listed in near_keys on /admin/top   (default unset)

Routes:
  GET /        rate limited, answers 200 with a short text
  POST /login  rate limited, answers 401 unless the header x-password is \"letmein\"
  GET /reports, GET /exports/{id}
               rate limited, answer 200 (routes of examples/limits.toml)
  GET /slow?ms=<n>
               rate limited, answers after n milliseconds (at most 10000), to see
               CONCURRENCY at work
  GET /spend?cost=<n>
               rate limited, answers 200 with the COST_HEADER header (x-cost when unset)
               set to n, the response's real cost for COST_HEADER
  GET /stream?bytes=<n>
               rate limited, streams n bytes (at most 10000000) in chunks of 1000, the
               response's real cost for COST_BODY=bytes
  POST /echo   rate limited, answers the request body as it came
  POST /mcp    rate limited, answers a JSON-RPC result for each call (an array for a
               batch), naming its method and tool
  POST /graphql
               rate limited, answers {\"data\":null}
  GET /llm?tokens=<n>[&stream=true]
               rate limited, answers {\"usage\":{\"total_tokens\":n}}, or with
               stream=true three server-sent events, the last carrying that usage
  GET /health  never limited
  GET /metrics every metric of the layer, in Prometheus text format, with the server's
               live tokio tasks (demo_tasks_alive) and the memory store's keys
               (demo_memory_store_keys); never limited
  GET /admin/top?policy=<name>&n=<count>
               the keys each policy denied most over the last minute, as JSON (policy
               and n are optional; n defaults to 10); never limited
  PUT /admin/limits/<policy>/<key>?quota=<quota>&until=<unix seconds>
               gives one key a limit of its own, e.g. quota=100/min, on every instance
               sharing the store, its usage kept, until the time given (optional: a
               year); 204, or 400 naming a bad parameter; never limited
  DELETE /admin/limits/<policy>/<key>
               ends it: the key is back under its policy's quota; 204
  PUT /admin/deny/<key>?until=<unix seconds>, PUT /admin/allow/<key>?until=...
               puts a key (as KEY names it) on the deny or allow list, on every instance
               sharing the store from its next request, until the time given (optional:
               until deleted); 204, or 400 naming a bad parameter; 409 with LEASE,
               whose leases are spent without asking Redis. An entry with a / is a
               network (127.0.0.0%2F24): its clients' addresses are on the list, on this
               instance at once and on the others within a second
  DELETE /admin/deny/<key>, DELETE /admin/allow/<key>
               takes it off; 204
  With ADMIN_BIND set, /metrics and /admin/* are answered there, and not on BIND.
  /admin/* answer the holder of ADMIN_TOKEN (Authorization: Bearer <token>), or without
  it loopback clients naming localhost or an IP address as Host only (401 or 403
  otherwise); /metrics is open where they are served.
";

/// The file's policies, or one policy per quota in `RATE_LIMIT`, all with the chosen
/// algorithm.
fn policies<St: Store, R>(
    config: &Config,
    mut builder: tower_ratelimit::RateLimitLayerBuilder<St, R>,
) -> Result<tower_ratelimit::RateLimitLayerBuilder<St, R>, String> {
    if let Some((path, limits)) = &config.file {
        let policies = limits
            .policies()
            .map_err(|e| format!("CONFIG {path}: {e}"))?;
        return Ok(builder
            .policies(policies)
            .headers(config.headers)
            .on_store_error(config.on_store_error));
    }
    let quotas: Vec<&str> = config.rate_limit.split(',').collect();
    if config.policy_name.is_some() && quotas.len() > 1 {
        return Err(
            "POLICY_NAME names the one policy of RATE_LIMIT, which has several quotas; drop it (each is then named ALGORITHM:QUOTA)".into(),
        );
    }
    for quota in quotas {
        let mut policy = config
            .abuse
            .policy(Policy::new(config.algorithm, quota.trim()));
        if let Some(name) = &config.policy_name {
            policy = policy.name(name.as_str());
        }
        if let Some(units) = config.lease {
            policy = policy.lease(units);
        }
        if let Some(wait) = config.wait {
            policy = policy.wait_up_to(wait);
        }
        if let Some(settle) = &config.settle {
            policy = policy.cost(|_| 1).settle(settle.clone());
        }
        if let Some(calendar) = &config.calendar {
            policy = policy.calendar(calendar.clone());
        }
        if let Some((header, percent)) = &config.reserve {
            let others = 100 - percent;
            let reserve = Reserve::header(header)
                .share("critical", 100)
                .others(others);
            policy = policy.reserve(reserve);
        }
        // Last: BODY_COST replaces the estimate of 1 a settled policy starts from.
        builder = builder.policy(config.bodies.policy(policy));
    }
    if let Some((n, max)) = config.concurrency {
        builder = builder.policy(Policy::concurrency(n).max_duration(max));
    }
    Ok(builder
        .headers(config.headers)
        .on_store_error(config.on_store_error))
}

/// The public app and the admin routes.
struct Apps {
    public: Router,
    admin: Router,
}

/// The apps, and the store's description that `describe` gives once the layer is built;
/// `/metrics` shows the keys `keys` counts in the store, if it counts them.
fn app<St: Store>(
    config: &Config,
    store: St,
    metrics: PrometheusHandle,
    describe: impl FnOnce(&St) -> String,
    keys: fn(&St) -> Option<usize>,
) -> Result<(Apps, String), String> {
    let mut builder = RateLimitLayer::builder()
        .store(store)
        .top_limited(TopLimited::new())
        .lists(abuse::lists(config)?);
    if config.file.is_none() {
        let listed = config.abuse.listed;
        let key = key_extractor(&config.key, &config.trusted_proxies, listed)?;
        builder = builder.key(config.bodies.key(key.into()));
    }
    let adaptive = config
        .overload
        .as_ref()
        .and_then(overload::Overload::policy);
    let layer = policies(config, builder)?
        .policies(adaptive.clone())
        .read_bodies(config.bodies.limits)
        .build()
        .map_err(|e| format!("{}: {e}", source(config)))?;
    let described = describe(layer.store());
    if let Some((path, _)) = &config.file {
        reload_on_sighup(layer.clone(), path.clone(), adaptive);
    }
    let store = layer.store().clone();
    // Every /admin route behind the guard: ADMIN_TOKEN's holder, or loopback clients only.
    let guard = AdminGuardLayer::token_or_loopback(config.admin_token.clone());
    let admin = Router::new()
        .route_service(
            "/admin/top",
            layer.top_limited_service().guard(AdminGuardLayer::anyone()),
        )
        .merge(limits::routes(layer.clone()))
        .merge(abuse::routes(layer.clone(), abuse::lists_follow(config)))
        .route_layer(guard)
        .route(
            "/metrics",
            get(move || {
                gauges(keys(&store));
                let text = metrics.render();
                async move { ([("content-type", "text/plain; version=0.0.4")], text) }
            }),
        );
    let cost_header = config.cost_header.clone();
    let public = Router::new()
        .route("/", get(|| async { "hello from tower-ratelimit\n" }))
        .route("/slow", get(slow))
        .route("/login", post(login))
        .route("/reports", get(|| async { "reports\n" }))
        .route("/exports/{id}", get(|| async { "export\n" }))
        .route(
            "/spend",
            get(move |axum::extract::Query(q)| spend(cost_header.clone(), q)),
        )
        .route("/stream", get(stream))
        .merge(bodies::routes());
    let public = match &config.overload {
        Some(overload) => public.route("/work", overload.route()),
        None => public,
    };
    let public = public
        // Responses in axum's own body: axum does not box them again.
        .route_layer(layer.body::<AxumBody>())
        .route("/health", get(|| async { "ok\n" }));
    Ok((Apps { public, admin }, described))
}

/// The process's own gauges, set when `/metrics` is read: its live tokio tasks and the memory
/// store's keys (`keys`, when the store is in memory).
fn gauges(keys: Option<usize>) {
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    metrics::gauge!("demo_tasks_alive").set(tasks as f64);
    if let Some(keys) = keys {
        metrics::gauge!("demo_memory_store_keys").set(keys as f64);
    }
}

/// The Prometheus recorder of every metric the layer emits, its histograms with buckets from
/// 0.1 ms to 10 s.
fn prometheus() -> Result<PrometheusHandle, String> {
    let buckets = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        10.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .and_then(|b| b.install_recorder())
        .map_err(|e| format!("metrics: {e}"))?;
    tower_ratelimit::telemetry::describe_metrics();
    // The recorder keeps histogram samples until upkeep folds them into the buckets.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Reads the policy file again on each `SIGHUP` and swaps the layer's policies, keeping
/// every key's usage; a file with a mistake is rejected, and the old limits stay.
fn reload_on_sighup<St: Store>(
    layer: RateLimitLayer<St, Wrapped, Read>,
    path: String,
    adaptive: Option<Policy>,
) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            eprintln!("CONFIG {path}: cannot listen for SIGHUP; the file will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            let reloaded = read_limits(&path).and_then(|limits| {
                let mut policies = limits
                    .policies()
                    .map_err(|e| format!("CONFIG {path}: {e}"))?;
                policies.extend(adaptive.clone());
                let lists = limits.lists().map_err(|e| format!("CONFIG {path}: {e}"))?;
                let report = layer
                    .reload(policies)
                    .map_err(|e| format!("CONFIG {path}: {e}"))?;
                // Checked before: it fails only on a malformed entry, which `lists` reports.
                layer
                    .reload_lists(&lists)
                    .map_err(|e| format!("CONFIG {path}: {e}"))?;
                Ok(report)
            });
            match reloaded {
                Ok(report) => println!("reloaded CONFIG {path}: {report}"),
                Err(e) => eprintln!("{e}; the file was not reloaded, the old limits stay"),
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (layer, path, adaptive);
}

/// Prints why the store is not connected to Redis yet, each time the reason changes, and
/// when it connects.
fn report_connection(store: RedisStore) {
    tokio::spawn(async move {
        let mut said = Some(String::new());
        loop {
            let now = store.connection_error();
            if now != said {
                match &now {
                    Some(error) => eprintln!("redis: not connected yet: {error}"),
                    None => eprintln!("redis: connected; decisions are exact"),
                }
            }
            if now.is_none() {
                return;
            }
            said = now;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
}

/// The apps and a description of their store.
async fn build(config: &Config) -> Result<(Apps, String), String> {
    let metrics = prometheus()?;
    // Check the key before connecting, so a typo is reported as such.
    if config.file.is_none() {
        let key = key_extractor(&config.key, &config.trusted_proxies, config.abuse.listed)?;
        config.abuse.check(key)?;
    }
    match &config.redis_url {
        None => {
            let mut store = tower_ratelimit::MemoryStore::builder();
            if let Some(yes) = config.per_thread_reads {
                store = store.per_thread_reads(yes);
            }
            if let Some(n) = config.max_keys {
                store = store.max_keys(n);
            }
            app(
                config,
                store.build(),
                metrics,
                |store| format!("memory PER_THREAD_READS={}", store.per_thread_reads()),
                |store| Some(store.len()),
            )
        }
        Some(url) => {
            // Check the quota before connecting, so a typo is reported as such.
            policies(config, RateLimitLayer::builder())?
                .read_bodies(config.bodies.limits)
                .build()
                .map_err(|e| format!("{}: {e}", source(config)))?;
            // The server starts while Redis is down: ON_STORE_ERROR answers until it is up.
            let store = config
                .redis_access
                .apply(RedisStore::builder(url))
                .prefix(config.prefix.as_str())
                .deadline(config.store_timeout)
                .connect_lazily(true)
                .build()
                .await
                .map_err(|e| format!("REDIS_URL: {e}"))?;
            // A Redis that is up is connected within milliseconds: give it a second, so that
            // the first requests are decided by it, then start anyway.
            for _ in 0..100 {
                if store.is_connected() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            report_connection(store.clone());
            let described = format!(
                "redis prefix={} ON_STORE_ERROR={:?} STORE_TIMEOUT_MS={} LEASE={}",
                config.prefix,
                config.on_store_error,
                config.store_timeout.as_millis(),
                config.lease.map_or("off".into(), |u| u.to_string())
            );
            app(config, store, metrics, |_| described, |_| None)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let result = async {
        let config = config()?;
        let (apps, store) = build(&config).await?;
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|e| format!("BIND: cannot listen on {}: {e}", config.bind))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (app, admin) = match config.admin_bind {
            None => (apps.public.merge(apps.admin), format!("http://{addr}")),
            Some(admin_bind) => {
                let admin = tokio::net::TcpListener::bind(admin_bind)
                    .await
                    .map_err(|e| format!("ADMIN_BIND: cannot listen on {admin_bind}: {e}"))?;
                let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
                let router = apps.admin;
                tokio::spawn(serve::serve(admin, router, std::future::pending()));
                (apps.public, format!("http://{admin_addr}"))
            }
        };
        let limits = match &config.file {
            Some((path, limits)) => {
                let names: Vec<&str> = limits
                    .policy_configs()
                    .iter()
                    .map(|p| p.name().unwrap_or("unnamed"))
                    .collect();
                format!("CONFIG={path} ({}; SIGHUP reloads it)", names.join(", "))
            }
            None => format!(
                "algorithm={} RATE_LIMIT={} WAIT_MS={} CONCURRENCY={} KEY={}{}",
                config.algorithm,
                config.rate_limit,
                config.wait.map_or("off".into(), |w| w.as_millis().to_string()),
                config.concurrency.map_or("off".into(), |(n, max)| {
                    format!("{n} (max {} ms)", max.as_millis())
                }),
                config.key,
                if config.key == "client_ip" {
                    let list: Vec<String> =
                        config.trusted_proxies.iter().map(Cidr::to_string).collect();
                    format!(" TRUSTED_PROXIES={}", list.join(","))
                } else {
                    String::new()
                },
            ),
        };
        let overload = config.overload.as_ref().map_or(String::new(), |o| o.describe());
        println!(
            "listening on http://{addr} | store={store} {limits}{overload}{} HEADERS={:?} | admin={admin} (/metrics, /admin/top) | --help lists the variables",
            config.bodies.describe(),
            config.headers,
        );
        serve::serve(listener, app, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok::<(), String>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}
