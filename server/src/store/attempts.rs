//! Exactly once: the attempt row written before the provider call, idempotency keys,
//! and the orphans a stopped process leaves.
//!
//! An allowed send takes its counters and writes its message-log row as `pending` in
//! one write (`begin`), before the provider is called, so a kill at any moment after
//! the call started leaves a row. The provider's answer turns the row into `sent`,
//! `failed` (counters given back) or `unknown` (`finish`), with its event and, for a
//! request with an idempotency key, the answer to replay, in the same transaction. A
//! row still `pending` past its deadline (the provider timeout plus a margin) belonged
//! to a process that stopped mid-call: `sweep_orphans` makes it `unknown` (it may have
//! been sent) and gives its key the answer of an unknown outcome.
//!
//! An idempotency key is claimed before the pipeline runs (`claim_idempotency`): one
//! conditional upsert, so of concurrent requests with one key exactly one runs. The
//! claim is a lease with an owner token: `begin` links the attempt row only while the
//! claim is still the caller's, so a request whose lease was taken over never sends.

use super::counters::{LimitHit, Reservation};
use super::messages::{LogEntry, OutboxEvent};
use super::writer::{Statement, WriteOp};
use super::{Store, StoreError, bind_dollar};
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
    /// The key's first request is still running. `log_id` is its attempt row once it
    /// reached the provider; `lease_until` bounds how long it may take to get there.
    /// `since` is when the key was claimed.
    InProgress { log_id: Option<i64>, lease_until: Option<i64>, since: i64 },
}

/// The attempt row and the counters of an allowed send, written before the provider
/// call.
#[derive(Clone, Debug)]
pub struct Begin {
    pub reservations: Vec<Reservation>,
    /// The row, with status `pending`.
    pub entry: LogEntry,
    /// When a row still pending is an orphan.
    pub deadline_at: i64,
    pub idem: Option<IdemOwner>,
}

/// What `begin` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Began {
    /// The counters are taken and the row written: its id, and each counter's value
    /// after this send's increment, in the order of the reservations (the send's place
    /// among every send that took it, on any replica).
    Written { log_id: i64, counts: Vec<i64> },
    /// A counter was full; nothing was written.
    Limit(LimitHit),
    /// The idempotency claim is no longer this request's; nothing was written.
    KeyLost,
}

/// The provider's answer to an attempt.
#[derive(Clone, Debug, Default)]
pub struct Finish {
    pub log_id: i64,
    /// `sent`, `failed`, `unknown`, or `refused` (a policy decision that did not hold
    /// against the counters the send took).
    pub status: String,
    /// The row's new decision, when it changes (`refused`).
    pub decision: Option<String>,
    pub error_code: Option<String>,
    pub policy: Option<String>,
    pub reason: Option<String>,
    pub provider_message_id: Option<String>,
    pub instance_id: Option<String>,
    pub recipient: Option<String>,
    pub at: i64,
    pub event: Option<OutboxEvent>,
    /// Counters to give back (a clean failure).
    pub release: Vec<Reservation>,
    /// What becomes of the request's idempotency key.
    pub answer: Option<KeyFate>,
}

/// How long a claimed key may take to reach its attempt row before another request
/// with the same key may take it over (the request's process is presumed gone).
pub const CLAIM_LEASE_MS: i64 = 30_000;
/// How long a key and its answer are kept.
pub const KEY_TTL_MS: i64 = 24 * 3_600_000;

const CLAIM_SQL: &str = "INSERT INTO idempotency_keys (customer_id, idem_key, request_hash, owner, created_at, \
     expires_at, lease_until) VALUES ($1, $2, $3, $4, $5, $6, $7) \
     ON CONFLICT (customer_id, idem_key) DO UPDATE SET request_hash = excluded.request_hash, \
     owner = excluded.owner, created_at = excluded.created_at, expires_at = excluded.expires_at, \
     lease_until = excluded.lease_until, log_id = NULL, response_status = NULL, response_body = NULL \
     WHERE idempotency_keys.expires_at <= excluded.created_at \
     OR (idempotency_keys.log_id IS NULL AND idempotency_keys.response_status IS NULL \
     AND idempotency_keys.lease_until <= excluded.created_at \
     AND idempotency_keys.request_hash = excluded.request_hash)";
