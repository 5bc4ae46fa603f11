//! The admission of a PBX webhook request as one write of the group-commit writer:
//! the check that the integration is still as the request was authenticated against,
//! the replay check of its signature, its GCRA rate limit, and, for an event that
//! sends nothing, its log row. On SQLite the statements run in the writer's
//! transaction; on PostgreSQL one call of `gateway_pbx_admit` (migrations 0003, 0018
//! and 0020) does the same for the whole batch.
//!
//! On SQLite the replay check does not write a signature into a b-tree keyed by it: a
//! random key per event put each at its own page, and a commit of n events wrote n pages
//! (two thirds of its pages, BENCHMARKS.md, issue 22). The signatures are appended to
//! `pbx_signature_log` in arrival order (migration 0015), and the writer thread keeps the
//! window's signatures in memory (`Seen`), which only it sees. At the first check of each
//! transaction the writer reads the log on from the last id it read, so rows a replica
//! on the same file appended are known (nobody else appends while the writer holds the
//! lock). What a check adds to the memory, and the last id read, are undone if the
//! batch's transaction rolls back (`writer::sqlite_on_rollback`), so a batch rolled back
//! forgets them as it forgets its rows. The memory was a temporary table of the writer's
//! connection until the writer's undo existed: its statements and its rollback journal
//! cost the writer 10 to 30 % of its CPU an event (BENCHMARKS.md, issue 22, twenty-first
//! session).
//!
//! The first check is what lets the webhook take its integration from the cache
//! (`store::cache`): a rotated secret, a new allowlist, a changed setting or a PBX
//! module turned off is seen by the first admission that starts after the command
//! returned, which then writes nothing and answers [`Admission::Stale`], and the
//! request is checked again against the integration read anew.

use super::super::writer::{MAX_BATCH, PgAnswer, Postgres, Write, sqlite_on_rollback, sqlite_transaction, unexpected};
use super::super::{Store, StoreError, bind_dollar, now_ms};
use super::{PbxEvent, PbxIntegration, insert_event_sqlite};
use rusqlite::types::Value as SqlValue;
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

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
    /// The integration the request was checked against: the admission is
    /// [`Admission::Stale`] unless its settings, secrets and the customer's PBX module
    /// are still these.
    pub used: Arc<PbxIntegration>,
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
    /// The integration changed (or is gone) since it was read: nothing was written.
    Stale,
    /// The signature was seen before inside the window.
    Replayed,
    Admitted {
        /// `Some(ms)` when the rate limit refused: how long until a request passes.
        rate_limited_for_ms: Option<i64>,
        log_id: Option<i64>,
    },
}

/// The GCRA upsert (SQLite; PostgreSQL runs the same logic in `gateway_pbx_admit`): it
/// changes one row when the request is allowed and none when it is refused (the row
/// count, rather than `RETURNING`: see `store::sqlite_insert`).
const RATE_SQL: &str = "INSERT INTO rate_limits (key, tat, expires_at) VALUES ($1, $2 + $3, $2 + $3) \
     ON CONFLICT (key) DO UPDATE SET \
       tat = (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3, \
       expires_at = (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) + $3 \
     WHERE (CASE WHEN rate_limits.tat > $2 THEN rate_limits.tat ELSE $2 END) - $2 <= $4";
