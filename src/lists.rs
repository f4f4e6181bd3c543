//! Allow and deny lists: clients that are never limited, and clients that are always refused.
//!
//! A [`Lists`] names networks (CIDR, IPv4 and IPv6) and keys. A request whose client address
//! is in a denied network, or whose key is denied, is answered `403 Forbidden` with a
//! problem+json body of the type [`DENIED`](crate::response::DENIED); a request allowed goes
//! on, not limited and not counted by any policy. The address is the one the lists'
//! [`ClientIp`] finds (its trusted proxies decide whether a forwarding header is believed:
//! with none, the peer's own address); the key is the layer's (or [`Lists::key`]'s).
//!
//! Entries can also be added and removed while the service runs
//! ([`RateLimitControl::deny`](crate::RateLimitControl::deny) and its siblings, taking the same
//! [`Entry`] as the lists given), with an optional end: a key's are kept in the store,
//! beside the states of the key, so that every instance sharing the store obeys them from its
//! next request, in the decision's one call.
//!
//! A denial wins: a request both allowed and denied is denied. A network match is decided
//! before the store is asked, and needs no store call.
//!
//! ```
//! use tower_ratelimit::{Policy, RateLimitLayer, lists::Lists};
//!
//! # fn main() -> Result<(), tower_ratelimit::ConfigError> {
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::gcra("10/s"))
//!     .lists(
//!         Lists::new()
//!             .deny(["203.0.113.0/24", "2001:db8:bad::/48", "scraper-7"])
//!             .allow(["10.0.0.0/8", "monitoring"]),
//!     )
//!     .build()?;
//! # let _ = layer;
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::algorithm::Compiled as Definition;
use crate::error::{ConfigError, EntryError};
use crate::key::{Cidr, ClientIp, Key, KeyExtractor, RequestRef};
use crate::policy::{Part, Tier};
use crate::quota::Quota;
use crate::store::{Networks, Op, Store};

/// Allow and deny lists of networks and keys, for
/// [`RateLimitLayerBuilder::lists`](crate::RateLimitLayerBuilder::lists) (see the
/// [module](self)).
#[derive(Clone, Debug, Default)]
pub struct Lists {
    allow: Vec<String>,
    deny: Vec<String>,
    client_ip: Option<ClientIp>,
    key: Option<Arc<dyn KeyExtractor>>,
    static_only: bool,
}

impl Lists {
    /// Empty lists: nothing allowed or denied but what is added at runtime.
    pub fn new() -> Self {
        Lists::default()
    }

    /// Adds entries to the allow list, each an [`Entry`] written as text: networks
    /// (`10.0.0.0/8`, `2001:db8::/32`), addresses (`192.0.2.1`, matched as the client's
    /// address) or keys (anything else, matched against the request's key). An entry that
    /// has a `/` but is no network is an error of [`build`](crate::RateLimitLayerBuilder::build).
    /// The runtime operations take the same entries
    /// ([`RateLimitControl::allow`](crate::RateLimitControl::allow)).
    #[must_use]
    pub fn allow<I>(mut self, entries: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.allow.extend(entries.into_iter().map(Into::into));
        self
    }

    /// Adds entries to the deny list, written as for [`allow`](Self::allow).
    #[must_use]
    pub fn deny<I>(mut self, entries: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.deny.extend(entries.into_iter().map(Into::into));
        self
    }