const KEY_SQL: &str = "SELECT request_hash, lease_until, log_id, response_status, response_body, created_at \
     FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND expires_at > $3";
const OWNED_SQL: &str = "SELECT 1 FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND owner = $3 \
     AND log_id IS NULL AND response_status IS NULL";
const LINK_SQL: &str =
    "UPDATE idempotency_keys SET log_id = $3, lease_until = NULL WHERE customer_id = $1 AND idem_key = $2";
/// The answer of a refused request, kept with its log row.
const ANSWER_REFUSAL_SQL: &str = "UPDATE idempotency_keys SET response_status = $4, response_body = $5, \
     log_id = $6, lease_until = NULL WHERE customer_id = $1 AND idem_key = $2 AND owner = $3 \
     AND response_status IS NULL";
const INSERT_PENDING_SQL: &str = "INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, \
     recipient, message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, \
     policy_trace, deadline_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
     RETURNING id";
const FINISH_SQL: &str = "UPDATE message_log SET status = $2, error_code = $3, policy = $4, reason = $5, \
     provider_message_id = $6, decision = COALESCE($7, decision), deadline_at = NULL \
     WHERE id = $1 AND status = 'pending'";
const RELEASE_SQL: &str = "DELETE FROM idempotency_keys WHERE log_id = $1";
/// A refused request gives its key up (see `KeyFate::Release`).
pub(super) const RELEASE_REFUSAL_SQL: &str =
    "DELETE FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND owner = $3";
const ANSWER_SQL: &str = "UPDATE idempotency_keys SET response_status = $2, response_body = $3, lease_until = NULL \
     WHERE log_id = $1 AND response_status IS NULL";
const ORPHAN_KEYS_SQL: &str = "UPDATE idempotency_keys SET response_status = $1, response_body = $2, \
     lease_until = NULL WHERE response_status IS NULL AND log_id IN \
     (SELECT id FROM message_log WHERE status = 'pending' AND deadline_at < $3)";
const ORPHAN_ROWS_SQL: &str = "UPDATE message_log SET status = 'unknown', error_code = 'gateway_send_failed', \
     policy = 'gateway/provider', reason = $1, deadline_at = NULL WHERE status = 'pending' AND deadline_at < $2";

/// The reason an orphaned attempt is logged with.
pub const ORPHAN_REASON: &str = "the gateway stopped while the provider call was in flight; it may have been sent";

impl Store {
    /// Claims `key` for a request whose parsed body hashes to `request_hash`; `owner`
    /// is the request's own token.
    pub async fn claim_idempotency(&self, idem: &IdemOwner, request_hash: &str, now: i64) -> Result<Claim, StoreError> {
        let params = vec![
            SqlValue::Text(idem.customer_id.clone()),
            SqlValue::Text(idem.key.clone()),
            SqlValue::Text(request_hash.to_string()),
            SqlValue::Text(idem.owner.clone()),
            SqlValue::Integer(now),
            SqlValue::Integer(now + KEY_TTL_MS),
            SqlValue::Integer(now + CLAIM_LEASE_MS),
        ];
        let statements = vec![Statement { sql: CLAIM_SQL, params }];
        let rows = self.write_op(|reply| WriteOp::Exec { statements, finish: None, reply }).await?;
        if rows.first().copied().unwrap_or(0) > 0 {
            return Ok(Claim::Claimed);
        }
        let row =
            sqlx::query(KEY_SQL).bind(&idem.customer_id).bind(&idem.key).bind(now).fetch_optional(&self.read).await?;
        // Expired between the two statements: claim it again.
        let Some(row) = row else { return Box::pin(self.claim_idempotency(idem, request_hash, now)).await };
        let hash: String = row.try_get("request_hash")?;
        if hash != request_hash {
            return Ok(Claim::Mismatch);
        }
        let status: Option<i64> = row.try_get("response_status")?;
        let body: Option<String> = row.try_get("response_body")?;
        if let (Some(status), Some(body)) = (status, body) {
            return Ok(Claim::Replay(Answer { status: status as u16, body }));
        }
        Ok(Claim::InProgress {
            log_id: row.try_get("log_id")?,
            lease_until: row.try_get("lease_until")?,
            since: row.try_get("created_at")?,
        })
    }