/// How long a signature is remembered after the time it signs (by the SQLite writer in
/// memory, and by retention in the tables): at least twice the webhook's tolerance
/// (`pbx::auth::TOLERANCE_SECONDS`, asserted there when the gateway is built), so that
/// a signature is never forgotten while its timestamp is still accepted.
pub const SIGNATURE_MEMORY_SECONDS: i64 = 600;
/// The log's rows after the last one the writer read (`$1`).
const LOG_AFTER_SQL: &str = "SELECT id, ts, integration_id, signature FROM main.pbx_signature_log WHERE id > $1";
const SEEN_LOG_SQL: &str = "INSERT INTO main.pbx_signature_log (ts, integration_id, signature) VALUES ($1, $2, $3)";
/// How many of the oldest signatures past the window the first check of a transaction
/// forgets: eight for each write a transaction can hold, as many as when each check
/// forgot eight, so that memory keeps pace (with the signatures of busy replicas on the
/// same file, which it takes in too) without a pause to empty a minute's worth at once.
const FORGET_AT_ONCE: usize = 8 * MAX_BATCH;
const TAT_SQL: &str = "SELECT tat FROM rate_limits WHERE key = $1";
/// The integration as it was used: every column the webhook reads that can change.
const UNCHANGED_SQL: &str = "SELECT 1 FROM pbx_integrations p JOIN customers c ON c.id = p.customer_id \
     WHERE p.id = $1 AND p.secret_hash = $2 AND p.hmac_secret IS $3 AND p.ip_allowlist IS $4 \
     AND p.rate_per_minute IS $5 AND p.burst IS $6 AND p.cooldown_seconds IS $7 \
     AND p.strict_window_hours IS $8 AND p.business_name IS $9 AND (c.module_pbx <> 0) = $10";

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

    /// The same writes in `gateway_pbx_admit` (migrations 0003 and 0020), where "now"
    /// for the limiter is the database's clock, shared by every replica.
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
        let u = &a.used;
        let used = serde_json::json!({
            "secret_hash": u.secret_hash, "hmac_secret": u.hmac_secret, "ip_allowlist": u.ip_allowlist,
            "rate_per_minute": u.rate_per_minute, "burst": u.burst, "cooldown_seconds": u.cooldown_seconds,
            "strict_window_hours": u.strict_window_hours, "business_name": u.business_name,
            "module_pbx": i64::from(u.module_pbx),
        });
        let arg = serde_json::json!({"integration_id": u.id, "used": used, "signature": a.signature,
                               "signature_ts": a.signature_ts, "rate": rate, "log": log});
        Postgres::Call { function: "gateway_pbx_admit", arg }
    }

    fn read_postgres(&self, answer: PgAnswer) -> Result<Admission, StoreError> {
        let PgAnswer::Value(r) = answer else { return Err(StoreError::Conflict("an admission had no answer".into())) };
        if r["stale"] == true {
            return Ok(Admission::Stale);
        }
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
    if !unchanged(tx, &a.used)? {
        return Ok(Admission::Stale);
    }
    if let Some(signature) = &a.signature
        && !sqlite_remember(tx, a.signature_ts, a.used.id, signature)?
    {
        return Ok(Admission::Replayed);
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
        let allowed = stmt.raw_execute()? == 1;
        if !allowed {
            let tat: i64 = tx.prepare_cached(TAT_SQL)?.query_row([&rate.key], |row| row.get(0))?;
            rate_limited_for_ms = Some(tat - now - rate.tolerance_ms);
        }
    }
    let mut log_id = None;
    if let Some(log) = &a.log {
        let log = admitted_log(log, rate_limited_for_ms);
        log_id = Some(insert_event_sqlite(tx, &log)?);
    }
    Ok(Admission::Admitted { rate_limited_for_ms, log_id })
}

/// A signature as the memory holds it: its timestamp, its integration and the first 16
/// bytes of its SHA-256, 32 bytes in all with nothing on the heap (a signature is itself
/// an HMAC of 32 bytes as 64 characters, or whatever another version logged). Two
/// signatures of one timestamp and integration that share those 16 bytes, the second
/// refused as a replay, are as likely as guessing a 128-bit key.
type Signature = (i64, i64, [u8; 16]);

fn signature_of(ts: i64, integration: i64, signature: &[u8]) -> Signature {
    let digest = Sha256::digest(signature);
    let mut short = [0u8; 16];
    short.copy_from_slice(&digest[..16]);
    (ts, integration, short)
}

/// The writer thread's memory of the replay window (see the module's documentation).
#[derive(Default)]
struct Seen {
    /// In timestamp order, so that the oldest are forgotten first.
    signatures: BTreeSet<Signature>,
    /// The last id of `pbx_signature_log` read or appended.
    last: i64,
    /// The writer's transaction (`writer::sqlite_transaction`) whose first check brought
    /// the memory up to date.
    caught_up_in: u64,
}

std::thread_local! {
    static SEEN: RefCell<Seen> = RefCell::default();
}

/// Adds a signature this transaction appends to the memory; false when it was there
/// already. If the transaction rolls back, the signature is forgotten and the last id
/// read is put back where it was before this check (a process that appends afterwards
/// may take the ids of this transaction's appends, and they must be read).
fn remember(signature: Signature) -> bool {
    let Some(last) = SEEN.with_borrow_mut(|seen| seen.signatures.insert(signature).then_some(seen.last)) else {
        return false;
    };
    sqlite_on_rollback(move || {
        SEEN.with_borrow_mut(|seen| {
            seen.signatures.remove(&signature);
            seen.last = last;
        })
    });
    true
}

