//! Networks put on the allow or deny list at runtime
//! ([`RateLimitControl::deny_network`](crate::RateLimitControl::deny_network)). A key's entry is
//! one state the store reads with the key's decision; a network names no key, and a request
//! would have to ask for every network its address could be in. Networks listed at runtime
//! are few, so every instance holds all of them ([`Networks`], in the store's registry) and
//! matches a request's client address against them without a store call. In memory the
//! registry's are the store's own. With Redis they are also kept in one string under the
//! store's prefix (`<prefix>!networks`), one line per entry, changed by one script; a request
//! is never decided on networks read longer ago than [`READ_EVERY`] (on the layer's clock): a
//! request that finds them older waits for a read (one for every request that finds it so),
//! and one that finds them older than [`READ_AHEAD`] starts one it does not wait for, so that
//! steady traffic never waits. A read that fails keeps what was last read. An instance's own change is applied to what it holds as
//! the change itself, never as the string the store answers: replies are applied by the tasks
//! that wait for them, in whatever order those run, and a string read before a change must not
//! undo it when its task runs after the change's (a read begun before a change made here is
//! dropped; the next one sees it).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::key::Cidr;

/// The most networks listed at runtime at once: each is compared with every request's address.
pub(crate) const MOST: usize = 1_000;

/// The oldest networks stored in Redis a request is decided on: a request that finds the last
/// read begun longer ago waits for a new one.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const READ_EVERY: Duration = Duration::from_secs(1);

/// The age of the last read from which a request starts a new one without waiting for it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const READ_AHEAD: Duration = Duration::from_millis(500);

/// How fresh the networks read from the store are for a request ([`Networks::age`]).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Age {
    /// Read less than [`READ_AHEAD`] ago.
    Fresh,
    /// Read less than [`READ_EVERY`] ago: the request goes on, and a new read starts.
    Aging,
    /// Never read, or [`READ_EVERY`] ago or more: the request waits for a new read.
    Stale,
}

/// Where a change of a network entry was stored ([`Sealed::store_network`](super::private::Sealed::store_network)).
#[derive(Debug)]
// Only a store that stores the networks itself (Redis) makes the last two.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Stored {
    /// Nowhere but in the registry's networks, which are the store's own (memory): the
    /// caller changes them.
    Here,
    /// In the store too: the caller changes the registry's networks as the store did.
    Kept,
    /// Nowhere: [`MOST`] networks are listed already.
    Full,
}

/// The error of a change past [`MOST`] networks.
pub(crate) fn full() -> String {
    format!("{MOST} networks are listed at runtime already; take some off first")
}

/// One network on a list until an end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    network: Cidr,
    /// On the deny list, else the allow list.
    deny: bool,
    /// The end, in microseconds on the layer's clock (since 1970).
    until_us: u64,
}

impl Listed {
    /// `network` on the deny list (`deny`) or the allow list until `until_us`.
    pub(crate) fn new(network: Cidr, deny: bool, until_us: u64) -> Self {
        Listed {
            network,
            deny,
            until_us,
        }
    }

    /// What names the entry: its list and its network (`deny 203.0.113.0/24`).
    pub(crate) fn name(&self) -> String {
        let list = if self.deny { "deny" } else { "allow" };
        format!("{list} {}", self.network)
    }

    /// The entry as it is kept: its name and its end.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn line(&self) -> String {
        format!("{} {}", self.name(), self.until_us)
    }

    /// An entry kept as `line`, if it is one.
    fn parse(line: &str) -> Option<Listed> {
        let mut words = line.split(' ');
        let deny = match words.next()? {
            "deny" => true,
            "allow" => false,
            _ => return None,
        };
        let network = words.next()?.parse().ok()?;
        let until_us = words.next()?.parse().ok()?;
        words.next().is_none().then_some(Listed {
            network,
            deny,
            until_us,
        })
    }
}

/// The networks listed at runtime that an instance holds.
#[derive(Debug, Default)]
pub(crate) struct Networks {
    listed: ArcSwap<Vec<Listed>>,
    /// Whether any network is listed: requests look no further when none is.
    any: AtomicBool,
    /// When the last read from the store began, in microseconds on the layer's clock (plus
    /// one: 0 is never), and whether a read is under way.
    read_at_us: AtomicU64,
    reading: AtomicBool,
    /// Wakes the requests waiting for the read under way when it ends.
    ended: tokio::sync::Notify,
    /// How many changes were made here: taken while one is made, so that they are made one
    /// at a time and a read begun before one is not applied after it.
    changes: Mutex<u64>,
}

