//! Sealed cursors: a list's position encrypted with a key every instance
//! shares, for lists a key sees only part of (transactions, subscriptions;
//! docs/design.md §7). A page's `next` may have to continue after a record
//! the key may not see; sealed, its id tells the key nothing, and a cursor
//! it did not get from the API (or got from another list) is refused.
//!
//! The key is 32 random bytes kept in the store (`_secrets`, record
//! `cursors`), made by whichever instance needs it first: an insert that
//! only one instance wins, then a read, so all of them use the one stored.
//! A cursor is AEAD (ChaCha20-Poly1305) over the position, with a random
//! nonce and the list's name as associated data.

use base64::Engine as _;
use mongodb::bson::{Document, doc};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::sync::OnceCell;

use crate::store::{DynStore, StoreError, StoreResult};

/// Where the key is kept.
pub(crate) const SECRETS: &str = "_secrets";
const CURSORS: &str = "cursors";
/// The format of the key's record.
const VERSION: i32 = 1;
const KEY_LEN: usize = 32;

/// Which list a cursor belongs to (its associated data: a cursor of one
/// list does not open in another).
#[derive(Clone, Copy, Debug)]
pub(crate) enum List {
    Transactions,
    Subscriptions,
}

impl List {
    fn name(self) -> &'static [u8] {
        match self {
            Self::Transactions => b"transactions",
            Self::Subscriptions => b"subscriptions",
        }
    }
}

/// Seals and opens cursors with the shared key, read from the store once.
pub(crate) struct Seal {
    store: DynStore,
    key: OnceCell<LessSafeKey>,
    random: SystemRandom,
}

impl Seal {
    pub(crate) fn new(store: DynStore) -> Self {
        Self { store, key: OnceCell::new(), random: SystemRandom::new() }
    }

    /// `position` sealed for `list`: nonce, then ciphertext and tag.
    pub(crate) async fn seal(&self, list: List, position: &str) -> StoreResult<Vec<u8>> {
        let key = self.key().await?;
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| StoreError::Internal("no randomness for a cursor".into()))?;
        let mut sealed = position.as_bytes().to_vec();
        key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(list.name()), &mut sealed)
            .map_err(|_| StoreError::Internal("a cursor could not be sealed".into()))?;
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The position `sealed` holds, `None` when it was not sealed for
    /// `list` with this key.
    pub(crate) async fn open(&self, list: List, sealed: &[u8]) -> StoreResult<Option<String>> {
        let key = self.key().await?;
        let Some((nonce, sealed)) = sealed.split_first_chunk::<NONCE_LEN>() else { return Ok(None) };
        let mut buf = sealed.to_vec();
        let Ok(plain) = key.open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(list.name()), &mut buf)
        else {
            return Ok(None);
        };
        Ok(String::from_utf8(plain.to_vec()).ok())
    }

    async fn key(&self) -> StoreResult<&LessSafeKey> {
        self.key.get_or_try_init(|| load(&self.store, &self.random)).await
    }
}

/// The stored key, made first when there is none. A record that cannot be
/// read is reported and replaced (only cursors already handed out are lost),
/// on condition that it is still the one read, so that instances racing to
/// replace it end on one key.
async fn load(store: &DynStore, random: &SystemRandom) -> StoreResult<LessSafeKey> {
    for _ in 0..8 {
        match store.get(SECRETS, CURSORS).await? {
            Some(record) => match key_of(&record) {
                Some(key) => return Ok(key),
                None => {
                    tracing::error!(collection = SECRETS, id = CURSORS, "unreadable cursor key: replacing it");
                    let mut same = record.clone();
                    same.remove("_id");
                    store.delete(SECRETS, CURSORS, same).await?;
                }
            },
            None => {
                let mut bytes = [0u8; KEY_LEN];
                random.fill(&mut bytes).map_err(|_| StoreError::Internal("no randomness for a key".into()))?;
                let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
                store.insert(SECRETS, doc! { "_id": CURSORS, "v": VERSION, "key": encoded }).await?;
            }
        }
    }
    Err(StoreError::Internal("the cursor key could not be settled".into()))
}

fn key_of(record: &Document) -> Option<LessSafeKey> {
    if record.get_i32("v").ok()? != VERSION {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(record.get_str("key").ok()?).ok()?;
    (bytes.len() == KEY_LEN).then_some(())?;
    Some(LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &bytes).ok()?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn a_sealed_position_opens_only_in_its_own_list_and_with_the_shared_key() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let (one, two) = (Seal::new(Arc::clone(&store)), Seal::new(Arc::clone(&store)));
        let sealed = one.seal(List::Transactions, "0193-abc").await.unwrap();
        assert!(!sealed.windows(8).any(|w| w == b"0193-abc"));
        assert_eq!(two.open(List::Transactions, &sealed).await.unwrap().as_deref(), Some("0193-abc"));
        assert_eq!(two.open(List::Subscriptions, &sealed).await.unwrap(), None);
        let mut bent = sealed.clone();
        *bent.last_mut().unwrap() ^= 1;
        assert_eq!(one.open(List::Transactions, &bent).await.unwrap(), None);
        assert_eq!(one.open(List::Transactions, &sealed[..5]).await.unwrap(), None);
        // Two seals of one position differ (a fresh nonce each).
        assert_ne!(one.seal(List::Transactions, "0193-abc").await.unwrap(), sealed);
    }

    #[tokio::test]
    async fn an_unreadable_key_is_replaced() {
        let store: DynStore = Arc::new(MemoryStore::default());
        store.insert(SECRETS, doc! { "_id": CURSORS, "v": 1, "key": "not base64!" }).await.unwrap();
        let seal = Seal::new(Arc::clone(&store));
        let sealed = seal.seal(List::Subscriptions, "x").await.unwrap();
        assert_eq!(Seal::new(store).open(List::Subscriptions, &sealed).await.unwrap().as_deref(), Some("x"));
    }
}
