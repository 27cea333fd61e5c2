//! Pages and counts under a collection's rules (docs/guides/rules.md):
//! the caller's filter AND each grant's `match`, each served by its own
//! index; the union of several grants merged in one order, each document
//! once; a count of the union by inclusion and exclusion, every term from
//! index entries. No rule ever scans.

use std::cmp::Ordering;
use std::collections::HashSet;

use super::cursor::{Cursor, Forms, ID_ORDER, another_query, decode_cursor, encode_cursor};
use super::{Queries, Query, QueryError, QueryPage, store_query};
use crate::document::PageItem;
use crate::query::filter::{Cond, Filter};
use crate::query::plan::{Plan, Planning, SortKey, Unserved};
use crate::store::embedded::keys;
use crate::store::{Bson, Document, IndexQuery};

/// Grants a count's union is taken over at most (2^n − 1 counts).
pub(crate) const MAX_COUNTED_GRANTS: usize = 4;

/// One grant's part of a read: its name and its resolved `match`.
pub(crate) struct Part<'a> {
    pub grant: &'a str,
    pub filter: &'a Filter,
}

/// The value an equality pins `path` to in `filter`, if it does.
fn pinned<'f>(filter: &'f Filter, path: &str) -> Option<&'f Bson> {
    match filter.paths.get(path).map(Vec::as_slice) {
        Some([Cond::Eq(v)]) => Some(v),
        _ => None,
    }
}

/// One grant's read: its filter, its plan (`None`: the id order), and
/// the order its index yields (paths and directions, `_id` last).
struct Sub {
    grant: String,
    filter: Filter,
    plan: Option<Plan>,
    order: Vec<(String, i32)>,
}

impl Sub {
    fn store_order(&self) -> Vec<(String, i32)> {
        match &self.plan {
            Some(plan) => store_query(plan).order(),
            None => ID_ORDER.map(|(p, d)| (p.to_owned(), d)).to_vec(),
        }
    }
}

/// Where one part of a union resumes from a merged cursor.
enum Resume {
    /// Every document of the part comes after the cursor.
    Start,
    /// None does.
    Skip,
    /// After this key, in the part's own order.
    After(Vec<Bson>),
}

/// How `sub` resumes from `key` (in `order`): its pinned values, which
/// lead its place in the merged order, compared with the cursor's first.
fn resume(sub: &Sub, order: &[(String, i32)], key: &[Bson]) -> Resume {
    for (i, (path, dir)) in order.iter().enumerate() {
        let Some(value) = pinned(&sub.filter, path) else { break };
        match compare(std::slice::from_ref(value), &key[i..=i], &[(path.clone(), *dir)]) {
            Ordering::Less => return Resume::Skip,
            Ordering::Greater => return Resume::Start,
            Ordering::Equal => {}
        }
    }
    let values = sub
        .order
        .iter()
        .map(|(p, _)| order.iter().position(|(q, _)| q == p).map_or(Bson::Null, |i| key[i].clone()))
        .collect();
    Resume::After(values)
}

/// A union's merged order, where it resumes, and its cursors' digest.
#[derive(Clone, Copy)]
struct Merged<'a> {
    order: &'a [(String, i32)],
    after: Option<&'a [Bson]>,
    digest: i64,
}

/// Order bytes of `value` as an index keeps it.
fn key_bytes(value: Option<&Bson>) -> Vec<u8> {
    let mut out = Vec::new();
    keys::push(&mut out, value);
    out
}

