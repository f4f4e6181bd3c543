//! One decision in Redis: the checks encoded as one call of the decision function (or
//! script), its reply read back (`reply.rs`); on a cluster, a request's keys in different slots
//! decided at once and undone when one denies (`slots.rs`); and the store's side of the `Sealed` trait (a decision
//! under its deadline, or finished without its request).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Cmd, ErrorKind, ServerErrorKind};

use super::conn::{AnyConn, load};
use super::link::Link;
use super::script::{SCRIPT, shape};
use super::script::{flag_listed, record_alone, record_follows};
use super::{Inner, RELOAD_TIMEOUT, RedisStore, redis_key};
use crate::algorithm::compact;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::networks::Age;
use crate::store::{Check, Checks, Op};
use crate::store::{Listed, Registry, private};

mod reply;
mod slots;
use reply::{Said, decision_of, read_reply};
use slots::one_hash_slot;

/// Milliseconds added to every TTL when a clock is injected.
pub(super) const INJECTED_CLOCK_TTL_SLACK_MS: u64 = 60_000;

impl Inner {
    pub(super) async fn decision(&self, checks: &[Check]) -> Result<Decision, StoreError> {
        let link = self.linking.get(&self.target)?;
        let said = if !link.conn.is_cluster() || one_hash_slot(checks) {
            self.run(link, checks).await?
        } else {
            // Boxed, as the pools' futures are: only clusters take this path.
            let bounded = !checks.iter().any(|c| c.op().grants());
            Box::pin(self.across_hash_slots(link, checks, bounded)).await?
        };
        Ok(decision_of(checks, said))
    }

    /// The tag a check is sent with: its tier's; for a key's own limit being set, followed
    /// by `@` and its quota (limit, window, 0 for a month, and burst, 0 for none), which the
    /// script keeps with the key's state; for a calendar, followed by the boundaries of the
    /// periods around the present (which the script finds its period among).
    fn tag<'a>(&self, check: &'a Check) -> std::borrow::Cow<'a, str> {
        let tier = check.tier();
        let own = match (check.op(), tier.own_quota()) {
            (Op::Limit { .. }, Some(q)) => Some(q),
            _ => None,
        };
        let periods = tier.algorithm().periods();
        if own.is_none() && periods.is_none() {
            return std::borrow::Cow::Borrowed(tier.call_tag());
        }
        let mut tag = tier.tag().to_owned();
        if let Some(q) = own {
            let window = if q.is_monthly() {
                0
            } else {
                q.window().as_micros() as u64
            };
            let numbers = [
                u64::from(q.limit()),
                window,
                u64::from(q.burst().unwrap_or(0)),
            ];
            tag.push('@');
            tag.push_str(&numbers.map(compact).join(","));
        }
        if let Some(periods) = periods {
            tag.push_str(periods.around(self.now_micros()).text());
        }
        // The escalation, as the call tag has it after the tag.
        tag.push_str(&tier.call_tag()[tier.tag().len()..]);
        std::borrow::Cow::Owned(tag)
    }

    /// The time here: the injected clock's, else the system's (a calendar's periods are found
    /// by it; the script decides on Redis's own time).
    fn now_micros(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock.now_micros(),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        }
    }

    /// One script call deciding `checks`, whose keys must share a hash slot on a cluster.
    async fn run(&self, link: &Link, checks: &[Check]) -> Result<Said, StoreError> {
        // The key's record of list entries, last, sends no arguments (decide.lua's `listing`).
        let record = record_follows(checks);
        let command = |name: &str, script: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script).arg(checks.len());
            for check in checks {
                cmd.arg(redis_key(&self.prefix, check.tier().name(), check.key()));
            }
            let injected = self.clock.is_some();
            let sent = &checks[..checks.len() - usize::from(record)];
            if record && sent.is_empty() {
                cmd.arg(record_alone(injected));
            }
            for (i, check) in sent.iter().enumerate() {
                // The shape, the cost unless it is 1, the operation's own integers and the
                // tag, which names the algorithm and its parameters (see decide.lua).
                let id = check.tier().algorithm().algorithm().lua_id();
                let (op, cost) = (check.op(), check.cost());
                let shape = shape(id, op, cost, injected);
                cmd.arg(if record && i == 0 {
                    flag_listed(shape)
                } else {
                    shape
                });
                if cost != 1 {
                    cmd.arg(cost);
                }
                let lease_ttl = check.tier().lease().map_or(0, |l| l.ttl_us());
                cmd.arg(&op.args(lease_ttl)[..]);
                cmd.arg(&*self.tag(check));
            }
            if let Some(clock) = &self.clock {
                // Redis expires keys on its own clock, which an injected one may outrun or lag.
                cmd.arg(clock.now_micros()).arg(INJECTED_CLOCK_TTL_SLACK_MS);
            }
            cmd
        };
        let call = if link.functions {
            command("FCALL", SCRIPT.function())
        } else {
            command("EVALSHA", SCRIPT.sha())
        };
        let eval = || command("EVAL", SCRIPT.source());
        let reply: Vec<i64> = link
            .conn
            .with(|mut c| async move { self.invoke(&call, eval, &mut c).await })
            .await?;
        read_reply(checks, &reply, record)
    }
}

