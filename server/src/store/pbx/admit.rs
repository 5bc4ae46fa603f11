//! The admission of a PBX webhook request as one write of the group-commit writer:
//! the replay check of its signature, its GCRA rate limit, and, for an event that
//! sends nothing, its log row. On SQLite the statements run in the writer's
//! transaction; on PostgreSQL one call of `gateway_pbx_admit` (migration 0003) does the
//! same.

use super::super::writer::{PgAnswer, Postgres, Write, unexpected};
use super::super::{Store, StoreError, bind_dollar, now_ms};
use super::{INSERT_EVENT_SQL, PbxEvent, event_values};
use rusqlite::types::Value as SqlValue;

/// One GCRA check: allowed when the theoretical arrival time is at most `tolerance_ms`
/// ahead of now; an allowed request moves it `interval_ms` on. "Now" is read where the
/// write runs (the SQLite writer thread; PostgreSQL's `clock_timestamp()`), so the
/// writes of one limiter see a clock that never goes back, and replicas on one
/// PostgreSQL share one clock.
#[derive(Clone, Debug)]
pub struct RateCheck {
    pub key: String,
    pub interval_ms: i64,
    pub tolerance_ms: i64,
}

/// The admission write of a webhook request, in the order of the checks.
#[derive(Clone, Debug)]
pub struct PbxAdmit {
    pub integration_id: i64,
    /// A verified signature to remember (HMAC on), with the timestamp it signs (Unix
    /// seconds).
    pub signature: Option<String>,
    pub signature_ts: i64,
    /// The rate limit, when the request reached that step.
    pub rate: Option<RateCheck>,
    /// The event's log row when it is final at admission (no send); written as
    /// `rate_limited` instead when the rate limit refuses.
    pub log: Option<PbxEvent>,
}

/// What admission decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The signature was seen before inside the window.
    Replayed,
    Admitted {
        /// `Some(ms)` when the rate limit refused: how long until a request passes.
        rate_limited_for_ms: Option<i64>,
        log_id: Option<i64>,
    },
}

/// The GCRA upsert (SQLite; PostgreSQL runs the same logic in `gateway_pbx_admit`).
const RATE_SQL: &str = "INSERT INTO rate_limits (key, tat, expires_at) VALUES ($1, $2 + $3, $2 + $3) \
     ON CONFLICT (key) DO UPDATE SET \
       tat = (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3, \
       expires_at = (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3 \
     WHERE (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) - $2 <= $4 \
     RETURNING tat";
const SEEN_SQL: &str = "INSERT INTO pbx_seen_signatures (ts, integration_id, signature) \
     VALUES ($1, $2, $3) ON CONFLICT (ts, integration_id, signature) DO NOTHING";
const TAT_SQL: &str = "SELECT tat FROM rate_limits WHERE key = $1";

impl Store {
    /// Replay check, rate limit and (for an event that sends nothing) its log row, in
    /// one write of the group-commit writer.
    pub async fn pbx_admit(&self, admit: PbxAdmit) -> Result<Admission, StoreError> {
        self.write(admit).await
    }
}

impl Write for PbxAdmit {
    type Output = Admission;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<Admission, StoreError> {
        sqlite_pbx_admit(tx, self)
    }

    /// The same writes in `gateway_pbx_admit` (migration 0003), where "now" for the
    /// limiter is the database's clock, shared by every replica.
    fn postgres(&self) -> Postgres {
        let admit = self;
        let a = admit;
        let log = a.log.as_ref().map(|l| {
            serde_json::json!({
                "integration_id": l.integration_id, "customer_id": l.customer_id, "event_type": l.event_type,
                "action": l.action, "status_code": l.status_code, "error_code": l.error_code,
                "phone": l.phone, "message_id": l.message_id, "external_message_id": l.external_message_id,
                "response": l.response, "created_at": l.created_at,
            })
        });
        let rate = a
            .rate
            .as_ref()
            .map(|r| serde_json::json!({"key": r.key, "interval": r.interval_ms, "tolerance": r.tolerance_ms}));
        let arg = serde_json::json!({"integration_id": a.integration_id, "signature": a.signature,
                               "signature_ts": a.signature_ts, "rate": rate, "log": log});
        Postgres::Call { function: "gateway_pbx_admit", arg }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Admission, StoreError> {
        let PgAnswer::Value(r) = answer else { return Err(StoreError::Conflict("an admission had no answer".into())) };
        if r["replay"] == true {
            return Ok(Admission::Replayed);
        }
        if !r.is_object() {
            return Err(unexpected(&r));
        }
        Ok(Admission::Admitted { rate_limited_for_ms: r["rate_limited_for_ms"].as_i64(), log_id: r["log_id"].as_i64() })
    }
}

fn sqlite_pbx_admit(tx: &rusqlite::Transaction<'_>, a: &PbxAdmit) -> Result<Admission, StoreError> {
    if let Some(signature) = &a.signature {
        let mut stmt = tx.prepare_cached(SEEN_SQL)?;
        bind_dollar(
            &mut stmt,
            &[
                SqlValue::Integer(a.signature_ts),
                SqlValue::Integer(a.integration_id),
                SqlValue::Text(signature.clone()),
            ],
        )?;
        if stmt.raw_execute()? == 0 {
            return Ok(Admission::Replayed);
        }
    }
    let mut rate_limited_for_ms = None;
    if let Some(rate) = &a.rate {
        let now = now_ms();
        let mut stmt = tx.prepare_cached(RATE_SQL)?;
        bind_dollar(
            &mut stmt,
            &[
                SqlValue::Text(rate.key.clone()),
                SqlValue::Integer(now),
                SqlValue::Integer(rate.interval_ms),
                SqlValue::Integer(rate.tolerance_ms),
            ],
        )?;
        let allowed = stmt.raw_query().next()?.is_some();
        if !allowed {
            let tat: i64 = tx.prepare_cached(TAT_SQL)?.query_row([&rate.key], |row| row.get(0))?;
            rate_limited_for_ms = Some(tat - now - rate.tolerance_ms);
        }
    }
    let mut log_id = None;
    if let Some(log) = &a.log {
        let log = admitted_log(log, rate_limited_for_ms);
        let mut insert = tx.prepare_cached(INSERT_EVENT_SQL)?;
        bind_dollar(&mut insert, &event_values(&log))?;
        log_id = Some(insert.raw_query().next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?.get(0)?);
    }
    Ok(Admission::Admitted { rate_limited_for_ms, log_id })
}

/// The log row of an admitted event: as given, or `rate_limited` when the limit refused.
fn admitted_log(log: &PbxEvent, rate_limited_for_ms: Option<i64>) -> PbxEvent {
    match rate_limited_for_ms {
        None => log.clone(),
        Some(_) => PbxEvent {
            action: "rate_limited".into(),
            status_code: 429,
            error_code: Some("webhook_rate_limited".into()),
            response: None,
            ..log.clone()
        },
    }
}
