//! The values a configuration file gives as text (durations, statuses, header names, routes,
//! the measure of a body), each read with `FromStr` as its field is deserialized.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::Deserialize;

use crate::error::ConfigError;
use crate::quota::Quota;

/// A value read from a string (or, for a status, a number) and parsed with `FromStr`.
#[derive(Clone, Debug)]
pub(super) struct Text<T>(pub(super) T);

impl<'de, T> Deserialize<'de> for Text<T>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Number(u64),
        }
        let text = match Written::deserialize(d)? {
            Written::Text(text) => text,
            Written::Number(n) => n.to_string(),
        };
        text.parse().map(Text).map_err(serde::de::Error::custom)
    }
}

/// A duration written as a quota's window, e.g. `500ms`, `30s`, `2min`.
#[derive(Clone, Debug)]
pub(super) struct DurationText(pub(super) Duration);

impl std::str::FromStr for DurationText {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        format!("1/{text}")
            .parse::<Quota>()
            .map(|q| DurationText(q.window()))
            .map_err(|_| format!("{text:?} is not a duration such as 500ms, 30s, 2min or 1h"))
    }
}

/// An HTTP status.
#[derive(Clone, Copy, Debug)]
pub(super) struct Status(pub(super) StatusCode);

impl std::str::FromStr for Status {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        text.parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .map(Status)
            .ok_or_else(|| format!("{text:?} is not an HTTP status such as 401"))
    }
}

/// A header name.
#[derive(Clone, Debug)]
pub(super) struct HeaderNameText(pub(super) http::HeaderName);

impl std::str::FromStr for HeaderNameText {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        http::HeaderName::from_bytes(text.as_bytes())
            .map(HeaderNameText)
            .map_err(|_| format!("{text:?} is not a header name"))
    }
}

/// What a policy reads of a response body to settle its cost: `bytes`, or `json:<pointer>`
/// (the number there in its JSON, or in its last server-sent event's).
#[derive(Clone, Debug)]
pub(super) enum BodyMeasure {
    Bytes,
    #[cfg(feature = "json")]
    Json(String),
}

impl std::str::FromStr for BodyMeasure {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "bytes" => Ok(BodyMeasure::Bytes),
            #[cfg(feature = "json")]
            other if other.starts_with("json:") => {
                let pointer = &other["json:".len()..];
                crate::key::check_pointer(pointer).map_err(|e| e.to_string())?;
                Ok(BodyMeasure::Json(pointer.to_owned()))
            }
            other => Err(format!(
                "{other:?} is not what a body is read for; expected bytes or json:<pointer>"
            )),
        }
    }
}

/// A route as written: `"/path"` or `"METHOD /path"`.
#[derive(Clone, Debug)]
pub(super) struct RouteText(pub(super) Option<Method>, pub(super) String);

impl std::str::FromStr for RouteText {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (method, path) = match text.split_once(char::is_whitespace) {
            Some((m, p)) => {
                let m = Method::from_bytes(m.as_bytes())
                    .map_err(|_| format!("{m:?} is not a method"))?;
                (Some(m), p.trim())
            }
            None => (None, text),
        };
        if !path.starts_with('/') {
            return Err(format!(
                "{text:?} is not a route such as \"/items\", \"GET /items/{{id}}\" or \"/admin/*\""
            ));
        }
        Ok(RouteText(method, path.to_owned()))
    }
}

/// Status codes as a list a predicate can search.
pub(super) fn statuses(codes: &[Text<Status>]) -> Arc<[StatusCode]> {
    codes.iter().map(|c| c.0.0).collect()
}

/// A policy's cost as written: units (`3`); `"json:<pointer>"`, the number at that JSON
/// pointer of the request's body; `"graphql"` or `"graphql:<max depth>"`, its GraphQL
/// query's calculated cost (at most 10 deep by default).
#[derive(Clone, Debug)]
pub(super) enum CostText {
    Units(u32),
    #[cfg(feature = "json")]
    Json(String),
    #[cfg(feature = "graphql")]
    Graphql(u32),
}

impl std::str::FromStr for CostText {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        if let Some(pointer) = s.strip_prefix("json:") {
            #[cfg(feature = "json")]
            {
                crate::key::check_pointer(pointer)?;
                return Ok(CostText::Json(pointer.to_owned()));
            }
            #[cfg(not(feature = "json"))]
            return Err(ConfigError::new(format!(
                "the cost json:{pointer} reads JSON bodies: build with the json feature"
            )));
        }
        #[cfg(feature = "graphql")]
        if let Some(depth) = s.strip_prefix("graphql") {
            let depth = match depth.strip_prefix(':') {
                Some(depth) => depth.parse().ok().filter(|&d| d > 0),
                None => depth.is_empty().then_some(10),
            };
            return depth.map(CostText::Graphql).ok_or_else(|| {
                ConfigError::new(format!(
                    "cost {s:?}: expected graphql, or graphql:<max depth> with a depth of 1 or more"
                ))
            });
        }
        s.parse().map(CostText::Units).map_err(|_| {
            ConfigError::new(format!(
                "cost {s:?}: expected a whole number of units, json:<pointer> or graphql"
            ))
        })
    }
}