impl Inner {
    /// The decision's `FCALL` or `EVALSHA`; if Redis has neither the function nor the script
    /// (`NOSCRIPT` or "Function not found": after `SCRIPT FLUSH` or `FUNCTION FLUSH`, on a new
    /// node, or after a restart without persistence; the call did not run), the same call as
    /// `EVAL` with the script's source, which decides in the same step and caches the script
    /// again. A call that may have run is never retried. After a missing function, the library
    /// is loaded again by a task of its own, outside the decision and its deadline.
    ///
    /// Not `redis::Script::invoke_async`: on `NOSCRIPT` it sends `SCRIPT LOAD` and then the
    /// `EVALSHA` again, two more round trips inside the decision's deadline, and a `SCRIPT FLUSH`
    /// between the two (the test `script_flush_loses_no_decision` makes them) fails the
    /// decision; one `EVAL` carries the source and runs in the same step. It also copies every
    /// key and argument into buffers of its own before building the command we build directly.
    async fn invoke(
        &self,
        call: &Cmd,
        eval: impl FnOnce() -> Cmd,
        conn: &mut AnyConn,
    ) -> redis::RedisResult<Vec<i64>> {
        match call.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::info!("decision script missing from Redis (NOSCRIPT); sending it again");
                eval().query_async(conn).await
            }
            Err(e) if is_missing_function(&e) => {
                tracing::info!("decision function missing from Redis; loading it again");
                self.reload.store(true, Ordering::Release);
                eval().query_async(conn).await
            }
            Err(e) => match conn.redirected(&e, call).await {
                Some(reply) => reply,
                None => Err(e),
            },
            other => other,
        }
    }
}

impl Inner {
    /// Loads the decision library again, after a decision found it missing; one load at a
    /// time.
    pub(super) async fn reload_function(self: Arc<Self>) {
        if self.reloading.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(link) = self.linking.get(&self.target) else {
            return;
        };
        match load(&link.conn, true, RELOAD_TIMEOUT).await {
            Ok(()) => tracing::info!("decision function loaded again"),
            Err(error) => tracing::warn!(%error, "could not load the decision function again"),
        }
        self.reloading.store(false, Ordering::Release);
    }
}