    /// How a request's client address is found for the networks (default: as the lists'
    /// key finds it when it is, or holds, a [`ClientIp`]; else the peer's own address, no
    /// forwarding header believed). Give the [`ClientIp`] of your trusted
    /// proxies when the service is behind them; a client's own `X-Forwarded-For` is then
    /// believed only from them.
    #[must_use]
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = Some(client_ip);
        self
    }

    /// The key the key entries, and the entries added at runtime, are matched against
    /// (default: the layer's key).
    #[must_use]
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// [`key`](Self::key), shared.
    #[cfg(feature = "serde")]
    pub(crate) fn keyed(mut self, key: Arc<dyn KeyExtractor>) -> Self {
        self.key = Some(key);
        self
    }

    /// Whether entries added at runtime are read at each decision (default `true`). Each
    /// decision then also reads the key's record of list entries in its one store call (in
    /// the Redis script, one `GET`, before any policy); with
    /// `false` only the entries given here count, and the runtime operations fail. Policies
    /// that take leases ([`Policy::lease`](crate::Policy::lease)) spend units without asking
    /// the store; with entries kept in the store, each request asks it for them.
    #[must_use]
    pub fn kept_in_store(mut self, kept: bool) -> Self {
        self.static_only = !kept;
        self
    }

    /// Whether every entry is well written (what [`compile`](Self::compile) would report).
    #[cfg(feature = "serde")]
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let key = self.key.as_deref();
        Entries::of(&self.allow, "allow", key)?;
        Entries::of(&self.deny, "deny", key)?;
        Ok(())
    }

    /// The lists checked and compiled, with `key` the layer's: the key entries made the keys
    /// the lists' key makes of them, the networks matched against the address the lists'
    /// `ClientIp` finds, else the key's own (a `ClientIp` behind trusted proxies), else the
    /// peer's.
    pub(crate) fn compile(&self, key: &Arc<dyn KeyExtractor>) -> Result<Compiled, ConfigError> {
        let key = self.key.clone().unwrap_or_else(|| key.clone());
        let client_ip = match (&self.client_ip, key.client_ip()) {
            (Some(c), _) | (None, Some(c)) => c.clone(),
            (None, None) => ClientIp::new(std::iter::empty::<&str>())?,
        };
        Ok(Compiled {
            allow: Entries::of(&self.allow, "allow", Some(&*key))?,
            deny: Entries::of(&self.deny, "deny", Some(&*key))?,
            client_ip,
            key,
            in_store: !self.static_only,
        })
    }
}

/// An entry of a list, as [`Lists::deny`] and [`Lists::allow`] read it and as the runtime
/// operations ([`RateLimitControl::deny`](crate::RateLimitControl::deny) and its siblings) take
/// it: a network or an address, matched against the client's address, or a key, matched
/// against the request's key.
///
/// Written as text (`"203.0.113.0/24".parse()`): a network (`10.0.0.0/8`, `2001:db8::/32`)
/// or an address (`192.0.2.1`, the network of that address alone) is a network; anything
/// else is a key. An entry with a `/` that is no network is an error, never a key.
///
/// ```
/// use tower_ratelimit::lists::Entry;
///
/// assert!(matches!("203.0.113.0/24".parse(), Ok(Entry::Network(_))));
/// assert!(matches!("192.0.2.1".parse(), Ok(Entry::Network(_))));
/// assert!(matches!("scraper-7".parse(), Ok(Entry::Key(_))));
/// assert!("10.0.0.0/33".parse::<Entry>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A network (an address is the network of that address alone): requests whose client
    /// address is in it.
    Network(Cidr),
    /// A key: requests the lists' key names so (see
    /// [`KeyExtractor::entry_keys`]).
    Key(Key),
}

impl std::str::FromStr for Entry {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ConfigError::new("an empty entry"));
        }
        if text.contains('/') || text.parse::<IpAddr>().is_ok() {
            return text.parse().map(Entry::Network);
        }
        Ok(Entry::Key(Key::from(text)))
    }
}

impl From<Cidr> for Entry {
    fn from(network: Cidr) -> Self {
        Entry::Network(network)
    }
}

impl From<IpAddr> for Entry {
    fn from(ip: IpAddr) -> Self {
        Entry::Network(Cidr::host(ip))
    }
}

impl From<Key> for Entry {
    fn from(key: Key) -> Self {
        Entry::Key(key)
    }
}

impl From<&Key> for Entry {
    fn from(key: &Key) -> Self {
        Entry::Key(key.clone())
    }
}

