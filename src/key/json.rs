//! Keys read from a JSON request body: [`JsonKey`] (a value at a JSON pointer) and
//! [`JsonRpcKey`] (a JSON-RPC call's method, with an MCP tool's name). A policy keyed so needs
//! a layer that reads bodies (see [`request_body`](crate::request_body)).

use serde_json::Value;

use super::{Key, KeyExtractor, RequestRef, UNREAD};
use crate::error::{ConfigError, KeyRejection};

/// The key of a request whose JSON body has no value where a key looks: one key of its own,
/// shared by every such request, and limited as any other (never a way around the limit).
pub const MISSING: &str = "(missing)";

/// The value at a JSON pointer of the request's JSON body (made by [`json`]).
#[derive(Clone, Debug)]
pub struct JsonKey {
    pointer: Box<str>,
}

/// The value at `pointer` (RFC 6901: `/params/name`, `/items/0/id`; `""` the whole body) of
/// the request's JSON body, as the key: a string as its text, any other value as its JSON (a
/// number `42`, an object compacted). A body without that value is keyed [`MISSING`]. Fails
/// when `pointer` is not a JSON pointer.
///
/// ```
/// use tower_ratelimit::key::{self, PeerIp};
///
/// // Per client and per tool named in the body.
/// let key = key::all((PeerIp::new(), key::json("/params/name")?));
/// # let _ = key;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
pub fn json(pointer: &str) -> Result<JsonKey, ConfigError> {
    check_pointer(pointer)?;
    Ok(JsonKey {
        pointer: pointer.into(),
    })
}

/// Why `pointer` is no JSON pointer, if it is not one.
pub(crate) fn check_pointer(pointer: &str) -> Result<(), ConfigError> {
    let escapes_ok = pointer
        .split('~')
        .skip(1)
        .all(|s| s.starts_with(['0', '1']));
    if (pointer.is_empty() || pointer.starts_with('/')) && escapes_ok {
        return Ok(());
    }
    Err(ConfigError::new(format!(
        "{pointer:?} is not a JSON pointer: it starts with '/' (\"/params/name\"), \
         and '~' is written '~0', '/' in a name '~1'"
    )))
}

/// The JSON the keys of `request` read: its body's, or the call's of a batch.
pub(crate) fn body_json<'a>(request: &RequestRef<'a>) -> Result<&'a Value, KeyRejection> {
    request.json().ok_or_else(|| {
        KeyRejection::misconfigured(
            "body_not_read",
            "a key reads the request body, which the layer did not read",
        )
    })
}

impl KeyExtractor for JsonKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        if request.is_unread() {
            return Ok(Key::from(UNREAD));
        }
        Ok(value_key(body_json(request)?.pointer(&self.pointer)))
    }

    fn reads_body(&self) -> bool {
        true
    }
}

/// The key of `value`: a string's text, any other value's JSON, [`MISSING`] for none.
fn value_key(value: Option<&Value>) -> Key {
    match value {
        Some(Value::String(s)) => Key::from(s.as_str()),
        Some(other) => Key::from(other.to_string()),
        None => Key::from(MISSING),
    }
}

/// A JSON-RPC 2.0 call's method as the key (made by [`jsonrpc`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonRpcKey;

/// The method of the JSON-RPC 2.0 call in the request's body as the key; for an MCP tool call
/// (`"method": "tools/call"`) the method and the tool's name, `tools/call:<params.name>`. A
/// body without a method (a response, a notification's reply) is keyed [`MISSING`].
///
/// ```
/// use tower_ratelimit::key::{self, PeerIp};
///
/// // Per client and per method (per tool for MCP's tools/call).
/// let key = key::all((PeerIp::new(), key::jsonrpc()));
/// # let _ = key;
/// ```
pub fn jsonrpc() -> JsonRpcKey {
    JsonRpcKey
}

impl KeyExtractor for JsonRpcKey {
    fn extract(&self, request: &RequestRef<'_>) -> Result<Key, KeyRejection> {
        if request.is_unread() {
            return Ok(Key::from(UNREAD));
        }
        Ok(method_key(body_json(request)?))
    }

    fn reads_body(&self) -> bool {
        true
    }
}

/// The key of one JSON-RPC call.
pub(crate) fn method_key(call: &Value) -> Key {
    match call.get("method").and_then(Value::as_str) {
        Some("tools/call") => match call.pointer("/params/name").and_then(Value::as_str) {
            Some(tool) => Key::from(format!("tools/call:{tool}")),
            None => Key::from(format!("tools/call:{MISSING}")),
        },
        Some(method) => Key::from(method),
        None => Key::from(MISSING),
    }
}

/// The cost at `pointer` of the JSON `request`'s body keys read (the body's, or a batch's
/// call's), or why there is none: absent, negative, fractional, too large, or no number.
pub(crate) fn cost_at(request: &RequestRef<'_>, pointer: &str) -> Result<u64, KeyRejection> {
    let json = body_json(request)?;
    let why = match json.pointer(pointer) {
        None => "is absent".to_owned(),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(units), _) if units <= u64::from(u32::MAX) => return Ok(units),
            (Some(_), _) => format!("is {n}, over {}", u32::MAX),
            (None, Some(f)) if f < 0.0 => format!("is {n}, a negative number"),
            (None, Some(f)) if f.fract() != 0.0 => format!("is {n}, not a whole number"),
            (None, Some(f)) if f <= f64::from(u32::MAX) => return Ok(f as u64),
            _ => format!("is {n}, over {}", u32::MAX),
        },
        Some(other) => format!("is {}, not a number", kind(other)),
    };
    Err(KeyRejection::bad_request(
        "bad_cost",
        format!("the request's cost at {pointer:?} of its body {why}"),
    ))
}

/// What kind of JSON value `value` is, for people.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{MISSING, check_pointer, method_key, value_key};
    use crate::key::Key;

    #[test]
    fn values_make_keys_and_a_missing_one_is_its_own() {
        let body = json!({"params": {"name": "search", "n": 42, "o": {"a": 1}}});
        let key = |p: &str| value_key(body.pointer(p));
        assert_eq!(key("/params/name"), Key::from("search"));
        assert_eq!(key("/params/n"), Key::from("42"));
        assert_eq!(key("/params/o"), Key::from("{\"a\":1}"));
        assert_eq!(key("/params/absent"), Key::from(MISSING));
    }

    #[test]
    fn a_call_is_keyed_by_method_and_tool() {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search"}});
        assert_eq!(method_key(&call), Key::from("tools/call:search"));
        assert_eq!(method_key(&json!({"method": "ping"})), Key::from("ping"));
        assert_eq!(method_key(&json!({"result": 1})), Key::from(MISSING));
        let nameless = json!({"method": "tools/call", "params": {}});
        assert_eq!(method_key(&nameless), Key::from("tools/call:(missing)"));
    }

    #[test]
    fn pointers_are_checked() {
        for ok in ["", "/", "/params/name", "/a~0b/c~1d", "/items/0"] {
            assert!(check_pointer(ok).is_ok(), "{ok}");
        }
        for bad in ["params", "/a~2", "/a~"] {
            let err = check_pointer(bad).unwrap_err().to_string();
            assert!(err.contains("JSON pointer"), "{bad}: {err}");
        }
    }
}
