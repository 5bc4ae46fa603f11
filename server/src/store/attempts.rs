//! Exactly once: the attempt row written before the provider call, and the orphans a
//! stopped process leaves.
//!
//! An allowed send takes its counters and writes its message-log row as `pending` in
//! one write (`begin`), before the provider is called, so a kill at any moment after
//! the call started leaves a row. The provider's answer turns the row into `sent`,
//! `failed` (counters given back) or `unknown` (`finish`), with its event and, for a
//! request with an idempotency key, the answer to replay, in the same transaction. A
//! row still `pending` whose owner's lease has lapsed (see `leases`) belonged to a
//! process that stopped mid-call: `sweep_orphans` makes it `unknown` (it may have been
//! sent) and gives its key the answer of an unknown outcome. A row of a live owner is
//! never swept, however long its provider call runs. (A row written without a lease
//! keeps the clock rule: its deadline, the provider timeout plus a margin.)
//!
//! A send-message idempotency key is read before the pipeline runs (a replay answers
//! at once) and taken in `begin`'s own write, with the attempt row, so of concurrent
//! requests with one key exactly one sends; the conditional upsert of `idempotency`
//! (`claim_idempotency`) is how the PBX path claims its keys first. The claim is a
//! lease with an owner token: `begin` links the attempt row only while the claim is
//! still the caller's, so a request whose lease was taken over never sends.

use super::counters::{self, LimitHit, Reservation};
use super::idempotency::{Answer, CLAIM_SQL, IdemOwner, KeyFate, claim_json, claim_values};
use super::messages::{self, LogEntry, OutboxEvent};
use super::writer::{Exec, PgAnswer, Postgres, Statement, Write, lane, sqlite_exec, unexpected};
use super::{Bound, Store, StoreError, bind_dollar, bound_int, bound_opt, bound_text};
use rusqlite::types::Value as SqlValue;
use sqlx::Row;

/// The attempt row and the counters of an allowed send, written before the provider
/// call.
#[derive(Clone, Debug)]
pub struct Begin {
    pub reservations: Vec<Reservation>,
    /// The row, with status `pending`.
    pub entry: LogEntry,
    /// When a row still pending is an orphan, if it has no owner lease.
    pub deadline_at: i64,
    pub idem: Option<IdemOwner>,
    /// The lease of the process that writes it; `Store::begin_attempt` fills it.
    pub owner_lease: Option<i64>,
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
     policy_trace, request_id, correlation_id, deadline_at, idem_key, owner_lease) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)";
/// A settle that changes the row's decision (`$7`: a refusal that held at the provider);
/// [`FINISH_KEEP_DECISION_SQL`] for every other, since SQLite rewrites the entry of each
/// index on a column an `UPDATE` names (the time index, the refusals) even when the value
/// stays the same.
const FINISH_SQL: &str = "UPDATE message_log SET status = $2, error_code = $3, policy = $4, reason = $5, \
     provider_message_id = $6, decision = $7, deadline_at = NULL \
     WHERE id = $1 AND status = 'pending'";
const FINISH_KEEP_DECISION_SQL: &str = "UPDATE message_log SET status = $2, error_code = $3, policy = $4, \
     reason = $5, provider_message_id = $6, deadline_at = NULL WHERE id = $1 AND status = 'pending'";
const RELEASE_SQL: &str = "DELETE FROM idempotency_keys WHERE customer_id = $1 AND idem_key = $2 AND log_id = $3";
const ANSWER_SQL: &str = "UPDATE idempotency_keys SET response_status = $4, response_body = $5, lease_until = NULL \
     WHERE customer_id = $1 AND idem_key = $2 AND log_id = $3 AND response_status IS NULL";