impl Networks {
    /// Whether any network is listed.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// What the networks say of `ip` at `now_us` (read only when an entry matches):
    /// `Some(true)` denied, `Some(false)` allowed, `None` neither. A denial wins.
    pub(crate) fn judge(&self, ip: IpAddr, now_us: impl Fn() -> u64) -> Option<bool> {
        let listed = self.listed.load();
        let mut said = None;
        for entry in listed.iter().filter(|e| e.network.contains(ip)) {
            if entry.until_us > now_us() {
                if entry.deny {
                    return Some(true);
                }
                said = Some(false);
            }
        }
        said
    }

    /// Puts `entry` on its list (replacing the network's entry there), or takes the
    /// network off it (`remove`); entries ended by `now_us` are dropped. Fails, changing
    /// nothing, past [`MOST`] entries.
    pub(crate) fn change(&self, entry: Listed, remove: bool, now_us: u64) -> Result<(), String> {
        let mut changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let same = |e: &Listed| e.network == entry.network && e.deny == entry.deny;
        let mut listed: Vec<Listed> = (self.listed.load().iter())
            .filter(|e| e.until_us > now_us && !same(e))
            .copied()
            .collect();
        if !remove {
            listed.push(entry);
        }
        if listed.len() > MOST {
            return Err(full());
        }
        self.set(listed);
        *changes += 1;
        Ok(())
    }

