//! Lists a page at a time: the page query every list takes, and the
//! opaque cursors that name where a page ends.

use base64::Engine as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::contract::{Cursor, MAX_CURSOR};
use super::error::ApiError;
use crate::documents::rules::Invalid;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page.
    #[param(value_type = Option<Cursor>)]
    pub after: Option<String>,
}

pub const DEFAULT_PAGE: i64 = 50;
pub const MAX_PAGE: i64 = 1000;

/// A page request's size (1..1000, default 50) and the id its `after`
/// cursor names.
pub fn paging(limit: Option<i64>, after: Option<&str>) -> Result<(usize, Option<String>), ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Invalid::new("/query/limit", format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    Ok((limit as usize, after.map(decode_cursor).transpose()?))
}

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

pub fn encode_cursor(id: &str) -> String {
    CURSOR.encode(id)
}

pub fn decode_cursor(cursor: &str) -> Result<String, ApiError> {
    if cursor.len() > MAX_CURSOR {
        return Err(Invalid::new("/query/after", "not a cursor returned by this API (too long)").into());
    }
    CURSOR
        .decode(cursor)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .map_err(|_| Invalid::new("/query/after", "not a cursor returned by this API").into())
}
