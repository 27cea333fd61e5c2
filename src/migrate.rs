//! Numbered, idempotent migrations of the gateway's own collections (the
//! files in `migrations/`), applied at start and by `txgate migrate`, each
//! recorded in `_migrations` so it runs once.

use serde::Deserialize;

use crate::store::scans::USER;
use crate::store::{DateTime, IndexSpec, Store, StoreError, StoreResult, doc};

pub const MIGRATIONS_COLLECTION: &str = "_migrations";

/// Every migration, in order: `(name, JSON spec)`, one per file in
/// `migrations/` (listed by `build.rs`, so none can be left out).
pub const MIGRATIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    description: String,
    #[serde(default)]
    indexes: Vec<IndexIn>,
    /// Indexes a later migration replaced.
    #[serde(default)]
    drop: Vec<IndexRef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexIn {
    /// A collection, or `*`: a template every user collection gets on its
    /// first write.
    collection: String,
    name: String,
    /// Fields in order, each `1` (ascending; order is read in reverse when
    /// a scan wants it).
    keys: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    unique: bool,
    #[serde(default)]
    sparse: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexRef {
    collection: String,
    name: String,
}

fn parse(name: &str, text: &str) -> StoreResult<Spec> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(format!("migration {name} is malformed: {e}")))
}

fn spec(name: &str, index: &IndexIn) -> StoreResult<IndexSpec> {
    if let Some((field, _)) = index.keys.iter().find(|(_, v)| v.as_i64() != Some(1)) {
        return Err(StoreError::Internal(format!(
            "migration {name}: index {} field {field} must be 1 (ascending)",
            index.name
        )));
    }
    Ok(IndexSpec {
        name: index.name.clone(),
        fields: index.keys.keys().cloned().collect(),
        unique: index.unique,
        sparse: index.sparse,
        counted: false,
    })
}

/// Every index the migrations leave in place: `(collection, spec)`, `*`
/// for the templates of user collections.
pub fn declared_indexes() -> Vec<(String, IndexSpec)> {
    let mut out: Vec<(String, IndexSpec)> = Vec::new();
    for (name, text) in MIGRATIONS {
        let spec_of = parse(name, text).expect("migrations parse (checked by a test)");
        for index in &spec_of.indexes {
            let index_spec = spec(name, index).expect("migration indexes are ascending (checked by a test)");
            out.retain(|(c, s)| !(c == &index.collection && s.name == index.name));
            out.push((index.collection.clone(), index_spec));
        }
        for gone in &spec_of.drop {
            out.retain(|(c, s)| !(c == &gone.collection && s.name == gone.name));
        }
    }
    out
}

/// The index templates every user collection gets.
pub fn templates() -> Vec<IndexSpec> {
    declared_indexes().into_iter().filter(|(c, _)| c == USER).map(|(_, s)| s).collect()
}

/// A migration's record in the migrations collection, once applied.
#[derive(serde::Serialize)]
struct Applied<'a> {
    #[serde(rename = "_id")]
    name: &'a str,
    description: &'a str,
    applied_at: DateTime,
}

/// Apply every migration not yet recorded, and make sure every index of
/// the gateway's own collections exists (cheap when it does; a store
/// created before an index was declared gets it built). Returns the names
/// of the migrations applied now.
pub async fn run(store: &dyn Store) -> StoreResult<Vec<String>> {
    let mut applied = Vec::new();
    for (name, text) in MIGRATIONS {
        if store.get(MIGRATIONS_COLLECTION, name).await?.is_some() {
            continue;
        }
        let spec_of = parse(name, text)?;
        // Templates reach the user collections that exist now; new ones get
        // them on their first write.
        let users: Vec<String> = if spec_of.indexes.iter().any(|i| i.collection == USER) {
            store.collections().await?.into_iter().filter(|c| !c.starts_with('_')).collect()
        } else {
            Vec::new()
        };
        for index in spec_of.indexes.iter().filter(|i| i.collection == USER) {
            let index_spec = spec(name, index)?;
            for (n, coll) in users.iter().enumerate() {
                tracing::info!(migration = %name, index = %index.name, collection = %coll, progress = format!("{}/{}", n + 1, users.len()), "building index");
                store.ensure_index(coll, index_spec.clone()).await?;
            }
        }
        for gone in &spec_of.drop {
            store.drop_index(&gone.collection, &gone.name).await?;
        }
        // Another instance may have recorded it meanwhile: index creation is
        // idempotent, so losing this insert is harmless.
        let applied_record = Applied { name, description: &spec_of.description, applied_at: DateTime::now() };
        store.insert(MIGRATIONS_COLLECTION, crate::store::shape::fields(&applied_record)).await?;
        tracing::info!(migration = %name, description = %spec_of.description, "migration applied");
        applied.push((*name).to_owned());
    }
    for (coll, index) in declared_indexes() {
        if coll != USER {
            store.ensure_index(&coll, index).await?;
        }
    }
    Ok(applied)
}

/// Whether every migration is recorded.
pub(crate) async fn all_applied(store: &dyn Store) -> StoreResult<bool> {
    for (name, _) in MIGRATIONS {
        if store.get(MIGRATIONS_COLLECTION, name).await?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scans::{ALL, PRIMARY, ScanDecl, check};

    #[test]
    fn every_file_in_migrations_is_listed_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".json"))
            .map(|n| n.trim_end_matches(".json").to_owned())
            .collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|(name, _)| *name).collect();
        assert_eq!(listed, files);
        assert!(listed.contains(&"0003_indexed_scans"));
    }

    #[test]
    fn every_migration_parses() {
        for (name, text) in MIGRATIONS {
            let parsed = parse(name, text).unwrap_or_else(|e| panic!("{e}"));
            for index in &parsed.indexes {
                spec(name, index).unwrap();
            }
        }
        assert!(templates().iter().any(|t| t.name == "locked"));
        assert!(!declared_indexes().iter().any(|(_, s)| s.name == "status_next"), "dropped by 0003");
    }

    // Every scan the store declares (`txgate_store::scans`) is served by
    // an index these migrations create.
    #[test]
    fn every_scan_is_served_by_a_declared_index() {
        let indexes = declared_indexes();
        let failures: Vec<String> = ALL.iter().filter_map(|d| check(d, &indexes).err()).collect();
        assert!(failures.is_empty(), "scans without an index: {failures:#?}");
    }

    #[test]
    fn a_scan_without_a_declared_index_is_refused() {
        let indexes = declared_indexes();
        let bad = [
            ScanDecl { coll: "_txns", index: "nope", eq: &["status"], by: "_id" },
            ScanDecl { coll: "_txns", index: "status_expires", eq: &[], by: "expires_at" },
            ScanDecl { coll: "_txns", index: "status_expires", eq: &["status"], by: "finished_at" },
            ScanDecl { coll: "_txns", index: "status_expires", eq: &["status", "expires_at"], by: "_id" },
            ScanDecl { coll: "_deliveries", index: "status", eq: &["status"], by: "next_at" },
            ScanDecl { coll: "*", index: "status", eq: &["status"], by: "_id" },
            ScanDecl { coll: "_txns", index: PRIMARY, eq: &["status"], by: "_id" },
        ];
        for decl in &bad {
            assert!(check(decl, &indexes).is_err(), "{decl:?} was accepted");
        }
    }
}