    /// Takes the counters and writes the pending attempt row, in one write.
    pub async fn begin_attempt(&self, begin: Begin) -> Result<Began, StoreError> {
        let begin = Box::new(begin);
        self.write_op(|reply| WriteOp::Begin { begin, reply }).await
    }

    /// Records the provider's answer to a pending attempt; false when the row was no
    /// longer pending (an orphan sweep got there first: it stays `unknown`).
    pub async fn settle_attempt(&self, finish: Finish) -> Result<bool, StoreError> {
        let finish = Box::new(finish);
        self.write_op(|reply| WriteOp::Finish { finish, reply }).await
    }

    /// Makes every attempt still pending before `now` `unknown`, and gives its key
    /// `answer`; returns how many.
    pub async fn sweep_orphans(&self, now: i64, answer: &Answer) -> Result<u64, StoreError> {
        let statements = vec![
            Statement {
                sql: ORPHAN_KEYS_SQL,
                params: vec![
                    SqlValue::Integer(i64::from(answer.status)),
                    SqlValue::Text(answer.body.clone()),
                    SqlValue::Integer(now),
                ],
            },
            Statement {
                sql: ORPHAN_ROWS_SQL,
                params: vec![SqlValue::Text(ORPHAN_REASON.into()), SqlValue::Integer(now)],
            },
        ];
        let rows = self.write_op(|reply| WriteOp::Exec { statements, finish: None, reply }).await?;
        Ok(rows.get(1).copied().unwrap_or(0))
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
        self.write_op(|reply| WriteOp::Exec { statements, finish: None, reply }).await.map(|_| ())
    }

    /// Deletes idempotency keys past their 24 hours; returns how many.
    pub async fn prune_idempotency(&self, now: i64) -> Result<u64, StoreError> {
        let done =
            sqlx::query("DELETE FROM idempotency_keys WHERE expires_at < $1").bind(now).execute(&self.write).await?;
        Ok(done.rows_affected())
    }
}

fn text(s: &Option<String>) -> SqlValue {
    s.clone().map_or(SqlValue::Null, SqlValue::Text)
}

fn pending_values(b: &Begin) -> Vec<SqlValue> {
    let mut values = super::writer::log_values(&b.entry);
    values.push(SqlValue::Integer(b.deadline_at));
    values
}

/// `begin` on SQLite, inside the writer's transaction.
pub(super) fn sqlite_begin(tx: &rusqlite::Transaction<'_>, b: &Begin) -> Result<Began, StoreError> {
    if let Some(idem) = &b.idem {
        let mut owned = tx.prepare_cached(OWNED_SQL)?;
        bind_dollar(&mut owned, &owner_values(idem))?;
        if owned.raw_query().next()?.is_none() {
            return Ok(Began::KeyLost);
        }
    }
    let counts = match super::writer::sqlite_reserve(tx, &b.reservations)? {
        Ok(counts) => counts,
        Err(hit) => return Ok(Began::Limit(hit)),
    };
    let mut insert = tx.prepare_cached(INSERT_PENDING_SQL)?;
    bind_dollar(&mut insert, &pending_values(b))?;
    let id: i64 = insert.raw_query().next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?.get(0)?;
    if let Some(idem) = &b.idem {
        let mut link = tx.prepare_cached(LINK_SQL)?;
        bind_dollar(
            &mut link,
            &[SqlValue::Text(idem.customer_id.clone()), SqlValue::Text(idem.key.clone()), SqlValue::Integer(id)],
        )?;
        link.raw_execute()?;
    }
    Ok(Began::Written { log_id: id, counts })
}

fn owner_values(idem: &IdemOwner) -> [SqlValue; 3] {
    [SqlValue::Text(idem.customer_id.clone()), SqlValue::Text(idem.key.clone()), SqlValue::Text(idem.owner.clone())]
}