fn compare(a: &[Bson], b: &[Bson], order: &[(String, i32)]) -> Ordering {
    for ((x, y), (_, dir)) in a.iter().zip(b).zip(order) {
        let o = key_bytes(Some(x)).cmp(&key_bytes(Some(y)));
        let o = if *dir < 0 { o.reverse() } else { o };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn value_at(data: &Document, id: &str, path: &str) -> Bson {
    if path == "_id" {
        return Bson::String(id.to_owned());
    }
    crate::store::filter::lookup(data, path).cloned().unwrap_or(Bson::Null)
}

/// `err` naming the grant whose part of a read no index serves.
fn naming(err: QueryError, grant: &str) -> QueryError {
    match err {
        QueryError::Unserved(Unserved::Never(detail)) => {
            QueryError::Unserved(Unserved::Never(format!("grant {grant}: {detail}")))
        }
        QueryError::Unserved(Unserved::Needs { fields, why }) => {
            let detail = format!("grant {grant}: {}", crate::query::plan::needs_detail(&fields, why));
            let name = crate::indexes::free_name(&fields, |_| false);
            QueryError::Suggested { name, fields, detail }
        }
        QueryError::Suggested { name, fields, detail } => {
            QueryError::Suggested { name, fields, detail: format!("grant {grant}: {detail}") }
        }
        other => other,
    }
}

impl Queries {
    /// Why no index serves `grant`'s part: the answer for it, naming it.
    async fn unserved_part(&self, coll: &str, grant: &str, why: Unserved, planning: Planning<'_>) -> QueryError {
        naming(self.unserved(coll, why, planning).await, grant)
    }

    /// A page of `query` over `coll` under `parts` (at least one): the
    /// documents any part's filter AND the query's matches, each once.
    pub(crate) async fn page_ruled(
        &self,
        coll: &str,
        query: &Query,
        parts: &[Part<'_>],
    ) -> Result<QueryPage, QueryError> {
        if let [part] = parts {
            let one = Query { filter: query.filter.and(part.filter), ..query.clone() };
            return self.page(coll, &one).await.map_err(|e| naming(e, part.grant));
        }
        let sort = Self::merge_sort(query, parts)?;
        let mut subs = Vec::with_capacity(parts.len());
        for part in parts {
            let filter = query.filter.and(part.filter);
            let planning = Planning::Page { filter: &filter, sort: &sort };
            let plan = if filter.paths.is_empty() && sort.is_empty() {
                None
            } else {
                match self.indexes.plan(coll, planning).await? {
                    Ok(plan) => Some(plan),
                    Err(why) => return Err(self.unserved_part(coll, part.grant, why, planning).await),
                }
            };
            subs.push(Sub { grant: part.grant.to_owned(), filter, plan, order: Vec::new() });
        }
        // The merged order: the sort, then the id.
        let mut order: Vec<(String, i32)> =
            sort.iter().map(|k| (k.path.clone(), if k.desc { -1 } else { 1 })).collect();
        order.push(("_id".to_owned(), 1));
        for sub in &mut subs {
            sub.order = sub.store_order();
            // Each part's index must yield the merged order, less what it pins.
            let wanted: Vec<&(String, i32)> = order.iter().filter(|(p, _)| pinned(&sub.filter, p).is_none()).collect();
            // A path it pins comes before every path it orders by: each part
            // resumes from a cursor by its pins alone, or after it.
            let first_free = order.iter().position(|(p, _)| pinned(&sub.filter, p).is_none()).unwrap_or(order.len());
            if let Some((late, _)) = order[first_free..].iter().find(|(p, _)| pinned(&sub.filter, p).is_some()) {
                return Err(QueryError::Unserved(Unserved::Never(format!(
                    "grant {}: its match pins {late:?}, which the query sorts by after {:?}; a union of grants is \
                     sorted by the paths a grant pins first",
                    sub.grant, order[first_free].0
                ))));
            }
            if wanted.len() != sub.order.len() || wanted.iter().zip(&sub.order).any(|(w, o)| *w != o) {
                return Err(QueryError::Unserved(Unserved::Never(format!(
                    "grant {}: its index yields the order {:?}, not the merged order {:?} of the caller's grants; \
                     sort by the path the grants' matches range over",
                    sub.grant, sub.order, order
                ))));
            }
        }
        let digest = Forms::of(&query.filter, query.after.is_some()).digest(Some(coll), &order);
        let after = match query.after.as_deref().map(decode_cursor).transpose()? {
            None => None,
            Some(Cursor { key, .. }) if key.len() != order.len() => {
                return Err(QueryError::Cursor("not a cursor of this query".into()));
            }
            Some(cursor) if cursor.of_another(&[digest]) => return Err(another_query()),
            Some(Cursor { key, .. }) => Some(key),
        };
        let mut reading = self.positioned.collection(coll).await?;
        loop {
            let merged = Merged { order: &order, after: after.as_deref(), digest };
            let page = self.read_union(coll, (query, &subs), merged, &reading).await?;
            if reading.stands().await? {
                return Ok(page);
            }
        }
    }

    /// The sort a union is merged in: the query's, or (without one) the
    /// one path the filters range over, if any.
    fn merge_sort(query: &Query, parts: &[Part<'_>]) -> Result<Vec<SortKey>, QueryError> {
        if !query.sort.is_empty() {
            return Ok(query.sort.clone());
        }
        let mut ranged: Vec<String> = parts
            .iter()
            .flat_map(|p| {
                let f = query.filter.and(p.filter);
                f.paths
                    .iter()
                    .filter(|(_, c)| !matches!(c.as_slice(), [Cond::Eq(_)]))
                    .map(|(p, _)| p.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        ranged.sort_unstable();
        ranged.dedup();
        match ranged.as_slice() {
            [] => Ok(Vec::new()),
            [one] => Ok(vec![SortKey { path: one.clone(), desc: false }]),
            many => Err(QueryError::Unserved(Unserved::Never(format!(
                "the caller's grants range over {many:?}: a union is merged in one order; sort by one of them"
            )))),
        }
    }

    /// One read of every part of a union, merged.
    async fn read_union(
        &self,
        coll: &str,
        (query, subs): (&Query, &[Sub]),
        merged: Merged<'_>,
        reading: &crate::positioned::Reading<'_>,
    ) -> Result<QueryPage, QueryError> {
        let Merged { order, after, digest } = merged;
        let mut found: Vec<(Vec<Bson>, PageItem)> = Vec::new();
        // The least key up to which every part has been read: past it, a
        // part that has more may hold documents not read yet.
        let mut bound: Option<Vec<Bson>> = None;
        for sub in subs {
            let sub_order = &sub.order;
            let sub_after = match after.map(|key| resume(sub, order, key)) {
                None | Some(Resume::Start) => None,
                Some(Resume::Skip) => continue,
                Some(Resume::After(values)) => {
                    let digest = Forms::of(&sub.filter, true).digest(Some(coll), sub_order);
                    Some(encode_cursor(&values, Some(digest)))
                }
            };
            let sub_query = Query {
                filter: sub.filter.clone(),
                sort: Vec::new(),
                fields: None,
                limit: query.limit,
                after: sub_after,
            };
            let page = self.read_page(coll, &sub_query, sub.plan.as_ref(), reading.at(), reading.position()).await?;
            for item in page.items {
                let live = item.into_live()?;
                let key: Vec<Bson> = order.iter().map(|(p, _)| value_at(&live.data, &live.id, p)).collect();
                found.push((key, PageItem::Built(live)));
            }
            if let Some(next) = page.next {
                let Cursor { key: sub_key, .. } = decode_cursor(&next)?;
                // The part's last key read, in the merged order's terms.
                let key: Vec<Bson> = order
                    .iter()
                    .map(|(p, _)| match sub_order.iter().position(|(q, _)| q == p) {
                        Some(i) => sub_key.get(i).cloned().unwrap_or(Bson::Null),
                        None => pinned(&sub.filter, p).cloned().unwrap_or(Bson::Null),
                    })
                    .collect();
                if bound.as_ref().is_none_or(|b| compare(&key, b, order) == Ordering::Less) {
                    bound = Some(key);
                }
            }
        }
        found.sort_by(|a, b| compare(&a.0, &b.0, order));
        let mut seen = HashSet::new();
        let mut items = Vec::new();
        let mut last: Option<Vec<Bson>> = None;
        let mut more = bound.is_some();
        for (key, item) in found {
            if bound.as_ref().is_some_and(|b| compare(&key, b, order) == Ordering::Greater) {
                break;
            }
            // Never one at or before the cursor.
            if after.is_some_and(|a| compare(&key, a, order) != Ordering::Greater) {
                continue;
            }
            if !seen.insert(item.id().to_owned()) {
                continue;
            }
            if items.len() == query.limit {
                more = true;
                break;
            }
            last = Some(key);
            items.push(item);
        }
        // Nothing shown yet every part has more: go on past the bound.
        let resume = last.or(if items.is_empty() { bound } else { None });
        let next = if more { resume.map(|k| encode_cursor(&k, Some(digest))) } else { None };
        let items = super::project::trim(items, query.fields.as_deref())?;
        Ok(QueryPage { items, next, position: reading.position() })
    }

    /// How many live documents any of `parts` AND `filter` matches, each
    /// once: inclusion and exclusion over the parts' intersections, each
    /// counted from index entries at one position.
    pub(crate) async fn count_ruled(
        &self,
        coll: &str,
        filter: &Filter,
        parts: &[Part<'_>],
    ) -> Result<(u64, u64), QueryError> {
        if let [part] = parts {
            let one = filter.and(part.filter);
            return self.count(coll, &one).await.map_err(|e| naming(e, part.grant));
        }
        if parts.len() > MAX_COUNTED_GRANTS {
            return Err(QueryError::Unserved(Unserved::Never(format!(
                "the caller holds {} grants that count on this collection: a count takes the union of \
                 {MAX_COUNTED_GRANTS} at most",
                parts.len()
            ))));
        }
        // Every nonempty subset: its filter, its sign, its plan.
        let mut terms: Vec<(Filter, i64, IndexQuery)> = Vec::new();
        for mask in 1u32..(1 << parts.len()) {
            let chosen: Vec<&Part<'_>> =
                parts.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, p)| p).collect();
            let f = chosen.iter().fold(filter.clone(), |acc, p| acc.and(p.filter));
            let sign = if chosen.len() % 2 == 1 { 1 } else { -1 };
            let planning = Planning::Count { filter: &f };
            let query = match self.indexes.plan(coll, planning).await? {
                Ok(plan) => store_query(&plan),
                Err(_) if f.paths.is_empty() => IndexQuery::live(),
                Err(why) => {
                    let names: Vec<&str> = chosen.iter().map(|p| p.grant).collect();
                    return Err(self.unserved_part(coll, &names.join(" and "), why, planning).await);
                }
            };
            terms.push((f, sign, query));
        }
        let mut reading = self.positioned.collection(coll).await?;
        loop {
            let mut total: i64 = 0;
            for (f, sign, query) in &terms {
                let n = self.read_count(coll, f, query, reading.at()).await?;
                total += sign * i64::try_from(n).unwrap_or(i64::MAX);
            }
            if reading.stands().await? {
                return Ok((u64::try_from(total).unwrap_or(0), reading.position()));
            }
        }
    }
}
