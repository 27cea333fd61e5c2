//! Change events under collections' rules (docs/guides/rules.md,
//! "Streams"): each change judged for one reader, in memory, on the
//! document before and after it, by the rules in force at the event's
//! position. In→in and out→in are sent, the data trimmed to the fields
//! the reader may read; in→out (deletes and expiries included) is sent as
//! `left`, with no data; out→out is never sent. The document before the
//! change is what the event kept of it (format 2, the fields the rules'
//! `match` named when it was written) when that covers what the reader's
//! grants look at; else its previous version's event. A transaction's event
//! that names a member of a collection whose rules judge the reader is
//! not sent (its members are documents the reader may not see).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::model::EventType;
use super::set::{Prior, SetFilter};
use super::{Log, Ready};
use crate::query::filter::Matcher;
use crate::rules::{Action, Judged, Principal, Rules};
use crate::store::convert::{document_to_object, object_to_document};
use crate::store::{Document, StoreResult};

/// How long a judgement by rules whose `when` looks at the time holds.
const TIMED: Duration = Duration::from_secs(1);

/// A judgement, and when it was made if it holds for that moment only.
type Made = (Arc<Judged>, Option<Instant>);

/// One reader's judge of events under rules.
pub(crate) struct RuledReader {
    pub who: Principal,
    pub rules: Arc<Rules>,
    /// The reader's judgement by each (collection, version) met, and
    /// when it was made if it holds for that moment only (a `when` on
    /// `now`: made again after [`TIMED`]).
    judged: Mutex<HashMap<(String, i64), Made>>,
    /// Each collection's last version met, and whether the reader had a
    /// grant to stream it then.
    had: Mutex<HashMap<String, (i64, bool)>>,
    /// Set when a newer version left the reader no grant where an older
    /// one gave some.
    lost: std::sync::atomic::AtomicBool,
}

impl RuledReader {
    pub(crate) fn new(who: Principal, rules: Arc<Rules>) -> Self {
        Self { who, rules, judged: Mutex::default(), had: Mutex::default(), lost: Default::default() }
    }

    /// Whether a rule change left the reader no grant to stream a
    /// collection it had one for.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Note the reader's grants under `version` of `coll`'s rules.
    fn note(&self, coll: &str, version: i64, judged: &Judged) {
        let has = match judged {
            Judged::Free => true,
            Judged::Ruled(judge) => judge.allowing(Action::Stream).next().is_some(),
        };
        let mut had = self.had.lock().expect("had");
        match had.get(coll) {
            // A newer version, or the same one judged again later (a `when`
            // on the time), left the reader no grant.
            Some(&(seen, true)) if version >= seen && !has => {
                self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            Some(&(seen, _)) if version < seen => return,
            _ => {}
        }
        if had.len() > 1024 {
            had.clear();
        }
        had.insert(coll.to_owned(), (version, has));
    }

    /// Note the reader's grants on each of `collections` under their rules
    /// in force now (see [`Self::lost`]).
    pub(crate) async fn seed(&self, collections: &[String]) -> StoreResult<()> {
        for coll in collections {
            self.judged(coll, u64::MAX).await?;
        }
        Ok(())
    }

    /// How the rules of `coll` in force at `position` judge the reader.
    async fn judged(&self, coll: &str, position: u64) -> StoreResult<Arc<Judged>> {
        let versions = self.rules.of(coll).await?;
        let set = versions.at(position);
        let Some(set) = set else { return Ok(Arc::new(Judged::Free)) };
        let key = (coll.to_owned(), set.version);
        if let Some((j, made)) = self.judged.lock().expect("judged").get(&key)
            && made.is_none_or(|m| m.elapsed() < TIMED)
        {
            return Ok(Arc::clone(j));
        }
        let judged = Arc::new(Judged::of(Some(set), &self.who, &self.rules.now_string()));
        self.note(coll, set.version, &judged);
        let mut cache = self.judged.lock().expect("judged");
        if cache.len() > 1024 {
            cache.clear();
        }
        cache.insert(key, (Arc::clone(&judged), set.timed.then(Instant::now)));
        Ok(judged)
    }

    /// `ready` as this reader sees it (`None`: not at all); `set`, the
    /// reader's own filtered set, narrows it further.
    pub(crate) async fn judge(
        &self,
        log: &Log,
        ready: &Arc<Ready>,
        set: Option<&SetFilter>,
    ) -> StoreResult<Option<Arc<Ready>>> {
        let event = &ready.event;
        if let Some(set) = set
            && event.collection.as_deref() != Some(set.collection.as_str())
        {
            return Ok(None);
        }
        let Some(coll) = event.collection.as_deref() else {
            // A transaction's event: sent only if no member's rules judge the reader.
            for member in event.members.iter().flatten() {
                if matches!(*self.judged(&member.collection, event.seq).await?, Judged::Ruled(_)) {
                    return Ok(None);
                }
            }
            return Ok(Some(Arc::clone(ready)));
        };
        let judged = self.judged(coll, event.seq).await?;
        let Judged::Ruled(judge) = &*judged else {
            return match set {
                None => Ok(Some(Arc::clone(ready))),
                Some(set) => set.judge(log, ready).await,
            };
        };
        let extra: Option<&Matcher> = set.map(|s| &s.filter);
        let sees = |data: &Document| judge.sees(Action::Stream, data).filter(|_| extra.is_none_or(|m| m.matches(data)));
        let after = match (event.kind, &event.data) {
            (EventType::Created | EventType::Updated, Some(data)) => {
                let data = object_to_document(data);
                sees(&data).map(|seen| (data, seen))
            }
            _ => None,
        };
        // The document before the change: what the event kept of it, when
        // that covers every field the reader's grants and filter look at;
        // else its previous version's event.
        let needed = || {
            let grants = judge.allowing(Action::Stream).flat_map(|a| a.fields());
            grants.chain(extra.into_iter().flat_map(Matcher::fields))
        };
        let kept = event.before.as_deref().and_then(|b| b.covering(needed()));
        let before = match kept {
            Some(data) => sees(data).is_some(),
            None => match ready.prior(log).await? {
                Prior::Data(data) => sees(data).is_some(),
                // Unknown (purged): never told as `left`, which would name
                // a document the reader may never have seen.
                Prior::Absent | Prior::Unknown => false,
            },
        };
        Ok(match (before, after) {
            (_, Some((mut data, seen))) => {
                crate::rules::eval::project(&mut data, seen.fields.as_ref());
                let mut shown = event.clone();
                shown.data = Some(document_to_object(&data));
                Some(Ready::new(shown))
            }
            (true, None) => {
                let mut left = event.clone();
                left.left = Some(true);
                left.data = None;
                Some(Ready::new(left))
            }
            (false, None) => None,
        })
    }
}
