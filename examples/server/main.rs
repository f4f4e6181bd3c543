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
mod help;
mod bodies;
mod config;
mod limits;
mod overload;
mod routes;
mod serve;
mod sockets;

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
        let quota = quota.trim();
        let mut policy = config.abuse.policy(Policy::new(config.algorithm, quota));
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
        let name = match (&config.policy_name, quota.parse::<tower_ratelimit::Quota>()) {
            (Some(name), _) => name.clone(),
            (None, Ok(parsed)) => format!("{}:{parsed}", config.algorithm),
            (None, Err(_)) => format!("{}:{quota}", config.algorithm),
        };
        let key = || {
            key_extractor(&config.key, &config.trusted_proxies, config.abuse.listed).map(Into::into)
        };
        builder = builder.policies(config.bodies.policies(policy, &name, key)?);
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
        builder = builder.key(key);
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
            layer
                .control()
                .top_limited_service()
                .guard(AdminGuardLayer::anyone()),
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
        .merge(bodies::routes())
        .merge(config.sockets.routes(config, layer.store().clone())?);
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
                    .control()
                    .reload(policies)
                    .map_err(|e| format!("CONFIG {path}: {e}"))?;
                // Checked before: it fails only on a malformed entry, which `lists` reports.
                layer
                    .control()
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
        print!("{}", help::HELP);
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
                let timeout = config.header_timeout;
                tokio::spawn(serve::serve(admin, router, timeout, std::future::pending()));
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
            "listening on http://{addr} | store={store} {limits}{overload}{}{} HEADERS={:?} | admin={admin} (/metrics, /admin/top) | --help lists the variables",
            config.bodies.describe(),
            config.sockets.describe(),
            config.headers,
        );
        serve::serve(listener, app, config.header_timeout, async {
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
