//! API keys and their grants, as the configuration gives them: a key is
//! known by its place in the setting, never by any part of it, and its
//! `Debug` never shows it. The HTTP layer checks requests against them
//! (`http::auth`).

use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Read,
    Write,
    Admin,
}

impl Scope {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// A scope, on every collection or on one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub scope: Scope,
    pub collection: Option<String>,
}

impl Grant {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (scope, collection) = match spec.split_once('@') {
            Some((scope, coll)) => (scope, Some(coll)),
            None => (spec, None),
        };
        let scope = Scope::parse(scope)
            .ok_or_else(|| format!("unknown scope {scope:?} (read, write, admin; or scope@collection)"))?;
        if let Some(coll) = collection
            && !crate::document::rules::is_collection_name(coll)
        {
            return Err(format!("{spec:?}: {coll:?} is not a collection name (^[a-zA-Z][a-zA-Z0-9_-]{{0,63}}$)"));
        }
        Ok(Grant { scope, collection: collection.map(str::to_owned) })
    }

    pub fn covers(&self, needed: Scope, collection: Option<&str>) -> bool {
        self.scope >= needed
            && match (&self.collection, collection) {
                (None, _) => true,
                (Some(own), Some(c)) => own == c,
                (Some(_), None) => false,
            }
    }
}

/// An API key and what it may do. Its `Debug` shows the grants, never the
/// key.
#[derive(Clone)]
pub struct ApiKey {
    pub key: String,
    pub grants: Vec<Grant>,
    /// A label that is not secret: what change events record as the key
    /// that made a change, and what conflicts show (`key-<n>` by default,
    /// its place in the setting).
    pub name: String,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("key", &REDACTED)
            .field("grants", &self.grants)
            .finish()
    }
}

const REDACTED: &str = "[redacted]";

impl ApiKey {
    /// What this key's requests are known by where they must be kept apart
    /// from other keys' (idempotency keys): a digest of the whole key,
    /// stable across restarts, from which the key cannot be recovered.
    pub fn scope(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.key.as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// One key as the TOML file may give it:
/// `{ key = "...", scopes = ["read@orders"], name = "billing" }`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub key: String,
    pub scopes: Vec<String>,
    #[serde(default)]
    pub name: Option<String>,
}

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEntry")
            .field("name", &self.name)
            .field("key", &REDACTED)
            .field("scopes", &self.scopes)
            .finish()
    }
}

/// `TXGATE_API_KEYS` (or `api_keys` in the TOML file): the string form,
/// or, in the file, a list of `{ key, scopes }` tables. `Debug` shows no
/// key.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub enum KeysSetting {
    Spec(String),
    Table(Vec<KeyEntry>),
}

impl std::fmt::Debug for KeysSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeysSetting::Spec(_) => f.write_str("Spec([redacted])"),
            KeysSetting::Table(entries) => f.debug_tuple("Table").field(entries).finish(),
        }
    }
}

impl std::str::FromStr for KeysSetting {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(KeysSetting::Spec(s.to_owned()))
    }
}

impl KeysSetting {
    /// The keys, or why not; `None` when the setting names none (unset).
    pub fn keys(&self) -> Result<Option<Vec<ApiKey>>, String> {
        match self {
            KeysSetting::Spec(spec) if spec.trim().is_empty() => Ok(None),
            KeysSetting::Spec(spec) => parse_keys(spec).map(Some),
            KeysSetting::Table(entries) if entries.is_empty() => Err("api_keys is set but names no key".into()),
            KeysSetting::Table(entries) => {
                let keys = entries
                    .iter()
                    .enumerate()
                    .map(|(n, e)| {
                        let mut scopes: Vec<&str> = e.scopes.iter().map(String::as_str).collect();
                        let named = e.name.as_ref().map(|name| format!("name={name}"));
                        scopes.extend(named.as_deref());
                        key(n + 1, &e.key, &scopes)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                distinct_names(&keys)?;
                Ok(Some(keys))
            }
        }
    }
}

/// Whether `name` may name a key: 1 to 64 letters, digits, `_`, `-`, `.`
/// and `@`, starting with a letter or digit.
fn is_key_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'))
}

fn distinct_names(keys: &[ApiKey]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for k in keys {
        if !seen.insert(k.name.as_str()) {
            return Err(format!("two API keys are named {:?}: names tell keys apart in events", k.name));
        }
    }
    Ok(())
}

/// Key number `n` (from 1) of the setting; errors name it by its place,
/// never by any part of the key.
/// A `name=<label>` item among the scopes names the key.
fn key(n: usize, key: &str, scopes: &[&str]) -> Result<ApiKey, String> {
    if key.len() < 16 {
        return Err(format!("API key #{n} is too short: use at least 16 characters"));
    }
    let mut name = None;
    let mut grants = Vec::new();
    for item in scopes.iter().map(|s| s.trim()) {
        match item.strip_prefix("name=") {
            Some(label) if !is_key_name(label) => {
                return Err(format!(
                    "API key #{n}: {label:?} is not a key name (1 to 64 letters, digits, _ - . @; first a letter or digit)"
                ));
            }
            Some(_) if name.is_some() => return Err(format!("API key #{n} is named twice")),
            Some(label) => name = Some(label.to_owned()),
            None => grants.push(Grant::parse(item)?),
        }
    }
    if grants.is_empty() {
        return Err(format!("API key #{n} has no scope"));
    }
    Ok(ApiKey { key: key.to_owned(), grants, name: name.unwrap_or_else(|| format!("key-{n}")) })
}

/// Parse `key:grant[+grant],...` where a grant is `scope` or
/// `scope@collection`.
pub fn parse_keys(spec: &str) -> Result<Vec<ApiKey>, String> {
    let mut keys = Vec::new();
    for (n, entry) in spec.split(',').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
        let (k, scopes) =
            entry.rsplit_once(':').ok_or_else(|| format!("API key #{} must be key:scope[+scope]", n + 1))?;
        keys.push(key(n + 1, k, &scopes.split('+').collect::<Vec<_>>())?);
    }
    if keys.is_empty() {
        return Err("TXGATE_API_KEYS is set but names no key".into());
    }
    distinct_names(&keys)?;
    Ok(keys)
}
