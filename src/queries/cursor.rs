//! A page's cursor: the key of the last entry read, and a digest of the
//! query it belongs to, so a cursor passed with another query is refused.

use base64::Engine as _;

use super::{MAX_CURSOR, Query, QueryError};
use crate::query::filter::{Cond, Filter};
use crate::store::{Bson, Document};

impl Query {
    /// A digest of what the query selects and the order it is read in
    /// (see [`digest_of`]), which its cursors hold.
    #[cfg(test)]
    pub(super) fn digest(&self, coll: Option<&str>, order: &[(String, i32)]) -> i64 {
        Forms::of(&self.filter, false).digest(coll, order)
    }

    /// The digests a cursor of this query may hold (see [`Forms::digests`]).
    #[cfg(test)]
    pub(super) fn digests(&self, coll: Option<&str>, order: &[(String, i32)]) -> Vec<i64> {
        Forms::of(&self.filter, true).digests(coll, order)
    }
}

/// A filter in the forms its cursors' digests are taken of, worked out
/// once per page: the one form ([`Filter::canonical`]) and, when a cursor
/// is to be checked and they differ, the values as written (cursors made
/// before values took one form hold that).
pub(super) struct Forms {
    normal: Vec<Vec<u8>>,
    written: Option<Vec<Vec<u8>>>,
}

impl Forms {
    pub(super) fn of(filter: &Filter, checking: bool) -> Self {
        let normal = filter.canonical(Cond::normal);
        let written = checking.then(|| filter.canonical(Cond::clone)).filter(|written| *written != normal);
        Forms { normal, written }
    }

    /// The digest this query's cursors are given.
    pub(super) fn digest(&self, coll: Option<&str>, order: &[(String, i32)]) -> i64 {
        digest_of(&self.normal, coll, order)
    }

    /// The digests a cursor of this query may hold: [`Self::digest`], and
    /// the one of the values as written where that differs.
    pub(super) fn digests(&self, coll: Option<&str>, order: &[(String, i32)]) -> Vec<i64> {
        std::iter::once(&self.normal).chain(&self.written).map(|conds| digest_of(conds, coll, order)).collect()
    }
}

/// A digest of what a query selects and the order it is read in
/// (collection `coll`, its filter's conditions `conds`, in whatever order
/// they were written, and `order`, the fields and directions of the index
/// read with the id last), which its cursors hold: the first 8 bytes of a
/// SHA-256. Without `coll`: the digest cursors of format 2 hold.
pub(super) fn digest_of(conds: &[Vec<u8>], coll: Option<&str>, order: &[(String, i32)]) -> i64 {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    if let Some(coll) = coll {
        hash.update(b"collection");
        hash.update((coll.len() as u64).to_le_bytes());
        hash.update(coll.as_bytes());
    }
    for cond in conds {
        hash.update((cond.len() as u64).to_le_bytes());
        hash.update(cond);
    }
    hash.update(u64::MAX.to_le_bytes());
    for (path, direction) in order {
        hash.update((path.len() as u64).to_le_bytes());
        hash.update(path.as_bytes());
        hash.update(direction.to_le_bytes());
    }
    let bytes: [u8; 8] = hash.finalize()[..8].try_into().expect("8 bytes");
    i64::from_le_bytes(bytes)
}

pub(super) const CURSOR: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
/// The version of the cursor's format: 3 holds its query's digest with its
/// collection, in the id order too. Earlier releases' are still taken: 2
/// holds the digest without the collection (along an index only), 1 none.
pub(super) const CURSOR_FORMAT: i32 = 3;

/// The order of a query that neither filters nor sorts, as its digest
/// names it.
pub(super) const ID_ORDER: [(&str, i32); 1] = [("_id", 1)];

pub(super) fn another_query() -> QueryError {
    QueryError::Cursor(
        "a cursor of another query (its collection, its filter, its sort or the index serving it differ): pass it \
         with the query it came from, or start again from the first page"
            .into(),
    )
}

/// A cursor as encoded: its format, the entry's key and, along an index,
/// its query's digest ([`Query::digest`]).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CursorBody {
    f: i32,
    k: Vec<Bson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    q: Option<i64>,
}

/// A cursor as decoded.
pub(super) struct Cursor {
    pub(super) key: Vec<Bson>,
    /// The digest of the query it was given with.
    pub(super) query: i64,
}

impl Cursor {
    /// Whether the cursor was given with another query than the one of
    /// `digests`.
    pub(super) fn of_another(&self, digests: &[i64]) -> bool {
        !digests.contains(&self.query)
    }
}

pub(super) fn encode_cursor(key: &[Bson], query: Option<i64>) -> String {
    let d = crate::store::shape::fields(&CursorBody { f: CURSOR_FORMAT, k: key.to_vec(), q: query });
    let mut bytes = Vec::new();
    d.to_writer(&mut bytes).expect("a cursor serializes");
    CURSOR.encode(bytes)
}

