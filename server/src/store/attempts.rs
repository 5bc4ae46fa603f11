//! Exactly once: the attempt row written before the provider call, and the orphans a
//! stopped process leaves.
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
//! An idempotency key is claimed before the pipeline runs (see `idempotency`): one
//! conditional upsert, so of concurrent requests with one key exactly one runs. The
//! claim is a lease with an owner token: `begin` links the attempt row only while the
//! claim is still the caller's, so a request whose lease was taken over never sends.

use super::counters::{self, LimitHit, Reservation};
use super::idempotency::{Answer, CLAIM_SQL, IdemOwner, KeyFate, claim_json, claim_values};
use super::messages::{self, LogEntry, OutboxEvent};
use super::writer::{Exec, PgAnswer, Postgres, Statement, Write, sqlite_exec, unexpected};
use super::{Store, StoreError, bind_dollar};
use rusqlite::types::Value as SqlValue;

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
    /// The request's idempotency key, if it has one.
    pub idem: Option<IdemOwner>,
    /// What becomes of the request's idempotency key.
    pub answer: Option<KeyFate>,
}

/// An attempt row whose key was lost in the same write is taken back.
const UNDO_PENDING_SQL: &str = "DELETE FROM message_log WHERE id = $1";
const INSERT_PENDING_SQL: &str = "INSERT INTO message_log (customer_id, instance_id, api_key_id, source, purpose, \
     recipient, message_type, decision, error_code, policy, reason, provider_message_id, status, created_at, \
     policy_trace, request_id, correlation_id, deadline_at, idem_key) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) RETURNING id";
const FINISH_SQL: &str = "UPDATE message_log SET status = $2, error_code = $3, policy = $4, reason = $5, \
     provider_message_id = $6, decision = COALESCE($7, decision), deadline_at = NULL \
     WHERE id = $1 AND status = 'pending'";
const RELEASE_SQL: &str = "DELETE FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND log_id = $3";
const ANSWER_SQL: &str = "UPDATE idempotency_keys SET response_status = $4, response_body = $5, lease_until = NULL \
     WHERE customer_id = $1 AND idem_key = $2 AND log_id = $3 AND response_status IS NULL";
/// Keys are found from their attempt rows (`message_log.idem_key`), by primary key.
const ORPHAN_KEYS_SQL: &str = "UPDATE idempotency_keys SET response_status = $1, response_body = $2, \
     lease_until = NULL WHERE response_status IS NULL AND (customer_id, idem_key) IN \
     (SELECT customer_id, idem_key FROM message_log WHERE status = 'pending' AND deadline_at < $3 \
     AND idem_key IS NOT NULL)";
const ORPHAN_ROWS_SQL: &str = "UPDATE message_log SET status = 'unknown', error_code = 'gateway_send_failed', \
     policy = 'gateway/provider', reason = $1, deadline_at = NULL WHERE status = 'pending' AND deadline_at < $2";

/// The reason an orphaned attempt is logged with.
pub const ORPHAN_REASON: &str = "the gateway stopped while the provider call was in flight; it may have been sent";

impl Store {
    /// Takes the counters and writes the pending attempt row, in one write.
    pub async fn begin_attempt(&self, begin: Begin) -> Result<Began, StoreError> {
        self.write(begin).await
    }

    /// Records the provider's answer to a pending attempt; false when the row was no
    /// longer pending (an orphan sweep got there first: it stays `unknown`).
    pub async fn settle_attempt(&self, finish: Finish) -> Result<bool, StoreError> {
        self.write(finish).await
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
        let rows = self.write(Exec(statements)).await?;
        Ok(rows.get(1).copied().unwrap_or(0))
    }
}

fn text(s: &Option<String>) -> SqlValue {
    s.clone().map_or(SqlValue::Null, SqlValue::Text)
}

fn pending_values(b: &Begin) -> Vec<SqlValue> {
    let mut values = messages::log_values(&b.entry);
    values.push(SqlValue::Integer(b.deadline_at));
    values.push(b.idem.as_ref().map_or(SqlValue::Null, |i| SqlValue::Text(i.key.clone())));
    values
}

/// `begin` on SQLite, inside the writer's transaction.
fn sqlite_begin(tx: &rusqlite::Transaction<'_>, b: &Begin) -> Result<Began, StoreError> {
    let counts = match counters::sqlite_reserve(tx, &b.reservations)? {
        Ok(counts) => counts,
        Err(hit) => return Ok(Began::Limit(hit)),
    };
    let mut insert = tx.prepare_cached(INSERT_PENDING_SQL)?;
    bind_dollar(&mut insert, &pending_values(b))?;
    let id: i64 = insert.raw_query().next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?.get(0)?;
    // The key is taken here, with its attempt row, in the attempt's own write: free,
    // or already this request's. If another request with the key got there first,
    // this write takes back what it did (the rare path pays, not every send).
    if let Some(idem) = &b.idem {
        let claim = Statement { sql: CLAIM_SQL, params: claim_values(idem, b.entry.created_at, Some(id)) };
        if sqlite_exec(tx, &claim)? == 0 {
            sqlite_exec(tx, &Statement { sql: UNDO_PENDING_SQL, params: vec![SqlValue::Integer(id)] })?;
            counters::sqlite_release(tx, &b.reservations)?;
            return Ok(Began::KeyLost);
        }
    }
    Ok(Began::Written { log_id: id, counts })
}

