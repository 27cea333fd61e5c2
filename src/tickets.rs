//! Stream tickets (docs/guides/users.md, "Streams and tickets"): a browser's
//! `EventSource` cannot send an `Authorization` header, and a token in a
//! URL leaks into logs. A ticket is asked for with the credential
//! (`POST /v1/events/tickets`) and used once, within a minute, in its
//! place (`GET /v1/events?ticket=…`). The store holds only a digest of
//! it, with who asked, what they were granted, when their credential
//! expires and the stream it is for; it is claimed with a conditional
//! write, so it opens one stream whichever instance it reaches. Past
//! their time, tickets are purged.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::actor::UserId;
use crate::clock::Clock;
use crate::store::{DateTime, DynStore, StoreError, StoreResult, Update};

pub(crate) const TICKETS: &str = "_tickets";
/// How long a ticket may wait to be used.
pub(crate) const LIFETIME: Duration = Duration::from_secs(60);
/// The version of [`TicketRecord`]'s stored form.
const FORMAT: i32 = 1;

/// Who asked for a ticket, as the stream it opens will act.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// What keeps the caller's work apart (`Caller::scope`).
    pub scope: String,
    /// The API key's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserId>,
    /// The user's grants when the ticket was asked for (a key's are its
    /// current ones), in their grammar.
    #[serde(default)]
    pub grants: Vec<String>,
    /// The user's request rate (quota per window of seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<(u32, u64)>,
    /// When the credential expires: the stream ends then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<DateTime>,
    /// Anonymous access.
    #[serde(default)]
    pub anonymous: bool,
    /// The user's roles, as the token had them (rules judge by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// The token's claims, as JSON (rules judge by them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<String>,
}

/// The stream a ticket opens: the parameters of `GET /v1/events`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collections: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Where it starts: after this position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct TicketRecord {
    /// The digest of the ticket.
    #[serde(rename = "_id")]
    id: String,
    v: i32,
    holder: Holder,
    stream: Stream,
    expires_at: DateTime,
    used: bool,
}

/// A claimed ticket.
#[derive(Clone, Debug)]
pub(crate) struct Claimed {
    pub holder: Holder,
    pub stream: Stream,
}

/// A ticket that may still be used, and the id of its record (to spend it
/// with [`Tickets::spend`]).
#[derive(Clone, Debug)]
pub(crate) struct Peeked {
    pub id: String,
    pub claimed: Claimed,
}

/// Why a ticket does not open a stream.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Unknown, used already, or past its minute: said in the detail.
    Invalid(&'static str),
    Store(StoreError),
}

impl From<StoreError> for Refused {
    fn from(e: StoreError) -> Self {
        Refused::Store(e)
    }
}

/// Issues and claims tickets.
pub(crate) struct Tickets {
    store: DynStore,
    clock: Clock,
}

fn digest(ticket: &str) -> String {
    Sha256::digest(ticket.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

impl Tickets {
    pub(crate) fn new(store: DynStore, clock: Clock) -> Self {
        Self { store, clock }
    }

    /// A new ticket for `holder` to open `stream`, and when it expires.
    pub(crate) async fn issue(&self, holder: Holder, stream: Stream) -> StoreResult<(String, DateTime)> {
        use base64::Engine as _;
        let bytes: [u8; 32] = rand::random();
        let ticket = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let now = self.clock.now();
        let expires_at = DateTime::from_millis(now.timestamp_millis() + LIFETIME.as_millis() as i64);
        let record = TicketRecord { id: digest(&ticket), v: FORMAT, holder, stream, expires_at, used: false };
        let record = mongodb::bson::to_document(&record).expect("a ticket serializes");
        if !self.store.insert(TICKETS, record).await? {
            // 256 random bits met another ticket's.
            return Err(StoreError::Internal("a ticket's digest is taken".into()));
        }
        Ok((ticket, expires_at))
    }

    /// What `ticket` holds, if it may still be used (not claimed yet: see
    /// [`Tickets::spend`]), and its record's id.
    pub(crate) async fn peek(&self, ticket: &str) -> Result<Peeked, Refused> {
        if ticket.len() != 43 || !ticket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(Refused::Invalid("not a ticket"));
        }
        let id = digest(ticket);
        let Some(record) = self.store.get(TICKETS, &id).await? else {
            return Err(Refused::Invalid("no such ticket (or purged after it expired)"));
        };
        let record: TicketRecord = match mongodb::bson::from_document(record) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "a stored ticket cannot be decoded; refusing it");
                return Err(Refused::Invalid("the ticket's record cannot be read"));
            }
        };
        if record.v != FORMAT {
            return Err(Refused::Invalid("the ticket was issued by another release"));
        }
        if record.used {
            return Err(Refused::Invalid("the ticket was used already"));
        }
        if record.expires_at < self.clock.now() {
            return Err(Refused::Invalid("the ticket has expired (a ticket lives 60 s)"));
        }
        Ok(Peeked { id, claimed: Claimed { holder: record.holder, stream: record.stream } })
    }

    /// Use the ticket of record `id`: a conditional write, so that of
    /// several requests with it, on any instances, one does.
    pub(crate) async fn spend(&self, id: &str) -> Result<(), Refused> {
        let unused = mongodb::bson::doc! {"used": false};
        if !self.store.update(TICKETS, id, unused, Update::set(mongodb::bson::doc! {"used": true})).await? {
            return Err(Refused::Invalid("the ticket was used already"));
        }
        Ok(())
    }
}