/// Whether `e` says the function called is not loaded.
fn is_missing_function(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The decision of `checks` from the script's `reply` (for the fuzz targets).
#[cfg(fuzzing)]
pub(crate) fn read_decision(checks: &[Check], reply: &[i64]) -> Result<Decision, StoreError> {
    read_reply(checks, reply, record_follows(checks)).map(|said| decision_of(checks, said))
}

/// How long after its deadline a late decision that took something is awaited, to give it
/// back: past it, what it took stays taken until its lease ends.
const LATE_REPLY_WAIT: Duration = Duration::from_secs(60);

impl Inner {
    /// The error of a decision that missed its deadline, whose connection is checked.
    pub(super) fn missed_deadline(&self) -> StoreError {
        if let Some(link) = self.linking.link() {
            link.conn.missed_deadline();
        }
        StoreError::with_kind(
            StoreErrorKind::Timeout,
            format!("no decision from Redis within {:?}", self.deadline),
        )
    }

    /// `checks` decided within the deadline; past it, the decision goes on on a task of its
    /// own (for at most [`LATE_REPLY_WAIT`]) and, when it comes, what it took (a concurrency
    /// slot, a lease's units, a waiting request's booked time) is given back: the request
    /// got the failure policy's answer, and never holds them.
    async fn deciding_past_deadline(
        self: Arc<Self>,
        checks: Checks,
    ) -> Result<Decision, StoreError> {
        // The checks travel with the decision, for a late one to give back what it took.
        let inner = self.clone();
        let mut deciding = Box::pin(async move {
            let result = inner.decision(&checks).await;
            (checks, result)
        });
        match tokio::time::timeout(self.deadline, &mut deciding).await {
            Ok((_, result)) => result,
            Err(_) => {
                let error = self.missed_deadline();
                tokio::spawn(async move {
                    let late = tokio::time::timeout(LATE_REPLY_WAIT, deciding).await;
                    if let Ok((checks, Ok(late))) = late {
                        self.give_back(&checks, &late).await;
                    }
                });
                Err(error)
            }
        }
    }

    /// Gives back what `decision` of `checks` took, in one more call.
    async fn give_back(&self, checks: &[Check], decision: &Decision) {
        let mut undo = Checks::new();
        for (c, o) in checks.iter().zip(decision.outcomes()) {
            let Some(grant) = o.grant() else { continue };
            if let Some(op) = c.op().undo(o.is_allowed(), grant.units, Some(grant.end)) {
                undo.push(Check::new(
                    c.tier().clone(),
                    c.key().clone(),
                    grant.units,
                    op,
                ));
            }
        }
        if undo.is_empty() {
            return;
        }
        metrics::counter!("ratelimit_late_replies_given_back_total").increment(1);
        if let Err(error) = self.decision(&undo).await {
            tracing::warn!(%error, "could not give back what a late decision took");
        }
    }
}

#[allow(private_interfaces)]
impl private::Sealed for RedisStore {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'static>>;

    fn check(&self, checks: Checks) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            // A decision that may take what must be given back (slots, a lease's units,
            // booked time) is awaited past its deadline, to give back what it took.
            let takes = checks.iter().any(|c| c.op().grants());
            let result = if takes {
                inner.clone().deciding_past_deadline(checks).await
            } else if inner.across_slots(&checks) {
                // Each slot's script is cut at the deadline, and a denial stands.
                inner.decision(&checks).await
            } else {
                match tokio::time::timeout(inner.deadline, inner.decision(&checks)).await {
                    Ok(result) => result,
                    Err(_) => Err(inner.missed_deadline()),
                }
            };
            if inner.reload.swap(false, Ordering::AcqRel) {
                tokio::spawn(inner.reload_function());
            }
            result
        })
    }

    fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn keep_entry(&self, key: Key, deny: bool, us: u64, now_us: u64) -> private::KeptEntry {
        let inner = self.inner.clone();
        Box::pin(async move { inner.keep_entry(key, deny, us, now_us).await })
    }

    fn store_network(&self, entry: Listed, remove: bool, now_us: u64) -> private::StoredNetworks {
        let inner = self.inner.clone();
        Box::pin(async move { inner.store_network(entry, remove, now_us).await })
    }

    /// On a task of its own, one at a time; outside a runtime, not read (and not waited for).
    fn read_networks(&self, now_us: u64) -> Option<private::ReadingNetworks> {
        let networks = self.inner.registry.networks();
        let age = networks.age(now_us);
        if age == Age::Fresh {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let inner = self.inner.clone();
        let start = move || drop(runtime.spawn(inner.read_networks(now_us)));
        if age == Age::Aging {
            if networks.claim() {
                start();
            }
            return None;
        }
        let inner = self.inner.clone();
        Some(Box::pin(async move {
            inner.registry.networks().fresh(now_us, start).await;
        }))
    }

    /// On a task of its own; outside a runtime, the slots the decision took stay taken until
    /// their lease ends, and a warning says so.
    fn finish_detached(&self, decision: Self::Future, then: Box<dyn FnOnce(Decision) + Send>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to finish an abandoned decision on");
            return;
        };
        runtime.spawn(async move {
            if let Ok(decision) = decision.await {
                then(decision);
            }
        });
    }

    /// Polled once at once, which queues the command on the connection (a multiplexed
    /// connection sends its commands in the order they are queued: this instance's next
    /// decision on the key, for a client's next request, comes after it), then finished by a
    /// task of its own. Outside a runtime (a future dropped after its runtime shut down), the
    /// units stay spent until their lease ends, and a warning says so.
    fn check_detached(&self, checks: Checks) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to give units back to the store on");
            return;
        };
        let mut decision = self.check(checks);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match decision.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(error)) => {
                tracing::warn!(%error, "could not give units back to the store");
            }
            std::task::Poll::Ready(Ok(_)) => {}
            std::task::Poll::Pending => {
                runtime.spawn(async move {
                    if let Err(error) = decision.await {
                        tracing::warn!(%error, "could not give units back to the store");
                    }
                });
            }
        }
    }
}
