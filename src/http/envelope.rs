//! The wire shapes every document endpoint shares: a document as the API
//! shows it, and the paths that name a collection or a document.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::contract::{Collection, DocumentId, Fields};
use super::error::ApiError;
use crate::clock::rfc3339;
use crate::document::rules;
use crate::document::{Live, StoredLive};

/// A document as the API shows it.
#[derive(Serialize, ToSchema)]
pub(crate) struct DocumentOut {
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// Increases by exactly 1 with every committed change; the `ETag`.
    #[schema(minimum = 1, example = 3)]
    pub version: i64,
    /// The schema version its last writer declared.
    #[schema(minimum = 1, example = 1)]
    pub schema_version: i64,
    #[schema(format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub created_at: String,
    #[schema(format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub updated_at: String,
    /// The user's fields.
    #[schema(value_type = Fields)]
    pub data: DataOut,
}

/// A document's data: built, or the record as stored, written out from
/// its bytes without its gateway fields (the same JSON either way).
pub(crate) enum DataOut {
    Built(crate::store::Document),
    Stored(mongodb::bson::RawDocumentBuf),
}

impl Serialize for DataOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DataOut::Built(doc) => crate::store::convert::serialize_document(doc, s),
            DataOut::Stored(record) => crate::store::convert::serialize_raw_document(record, &StoredLive::NOT_DATA, s),
        }
    }
}

impl DocumentOut {
    pub(crate) fn new(collection: &str, live: Live) -> Self {
        Self {
            collection: collection.to_owned(),
            id: live.id,
            version: live.version,
            schema_version: live.schema_version,
            created_at: rfc3339(live.created_at),
            updated_at: rfc3339(live.updated_at),
            data: DataOut::Built(live.data),
        }
    }

    /// A document read as stored.
    pub(crate) fn stored(collection: &str, live: StoredLive) -> Self {
        Self {
            collection: collection.to_owned(),
            id: live.id,
            version: live.version,
            schema_version: live.schema_version,
            created_at: rfc3339(live.created_at),
            updated_at: rfc3339(live.updated_at),
            data: DataOut::Stored(live.record),
        }
    }
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct CollectionPath {
    #[param(value_type = Collection)]
    pub collection: String,
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct DocumentPath {
    #[param(value_type = Collection)]
    pub collection: String,
    #[param(value_type = DocumentId)]
    pub id: String,
}

impl CollectionPath {
    pub(crate) fn check(&self) -> Result<&str, ApiError> {
        rules::check_collection(&self.collection, "/path/collection")?;
        Ok(&self.collection)
    }
}

impl DocumentPath {
    pub(crate) fn check(&self) -> Result<(&str, &str), ApiError> {
        rules::check_collection(&self.collection, "/path/collection")?;
        rules::check_id(&self.id, "/path/id")?;
        Ok((&self.collection, &self.id))
    }
}
