//! Idempotency keys (the keys table): read before a send runs and taken in its
//! attempt's write (or claimed first by the PBX path's upsert), answered with the
//! request's log row, replayed, and pruned after 24 hours.
//! What a key means on the wire is `send::idempotency`; the attempt writes that link a
//! key to its attempt row are in `attempts`.

use super::writer::{Exec, PgAnswer, Postgres, Statement, Write, sqlite_exec};
use super::{Cols, FromCols, Store, StoreError};
use rusqlite::types::Value as SqlValue;
use sqlx::Row;

/// The final answer of a request, as the caller received it (status and exact body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// What becomes of a request's idempotency key when its answer is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyFate {
    /// The answer is final: kept and replayed for the same key and body.
    Keep(Answer),
    /// The answer says "try again" and nothing was sent (throttled, over quota, a
    /// provider that proved it did not take the message): the key is given up, so a
    /// retry with it runs again.
    Release,
}

/// The idempotency claim a request holds: its key and the token that proves it is the
/// claim's owner.
#[derive(Clone, Debug)]
pub struct IdemOwner {
    pub customer_id: String,
    pub key: String,
    pub owner: String,
    /// The fingerprint of the request's body.
    pub request_hash: String,
}

/// What claiming a key found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key is this request's: run the pipeline.
    Claimed,
    /// The key's first request finished: its answer.
    Replay(Answer),
    /// The key was used with another request body.
    Mismatch,
    /// The key's first request is still running, or its process stopped and nobody
    /// has settled it yet. `log_id` is its attempt row once it reached the provider;
    /// `since` is when the key was taken; `owner_lease` the lease of the process that
    /// took it (none for a process without one: see `leases`).
    InProgress { log_id: Option<i64>, since: i64, owner_lease: Option<i64> },
}

/// How long a claimed key may take to reach its attempt row before another request
/// with the same key may take it over (the request's process is presumed gone).
pub const CLAIM_LEASE_MS: i64 = 30_000;
/// How long a key and its answer are kept.
pub const KEY_TTL_MS: i64 = 24 * 3_600_000;

/// Whether a key taken before its attempt row (`log_id IS NULL`) was left by its owner:
/// the owner's lease has lapsed (see `leases`) or, for an owner without a lease, its
/// `lease_until` has passed (`excluded.created_at` is the claimant's now: on SQLite
/// every process shares that clock; PostgreSQL's claims use `gateway_lapsed`).
macro_rules! key_left {
    () => {
        "((idempotency_keys.owner_lease IS NULL AND idempotency_keys.lease_until <= excluded.created_at) \
         OR (idempotency_keys.owner_lease IS NOT NULL AND NOT EXISTS (SELECT 1 FROM process_leases p \
         WHERE p.id = idempotency_keys.owner_lease AND p.expires_at > excluded.created_at)))"
    };
}

/// Takes a key that is free (absent, expired, or left before its attempt row by a
/// request whose owner stopped, with the same body), or that this request holds already.
/// SQLite's statement; PostgreSQL's is `gateway_claim_key` (migration 0012).
pub(super) const CLAIM_SQL: &str = concat!(
    "INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, \
     created_at, expires_at, lease_until, log_id, owner_lease) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (customer_id, idem_key) DO UPDATE SET request_hash = excluded.request_hash, \
     owner = excluded.owner, created_at = excluded.created_at, expires_at = excluded.expires_at, \
     lease_until = excluded.lease_until, log_id = excluded.log_id, owner_lease = excluded.owner_lease, \
     response_status = NULL, response_body = NULL \
     WHERE idempotency_keys.expires_at <= excluded.created_at \
     OR (idempotency_keys.log_id IS NULL AND idempotency_keys.response_status IS NULL AND ",
    key_left!(),
    " AND idempotency_keys.request_hash = excluded.request_hash) \
     OR (idempotency_keys.owner = excluded.owner AND idempotency_keys.log_id IS NULL \
     AND idempotency_keys.response_status IS NULL)"
);
const KEY_SQL: &str = "SELECT request_hash, lease_until, log_id, response_status, response_body, created_at, \
     owner_lease FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND expires_at > $3";
/// The answer of a refused request, kept with its log row: the key is taken with its
/// answer if free (as `CLAIM_SQL`) or held by this request.
const ANSWER_REFUSAL_SQL: &str = concat!(
    "INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, \
     created_at, expires_at, lease_until, log_id, response_status, response_body) \
     VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9) \
     ON CONFLICT (customer_id, idem_key) DO UPDATE SET request_hash = excluded.request_hash, \
     owner = excluded.owner, created_at = excluded.created_at, expires_at = excluded.expires_at, \
     lease_until = NULL, log_id = excluded.log_id, response_status = excluded.response_status, \
     response_body = excluded.response_body \
     WHERE idempotency_keys.expires_at <= excluded.created_at \
     OR (idempotency_keys.log_id IS NULL AND idempotency_keys.response_status IS NULL AND ",
    key_left!(),
    " AND idempotency_keys.request_hash = excluded.request_hash) \
     OR (idempotency_keys.owner = excluded.owner AND idempotency_keys.response_status IS NULL)"
);
/// A refused request gives its key up (see `KeyFate::Release`).
pub(super) const RELEASE_REFUSAL_SQL: &str =
    "DELETE FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND owner = $3";

