//! The wire shapes every document endpoint shares: a document as the API
//! shows it, and the paths that name a collection or a document.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::contract::{Collection, DocumentId, Fields};
use super::error::ApiError;
use crate::clock::rfc3339;
use crate::document::rules;
use crate::document::{Live, StoredLive};
use crate::store::DateTime;

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
        let Live { id, version, schema_version, created_at, updated_at, data } = live;
        let stamps = (version, schema_version, created_at, updated_at);
        Self::of(collection, id, stamps, DataOut::Built(data))
    }

    /// A document read as stored.
    pub(crate) fn stored(collection: &str, live: StoredLive) -> Self {
        let StoredLive { id, version, schema_version, created_at, updated_at, record } = live;
        let stamps = (version, schema_version, created_at, updated_at);
        Self::of(collection, id, stamps, DataOut::Stored(record))
    }

    fn of(
        collection: &str,
        id: String,
        (version, schema_version, created_at, updated_at): (i64, i64, DateTime, DateTime),
        data: DataOut,
    ) -> Self {
        Self {
            collection: collection.to_owned(),
            id,
            version,
            schema_version,
            created_at: rfc3339(created_at),
            updated_at: rfc3339(updated_at),
            data,
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