/// A pending row whose owner stopped, on SQLite (`$now`: now, `$own`: this process's
/// lease, which its own sweep never takes, even while a renewal is late).
macro_rules! orphaned_sqlite {
    ($now:literal, $own:literal) => {
        concat!(
            "status = 'pending' AND COALESCE(owner_lease, 0) <> ",
            $own,
            " AND ((owner_lease IS NULL AND deadline_at < ",
            $now,
            ") OR (owner_lease IS NOT NULL AND NOT EXISTS (SELECT 1 FROM process_leases p \
             WHERE p.id = message_log.owner_lease AND p.expires_at > ",
            $now,
            ")))"
        )
    };
}
/// The same on PostgreSQL, by the database's clock (`gateway_lapsed`, migration 0012).
macro_rules! orphaned_postgres {
    ($own:literal) => {
        concat!(
            "status = 'pending' AND COALESCE(owner_lease, 0) <> ",
            $own,
            " AND gateway_lapsed(owner_lease, deadline_at)"
        )
    };
}
/// Keys are found from their attempt rows (`message_log.idem_key`), by primary key.
macro_rules! orphan_keys {
    ($orphaned:expr) => {
        concat!(
            "UPDATE idempotency_keys SET response_status = $1, response_body = $2, \
             lease_until = NULL WHERE response_status IS NULL AND (customer_id, idem_key) IN \
             (SELECT customer_id, idem_key FROM message_log WHERE ",
            $orphaned,
            " AND idem_key IS NOT NULL)"
        )
    };
}
macro_rules! orphan_rows {
    ($orphaned:expr) => {
        concat!(
            "UPDATE message_log SET status = 'unknown', error_code = 'gateway_send_failed', \
             policy = 'gateway/provider', reason = $1, deadline_at = NULL WHERE ",
            $orphaned
        )
    };
}
const ORPHAN_KEYS_SQLITE: &str = orphan_keys!(orphaned_sqlite!("$3", "$4"));
const ORPHAN_ROWS_SQLITE: &str = orphan_rows!(orphaned_sqlite!("$2", "$3"));
const ORPHAN_KEYS_POSTGRES: &str = orphan_keys!(orphaned_postgres!("$3"));
const ORPHAN_ROWS_POSTGRES: &str = orphan_rows!(orphaned_postgres!("$2"));

/// The reason an orphaned attempt is logged with.
pub const ORPHAN_REASON: &str = "the gateway stopped while the provider call was in flight; it may have been sent";

impl Store {
    /// Takes the counters and writes the pending attempt row, in one write, under this
    /// process's lease.
    pub async fn begin_attempt(&self, mut begin: Begin) -> Result<Began, StoreError> {
        begin.owner_lease = self.lease();
        self.write(begin).await
    }

    /// Records the provider's answer to a pending attempt; false when the row was no
    /// longer pending (an orphan sweep got there first: it stays `unknown`). Applying
    /// the same `Finish` twice changes nothing the second time.
    pub async fn settle_attempt(&self, finish: Finish) -> Result<bool, StoreError> {
        self.write(finish).await
    }

    /// Makes every attempt still pending whose owner stopped `unknown` (and gives its
    /// key `answer`); returns how many. `now` is this process's clock, which only rows
    /// without a lease (and, on SQLite, the leases) are read by; PostgreSQL reads
    /// leases by its own clock.
    pub async fn sweep_orphans(&self, now: i64, answer: &Answer) -> Result<u64, StoreError> {
        let own = SqlValue::Integer(self.lease().unwrap_or(0));
        let status = SqlValue::Integer(i64::from(answer.status));
        let body = SqlValue::Text(answer.body.clone());
        let reason = SqlValue::Text(ORPHAN_REASON.into());
        let statements = match self.backend() {
            super::Backend::Sqlite => vec![
                Statement { sql: ORPHAN_KEYS_SQLITE, params: vec![status, body, SqlValue::Integer(now), own.clone()] },
                Statement { sql: ORPHAN_ROWS_SQLITE, params: vec![reason, SqlValue::Integer(now), own] },
            ],
            super::Backend::Postgres => vec![
                Statement { sql: ORPHAN_KEYS_POSTGRES, params: vec![status, body, own.clone()] },
                Statement { sql: ORPHAN_ROWS_POSTGRES, params: vec![reason, own] },
            ],
        };
        let rows = self.write(Exec(statements)).await?;
        Ok(rows.get(1).copied().unwrap_or(0))
    }