impl Store {
    /// Claims the key of `idem` now, in a write of its own (the PBX webhook holds its
    /// `external_message_id` this way). A send-message request does not: it reads the
    /// key's state (`idempotency_state`), and its attempt's own write takes the key.
    pub async fn claim_idempotency(&self, idem: &IdemOwner, now: i64) -> Result<Claim, StoreError> {
        if self.write(ClaimKey { idem: idem.clone(), now, owner_lease: self.lease() }).await? {
            return Ok(Claim::Claimed);
        }
        match self.idempotency_state(idem, now).await? {
            // Expired between the two statements: claim it again.
            Claim::Claimed => Box::pin(self.claim_idempotency(idem, now)).await,
            state => Ok(state),
        }
    }

    /// What a request with `idem`'s key and body finds, writing nothing: `Claimed` when
    /// the key is free for it (absent, expired, or left before its attempt row by a
    /// request whose lease ended).
    pub async fn idempotency_state(&self, idem: &IdemOwner, now: i64) -> Result<Claim, StoreError> {
        let params =
            vec![SqlValue::Text(idem.customer_id.clone()), SqlValue::Text(idem.key.clone()), SqlValue::Integer(now)];
        // On the send path: SQLite reads through the plain reader connections.
        let row = self.read_one::<KeyRow>(KEY_SQL, params).await?;
        Ok(KeySnapshot(row).state(idem, now))
    }

    /// The attempt row a key's request wrote, if it got that far.
    pub async fn idempotency_attempt(&self, customer_id: &str, key: &str) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query("SELECT log_id FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2")
            .bind(customer_id)
            .bind(key)
            .fetch_optional(&self.read)
            .await?;
        Ok(row.map(|r| r.try_get::<Option<i64>, _>("log_id")).transpose()?.flatten())
    }

    /// Gives up a key whose request never wrote its attempt row (nothing was sent).
    pub async fn release_idempotency(&self, customer_id: &str, key: &str) -> Result<(), StoreError> {
        let statements = vec![Statement {
            sql: "DELETE FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND log_id IS NULL",
            params: vec![SqlValue::Text(customer_id.into()), SqlValue::Text(key.into())],
        }];
        self.write(Exec(statements)).await.map(|_| ())
    }
}

/// A key's row as read (`KEY_SQL`, or with the send's own read: `Store::send_context`),
/// or its absence.
#[derive(Clone, Debug, Default)]
pub struct KeySnapshot(Option<KeyRow>);

impl KeySnapshot {
    /// What a request with `idem`'s key and body finds (see `Store::idempotency_state`).
    pub fn state(self, idem: &IdemOwner, now: i64) -> Claim {
        let Some(row) = self.0 else { return Claim::Claimed };
        if row.request_hash != idem.request_hash {
            return Claim::Mismatch;
        }
        if let (Some(status), Some(body)) = (row.response_status, row.response_body) {
            return Claim::Replay(Answer { status: status as u16, body });
        }
        if row.log_id.is_none() && row.owner_lease.is_none() && row.lease_until.is_some_and(|l| l <= now) {
            return Claim::Claimed;
        }
        Claim::InProgress { log_id: row.log_id, since: row.created_at, owner_lease: row.owner_lease }
    }

    /// The key row's columns of table alias `table`, as `from_joined` reads them, for a
    /// read that joins the key's row (`Store::send_context`).
    pub(super) fn joined_columns(table: &str) -> String {
        let columns = KEY_COLUMNS.iter().zip(JOINED);
        columns.map(|(c, name)| format!("{table}.{c} AS {name}")).collect::<Vec<_>>().join(", ")
    }

    /// `joined_columns` for a read that joins no key's row: the one column
    /// `from_joined` reads first, always NULL.
    pub(super) fn no_joined_columns() -> String {
        format!("CAST(NULL AS TEXT) AS {}", JOINED[0])
    }

    /// From the columns `joined_columns` names (`ik_request_hash` is NULL when the join
    /// found no row).
    pub(super) fn from_joined(r: &impl Cols) -> Result<KeySnapshot, StoreError> {
        if r.col::<Option<String>>(JOINED[0])?.is_none() {
            return Ok(KeySnapshot(None));
        }
        Ok(KeySnapshot(Some(KeyRow::read(r, &JOINED)?)))
    }
}

/// The columns of a key's row that decide what a request with it finds, and their
/// names in a joined read.
const KEY_COLUMNS: [&str; 7] =
    ["request_hash", "lease_until", "log_id", "response_status", "response_body", "created_at", "owner_lease"];
const JOINED: [&str; 7] = [
    "ik_request_hash",
    "ik_lease_until",
    "ik_log_id",
    "ik_response_status",
    "ik_response_body",
    "ik_created_at",
    "ik_owner_lease",
];

