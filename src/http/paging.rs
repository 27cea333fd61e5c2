//! Lists a page at a time: the page query every list takes ([`ListQuery`],
//! the one cursor extractor), the page every list answers ([`Page`]), and
//! the opaque cursors that name where a page ends.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::contract::{Cursor, MAX_CURSOR};
use super::error::ApiError;
use crate::document::rules::Invalid;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page.
    #[param(value_type = Option<Cursor>)]
    pub after: Option<String>,
}

impl ListQuery {
    /// The page asked for: its size (1..1000, default 50) and the id its
    /// `after` cursor names.
    pub(crate) fn page(&self) -> Result<(usize, Option<String>), ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(Invalid::new("/query/limit", format!("limit must be between 1 and {MAX_PAGE}")).into());
        }
        Ok((limit as usize, self.after.as_deref().map(decode_cursor).transpose()?))
    }
}

/// A list's `status` filter as the status type it names (`Status`,
/// `DeliveryStatus`: their own `Deserialize`), or 422 at `/query/status`
/// saying what it may be (`one_of`).
pub(crate) fn status_filter<T: DeserializeOwned>(status: Option<&str>, one_of: &str) -> Result<Option<T>, ApiError> {
    let Some(status) = status else { return Ok(None) };
    let parsed = T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(status));
    parsed.map(Some).map_err(|_| Invalid::new("/query/status", format!("status is {one_of}")).into())
}

/// One page of a list: its items, and the cursor of the page after it
/// (`null` on the last page). Every list answers one.
#[derive(serde::Serialize)]
pub(crate) struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// `items`, and the cursor after `last` (the last id of the page, when
    /// more may follow).
    pub(crate) fn new(items: Vec<T>, last: Option<&str>) -> Self {
        Self { items, next: last.map(encode_cursor) }
    }
}

/// An item listed a page at a time: the name (and description) of its
/// page's schema in the API description.
pub(crate) trait Listed: ToSchema {
    const PAGE: &'static str;
    const PAGE_DOC: Option<&'static str> = None;
}

impl<T: Listed> PartialSchema for Page<T> {
    fn schema() -> RefOr<Schema> {
        let next = OneOfBuilder::new().item(ObjectBuilder::new().schema_type(Type::Null)).item({
            let mut cursor = Ref::from_schema_name(Cursor::name());
            cursor.description = "Cursor for `after=`; `null` on the last page.".into();
            cursor
        });
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(T::PAGE_DOC)
            .property("items", ArrayBuilder::new().items(Ref::from_schema_name(T::name())))
            .required("items")
            .property("next", next)
            .into()
    }
}

impl<T: Listed> ToSchema for Page<T> {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed(T::PAGE)
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((T::name().into_owned(), T::schema()));
        T::schemas(schemas);
    }
}

pub(crate) const DEFAULT_PAGE: i64 = 50;
pub(crate) const MAX_PAGE: i64 = 1000;

/// Cursors: unpadded base64url of the last id of a page. Decoding is
/// lenient (stray trailing bits, invalid UTF-8 replaced): a cursor is a
/// position, `after` it is well defined for any string.
const CURSOR: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone),
);

fn encode_cursor(id: &str) -> String {
    CURSOR.encode(id)
}

fn decode_cursor(cursor: &str) -> Result<String, ApiError> {
    if cursor.len() > MAX_CURSOR {
        return Err(Invalid::new("/query/after", "not a cursor returned by this API (too long)").into());
    }
    CURSOR
        .decode(cursor)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .map_err(|_| Invalid::new("/query/after", "not a cursor returned by this API").into())
}
