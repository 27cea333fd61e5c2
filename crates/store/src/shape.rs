//! Filters and updates as types. A stored shape names the fields a filter
//! matches or an update sets in a small serde struct beside the shape (a
//! record type and its changes live in one place), and [`fields`] makes
//! the document the backends take; the comparison operators a filter
//! needs are wrappers ([`Lt`], [`Lte`], [`Gt`], [`In`]). So code above the
//! store never spells a filter by hand, and a field's name and type are
//! those of the shape.

use serde::Serialize;
use serde::ser::SerializeMap;

use super::{Document, Update};

/// The document of `value`: a struct's fields, in order, as BSON. An
/// `Option` field that is `None` is `null` unless the struct skips it.
pub fn fields<T: Serialize>(value: &T) -> Document {
    mongodb::bson::to_document(value).expect("a stored shape serializes as a document")
}

impl Update {
    /// An update that sets the fields of `value`.
    pub fn fields<T: Serialize>(value: &T) -> Self {
        Self::set(fields(value))
    }
}

macro_rules! operator {
    ($(#[$doc:meta])* $name:ident, $op:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $name<T>(pub T);

        impl<T: Serialize> Serialize for $name<T> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry($op, &self.0)?;
                map.end()
            }
        }
    };
}

operator!(
    /// Matches values below this one.
    Lt,
    "$lt"
);
operator!(
    /// Matches values at or below this one.
    Lte,
    "$lte"
);
operator!(
    /// Matches values above this one.
    Gt,
    "$gt"
);
operator!(
    /// Matches any of these values.
    In,
    "$in"
);

/// A filter that matches every record.
pub fn any() -> Document {
    Document::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bson, DateTime, doc};

    #[derive(Serialize)]
    struct Due<'a> {
        status: In<&'a [&'a str]>,
        next_at: Lte<DateTime>,
        claim: Option<&'a str>,
    }

    #[test]
    fn a_shape_makes_the_document_a_filter_spells() {
        let at = DateTime::from_millis(5);
        let due = Due { status: In(&["pending", "failed"]), next_at: Lte(at), claim: None };
        assert_eq!(
            fields(&due),
            doc! {"status": {"$in": ["pending", "failed"]}, "next_at": {"$lte": at}, "claim": Bson::Null}
        );
        assert_eq!(fields(&Lt(3_i64)), doc! {"$lt": 3_i64});
        assert_eq!(fields(&Gt(3_i64)), doc! {"$gt": 3_i64});
    }
}