    /// How many changes were made here so far: read before the store is, and given to
    /// [`replace`](Self::replace) with what it answered.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn changes(&self) -> u64 {
        *self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The networks kept in the store, as `text` (one entry a line; a line that is none is
    /// skipped, and said), read when [`changes`](Self::changes) said `seen`: dropped (`false`)
    /// when a change was made here since, which the text may not hold.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn replace(&self, text: &str, seen: u64) -> bool {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        if *changes != seen {
            tracing::debug!("the networks read began before a change made here: dropped");
            return false;
        }
        let listed = (text.lines().filter(|l| !l.is_empty()))
            .filter_map(|line| {
                let entry = Listed::parse(line);
                if entry.is_none() {
                    tracing::warn!(line, "a network entry kept in the store is malformed");
                }
                entry
            })
            .take(MOST)
            .collect();
        self.set(listed);
        true
    }

    fn set(&self, listed: Vec<Listed>) {
        self.any.store(!listed.is_empty(), Ordering::Relaxed);
        self.listed.store(Arc::new(listed));
    }

    /// How fresh the last read is at `now_us` (on the layer's clock; a clock set back makes
    /// it stale).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn age(&self, now_us: u64) -> Age {
        let at = self.read_at_us.load(Ordering::Acquire);
        match now_us.checked_sub(at.wrapping_sub(1)) {
            _ if at == 0 => Age::Stale,
            Some(age) if age < READ_AHEAD.as_micros() as u64 => Age::Fresh,
            Some(age) if age < READ_EVERY.as_micros() as u64 => Age::Aging,
            _ => Age::Stale,
        }
    }

    /// Claims the next read, if none is under way: if so, the caller reads them and calls
    /// [`read`](Self::read).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn claim(&self) -> bool {
        !self.reading.swap(true, Ordering::AcqRel)
    }

    /// A read claimed by [`claim`](Self::claim), begun at `began_us`, ended; wakes the
    /// requests waiting for it. `counts` but when what it read was dropped (a change was made
    /// here since, see [`replace`](Self::replace)): the next request then reads again. A read
    /// that failed counts: requests go on with what was last read, and the next read is
    /// [`READ_EVERY`] later.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn read(&self, began_us: u64, counts: bool) {
        if counts {
            self.read_at_us.store(began_us + 1, Ordering::Release);
        }
        self.reading.store(false, Ordering::Release);
        self.ended.notify_waiters();
    }

    /// Waits until the networks are no longer stale at `now_us`: at once if a read ended
    /// since the caller looked, else until the read under way ends (`start` starts it when
    /// none is: called with the claim).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) async fn fresh(&self, now_us: u64, start: impl FnOnce()) {
        let ended = self.ended.notified();
        let mut ended = std::pin::pin!(ended);
        ended.as_mut().enable();
        if self.age(now_us) != Age::Stale {
            return;
        }
        if self.claim() {
            start();
        }
        ended.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(network: &str, deny: bool, until_us: u64) -> Listed {
        Listed {
            network: network.parse().unwrap(),
            deny,
            until_us,
        }
    }

    #[test]
    fn a_denial_wins_and_entries_end() {
        let networks = Networks::default();
        assert!(!networks.any());
        let ip = "10.1.2.3".parse().unwrap();
        networks
            .change(entry("10.0.0.0/8", false, 100), false, 0)
            .unwrap();
        assert!(networks.any());
        assert_eq!(networks.judge(ip, || 50), Some(false));
        networks
            .change(entry("10.1.0.0/16", true, 80), false, 0)
            .unwrap();
        assert_eq!(networks.judge(ip, || 50), Some(true));
        assert_eq!(networks.judge(ip, || 80), Some(false), "the denial ended");
        assert_eq!(networks.judge(ip, || 100), None);
        assert_eq!(
            networks.judge("::ffff:10.1.2.3".parse().unwrap(), || 0),
            Some(true)
        );
        // Taken off: by its list and network, whatever its end.
        networks
            .change(entry("10.1.0.0/16", true, 0), true, 0)
            .unwrap();
        assert_eq!(networks.judge(ip, || 50), Some(false));
    }

    #[test]
    fn kept_as_lines_and_read_back() {
        let networks = Networks::default();
        let one = entry("2001:db8::/32", true, 7);
        let text = format!("{}\nnonsense\n{}\n", one.line(), "allow 10.0.0.0/8 9");
        networks.replace(&text, 0);
        assert_eq!(
            *networks.listed.load().as_ref(),
            vec![one, entry("10.0.0.0/8", false, 9)]
        );
        networks.replace("", 0);
        assert!(!networks.any());
    }

    #[test]
    fn a_read_begun_before_a_change_here_does_not_undo_it() {
        let networks = Networks::default();
        let seen = networks.changes();
        let denied = entry("2001:db8:bad::/48", true, 10);
        networks.change(denied, false, 0).unwrap();
        // The store's string as read before the change, applied after it.
        networks.replace("", seen);
        assert_eq!(*networks.listed.load().as_ref(), vec![denied]);
        // A read begun after it is applied.
        networks.replace("allow 10.0.0.0/8 9", networks.changes());
        assert_eq!(
            *networks.listed.load().as_ref(),
            vec![entry("10.0.0.0/8", false, 9)]
        );
    }

    #[test]
    fn at_most_a_thousand() {
        let networks = Networks::default();
        for i in 0..MOST as u32 {
            let net = format!("{}/32", std::net::Ipv4Addr::from(i));
            networks.change(entry(&net, true, 10), false, 0).unwrap();
        }
        let refused = networks.change(entry("192.0.2.0/24", true, 10), false, 0);
        assert!(refused.unwrap_err().contains("1000 networks"));
        // Ended entries make room.
        networks
            .change(entry("192.0.2.0/24", true, 20), false, 10)
            .unwrap();
    }

    #[test]
    fn one_read_at_a_time_and_their_age() {
        let networks = Networks::default();
        assert_eq!(networks.age(0), Age::Stale, "never read");
        assert!(networks.claim());
        assert!(!networks.claim(), "under way");
        networks.read(1_000_000, true);
        assert_eq!(networks.age(1_000_000), Age::Fresh);
        assert_eq!(networks.age(1_499_999), Age::Fresh);
        assert_eq!(networks.age(1_500_000), Age::Aging);
        assert_eq!(networks.age(1_999_999), Age::Aging);
        assert_eq!(networks.age(2_000_000), Age::Stale);
        assert_eq!(networks.age(999_999), Age::Stale, "a clock set back");
        // A read dropped (a change made here since) keeps the last read's time.
        assert!(networks.claim());
        networks.read(3_000_000, false);
        assert_eq!(networks.age(3_000_000), Age::Stale);
    }
}