/// One list's entries, compiled: its networks and its keys.
#[derive(Debug, Default)]
struct Entries {
    networks: Vec<Cidr>,
    keys: HashSet<Key>,
}

impl Entries {
    /// The entries of the list named `list`, key entries as `key` makes them (as written
    /// without one).
    fn of(
        entries: &[String],
        list: &str,
        key: Option<&dyn KeyExtractor>,
    ) -> Result<Self, ConfigError> {
        let mut out = Entries::default();
        for text in entries {
            let entry: Entry =
                (text.parse()).map_err(|e: ConfigError| e.context(&format!("the {list} list")))?;
            match entry {
                Entry::Network(network) => out.networks.push(network),
                Entry::Key(entry) => {
                    let keys = match key {
                        Some(key) => crate::key::kept_entry_keys(key, &entry).map_err(|e| {
                            let text = text.trim();
                            ConfigError::new(format!("the {list} list's entry {text:?}: {e}"))
                        })?,
                        None => vec![entry.compact()],
                    };
                    out.keys.extend(keys);
                }
            }
        }
        Ok(out)
    }

    fn has_any(&self) -> bool {
        !self.networks.is_empty()
    }

    fn has_network(&self, ip: Option<IpAddr>) -> bool {
        self.has_any() && ip.is_some_and(|ip| self.networks.iter().any(|n| n.contains(ip)))
    }
}

/// What the lists say of a request.
#[derive(Debug)]
pub(crate) enum Judged {
    /// Refused: by a network (no key was made), or by a key entry.
    Denied(Why),
    /// Not limited, not counted.
    Allowed,
    /// Neither: decided by the policies, with the key whose runtime entries are read (when
    /// they are kept in the store and the request has one).
    Neither(Option<Key>),
}

/// What denied a request, for its `detail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// Its client address is in a denied network.
    Network,
    /// Its key is on the deny list given to the layer.
    Key,
    /// Its key was denied at runtime (an entry in the store).
    Entry,
}

impl Why {
    /// The response's `detail`.
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Why::Network => "the client's network is on the deny list",
            Why::Key | Why::Entry => "the client's key is on the deny list",
        }
    }

    /// The label of `ratelimit_listed_total`'s `by`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Why::Network => "network",
            Why::Key => "key",
            Why::Entry => "store",
        }
    }
}

/// The lists as a layer applies them.
pub(crate) struct Compiled {
    allow: Entries,
    deny: Entries,
    client_ip: ClientIp,
    key: Arc<dyn KeyExtractor>,
    in_store: bool,
}

impl Compiled {
    /// What the lists say of `request`: networks first, those given then those listed at
    /// runtime (`listed`, read when entries are kept in the store; `now` on the layer's
    /// clock), no key made for a denied one; then the key's entries given to the layer; the
    /// key is made for the runtime entries when `runtime` (entries may be in the store).
    pub(crate) fn judge(
        &self,
        request: &RequestRef<'_>,
        runtime: bool,
        listed: &Networks,
        now: &dyn Fn() -> u64,
    ) -> Judged {
        let listed = (self.in_store && listed.any()).then_some(listed);
        let networks = listed.is_some() || self.deny.has_any() || self.allow.has_any();
        let ip = networks
            .then(|| self.client_ip.resolve(request).ok().map(|r| r.ip()))
            .flatten();
        let at_runtime = listed.zip(ip).and_then(|(l, ip)| l.judge(ip, now));
        if self.deny.has_network(ip) || at_runtime == Some(true) {
            return Judged::Denied(Why::Network);
        }
        let runtime = runtime && self.in_store;
        let keyed = runtime || !self.deny.keys.is_empty() || !self.allow.keys.is_empty();
        let key = keyed
            .then(|| self.key.extract(request).ok().map(Key::compact))
            .flatten();
        if key.as_ref().is_some_and(|k| self.deny.keys.contains(k)) {
            return Judged::Denied(Why::Key);
        }
        let allowed = self.allow.has_network(ip) || at_runtime == Some(false);
        if allowed || key.as_ref().is_some_and(|k| self.allow.keys.contains(k)) {
            return Judged::Allowed;
        }
        Judged::Neither(key.filter(|_| runtime))
    }

