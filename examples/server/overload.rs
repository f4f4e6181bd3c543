//! The service as its own bottleneck: `GET /work` (`WORK_CAPACITY`), a backend whose latency
//! grows with its load as a database's does, and the adaptive concurrency limit in front of
//! it (`ADAPTIVE`, `ADAPTIVE_MIN`, `ADAPTIVE_MAX`, `ADAPTIVE_TIMEOUT_MS`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::http::StatusCode;
use tokio::sync::Semaphore;
use tower_ratelimit::{Policy, policy::Adaptive};

use crate::config::{env_or, positive};

/// What `/work` is, and the adaptive limit on it.
#[derive(Clone, Debug)]
pub(crate) struct Overload {
    /// Requests `/work` serves at once.
    capacity: usize,
    adaptive: Option<Adaptive>,
}

/// `WORK_CAPACITY` and `ADAPTIVE` (with its bounds), checked.
pub(crate) fn read() -> Result<Option<Overload>, String> {
    let capacity = positive("WORK_CAPACITY")?;
    let (min, max) = (positive("ADAPTIVE_MIN")?, positive("ADAPTIVE_MAX")?);
    let adaptive = match env_or("ADAPTIVE", "")?.as_str() {
        "" if min.is_some() || max.is_some() => {
            return Err("ADAPTIVE_MIN and ADAPTIVE_MAX bound ADAPTIVE; set it too".into());
        }
        "" => None,
        "gradient2" => Some(Adaptive::gradient2()),
        "aimd" => Some(Adaptive::aimd()),
        other => return Err(format!("ADAPTIVE: {other:?} is neither gradient2 nor aimd")),
    };
    // AIMD's latency threshold: unless set, twice the unloaded round trip it learns.
    let adaptive = match (positive("ADAPTIVE_TIMEOUT_MS")?, adaptive) {
        (None, adaptive) => adaptive,
        (Some(ms), Some(a)) if env_or("ADAPTIVE", "")? == "aimd" => {
            Some(a.timeout(Duration::from_millis(u64::from(ms))))
        }
        (Some(_), _) => {
            return Err(
                "ADAPTIVE_TIMEOUT_MS: the latency past which AIMD counts a request as failed; set ADAPTIVE=aimd too"
                    .into(),
            );
        }
    };
    let adaptive = adaptive.map(|a| {
        let a = min.map_or(a, |n| a.min(n));
        max.map_or(a, |n| a.max(n))
    });
    // The bounds checked here, so that their mistake names them.
    if let Some(adaptive) = adaptive {
        let alone = tower_ratelimit::RateLimitLayer::builder()
            .policy(Policy::adaptive_concurrency(adaptive))
            .build();
        if let Err(e) = alone {
            let named = match (min, max) {
                (Some(_), Some(_)) => "ADAPTIVE_MIN, ADAPTIVE_MAX",
                (Some(_), None) => "ADAPTIVE_MIN",
                (None, Some(_)) => "ADAPTIVE_MAX",
                (None, None) => "ADAPTIVE",
            };
            return Err(format!("{named}: {e} (ADAPTIVE_MAX is 1000 unless set)"));
        }
    }
    match (capacity, adaptive) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            Err("ADAPTIVE: limits GET /work, which WORK_CAPACITY adds; set it too".into())
        }
        (Some(n), adaptive) => Ok(Some(Overload {
            capacity: n as usize,
            adaptive,
        })),
    }
}

impl Overload {
    /// The adaptive limit of `GET /work`, if there is one.
    pub(crate) fn policy(&self) -> Option<Policy> {
        let adaptive = self.adaptive?;
        let policy = Policy::adaptive_concurrency(adaptive).name("work");
        Some(policy.route(Some(axum::http::Method::GET), "/work"))
    }

    /// What it is, for the start-up line.
    pub(crate) fn describe(&self) -> String {
        let adaptive = self.adaptive.map_or("off".into(), |a| format!("{a:?}"));
        format!(" WORK_CAPACITY={} ADAPTIVE={adaptive}", self.capacity)
    }

    /// `GET /work?ms=<n>`: serves `capacity` requests at a time, each taking n milliseconds
    /// (20 unless given, at most 10,000); the others wait their turn.
    pub(crate) fn route(&self) -> axum::routing::MethodRouter {
        let backend = Arc::new(Semaphore::new(self.capacity));
        axum::routing::get(
            move |Query(q): Query<std::collections::HashMap<String, String>>| {
                let backend = backend.clone();
                async move {
                    let bad = (
                        StatusCode::BAD_REQUEST,
                        "ms must be a number from 0 to 10000\n",
                    );
                    let ms: u64 = match q.get("ms") {
                        None => 20,
                        Some(ms) => ms.parse().map_err(|_| bad)?,
                    };
                    if ms > 10_000 {
                        return Err(bad);
                    }
                    let _turn = backend.acquire().await.expect("never closed");
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(format!("worked {ms} ms\n"))
                }
            },
        )
    }
}
