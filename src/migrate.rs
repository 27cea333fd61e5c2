//! Numbered, idempotent migrations of the gateway's own collections (the
//! files in `migrations/`), applied at start and by `txgate migrate`, each
//! recorded in `_migrations` so it runs once.

use serde::Deserialize;

use crate::store::{DateTime, Document, IndexSpec, Store, StoreError, StoreResult, doc};

pub const MIGRATIONS_COLLECTION: &str = "_migrations";

/// Every migration, in order: `(name, JSON spec)`, one per file in
/// `migrations/` (listed by `build.rs`, so none can be left out).
pub const MIGRATIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

#[derive(Deserialize)]
struct Spec {
    description: String,
    indexes: Vec<IndexIn>,
}

#[derive(Deserialize)]
struct IndexIn {
    collection: String,
    name: String,
    keys: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    unique: bool,
}

fn keys(map: &serde_json::Map<String, serde_json::Value>) -> StoreResult<Document> {
    crate::store::convert::object_to_document(map).map_err(|e| StoreError::Internal(e.to_string()))
}

/// Apply every migration not yet recorded. Returns the names applied now.
pub async fn run(store: &dyn Store) -> StoreResult<Vec<String>> {
    let mut applied = Vec::new();
    for (name, text) in MIGRATIONS {
        if store.get(MIGRATIONS_COLLECTION, name).await?.is_some() {
            continue;
        }
        let spec: Spec = serde_json::from_str(text)
            .map_err(|e| StoreError::Internal(format!("migration {name} is malformed: {e}")))?;
        for index in &spec.indexes {
            let index_spec = IndexSpec { name: index.name.clone(), keys: keys(&index.keys)?, unique: index.unique };
            store.ensure_index(&index.collection, index_spec).await?;
        }
        // Another instance may have recorded it meanwhile: index creation is
        // idempotent, so losing this insert is harmless.
        store
            .insert(
                MIGRATIONS_COLLECTION,
                doc! {"_id": *name, "description": &spec.description, "applied_at": DateTime::now()},
            )
            .await?;
        tracing::info!(migration = %name, description = %spec.description, "migration applied");
        applied.push((*name).to_owned());
    }
    Ok(applied)
}

/// Whether every migration is recorded.
pub async fn all_applied(store: &dyn Store) -> StoreResult<bool> {
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
        assert!(listed.contains(&"0002_deliveries"));
    }

    #[test]
    fn every_migration_parses() {
        for (name, text) in MIGRATIONS {
            let spec: Spec = serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            for index in spec.indexes {
                keys(&index.keys).unwrap();
            }
        }
    }
}
