//! [`KeySpec`]: a configured policy's key, as a string.

use std::sync::Arc;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::key::{ApiKey, Cidr, ClientIp, GlobalKey, GrpcMethod, HeaderKey, KeyExtractor, PeerIp};

/// How a configured policy finds its key, as a string:
///
/// | string | key |
/// |---|---|
/// | `"ip"` | the connection's peer address ([`PeerIp`]) |
/// | `"client_ip"` | the client behind the configuration's `trusted_proxies` ([`ClientIp`]) |
/// | `"global"` | one key for every request ([`GlobalKey`]) |
/// | `"bearer"` | the token of `Authorization: Bearer` ([`ApiKey::bearer`]) |
/// | `"header:<name>"` | the value of a request header ([`HeaderKey`]), gRPC metadata included |
/// | `"grpc_method"` | the full gRPC method name, `/package.Service/Method` ([`GrpcMethod`]) |
/// | `"json:<pointer>"` | the value at a JSON pointer of the request's JSON body ([`key::json`](crate::key::json)) |
/// | `"jsonrpc"` | a JSON-RPC call's method, `tools/call:<name>` for an MCP tool ([`key::jsonrpc`](crate::key::jsonrpc)) |
/// | `"<key>+<key>"` | several joined into one, e.g. `"ip+jsonrpc"`: per client and tool ([`key::all`](crate::key::all)) |
///
/// A key of the body needs the `json` feature and a layer that reads bodies
/// ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySpec {
    /// `"ip"`.
    Ip,
    /// `"client_ip"`.
    ClientIp,
    /// `"global"`.
    Global,
    /// `"bearer"`.
    Bearer,
    /// `"header:<name>"`.
    Header(String),
    /// `"grpc_method"`.
    GrpcMethod,
    /// `"json:<pointer>"`.
    Json(String),
    /// `"jsonrpc"`.
    JsonRpc,
    /// `"<key>+<key>"`.
    All(Vec<KeySpec>),
}

impl std::str::FromStr for KeySpec {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let s = s.trim();
        if s.contains('+') {
            let parts = s.split('+').map(str::parse).collect::<Result<_, _>>()?;
            return Ok(KeySpec::All(parts));
        }
        if let Some(pointer) = s.strip_prefix("json:") {
            #[cfg(feature = "json")]
            crate::key::check_pointer(pointer)?;
            return Ok(KeySpec::Json(pointer.to_owned()));
        }
        Ok(match s {
            "ip" => KeySpec::Ip,
            "jsonrpc" => KeySpec::JsonRpc,
            "client_ip" => KeySpec::ClientIp,
            "global" => KeySpec::Global,
            "bearer" => KeySpec::Bearer,
            "grpc_method" => KeySpec::GrpcMethod,
            other => match other.strip_prefix("header:") {
                Some(name) => {
                    HeaderKey::try_new(name)?;
                    KeySpec::Header(name.to_owned())
                }
                None => {
                    return Err(ConfigError::new(format!(
                        "unknown key {other:?}; expected ip, client_ip, global, bearer, grpc_method, header:<name>, json:<pointer>, jsonrpc, or several joined with +"
                    )));
                }
            },
        })
    }
}

impl std::fmt::Display for KeySpec {
    /// As written in a configuration (`"header:x-user"`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySpec::Ip => f.write_str("ip"),
            KeySpec::ClientIp => f.write_str("client_ip"),
            KeySpec::Global => f.write_str("global"),
            KeySpec::Bearer => f.write_str("bearer"),
            KeySpec::Header(name) => write!(f, "header:{name}"),
            KeySpec::GrpcMethod => f.write_str("grpc_method"),
            KeySpec::Json(pointer) => write!(f, "json:{pointer}"),
            KeySpec::JsonRpc => f.write_str("jsonrpc"),
            KeySpec::All(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("+")?;
                    }
                    write!(f, "{part}")?;
                }
                Ok(())
            }
        }
    }
}

impl KeySpec {
    /// The extractor; `proxies` are the trusted proxies of `client_ip`.
    pub fn extractor(&self, proxies: &[Cidr]) -> Result<Arc<dyn KeyExtractor>, ConfigError> {
        Ok(match self {
            KeySpec::Ip => Arc::new(PeerIp::new()),
            KeySpec::ClientIp => Arc::new(
                proxies
                    .iter()
                    .fold(ClientIp::builder(), |b, &net| b.trusted_network(net))
                    .build()
                    .map_err(|e| e.context("trusted_proxies"))?,
            ),
            KeySpec::Global => Arc::new(GlobalKey),
            KeySpec::Bearer => Arc::new(ApiKey::bearer()),
            KeySpec::Header(name) => Arc::new(HeaderKey::try_new(name)?),
            KeySpec::GrpcMethod => Arc::new(GrpcMethod::new()),
            #[cfg(feature = "json")]
            KeySpec::Json(pointer) => Arc::new(crate::key::json(pointer)?),
            #[cfg(feature = "json")]
            KeySpec::JsonRpc => Arc::new(crate::key::jsonrpc()),
            #[cfg(not(feature = "json"))]
            KeySpec::Json(_) | KeySpec::JsonRpc => {
                return Err(ConfigError::new(format!(
                    "the key {self} reads JSON bodies: build with the json feature"
                )));
            }
            KeySpec::All(parts) => {
                let parts =
                    (parts.iter().map(|p| p.extractor(proxies))).collect::<Result<Vec<_>, _>>()?;
                Arc::new(crate::key::all(parts))
            }
        })
    }
}

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