    /// Whether the pending attempt `log_id` belongs to a process that stopped (its
    /// lease lapsed, or, without one, its deadline passed): a retry may settle it now.
    pub async fn attempt_orphaned(&self, log_id: i64) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT owner_lease, deadline_at, status FROM message_log WHERE id = $1")
            .bind(log_id)
            .fetch_optional(&self.read)
            .await?;
        let Some(row) = row else { return Ok(false) };
        if row.try_get::<String, _>("status")? != "pending" {
            return Ok(false);
        }
        match row.try_get::<Option<i64>, _>("owner_lease")? {
            Some(lease) => Ok(Some(lease) != self.lease() && !self.lease_alive(lease).await?),
            None => Ok(row.try_get::<Option<i64>, _>("deadline_at")?.is_some_and(|d| d < super::now_ms())),
        }
    }
}

fn pending_values(b: &Begin) -> Vec<Bound<'_>> {
    let mut values = messages::log_values(&b.entry);
    values.push(bound_int(Some(b.deadline_at)));
    values.push(b.idem.as_ref().map_or(bound_int(None), |i| bound_text(&i.key)));
    values.push(bound_int(b.owner_lease));
    values
}

/// `begin` on SQLite, inside the writer's transaction.
fn sqlite_begin(tx: &rusqlite::Transaction<'_>, b: &Begin) -> Result<Began, StoreError> {
    let counts = match counters::sqlite_reserve(tx, &b.reservations)? {
        Ok(counts) => counts,
        Err(hit) => return Ok(Began::Limit(hit)),
    };
    let id = super::sqlite_insert(tx, INSERT_PENDING_SQL, &pending_values(b), "an attempt's row")?;
    // The key is taken here, with its attempt row, in the attempt's own write: free,
    // or already this request's. If another request with the key got there first,
    // this write takes back what it did (the rare path pays, not every send).
    if let Some(idem) = &b.idem {
        let claim =
            Statement { sql: CLAIM_SQL, params: claim_values(idem, b.entry.created_at, Some(id), b.owner_lease) };
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
    let mut values = vec![
        bound_int(Some(f.log_id)),
        bound_text(&f.status),
        bound_opt(&f.error_code),
        bound_opt(&f.policy),
        bound_opt(&f.reason),
        bound_opt(&f.provider_message_id),
    ];
    let sql = match &f.decision {
        Some(decision) => {
            values.push(bound_text(decision));
            FINISH_SQL
        }
        None => FINISH_KEEP_DECISION_SQL,
    };
    let mut update = tx.prepare_cached(sql)?;
    bind_dollar(&mut update, &values)?;
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
    let idem = b.idem.as_ref().map(|i| claim_json(i, b.entry.created_at, b.owner_lease));
    serde_json::json!({"op": "begin", "r": counters::reservations_json(&b.reservations),
                       "log": messages::log_json(&b.entry), "deadline_at": b.deadline_at, "idem": idem,
                       "owner_lease": b.owner_lease})
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

    /// A settle that gives counters back shares their lane with the sends that take them.
    fn lane(&self) -> usize {
        if self.release.is_empty() { lane::SETTLE } else { lane::MAIN }
    }
}

#[cfg(test)]
#[path = "attempts_set_tests.rs"]
mod set_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters are only ever changed by the main lane, so limits stay exact however
    /// many lanes run: a settle goes beside it only when it gives nothing back.
    #[test]
    fn only_a_settle_that_gives_nothing_back_leaves_the_main_lane() {
        let sent = Finish { status: "sent".into(), ..Finish::default() };
        assert_eq!(sent.lane(), lane::SETTLE);
        let r = Reservation { scope: "day:c".into(), window_start: 0, expires_at: 1, limit: 1 };
        let failed = Finish { status: "failed".into(), release: vec![r], ..Finish::default() };
        assert_eq!(failed.lane(), lane::MAIN);
        let begin = Begin {
            reservations: Vec::new(),
            entry: LogEntry::default(),
            deadline_at: 0,
            idem: None,
            owner_lease: None,
        };
        assert_eq!(begin.lane(), lane::MAIN);
    }
}