/// `finish` on SQLite, inside the writer's transaction.
fn sqlite_finish(tx: &rusqlite::Transaction<'_>, f: &Finish) -> Result<bool, StoreError> {
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
        // The event names its row (`log_id`), as `gateway_send_ops` does (0013).
        messages::sqlite_outbox(tx, event, Some(f.log_id))?;
    }
    if went_out(&f.status)
        && let (Some(instance), Some(phone)) = (&f.instance_id, &f.recipient)
    {
        messages::sqlite_contact(tx, instance, phone, f.at)?;
    }
    counters::sqlite_release(tx, &f.release)?;
    if let Some((statement, params)) = key_fate(f) {
        sqlite_exec(tx, &Statement { sql: statement, params })?;
    }
    Ok(true)
}

/// What `finish` does to the attempt's key: keep its answer, or give it up.
fn key_fate(f: &Finish) -> Option<(&'static str, Vec<SqlValue>)> {
    let (idem, fate) = (f.idem.as_ref()?, f.answer.as_ref()?);
    let key = [SqlValue::Text(idem.customer_id.clone()), SqlValue::Text(idem.key.clone()), SqlValue::Integer(f.log_id)];
    Some(match fate {
        KeyFate::Release => (RELEASE_SQL, key.to_vec()),
        KeyFate::Keep(answer) => {
            let mut params = key.to_vec();
            params.extend([SqlValue::Integer(i64::from(answer.status)), SqlValue::Text(answer.body.clone())]);
            (ANSWER_SQL, params)
        }
    })
}

fn went_out(status: &str) -> bool {
    matches!(status, "sent" | "unknown")
}

/// `begin` as an op of `gateway_send_ops` (PostgreSQL, migration 0008; 0013 has the
/// `finish` event name its row).
fn begin_json(b: &Begin) -> serde_json::Value {
    let idem = b.idem.as_ref().map(|i| claim_json(i, b.entry.created_at));
    serde_json::json!({"op": "begin", "r": counters::reservations_json(&b.reservations),
                       "log": messages::log_json(&b.entry), "deadline_at": b.deadline_at, "idem": idem})
}

/// `finish` as an op of `gateway_send_ops`.
fn finish_json(f: &Finish) -> serde_json::Value {
    serde_json::json!({
        "op": "finish", "id": f.log_id, "status": f.status, "decision": f.decision, "error_code": f.error_code, "policy": f.policy,
        "reason": f.reason, "provider_message_id": f.provider_message_id, "went_out": went_out(&f.status),
        "instance_id": f.instance_id, "recipient": f.recipient, "at": f.at,
        "event": f.event.as_ref().map(messages::outbox_json),
        "release": counters::reservations_json(&f.release),
        "idem": f.idem.as_ref().map(|i| serde_json::json!({"customer_id": i.customer_id, "key": i.key})),
        "answer": f.answer.as_ref().map(|fate| match fate {
            KeyFate::Keep(a) => serde_json::json!({"status": a.status, "body": a.body}),
            KeyFate::Release => serde_json::json!({"release": true}),
        }),
    })
}

/// `gateway_send_ops`'s answer to a `begin`.
fn began_from_json(r: &serde_json::Value) -> Option<Began> {
    if r["lost"] == true {
        return Some(Began::KeyLost);
    }
    if r["ok"] == true {
        let counts = r["counts"].as_array()?.iter().map(|c| c.as_i64()).collect::<Option<Vec<_>>>()?;
        return Some(Began::Written { log_id: r["id"].as_i64()?, counts });
    }
    Some(Began::Limit(LimitHit { index: r["index"].as_u64()? as usize, used: r["used"].as_i64()? }))
}

impl Write for Begin {
    type Output = Began;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Began, StoreError> {
        sqlite_begin(tx, self)
    }

    fn postgres(&self) -> Postgres {
        Postgres::Call { function: "gateway_send_ops", arg: begin_json(self) }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Began, StoreError> {
        match answer {
            PgAnswer::Value(r) => began_from_json(&r).ok_or_else(|| unexpected(&r)),
            PgAnswer::Rows(_) => Err(StoreError::Conflict("a begin had no answer".into())),
        }
    }
}

impl Write for Finish {
    type Output = bool;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<bool, StoreError> {
        sqlite_finish(tx, self)
    }

    fn postgres(&self) -> Postgres {
        Postgres::Call { function: "gateway_send_ops", arg: finish_json(self) }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<bool, StoreError> {
        match answer {
            PgAnswer::Value(r) => Ok(r["applied"] == true),
            PgAnswer::Rows(_) => Err(StoreError::Conflict("a finish had no answer".into())),
        }
    }
}
