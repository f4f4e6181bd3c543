//! Networks put on the allow or deny list at runtime
//! ([`RateLimitLayer::deny_network`](crate::RateLimitLayer::deny_network)). A key's entry is
//! one state the store reads with the key's decision; a network names no key, and a request
//! would have to ask for every network its address could be in. Networks listed at runtime
//! are few, so every instance holds all of them ([`Networks`], in the store's registry) and
//! matches a request's client address against them without a store call. In memory the
//! registry's are the store's own. With Redis they are also kept in one string under the
//! store's prefix (`<prefix>!networks`), one line per entry, changed by one script; an
//! instance reads it again once a second while requests come (`READ_EVERY`), and keeps what
//! it last read while Redis fails. An instance's own change is applied to what it holds as
//! the change itself, never as the string the store answers: replies are applied by the tasks
//! that wait for them, in whatever order those run, and a string read before a change must not
//! undo it when its task runs after the change's (a read begun before a change made here is
//! dropped; the next one sees it).

use std::net::IpAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::key::Cidr;

/// The most networks listed at runtime at once: each is compared with every request's address.
pub(crate) const MOST: usize = 1_000;

/// How often an instance reads the networks stored in Redis again, while requests come.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const READ_EVERY: Duration = Duration::from_secs(1);

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
    /// When they were last read from the store, in milliseconds from [`base`] (plus one: 0
    /// is never), and whether a read is under way.
    read_at_ms: AtomicU64,
    reading: AtomicBool,
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
    /// skipped, and said), read when [`changes`](Self::changes) said `seen`: dropped when a
    /// change was made here since, which the text may not hold.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn replace(&self, text: &str, seen: u64) {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        if *changes != seen {
            tracing::debug!("the networks read began before a change made here: dropped");
            return;
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
    }

    fn set(&self, listed: Vec<Listed>) {
        self.any.store(!listed.is_empty(), Ordering::Relaxed);
        self.listed.store(Arc::new(listed));
    }

    /// Whether they are due to be read from the store again ([`READ_EVERY`] after the last
    /// read, none under way): if so, the caller reads them and calls [`read`](Self::read).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn due(&self) -> bool {
        let now = ms_since_base() + 1;
        let last = self.read_at_ms.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= READ_EVERY.as_millis() as u64)
            && !self.reading.swap(true, Ordering::Acquire)
    }

    /// A read claimed by [`due`](Self::due) ended (whether or not it succeeded).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn read(&self) {
        self.read_at_ms
            .store(ms_since_base() + 1, Ordering::Relaxed);
        self.reading.store(false, Ordering::Release);
    }
}

/// Milliseconds since the first time this process asked.
fn ms_since_base() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64
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
    fn one_read_at_a_time() {
        let networks = Networks::default();
        assert!(networks.due());
        assert!(!networks.due(), "under way");
        networks.read();
        assert!(!networks.due(), "read a moment ago");
    }
}
