//! The layer's allow and deny lists at runtime: entries (keys and networks) put on them, kept
//! in the store, and the lists given to the layer reloaded.

use std::time::SystemTime;

use super::RateLimitControl;
use crate::error::{ConfigError, LimitError};
use crate::key::{Cidr, Key};
use crate::lists::Entry;
use crate::store::Store;

impl<St: Store> RateLimitControl<St> {
    /// Puts `entry` on the deny list until `until` (`None`: until
    /// [`remove_denied`](Self::remove_denied)), kept in the store: the same entries as
    /// [`Lists::deny`](crate::lists::Lists::deny) takes, meaning the same. A network (or an
    /// address, `"192.0.2.1".parse()?`) is [`deny_network`](Self::deny_network)'s, a key
    /// [`deny_key`](Self::deny_key)'s; each says when every instance obeys it, and how it
    /// fails.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::HeaderKey, lists::{Entry, Lists}};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .key(HeaderKey::try_new("x-api-key")?)
    ///     .policy(Policy::gcra("100/min"))
    ///     .lists(Lists::new())
    ///     .build()?;
    /// for text in ["203.0.113.0/24", "scraper-7"] {
    ///     let entry: Entry = text.parse()?;
    ///     layer.control().deny(entry.clone(), None).await?;
    ///     layer.control().remove_denied(entry).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn deny(
        &self,
        entry: impl Into<Entry>,
        until: Option<SystemTime>,
    ) -> Result<(), LimitError> {
        match entry.into() {
            Entry::Network(network) => self.deny_network(network, until).await,
            Entry::Key(key) => self.deny_key(&key, until).await,
        }
    }

    /// Puts `entry` on the allow list until `until` (`None`: until
    /// [`remove_allowed`](Self::remove_allowed)), as [`deny`](Self::deny) does on the deny
    /// list: [`allow_network`](Self::allow_network)'s for a network or an address,
    /// [`allow_key`](Self::allow_key)'s for a key.
    pub async fn allow(
        &self,
        entry: impl Into<Entry>,
        until: Option<SystemTime>,
    ) -> Result<(), LimitError> {
        match entry.into() {
            Entry::Network(network) => self.allow_network(network, until).await,
            Entry::Key(key) => self.allow_key(&key, until).await,
        }
    }

    /// Puts `key` on the deny list until `until` (`None`: until
    /// [`remove_denied`](Self::remove_denied)): every request of the key is answered `403`
    /// ([`DENIED`](crate::response::DENIED)), and no policy counts it. The entry is kept in the
    /// store beside the key's states, so every instance sharing the store refuses the key from
    /// its next request, and it ends on its own at `until`. The key is the lists' key
    /// ([`Lists::key`](crate::lists::Lists::key), by default the layer's), and `key` names
    /// the requests whose keys it makes ([`KeyExtractor::entry_keys`](crate::key::KeyExtractor::entry_keys)):
    /// where keys are client addresses, `Key::from("::1")`, `Key::from(ip)` and
    /// `"::ffff:127.0.0.1"` are the address's key, an IPv6 one grouped as requests are (its
    /// `/64` by default); where they are API keys, the token is hashed. (To list many single
    /// addresses where keys are client addresses, this is the way: [`deny`](Self::deny)
    /// takes an address as a network, and at most 1,000 networks are listed at runtime.)
    ///
    /// Fails with [`LimitError::NoLists`] unless the layer was built with
    /// [`lists`](crate::RateLimitLayerBuilder::lists) kept in the store (the default); with
    /// [`LimitError::Entry`] when the key names no request (`"alice"` where keys are
    /// addresses); with [`LimitError::Until`] when `until` is not after the present.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::{HeaderKey, Key}, lists::Lists};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .key(HeaderKey::try_new("x-api-key")?)
    ///     .policy(Policy::gcra("100/min"))
    ///     .lists(Lists::new())
    ///     .build()?;
    /// // A day off for a scraper.
    /// let tomorrow = SystemTime::now() + Duration::from_secs(86_400);
    /// layer.control().deny_key(&Key::from("scraper-7"), Some(tomorrow)).await?;
    /// layer.control().remove_denied(&Key::from("scraper-7")).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn deny_key(&self, key: &Key, until: Option<SystemTime>) -> Result<(), LimitError> {
        self.key_entry(true, key, until, false).await
    }

    /// Takes `entry` off the deny list kept in the store (see [`deny`](Self::deny)): a key
    /// (`&Key` as well), or a network as
    /// [`remove_denied_network`](Self::remove_denied_network) does.
    pub async fn remove_denied(&self, entry: impl Into<Entry>) -> Result<(), LimitError> {
        match entry.into() {
            Entry::Network(network) => self.remove_denied_network(network).await,
            Entry::Key(key) => self.key_entry(true, &key, None, true).await,
        }
    }

    /// Puts `key` on the allow list until `until` (`None`: until
    /// [`remove_allowed`](Self::remove_allowed)): its requests go on, neither limited nor
    /// counted by any policy, on every instance sharing the store from its next request. A
    /// key on both lists is denied. Fails as [`deny_key`](Self::deny_key) does.
    pub async fn allow_key(&self, key: &Key, until: Option<SystemTime>) -> Result<(), LimitError> {
        self.key_entry(false, key, until, false).await
    }

    /// Takes `entry` off the allow list kept in the store (see [`allow`](Self::allow)): a
    /// key (`&Key` as well), or a network as
    /// [`remove_allowed_network`](Self::remove_allowed_network) does.
    pub async fn remove_allowed(&self, entry: impl Into<Entry>) -> Result<(), LimitError> {
        match entry.into() {
            Entry::Network(network) => self.remove_allowed_network(network).await,
            Entry::Key(key) => self.key_entry(false, &key, None, true).await,
        }
    }

    /// Puts `key` on the deny list (`deny`) or the allow list until `until`, or takes it off
    /// (`remove`), in the store.
    async fn key_entry(
        &self,
        deny: bool,
        key: &Key,
        until: Option<SystemTime>,
        remove: bool,
    ) -> Result<(), LimitError> {
        self.control.list_key(deny, key, until, remove)?.await
    }

    /// Replaces the networks and keys given to the layer's lists, e.g. when its configuration
    /// file is read again (the entries added at runtime stay). **This instance only**: the
    /// lists given are held in each process, so every instance must be reloaded (as a
    /// configuration file is, by each instance reading it); an entry every instance obeys at
    /// once is one added with [`deny_key`](Self::deny_key),
    /// [`allow_key`](Self::allow_key) or [`deny_network`](Self::deny_network), kept in the
    /// store. Networks are matched against the
    /// address the new lists' [`client_ip`](crate::lists::Lists::client_ip) finds, else the
    /// layer key's `ClientIp` (behind its trusted proxies), else the peer's. Fails, changing
    /// nothing, when an entry is malformed or names no key the lists' key makes, when the
    /// layer was built without lists, or when the new lists keep entries in the store beside
    /// policies that take leases.
    pub fn reload_lists(&self, lists: &crate::lists::Lists) -> Result<(), ConfigError> {
        self.control.reload_lists(lists)
    }

    /// Puts the network `network` on the deny list until `until` (`None`: until
    /// [`remove_denied_network`](Self::remove_denied_network)): every request whose client
    /// address is in it is answered `403` ([`DENIED`](crate::response::DENIED)), before any
    /// key is made. The address is the one the lists' networks are matched against
    /// ([`Lists::client_ip`](crate::lists::Lists::client_ip)). A network names no key, so
    /// every instance holds the networks listed at runtime (at most 1,000) and matches each
    /// request against them without a store call: in memory at once; with Redis they are
    /// kept under the store's prefix (`<prefix>!networks`), this instance obeys at once and
    /// every other instance sharing the store from its first request a second or more after
    /// the change (a request is never decided on networks read longer ago: it waits for a
    /// read; while Redis fails, what was read last is kept).
    ///
    /// Fails as [`deny_key`](Self::deny_key) does, and with [`LimitError::Network`] when
    /// 1,000 networks are listed already.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, key::{Cidr, PeerIp}, lists::Lists};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .key(PeerIp::new())
    ///     .policy(Policy::gcra("100/min"))
    ///     .lists(Lists::new())
    ///     .build()?;
    /// let network: Cidr = "203.0.113.0/24".parse()?;
    /// layer.control().deny_network(network, None).await?;
    /// layer.control().remove_denied_network(network).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn deny_network(
        &self,
        network: Cidr,
        until: Option<SystemTime>,
    ) -> Result<(), LimitError> {
        self.control
            .list_network(true, network, until, false)?
            .await
    }

    /// Takes `network` off the deny list (see [`deny_network`](Self::deny_network)).
    pub async fn remove_denied_network(&self, network: Cidr) -> Result<(), LimitError> {
        self.control.list_network(true, network, None, true)?.await
    }

    /// Puts the network `network` on the allow list until `until` (`None`: until
    /// [`remove_allowed_network`](Self::remove_allowed_network)): requests from it go on,
    /// neither limited nor counted, unless a network they are in is denied. Obeyed as
    /// [`deny_network`](Self::deny_network) says, and fails as it does.
    pub async fn allow_network(
        &self,
        network: Cidr,
        until: Option<SystemTime>,
    ) -> Result<(), LimitError> {
        self.control
            .list_network(false, network, until, false)?
            .await
    }

    /// Takes `network` off the allow list (see [`allow_network`](Self::allow_network)).
    pub async fn remove_allowed_network(&self, network: Cidr) -> Result<(), LimitError> {
        self.control.list_network(false, network, None, true)?.await
    }
}
