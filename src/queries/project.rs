//! What a page answers of each document: the fields the query names
//! (`fields`), as MongoDB's projection keeps them.

use std::collections::HashMap;

use super::QueryError;
use crate::document::{Live, PageItem};
use crate::store::{Bson, Document};

/// Keep only `fields` of each document's data (dotted paths reach in);
/// a document kept as stored is built for it.
pub(crate) fn trim(items: Vec<PageItem>, fields: Option<&[String]>) -> Result<Vec<PageItem>, QueryError> {
    let Some(fields) = fields else { return Ok(items) };
    items
        .into_iter()
        .map(|item| {
            let mut live = item.into_live()?;
            trim_live(&mut live, fields);
            Ok(PageItem::Built(live))
        })
        .collect()
}

fn trim_live(item: &mut Live, fields: &[String]) {
    let mut kept = Kept::default();
    for path in fields {
        kept.add(path);
    }
    item.data = kept.project(&item.data);
}

/// The paths a projection keeps, as a tree: a field kept whole, or some
/// paths inside it.
#[derive(Default)]
struct Kept(HashMap<String, Option<Kept>>);

impl Kept {
    fn add(&mut self, path: &str) {
        let (head, rest) = match path.split_once('.') {
            None => (path, None),
            Some((head, rest)) => (head, Some(rest)),
        };
        match (self.0.get_mut(head), rest) {
            // Kept whole already: a path inside it adds nothing.
            (Some(None), _) => {}
            (Some(Some(inner)), Some(rest)) => inner.add(rest),
            (_, None) => {
                self.0.insert(head.to_owned(), None);
            }
            (None, Some(rest)) => {
                let mut inner = Kept::default();
                inner.add(rest);
                self.0.insert(head.to_owned(), Some(inner));
            }
        }
    }

    /// `doc` trimmed to these paths, in the document's own field order,
    /// as MongoDB's inclusion projection trims it: a path reaching into
    /// an object keeps that object with only the paths' fields (empty
    /// when it has none of them), one reaching into an array does so for
    /// each object in it and drops its other elements, and one reaching
    /// into any other value drops it.
    fn project(&self, doc: &Document) -> Document {
        let mut out = Document::new();
        for (name, value) in doc {
            match self.0.get(name) {
                None => {}
                Some(None) => {
                    out.insert(name.clone(), value.clone());
                }
                Some(Some(inner)) => {
                    if let Some(value) = inner.project_value(value) {
                        out.insert(name.clone(), value);
                    }
                }
            }
        }
        out
    }

    fn project_value(&self, value: &Bson) -> Option<Bson> {
        match value {
            Bson::Document(doc) => Some(Bson::Document(self.project(doc))),
            Bson::Array(items) => Some(Bson::Array(items.iter().filter_map(|v| self.project_value(v)).collect())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{StoredDoc, StoredLive, StoredView};

    fn data(value: serde_json::Value) -> Document {
        crate::store::convert::object_to_document(value.as_object().expect("an object"))
    }

    #[test]
    fn trimming_keeps_the_named_paths() {
        let at = crate::store::DateTime::from_millis(0);
        let fields = data(serde_json::json!({"a": 1, "b": {"c": 2, "d": 3}, "e": 4}));
        let live = Live { id: "a".into(), version: 1, schema_version: 1, created_at: at, updated_at: at, data: fields };
        // The same document built, and as stored.
        let record = StoredDoc::new_live("a".into(), live.data.clone(), 1, 1, at).to_record();
        let StoredView::Live(stored) = StoredLive::view(mongodb::bson::RawDocumentBuf::from_document(&record).unwrap())
        else {
            panic!("a live record")
        };
        let items = vec![PageItem::Built(live), PageItem::Stored(stored)];
        let trimmed = trim(items, Some(&["a".to_owned(), "b.c".to_owned(), "x".to_owned()])).unwrap();
        assert_eq!(trimmed.len(), 2);
        for item in trimmed {
            let PageItem::Built(item) = item else { panic!("trimmed documents are built") };
            assert_eq!(item.data, data(serde_json::json!({"a": 1, "b": {"c": 2}})));
        }
    }

    #[test]
    fn trimming_reaches_into_arrays_as_mongodbs_projection_does() {
        let at = crate::store::DateTime::from_millis(0);
        let written = serde_json::json!({
            "z": 0,
            "arr": [{"x": 1, "y": 2}, {"y": 3}, 5, [{"x": 4}, 6], {"x": {"deep": true}}],
            "obj": {"y": 1},
            "s": "text",
            "n": {"a": {"b": 1, "c": 2}, "d": 3},
        });
        let live = || Live {
            id: "a".into(),
            version: 1,
            schema_version: 1,
            created_at: at,
            updated_at: at,
            data: data(written.clone()),
        };
        let cases = [
            (vec!["arr.x"], serde_json::json!({"arr": [{"x": 1}, {}, [{"x": 4}], {"x": {"deep": true}}]})),
            // An object without the field stays, empty; a scalar does not.
            (vec!["obj.x", "s.x"], serde_json::json!({"obj": {}})),
            // Paths merge, in the document's order; a whole field wins.
            (vec!["n.d", "n.a.c", "z"], serde_json::json!({"z": 0, "n": {"a": {"c": 2}, "d": 3}})),
            (vec!["n.a.b", "n"], serde_json::json!({"n": {"a": {"b": 1, "c": 2}, "d": 3}})),
            (vec!["n", "n.a.b"], serde_json::json!({"n": {"a": {"b": 1, "c": 2}, "d": 3}})),
            (vec!["missing", "missing.x"], serde_json::json!({})),
        ];
        for (fields, want) in cases {
            let fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
            let trimmed = trim(vec![PageItem::Built(live())], Some(&fields)).unwrap();
            let [PageItem::Built(item)] = trimmed.as_slice() else { panic!("one built document") };
            assert_eq!(item.data, data(want), "{fields:?}");
        }
    }
}