/// A key's row as `KEY_SQL` reads it.
#[derive(Clone, Debug)]
struct KeyRow {
    request_hash: String,
    lease_until: Option<i64>,
    log_id: Option<i64>,
    response_status: Option<i64>,
    response_body: Option<String>,
    created_at: i64,
    owner_lease: Option<i64>,
}

impl KeyRow {
    /// The row from the columns `names` gives in `KEY_COLUMNS`' order.
    fn read(r: &impl Cols, names: &[&str; 7]) -> Result<KeyRow, StoreError> {
        let [request_hash, lease_until, log_id, response_status, response_body, created_at, owner_lease] = *names;
        Ok(KeyRow {
            request_hash: r.col(request_hash)?,
            lease_until: r.col(lease_until)?,
            log_id: r.col(log_id)?,
            response_status: r.col(response_status)?,
            response_body: r.col(response_body)?,
            created_at: r.col(created_at)?,
            owner_lease: r.col(owner_lease)?,
        })
    }
}

impl FromCols for KeyRow {
    fn from_cols(r: &impl Cols) -> Result<KeyRow, StoreError> {
        KeyRow::read(r, &KEY_COLUMNS)
    }
}

pub(super) fn owner_values(idem: &IdemOwner) -> [SqlValue; 3] {
    [SqlValue::Text(idem.customer_id.clone()), SqlValue::Text(idem.key.clone()), SqlValue::Text(idem.owner.clone())]
}

/// The values of `CLAIM_SQL` for a request taking its key at `now`, with its attempt
/// row when it has one (the key is then no longer leased: the attempt's deadline
/// governs).
pub(super) fn claim_values(idem: &IdemOwner, now: i64, log_id: Option<i64>, owner_lease: Option<i64>) -> Vec<SqlValue> {
    vec![
        SqlValue::Text(idem.customer_id.clone()),
        SqlValue::Text(idem.key.clone()),
        SqlValue::Text(idem.request_hash.clone()),
        SqlValue::Text(idem.owner.clone()),
        SqlValue::Integer(now),
        SqlValue::Integer(now + KEY_TTL_MS),
        match log_id {
            Some(_) => SqlValue::Null,
            None => SqlValue::Integer(now + CLAIM_LEASE_MS),
        },
        log_id.map_or(SqlValue::Null, SqlValue::Integer),
        owner_lease.map_or(SqlValue::Null, SqlValue::Integer),
    ]
}

/// The statement and values that settle a refused request's key, written at `at` with
/// its log row `log_id`.
pub(super) fn refusal_key(idem: &IdemOwner, fate: &KeyFate, log_id: i64, at: i64) -> (&'static str, Vec<SqlValue>) {
    match fate {
        KeyFate::Release => (RELEASE_REFUSAL_SQL, owner_values(idem).to_vec()),
        KeyFate::Keep(answer) => {
            let values = vec![
                SqlValue::Text(idem.customer_id.clone()),
                SqlValue::Text(idem.key.clone()),
                SqlValue::Text(idem.request_hash.clone()),
                SqlValue::Text(idem.owner.clone()),
                SqlValue::Integer(at),
                SqlValue::Integer(at + KEY_TTL_MS),
                SqlValue::Integer(log_id),
                SqlValue::Integer(i64::from(answer.status)),
                SqlValue::Text(answer.body.clone()),
            ];
            (ANSWER_REFUSAL_SQL, values)
        }
    }
}

/// The conditional upsert of a key (`Store::claim_idempotency`): true when taken. On
/// PostgreSQL an element of `gateway_send_ops` (migration 0008), so it rides in the
/// batch's one statement.
struct ClaimKey {
    idem: IdemOwner,
    now: i64,
    owner_lease: Option<i64>,
}

impl Write for ClaimKey {
    type Output = bool;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<bool, StoreError> {
        Ok(sqlite_exec(
            tx,
            &Statement { sql: CLAIM_SQL, params: claim_values(&self.idem, self.now, None, self.owner_lease) },
        )? > 0)
    }

    fn postgres(&self) -> Postgres {
        Postgres::Call { function: "gateway_send_ops", arg: claim_json(&self.idem, self.now, self.owner_lease) }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<bool, StoreError> {
        match answer {
            PgAnswer::Value(r) => Ok(r["claimed"] == true),
            PgAnswer::Rows(_) => Err(StoreError::Conflict("a claim had no answer".into())),
        }
    }
}

/// A key claim as `gateway_send_ops` reads it (an op of its own, or the `idem` of a
/// `begin`).
pub(super) fn claim_json(idem: &IdemOwner, now: i64, owner_lease: Option<i64>) -> serde_json::Value {
    serde_json::json!({
        "op": "claim", "customer_id": idem.customer_id, "key": idem.key, "hash": idem.request_hash,
        "owner": idem.owner, "now": now, "expires_at": now + KEY_TTL_MS, "lease_until": now + CLAIM_LEASE_MS,
        "owner_lease": owner_lease,
    })
}
