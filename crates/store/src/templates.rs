//! Index templates: user collections are created at run time, by their
//! first write, and each gets the indexes the migrations declare for `*`
//! (see [`super::scans`]) before that write lands, on either backend.
//! Which collections are done is remembered per process; ensuring an index
//! that exists is a no-op, so instances and restarts may repeat it.

use std::collections::HashSet;
use std::sync::RwLock;

use super::layer::{Layer, Layered};
use super::{DynStore, IndexSpec, Store, StoreResult, WriteKind};

/// The layer that gives each user collection its template indexes before
/// its first write lands.
pub struct Templates {
    templates: Vec<IndexSpec>,
    done: RwLock<HashSet<String>>,
}

impl Templates {
    /// `templates` over the store `inner`.
    pub fn over(inner: DynStore, templates: Vec<IndexSpec>) -> Layered<Self> {
        Layered::new(inner, Self { templates, done: RwLock::default() })
    }
}

impl Layer for Templates {
    /// Make sure user collection `coll` has every template index (a delete
    /// needs none: it can only remove what a write put there).
    async fn before_write(&self, below: &dyn Store, coll: &str, kind: WriteKind) -> StoreResult<()> {
        if kind == WriteKind::Delete || coll.starts_with('_') || self.done.read().expect("template set").contains(coll)
        {
            return Ok(());
        }
        for index in &self.templates {
            below.ensure_index(coll, index.clone()).await?;
        }
        self.done.write().expect("template set").insert(coll.to_owned());
        Ok(())
    }
}