/// The statement and values that settle a refused request's key.
pub(super) fn refusal_key(idem: &IdemOwner, fate: &KeyFate, log_id: i64) -> (&'static str, Vec<SqlValue>) {
    let mut values = owner_values(idem).to_vec();
    match fate {
        KeyFate::Release => (RELEASE_REFUSAL_SQL, values),
        KeyFate::Keep(answer) => {
            values.extend([
                SqlValue::Integer(i64::from(answer.status)),
                SqlValue::Text(answer.body.clone()),
                SqlValue::Integer(log_id),
            ]);
            (ANSWER_REFUSAL_SQL, values)
        }
    }
}

/// `finish` on SQLite, inside the writer's transaction.
pub(super) fn sqlite_finish(tx: &rusqlite::Transaction<'_>, f: &Finish) -> Result<bool, StoreError> {
    let mut update = tx.prepare_cached(FINISH_SQL)?;
    bind_dollar(
        &mut update,
        &[
            SqlValue::Integer(f.log_id),
            SqlValue::Text(f.status.clone()),
            text(&f.error_code),
            text(&f.policy),
            text(&f.reason),
            text(&f.provider_message_id),
            text(&f.decision),
        ],
    )?;
    if update.raw_execute()? == 0 {
        return Ok(false);
    }
    if let Some(event) = &f.event {
        super::writer::sqlite_outbox(tx, event)?;
    }
    if went_out(&f.status)
        && let (Some(instance), Some(phone)) = (&f.instance_id, &f.recipient)
    {
        super::writer::sqlite_contact(tx, instance, phone, f.at)?;
    }
    super::writer::sqlite_release(tx, &f.release)?;
    if let Some(KeyFate::Release) = &f.answer {
        tx.prepare_cached(RELEASE_SQL)?.execute([f.log_id])?;
    }
    if let Some(KeyFate::Keep(answer)) = &f.answer {
        let mut keep = tx.prepare_cached(ANSWER_SQL)?;
        bind_dollar(
            &mut keep,
            &[
                SqlValue::Integer(f.log_id),
                SqlValue::Integer(i64::from(answer.status)),
                SqlValue::Text(answer.body.clone()),
            ],
        )?;
        keep.raw_execute()?;
    }
    Ok(true)
}

fn went_out(status: &str) -> bool {
    matches!(status, "sent" | "unknown")
}

/// `begin` as an op of `gateway_send_ops` (PostgreSQL, migration 0008).
pub(super) fn begin_json(b: &Begin) -> serde_json::Value {
    let idem =
        b.idem.as_ref().map(|i| serde_json::json!({"customer_id": i.customer_id, "key": i.key, "owner": i.owner}));
    serde_json::json!({"op": "begin", "r": super::writer::reservations_json(&b.reservations),
                       "log": super::writer::log_json(&b.entry), "deadline_at": b.deadline_at, "idem": idem})
}

/// `finish` as an op of `gateway_send_ops`.
pub(super) fn finish_json(f: &Finish) -> serde_json::Value {
    serde_json::json!({
        "op": "finish", "id": f.log_id, "status": f.status, "decision": f.decision, "error_code": f.error_code, "policy": f.policy,
        "reason": f.reason, "provider_message_id": f.provider_message_id, "went_out": went_out(&f.status),
        "instance_id": f.instance_id, "recipient": f.recipient, "at": f.at,
        "event": f.event.as_ref().map(super::writer::outbox_json),
        "release": super::writer::reservations_json(&f.release),
        "answer": f.answer.as_ref().map(|fate| match fate {
            KeyFate::Keep(a) => serde_json::json!({"status": a.status, "body": a.body}),
            KeyFate::Release => serde_json::json!({"release": true}),
        }),
    })
}

/// `gateway_send_ops`'s answer to a `begin`.
pub(super) fn began_from_json(r: &serde_json::Value) -> Option<Began> {
    if r["lost"] == true {
        return Some(Began::KeyLost);
    }
    if r["ok"] == true {
        let counts = r["counts"].as_array()?.iter().map(|c| c.as_i64()).collect::<Option<Vec<_>>>()?;
        return Some(Began::Written { log_id: r["id"].as_i64()?, counts });
    }
    Some(Began::Limit(LimitHit { index: r["index"].as_u64()? as usize, used: r["used"].as_i64()? }))
}