/// Remembers a signature; false when it was seen before (a replay). See the module's
/// documentation.
fn sqlite_remember(
    tx: &rusqlite::Transaction<'_>,
    ts: i64,
    integration: i64,
    signature: &str,
) -> Result<bool, StoreError> {
    // The memory is the writer thread's, and only the writer's transactions undo it.
    let serial = sqlite_transaction();
    if serial == 0 {
        return Err(StoreError::Conflict("the replay check runs in the SQLite writer's transactions only".into()));
    }
    // Once a transaction: while the writer holds the lock no other process appends,
    // and this transaction's own appends move the last id read on as they go.
    if SEEN.with_borrow(|seen| seen.caught_up_in) != serial {
        catch_up(tx)?;
        // Only once it is done: a transaction whose catch-up failed does not go on.
        SEEN.with_borrow_mut(|seen| seen.caught_up_in = serial);
    }
    if !remember(signature_of(ts, integration, signature.as_bytes())) {
        return Ok(false);
    }
    let mut log = tx.prepare_cached(SEEN_LOG_SQL)?;
    bind_dollar(&mut log, &[SqlValue::Integer(ts), SqlValue::Integer(integration), SqlValue::Text(signature.into())])?;
    log.raw_execute()?;
    let appended = tx.last_insert_rowid();
    SEEN.with_borrow_mut(|seen| seen.last = seen.last.max(appended));
    Ok(true)
}

/// Brings the memory up to date at the first check of a transaction: forgets some of
/// the signatures past the window, then reads the rows other processes appended. Nothing
/// of it is undone if the transaction rolls back: those rows were committed, and stay.
fn catch_up(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    let kept_from = now_ms() / 1000 - SIGNATURE_MEMORY_SECONDS;
    forget_signatures_before(kept_from);
    let mut after = tx.prepare_cached(LOG_AFTER_SQL)?;
    let mut rows = after.query([SEEN.with_borrow(|seen| seen.last)])?;
    let mut last = None;
    SEEN.with_borrow_mut(|seen| {
        while let Some(row) = rows.next()? {
            let (id, ts): (i64, i64) = (row.get(0)?, row.get(1)?);
            last = last.max(Some(id));
            // Those past the window stay out; the last id moves on past them all the same.
            if ts >= kept_from {
                // As stored, text or not (what another version logged).
                let signature = row.get_ref(3)?.as_bytes().unwrap_or_default();
                seen.signatures.insert(signature_of(ts, row.get(2)?, signature));
            }
        }
        if let Some(last) = last {
            seen.last = seen.last.max(last);
        }
        Ok::<_, StoreError>(())
    })
}

/// Drops from memory up to `FORGET_AT_ONCE` of the signatures of timestamps before `ts`,
/// older first (the log keeps them until retention). Not undone by a rollback: a
/// signature past the window stays forgotten.
fn forget_signatures_before(ts: i64) {
    SEEN.with_borrow_mut(|seen| {
        for _ in 0..FORGET_AT_ONCE {
            match seen.signatures.first() {
                Some(first) if first.0 < ts => seen.signatures.pop_first(),
                _ => break,
            };
        }
    });
}

/// How many signatures the writer thread holds in memory.
#[cfg(test)]
fn remembered() -> usize {
    SEEN.with_borrow(|seen| seen.signatures.len())
}

/// Whether the integration is still as `used`.
fn unchanged(tx: &rusqlite::Transaction<'_>, used: &PbxIntegration) -> Result<bool, StoreError> {
    let text = |s: &Option<String>| s.clone().map_or(SqlValue::Null, SqlValue::Text);
    let int = |n: Option<i64>| n.map_or(SqlValue::Null, SqlValue::Integer);
    let mut stmt = tx.prepare_cached(UNCHANGED_SQL)?;
    bind_dollar(
        &mut stmt,
        &[
            SqlValue::Integer(used.id),
            SqlValue::Text(used.secret_hash.clone()),
            text(&used.hmac_secret),
            text(&used.ip_allowlist),
            int(used.rate_per_minute),
            int(used.burst),
            int(used.cooldown_seconds),
            int(used.strict_window_hours),
            text(&used.business_name),
            SqlValue::Integer(i64::from(used.module_pbx)),
        ],
    )?;
    Ok(stmt.raw_query().next()?.is_some())
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

#[cfg(test)]
#[path = "admit_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "seen_tests.rs"]
mod seen_tests;