    /// The keys the lists' key makes of the requests `entry` names (an entry added at
    /// runtime).
    pub(crate) fn entry_keys(&self, entry: &Key) -> Result<Vec<Key>, EntryError> {
        crate::key::kept_entry_keys(&*self.key, entry)
    }

    /// Whether entries added at runtime are kept in the store and read.
    pub(crate) fn in_store(&self) -> bool {
        self.in_store
    }
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lists")
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .field("in_store", &self.in_store)
            .finish_non_exhaustive()
    }
}

/// The lists of a layer built with them: as given (swapped by a reload), and the tier whose
/// name the records of its runtime entries are kept under.
pub(crate) struct LayerLists {
    lists: ArcSwap<Compiled>,
    records: Arc<Tier>,
}

impl LayerLists {
    /// [`LayerLists::new`] of `lists`, if the layer has lists; refused beside policies that
    /// take leases (`leases`) when they keep entries in the store ([`leases_with_lists`]).
    pub(crate) fn of<St: Store>(
        lists: Option<&Lists>,
        key: &Arc<dyn KeyExtractor>,
        store: &St,
        leases: bool,
    ) -> Result<Option<Self>, ConfigError> {
        let lists = lists.map(|l| LayerLists::new(l, key, store)).transpose()?;
        leases_with_lists::<St>(leases, lists.as_ref().is_some_and(LayerLists::in_store))?;
        Ok(lists)
    }

    /// `lists` compiled (`key`: the layer's), and the records' tier registered in `store`
    /// (its name taken: no policy may have it).
    pub(crate) fn new<St: Store>(
        lists: &Lists,
        key: &Arc<dyn KeyExtractor>,
        store: &St,
    ) -> Result<Self, ConfigError> {
        let compiled = lists.compile(key)?;
        let quota = Quota::per_second(std::num::NonZeroU32::MIN);
        let algorithm = Definition::new(crate::Algorithm::Gcra, quota, Default::default())
            .expect("1/s is a valid GCRA");
        let name: Arc<str> = RECORDS.into();
        let at = store.register(&[(name.clone(), algorithm.clone())], &|_| false)?[0];
        let part = Part::new(Op::ChargeIf);
        Ok(LayerLists {
            lists: ArcSwap::from_pointee(compiled),
            records: Arc::new(Tier::new(name, at, algorithm, part)),
        })
    }

    /// The lists as given now.
    pub(crate) fn present(&self) -> arc_swap::Guard<Arc<Compiled>> {
        self.lists.load()
    }

    /// Replaces the lists given (a reload).
    pub(crate) fn replace(&self, lists: Compiled) {
        self.lists.store(Arc::new(lists));
    }

    /// Whether the lists as given now keep entries in the store.
    pub(crate) fn in_store(&self) -> bool {
        self.present().in_store()
    }

    /// The tier of the records of the runtime entries: a check of it at the end of a store
    /// call says that the store reads the key's record first (Redis).
    pub(crate) fn records(&self) -> &Arc<Tier> {
        &self.records
    }
}

/// The name the records of the runtime entries are kept under (no policy may take it).
pub(crate) const RECORDS: &str = "!lists";

/// Refuses policies that take leases beside lists whose entries are kept in a store that does
/// not decide at once (`in_store`): every request would ask the store for its key's entries,
/// and the leases would save no call.
pub(crate) fn leases_with_lists<St: Store>(
    leases: bool,
    in_store: bool,
) -> Result<(), ConfigError> {
    if leases && in_store && !St::DECIDES_ALONE {
        return Err(ConfigError::new(
            "a policy takes leases (Policy::lease), and the lists keep entries in the store: \
             every request would ask the store for its key's entries, and the leases would save \
             no call; build the lists with .kept_in_store(false) (the entries given to the \
             layer still count), or drop the leases",
        ));
    }
    Ok(())
}
