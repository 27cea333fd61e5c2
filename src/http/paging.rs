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
use crate::seal::{List, Seal};
use crate::store::StoreError;

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
        let after = self.after.as_deref().map(decode_cursor).transpose()?;
        Ok((self.limit()?, after.map(|bytes| String::from_utf8_lossy(&bytes).into_owned())))
    }

    /// [`page`](Self::page) of a list whose cursors are sealed (`list`):
    /// the id a sealed cursor holds, 422 for one this list did not seal.
    /// An earlier release's cursor (the plain id of the record, a UUID in
    /// these lists) is taken as the id it names: a position the client
    /// chose shows it nothing it may not see. Anything else is 422, so a
    /// damaged cursor never restarts or ends a list silently.
    pub(crate) async fn sealed_page(&self, seal: &Seal, list: List) -> Result<(usize, Option<String>), ApiError> {
        let limit = self.limit()?;
        let Some(bytes) = self.after.as_deref().map(decode_cursor).transpose()? else { return Ok((limit, None)) };
        let after = match bytes.split_first() {
            Some((&SEALED, sealed)) => seal.open(list, sealed).await?.ok_or_else(not_a_cursor)?,
            _ => std::str::from_utf8(&bytes)
                .ok()
                .filter(|id| uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == *id))
                .ok_or_else(not_a_cursor)?
                .to_owned(),
        };
        Ok((limit, Some(after)))
    }

    fn limit(&self) -> Result<usize, ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(Invalid::new("/query/limit", format!("limit must be between 1 and {MAX_PAGE}")).into());
        }
        Ok(limit as usize)
    }
}

/// Records a page may read past what it keeps before it ends short, in a
/// list a key sees only part of ([`kept`]).
pub(crate) const SKIP_BUDGET: usize = 1000;

/// A page of up to `limit` records `keep` lets through, read after `after`
/// a store page at a time (`read`: records after a position, at most so
/// many, and the position to go on from when more exist), and where the
/// next page goes on from. The page ends at its `limit`-th kept record, at
/// the end of the list, or short once it has read [`SKIP_BUDGET`] records
/// besides the page, so a key that sees few records of many still gets an
/// answer in bounded time; the position it goes on from is then a record
/// the key may not see, which is why these lists seal their cursors.
pub(crate) async fn kept<T, Fut>(
    mut read: impl FnMut(Option<String>, usize) -> Fut,
    mut after: Option<String>,
    limit: usize,
    keep: impl Fn(&T) -> bool,
    id: impl Fn(&T) -> &str,
) -> Result<(Vec<T>, Option<String>), StoreError>
where
    Fut: Future<Output = Result<(Vec<T>, Option<String>), StoreError>>,
{
    let mut page = Vec::new();
    let mut skipped = 0;
    loop {
        // The first read asks for the page and the record after it (which
        // tells whether more follow); later ones (after records the key may
        // not see) read on in larger steps.
        let want = if page.is_empty() && skipped == 0 { limit + 1 } else { (limit - page.len()).max(100) };
        let (records, next) = read(after.take(), want.min(SKIP_BUDGET - skipped).max(1)).await?;
        let mut records = records.into_iter();
        while let Some(record) = records.next() {
            if !keep(&record) {
                skipped += 1;
                continue;
            }
            page.push(record);
            if page.len() == limit {
                // Full: the page goes on after its last record, unless what
                // was read shows the list ends with it (no kept record after
                // it, and nothing after what was read).
                let more = records.any(|r| keep(&r)) || next.is_some();
                let last = page.last().map(|r| id(r).to_owned());
                return Ok((page, last.filter(|_| more)));
            }
        }
        if next.is_none() || skipped >= SKIP_BUDGET {
            return Ok((page, next));
        }
        after = next;
    }
}

/// The first byte of a sealed cursor. No id starts with it: ids hold no
/// control characters.
const SEALED: u8 = 0x01;

impl<T> Page<T> {
    /// [`Page::new`] for a list whose cursors are sealed (`list`).
    pub(crate) async fn sealed(items: Vec<T>, last: Option<&str>, seal: &Seal, list: List) -> Result<Self, ApiError> {
        let next = match last {
            Some(last) => {
                let mut bytes = vec![SEALED];
                bytes.extend(seal.seal(list, last).await?);
                Some(CURSOR.encode(bytes))
            }
            None => None,
        };
        Ok(Self { items, next })
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

fn decode_cursor(cursor: &str) -> Result<Vec<u8>, ApiError> {
    if cursor.len() > MAX_CURSOR {
        return Err(Invalid::new("/query/after", "not a cursor returned by this API (too long)").into());
    }
    CURSOR.decode(cursor).map_err(|_| not_a_cursor())
}

fn not_a_cursor() -> ApiError {
    Invalid::new("/query/after", "not a cursor returned by this API").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kept` over records 0..n (their ids zero-padded, so in order),
    /// keeping those `keep` lets through, as a store page reads them: the
    /// pages it gives until the end, and how many records it read in all.
    async fn pages(n: u32, limit: usize, keep: impl Fn(u32) -> bool) -> (Vec<Vec<u32>>, usize) {
        let read_total = std::cell::Cell::new(0);
        let (mut out, mut after) = (Vec::new(), None::<String>);
        loop {
            let read = |after: Option<String>, want: usize| {
                let start = after.map_or(0, |a| a.parse::<u32>().unwrap() + 1);
                let records: Vec<String> = (start..n).take(want).map(|r| format!("{r:08}")).collect();
                read_total.set(read_total.get() + records.len());
                let more = start + (records.len() as u32) < n;
                let next = more.then(|| records.last().unwrap().clone());
                async move { Ok((records, next)) }
            };
            let keep = |r: &String| keep(r.parse().unwrap());
            let (page, next) = kept(read, after, limit, keep, |r| r).await.unwrap();
            out.push(page.iter().map(|r| r.parse().unwrap()).collect());
            match next {
                Some(next) => after = Some(next),
                None => return (out, read_total.get()),
            }
        }
    }

    #[tokio::test]
    async fn a_page_of_kept_records_goes_on_after_its_last_and_ends_short_past_its_budget() {
        // Everything kept: pages as the store reads them, and no empty
        // page after a full last one.
        let (got, read) = pages(9, 3, |_| true).await;
        assert_eq!(got, [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
        assert!(read <= 9 + 2, "read {read}");
        // One in four kept: pages fill past what is skipped.
        let (got, _) = pages(40, 3, |r| r % 4 == 0).await;
        assert_eq!(got, [vec![0, 4, 8], vec![12, 16, 20], vec![24, 28, 32], vec![36]]);
        // A full last page, others' records after it: no empty page after
        // it when what was read shows the end.
        let (got, _) = pages(12, 3, |r| r % 2 == 0).await;
        assert_eq!(got, [vec![0, 2, 4], vec![6, 8, 10]]);
        // Few kept among many: a page ends short once it has skipped its
        // budget, and the next goes on from there; every kept record comes
        // once.
        let n = (SKIP_BUDGET * 3) as u32;
        let (got, read) = pages(n, 2, |r| r == 5 || r > n - 3).await;
        let flat: Vec<u32> = got.iter().flatten().copied().collect();
        assert_eq!(flat, [5, n - 2, n - 1]);
        assert!(got.len() >= 3 && got.iter().any(Vec::is_empty), "{:?}", got.iter().map(Vec::len).collect::<Vec<_>>());
        assert!(read < (n as usize) * 2, "read {read}");
    }
}