pub(super) fn decode_cursor(cursor: &str) -> Result<Cursor, QueryError> {
    let bad = || QueryError::Cursor("not a cursor returned by this API".into());
    if cursor.len() > MAX_CURSOR {
        return Err(QueryError::Cursor("not a cursor returned by this API (too long)".into()));
    }
    let bytes = CURSOR.decode(cursor).map_err(|_| bad())?;
    let d = Document::from_reader(bytes.as_slice()).map_err(|_| bad())?;
    let body: CursorBody = mongodb::bson::from_document(d).map_err(|_| bad())?;
    // Earlier releases' formats (1 without a query, 2 without the
    // collection in its digest) are refused: a cursor is bound to its
    // collection and query (docs/operating.md, "Upgrading").
    if (1..CURSOR_FORMAT).contains(&body.f) {
        return Err(QueryError::Cursor(
            "a cursor of an earlier release, which this one no longer takes: start again from the first page".into(),
        ));
    }
    // This format's cursors exactly as `encode_cursor` writes them: with
    // their query's digest, nothing more, nothing after (one edited by
    // hand, say without its digest to be taken with any query, is not
    // one).
    let Some(query) = body.q.filter(|_| body.f == CURSOR_FORMAT && encode_cursor(&body.k, body.q) == cursor) else {
        return Err(bad());
    };
    let key = body.k;
    // A page's last values are what JSON data holds at an indexed path
    // (scalars, no NaN or infinity) and its id: nothing else is a cursor's.
    let scalar = |v: &Bson| match v {
        Bson::Double(d) => d.is_finite(),
        v => matches!(v, Bson::Null | Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::String(_)),
    };
    if !key.iter().all(scalar) {
        return Err(bad());
    }
    Ok(Cursor { key, query })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_strangers() {
        let key = vec![Bson::String("open".into()), Bson::Int64(5), Bson::Null, Bson::String("id-1".into())];
        let back = decode_cursor(&encode_cursor(&key, Some(7))).unwrap();
        assert_eq!((back.key, back.query), (key.clone(), 7));
        // Earlier releases' formats are refused: 1 (no digest) and 2 (its
        // digest without the collection).
        let earlier = |d: Document| {
            let mut bytes = Vec::new();
            d.to_writer(&mut bytes).unwrap();
            CURSOR.encode(bytes)
        };
        for old in [
            earlier(mongodb::bson::doc! {"f": 1, "k": key.clone()}),
            earlier(mongodb::bson::doc! {"f": 2, "k": key.clone(), "q": 8_i64}),
        ] {
            let Err(QueryError::Cursor(why)) = decode_cursor(&old) else { panic!("{old} taken") };
            assert!(why.contains("earlier release"), "{why}");
        }
        let back = decode_cursor(&encode_cursor(&key, Some(7))).unwrap();
        assert!(!back.of_another(&[7, 8]));
        assert!(back.of_another(&[8]));
        let later = {
            let mut bytes = Vec::new();
            mongodb::bson::doc! {"f": 4, "k": key.clone()}.to_writer(&mut bytes).unwrap();
            CURSOR.encode(bytes)
        };
        assert!(decode_cursor(&later).is_err());
        // This format's cursor edited: without its digest, with a member
        // more, its format as another integer type, bytes after it.
        let edited = |d: Document, tail: &[u8]| {
            let mut bytes = Vec::new();
            d.to_writer(&mut bytes).unwrap();
            bytes.extend_from_slice(tail);
            CURSOR.encode(bytes)
        };
        use mongodb::bson::doc;
        for forged in [
            edited(doc! {"f": 3, "k": key.clone()}, b""),
            edited(doc! {"f": 3, "k": key.clone(), "q": 7_i64, "x": 1}, b""),
            edited(doc! {"f": 3_i64, "k": key.clone(), "q": 7_i64}, b""),
            edited(doc! {"f": 3, "k": key.clone(), "q": 7_i64}, b"\0"),
        ] {
            assert!(decode_cursor(&forged).is_err(), "{forged}");
        }
        assert!(decode_cursor(&edited(doc! {"f": 3, "k": key.clone(), "q": 7_i64}, b"")).is_ok());
        assert!(decode_cursor("bm90IGEgY3Vyc29y").is_err());
        assert!(decode_cursor("!!").is_err());
        // Well formed, but holding what no page ends at: refused before
        // it reaches a store.
        let regex = Bson::RegularExpression(mongodb::bson::Regex { pattern: "(".into(), options: String::new() });
        let strangers = [
            regex,
            Bson::Document(Document::new()),
            Bson::Array(vec![]),
            Bson::MinKey,
            Bson::Double(f64::NAN),
            Bson::Double(f64::INFINITY),
        ];
        for strange in strangers {
            assert!(decode_cursor(&encode_cursor(std::slice::from_ref(&strange), Some(7))).is_err(), "{strange}");
        }
    }

    #[test]
    fn a_querys_digest_is_its_conditions_and_order_whatever_their_writing() {
        let query =
            |filter: serde_json::Value| Query { filter: Filter::parse(&filter).expect("a filter"), ..Query::default() };
        let order = vec![("amount".to_owned(), -1), ("_id".to_owned(), 1)];
        let a = query(serde_json::json!({"status": "open", "amount": {"$gt": 1, "$lt": 9}}));
        let b = query(serde_json::json!({"amount": {"$lt": 9, "$gt": 1}, "status": {"$eq": "open"}}));
        let c = query(serde_json::json!({"$and": [{"amount": {"$lt": 9}}, {"status": "open", "amount": {"$gt": 1}}]}));
        assert_eq!(a.digest(Some("c"), &order), b.digest(Some("c"), &order));
        assert_eq!(a.digest(Some("c"), &order), c.digest(Some("c"), &order));
        // Another bound, another value, another order: another query.
        let other = [
            query(serde_json::json!({"status": "open", "amount": {"$gt": 1, "$lt": 8}})),
            query(serde_json::json!({"status": "paid", "amount": {"$gt": 1, "$lt": 9}})),
            query(serde_json::json!({"status": "open", "amount": {"$gte": 1, "$lt": 9}})),
        ];
        for q in &other {
            assert_ne!(q.digest(Some("c"), &order), a.digest(Some("c"), &order), "{:?}", q.filter);
        }
        let reversed = vec![("amount".to_owned(), 1), ("_id".to_owned(), -1)];
        assert_ne!(a.digest(Some("c"), &reversed), a.digest(Some("c"), &order));
        let id_reversed = vec![("amount".to_owned(), -1), ("_id".to_owned(), -1)];
        assert_ne!(a.digest(Some("c"), &id_reversed), a.digest(Some("c"), &order));
        // Another collection: another query; without one, format 2's.
        assert_ne!(a.digest(Some("d"), &order), a.digest(Some("c"), &order));
        assert_ne!(a.digest(None, &order), a.digest(Some("c"), &order));
        assert_eq!(a.digest(None, &order), b.digest(None, &order));
        // Numbers equal as numbers, and lists as sets: one query.
        let n = query(serde_json::json!({"amount": {"$gt": 0}, "status": {"$in": ["b", "a", "a"]}}));
        let same = [
            query(serde_json::json!({"amount": {"$gt": 0.0}, "status": {"$in": ["a", "b"]}})),
            query(serde_json::json!({"amount": {"$gt": -0.0}, "status": {"$in": ["b", "a"]}})),
            query(serde_json::json!({"amount": {"$gt": 0e3}, "status": {"$in": ["a", "b", "b"]}})),
        ];
        for q in &same {
            assert_eq!(q.digest(Some("c"), &order), n.digest(Some("c"), &order), "{:?}", q.filter);
        }
        let apart = [
            query(serde_json::json!({"amount": {"$gt": 0.5}, "status": {"$in": ["a", "b"]}})),
            query(serde_json::json!({"amount": {"$gt": 0}, "status": {"$in": ["a"]}})),
            query(serde_json::json!({"amount": {"$gt": "0"}, "status": {"$in": ["a", "b"]}})),
        ];
        for q in &apart {
            assert_ne!(q.digest(Some("c"), &order), n.digest(Some("c"), &order), "{:?}", q.filter);
        }
        // Past 2^53 a double is not every integer: 2^53 + 1 is not 2^53.
        let big = query(serde_json::json!({"amount": 9_007_199_254_740_993_i64}));
        let big_double = query(serde_json::json!({"amount": 9_007_199_254_740_992.0}));
        let big_int = query(serde_json::json!({"amount": 9_007_199_254_740_992_i64}));
        assert_ne!(big.digest(Some("c"), &order), big_double.digest(Some("c"), &order));
        assert_eq!(big_int.digest(Some("c"), &order), big_double.digest(Some("c"), &order));
        // A cursor made before values took one form holds the digest of
        // its values as written: still this query's.
        let written = &same[0];
        let before = digest_of(&written.filter.canonical(Cond::clone), Some("c"), &order);
        assert_ne!(before, written.digest(Some("c"), &order));
        let key = vec![Bson::Int64(5), Bson::String("a".into())];
        let cursor = decode_cursor(&encode_cursor(&key, Some(before))).unwrap();
        assert!(!cursor.of_another(&written.digests(Some("c"), &order)));
        assert!(cursor.of_another(&apart[0].digests(Some("c"), &order)));
        // Integers as written are their one form: nothing else to accept.
        assert_eq!(a.digests(Some("c"), &order), vec![a.digest(Some("c"), &order)]);
    }
}
