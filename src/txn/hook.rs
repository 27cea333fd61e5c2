//! A post-commit hook as a transaction request carries it: where to send
//! what once the transaction commits. The deliveries it becomes are
//! [`crate::hooks`]'.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A hook as the client gave it in the transaction request.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Hook {
    #[serde(default = "default_method")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Headers,
    #[serde(default)]
    pub body: Option<Value>,
}

fn default_method() -> String {
    "POST".into()
}

/// A hook's own headers. Their values are write-only: typically a
/// receiver's credentials, they are sent and stored, but never shown (no
/// endpoint returns them, and `Debug` prints only the names).
#[derive(Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct Headers(pub std::collections::BTreeMap<String, String>);

/// What an API answer shows in place of a header value.
pub(crate) const REDACTED: &str = "[redacted]";

impl Headers {
    /// The names, each with [`REDACTED`] for its value.
    pub fn redacted(&self) -> std::collections::BTreeMap<String, String> {
        self.0.keys().map(|name| (name.clone(), REDACTED.to_owned())).collect()
    }
}

impl std::ops::Deref for Headers {
    type Target = std::collections::BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl From<std::collections::BTreeMap<String, String>> for Headers {
    fn from(map: std::collections::BTreeMap<String, String>) -> Self {
        Self(map)
    }
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.keys().map(|k| (k, REDACTED))).finish()
    }
}

/// A transaction request as shown back (and kept in its record): every
/// hook's header values replaced by [`REDACTED`].
pub(crate) fn redact_request(request: &serde_json::Value) -> serde_json::Value {
    let mut request = request.clone();
    if let Some(hooks) = request.get_mut("hooks").and_then(serde_json::Value::as_array_mut) {
        for hook in hooks {
            if let Some(headers) = hook.get_mut("headers").and_then(serde_json::Value::as_object_mut) {
                for value in headers.values_mut() {
                    *value = serde_json::Value::String(REDACTED.to_owned());
                }
            }
        }
    }
    request
}

/// `url` as shown to whoever may not change what it belongs to, and in
/// logs: its credentials (user and password) and its query string, where
/// receivers take tokens, replaced by [`REDACTED`]; its scheme, host, port
/// and path kept. One that does not parse is redacted whole.
pub(crate) fn redact_url(url: &str) -> String {
    let Ok(parsed) = url::Url::parse(url) else { return REDACTED.to_owned() };
    let secret = !parsed.username().is_empty() || parsed.password().is_some() || parsed.query().is_some();
    if !secret && parsed.fragment().is_none() {
        return url.to_owned();
    }
    let mut shown = format!("{}://", parsed.scheme());
    if !parsed.username().is_empty() || parsed.password().is_some() {
        shown.push_str(REDACTED);
        shown.push('@');
    }
    shown.push_str(parsed.host_str().unwrap_or_default());
    if let Some(port) = parsed.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(parsed.path());
    if parsed.query().is_some() {
        shown.push('?');
        shown.push_str(REDACTED);
    }
    shown
}

/// A transaction request (as [`redact_request`] keeps it) with every
/// hook's URL redacted ([`redact_url`]).
pub(crate) fn redact_request_urls(request: &mut serde_json::Value) {
    if let Some(hooks) = request.get_mut("hooks").and_then(serde_json::Value::as_array_mut) {
        for hook in hooks {
            if let Some(url) = hook.get_mut("url").filter(|u| u.is_string()) {
                *url = serde_json::Value::String(redact_url(url.as_str().unwrap_or_default()));
            }
        }
    }
}

/// The hooks of a transaction request (none when it has no `hooks`).
pub fn hooks_of(request: &str) -> Vec<Hook> {
    #[derive(Deserialize)]
    struct WithHooks {
        #[serde(default)]
        hooks: Vec<Hook>,
    }
    serde_json::from_str::<WithHooks>(request).map(|r| r.hooks).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn credentials_and_query_strings_of_urls_are_redacted() {
        let cases = [
            ("https://hooks.example.com/orders", "https://hooks.example.com/orders"),
            ("https://svc:P4ssw0rd@hooks.example.com/x?token=abc", "https://[redacted]@hooks.example.com/x?[redacted]"),
            ("https://svc@hooks.example.com:8443/x", "https://[redacted]@hooks.example.com:8443/x"),
            ("http://127.0.0.1:9000/h?k=v&other=w#frag", "http://127.0.0.1:9000/h?[redacted]"),
            ("https://hooks.example.com/x#token=abc", "https://hooks.example.com/x"),
            ("not a url with a secret", "[redacted]"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
