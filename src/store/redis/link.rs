//! The store's link to Redis: the connection and how decisions call it, made by `build()`, or
//! (with [`connect_lazily`](super::RedisStoreBuilder::connect_lazily)) by a task of its own
//! that tries again with backoff until Redis answers, so that an API can start while Redis is
//! down. Until then every decision fails at once, and the layer's failure policy answers it.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::conn::{Conn, Connect, load_decision};
use super::endpoint::explain;
use super::probe;
use crate::error::StoreError;

/// The first pause between two attempts to connect in the background; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A connection, and whether decisions on it are `FCALL`s (else `EVALSHA`s).
pub(super) struct Link {
    pub(super) conn: Conn,
    pub(super) functions: bool,
}

/// Everything needed to make the link, owned, so that a task can make it.
pub(super) struct LinkPlan {
    pub(super) connect: Connect,
    /// Redis's address, for messages (no credentials).
    pub(super) target: String,
    /// Whether to load the decision as a function.
    pub(super) functions: bool,
    pub(super) prefix: String,
    /// Whether decisions read Redis's `TIME`.
    pub(super) redis_time: bool,
}

impl LinkPlan {
    /// Connects, loads the decision, and checks the user's permissions.
    pub(super) async fn link(&self) -> Result<Link, StoreError> {
        let target = &self.target;
        let fail = |what: &str, e: &dyn fmt::Display| {
            let e = e.to_string();
            match explain(&e) {
                Some(cause) => {
                    StoreError::new(format!("cannot {what} Redis at {target}: {cause} ({e})"))
                }
                None => StoreError::new(format!("cannot {what} Redis at {target}: {e}")),
            }
        };
        let conn = self.connect.connect(&fail).await?;
        let wait = self.connect.connect_timeout * 2;
        let functions = load_decision(&conn, self.functions, wait, &fail).await?;
        if probe::run(&conn, &self.prefix, self.redis_time, wait).await? == probe::Probed::Full {
            tracing::warn!(
                %target,
                "Redis is out of memory (OOM, maxmemory with noeviction): decisions fail, and the failure policy answers them, until it has room"
            );
        }
        Ok(Link { conn, functions })
    }
}

/// The link, once made, and why it is not yet.
#[derive(Default)]
pub(super) struct Linking {
    link: OnceLock<Link>,
    /// The last attempt's error, while there is no link.
    failed: Mutex<Option<String>>,
}

impl Linking {
    /// A link made already.
    pub(super) fn made(link: Link) -> Arc<Linking> {
        let linking = Linking::default();
        let _ = linking.link.set(link);
        Arc::new(linking)
    }

    /// Makes the link on a task of its own, trying again with backoff until it is made or the
    /// store is dropped.
    pub(super) fn in_background(plan: LinkPlan) -> Arc<Linking> {
        let linking = Arc::new(Linking::default());
        let weak = Arc::downgrade(&linking);
        *linking.failed.lock().unwrap() = Some("the first attempt is under way".to_owned());
        tokio::spawn(connect_until_linked(plan, weak));
        linking
    }

    /// The link, when made.
    pub(super) fn link(&self) -> Option<&Link> {
        self.link.get()
    }

    /// The link, or an error saying that Redis is not reached yet, and why.
    pub(super) fn get(&self, target: &str) -> Result<&Link, StoreError> {
        match self.link.get() {
            Some(link) => Ok(link),
            None => Err(self.not_yet(target)),
        }
    }

    #[cold]
    fn not_yet(&self, target: &str) -> StoreError {
        let why = self.error().unwrap_or_default();
        StoreError::new(format!(
            "not connected to Redis at {target} yet (connecting in the background: {why})"
        ))
    }

    /// Why there is no link yet (`None` once there is one).
    pub(super) fn error(&self) -> Option<String> {
        match self.link.get() {
            Some(_) => None,
            None => self.failed.lock().unwrap().clone(),
        }
    }
}

async fn connect_until_linked(plan: LinkPlan, linking: Weak<Linking>) {
    let mut backoff = FIRST_BACKOFF;
    let started = std::time::Instant::now();
    loop {
        let result = plan.link().await;
        let Some(linking) = linking.upgrade() else {
            return;
        };
        match result {
            Ok(link) => {
                let _ = linking.link.set(link);
                *linking.failed.lock().unwrap() = None;
                tracing::info!(
                    target = %plan.target,
                    after_ms = started.elapsed().as_millis() as u64,
                    "connected to Redis; decisions are exact from now on"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    retry_in_ms = backoff.as_millis() as u64,
                    "Redis is not reached yet; the failure policy answers decisions meanwhile"
                );
                *linking.failed.lock().unwrap() = Some(error.to_string());
            }
        }
        drop(linking);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
