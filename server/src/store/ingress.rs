//! Provider events: stored raw, then applied in one transaction (see `ingress`).

use super::{Instance, Store, StoreError, now_ms};
use crate::ingress::evolution::{Fact, Keyword, keyword, phone_of, status_rank};
use gateway_api::events;
use serde_json::Value;
use sqlx::{Any, Row, Transaction};

/// How long a conversation window stays open after the contact's last message.
pub const CONVERSATION_WINDOW_MS: i64 = 24 * 3_600_000;

/// How long after an unknown send the provider's echo may settle it.
const UNKNOWN_SETTLE_WINDOW_MS: i64 = 10 * 60 * 1000;

/// What applying one post did (for the log and the tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Customer events written to the outbox, by name.
    pub events: Vec<String>,
    /// Facts skipped as duplicates or stale.
    pub skipped: usize,
}

fn timestamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Store {
    /// The hash of an instance's ingress secret.
    pub async fn ingress_secret_hash(&self, instance_id: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT ingress_secret_hash FROM instances WHERE id = $1")
            .bind(instance_id)
            .fetch_optional(&self.read)
            .await?;
        Ok(row.map(|r| r.try_get::<Option<String>, _>("ingress_secret_hash")).transpose()?.flatten())
    }

    /// Sets the hash of an instance's ingress secret.
    pub async fn set_ingress_secret_hash(&self, instance_id: &str, hash: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE instances SET ingress_secret_hash = $1 WHERE id = $2")
            .bind(hash)
            .bind(instance_id)
            .execute(&self.write)
            .await?;
        self.forget_cached();
        Ok(())
    }

    /// Stores a provider post as received; its id.
    pub async fn store_provider_event(&self, instance_id: &str, event: &str, payload: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO provider_events (instance_id, event, payload, received_at) VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(instance_id)
        .bind(event)
        .bind(payload)
        .bind(now_ms())
        .fetch_one(&self.write)
        .await?;
        Ok(row.try_get("id")?)
    }

    /// How many stored posts could not be applied.
    pub async fn provider_event_failures(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM provider_events WHERE error IS NOT NULL")
            .fetch_one(&self.read)
            .await?;
        Ok(row.try_get("n")?)
    }

    /// Records the outcome of applying a stored post.
    pub async fn finish_provider_event(&self, id: i64, error: Option<&str>) -> Result<(), StoreError> {
        sqlx::query("UPDATE provider_events SET processed_at = $1, error = $2 WHERE id = $3")
            .bind(now_ms())
            .bind(error.map(str::to_string))
            .bind(id)
            .execute(&self.write)
            .await?;
        Ok(())
    }

    /// Applies the facts of one post to `instance`, in one transaction.
    pub async fn apply_facts(
        &self,
        instance: &Instance,
        facts: &[Fact],
        received_at: i64,
    ) -> Result<Applied, StoreError> {
        let mut tx = write_transaction(&self.write).await?;
        let mut applied = Applied::default();
        let mut state = instance.connection_state.clone();
        for fact in facts {
            apply(&mut tx, instance, fact, received_at, &mut state, &mut applied).await?;
        }
        tx.commit().await?;
        if state != instance.connection_state {
            self.forget_cached();
        }
        Ok(applied)
    }

    /// The latest QR the provider sent for an instance (a data URL, `None` once it
    /// stopped issuing codes) and when.
    pub async fn latest_qr(&self, instance_id: &str) -> Result<(Option<String>, Option<i64>), StoreError> {
        let row = sqlx::query("SELECT qr_code, qr_updated_at FROM instances WHERE id = $1")
            .bind(instance_id)
            .fetch_optional(&self.read)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("instance {instance_id}")))?;
        Ok((row.try_get("qr_code")?, row.try_get("qr_updated_at")?))
    }

    /// An instance's lifecycle state: `created` (never paired), `qr_pending`,
    /// `connected`, `disconnected`, or `ban_suspected` (closed with a disconnect code
    /// that means the network refuses the number).
    pub async fn lifecycle(&self, instance: &Instance) -> Result<&'static str, StoreError> {
        let change = sqlx::query("SELECT reported FROM connection_changes WHERE instance_id = $1")
            .bind(&instance.id)
            .fetch_optional(&self.read)
            .await?;
        let reported: Option<String> = change.map(|r| r.try_get("reported")).transpose()?;
        Ok(match (instance.connection_state.as_str(), reported.as_deref()) {
            ("open", _) => "connected",
            ("connecting", _) => "qr_pending",
            (_, Some("ban_suspected")) => "ban_suspected",
            (_, Some(_)) => "disconnected",
            (_, None) => "created",
        })
    }

    /// Stores (or clears) an instance's current pairing QR.
    pub async fn store_qr(&self, instance_id: &str, qr: Option<&str>) -> Result<(), StoreError> {
        sqlx::query("UPDATE instances SET qr_code = $1, qr_updated_at = $2 WHERE id = $3")
            .bind(qr.map(str::to_string))
            .bind(now_ms())
            .bind(instance_id)
            .execute(&self.write)
            .await?;
        self.forget_cached();
        Ok(())
    }

    /// Received messages of a customer, newest first: (sender, text, external id).
    pub async fn recent_inbound(
        &self,
        customer_id: &str,
        limit: i64,
    ) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT sender, text, external_message_id FROM inbound_messages WHERE customer_id = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(customer_id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("sender")?, r.try_get("text")?, r.try_get("external_message_id")?))).collect()
    }
}

/// A transaction that holds the write lock from its first statement. On SQLite a
/// transaction that reads first and writes later cannot wait for the lock when the
/// send path's writer committed in between (it fails at once with SQLITE_BUSY); a
/// write first makes it wait like any writer. On PostgreSQL the statement is a no-op.
pub(super) async fn write_transaction(pool: &sqlx::AnyPool) -> Result<Transaction<'static, Any>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE provider_events SET error = error WHERE 1 = 0").execute(&mut *tx).await?;
    Ok(tx)
}

/// Writes the outbox event of type `events::$ty` with these fields (and the base);
/// `log = id` names the message-log row it is about, when there is one.
macro_rules! emit {
    ($tx:expr, $instance:expr, $at:expr, $applied:expr, $ty:ident { $($fields:tt)* }) => {
        emit!($tx, $instance, $at, $applied, log = None, $ty { $($fields)* })
    };
    ($tx:expr, $instance:expr, $at:expr, $applied:expr, log = $log:expr, $ty:ident { $($fields:tt)* }) => {
        event($tx, $instance, $at, $log, events::$ty::NAME, |base| serde_json::to_value(events::$ty { base, $($fields)* }), $applied)
    };
}

async fn event(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    at: i64,
    log_id: Option<i64>,
    name: &str,
    body: impl FnOnce(events::EventBase) -> serde_json::Result<Value>,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    let base = events::EventBase {
        event: name.to_string(),
        instance_id: instance.id.clone(),
        instance_name: instance.name.clone(),
        timestamp: timestamp(at),
    };
    let payload = body(base).map_err(|e| StoreError::Conflict(format!("event body: {e}")))?;
    let now = now_ms();
    sqlx::query(
        "INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at, log_id) \
         VALUES ($1, $2, $3, $4, $5, $5, $6)",
    )
    .bind(&instance.customer_id)
    .bind(&instance.id)
    .bind(name)
    .bind(payload.to_string())
    .bind(now)
    .bind(log_id)
    .execute(&mut **tx)
    .await?;
    applied.events.push(name.to_string());
    Ok(())
}

/// The phone behind a sender: its own jid, the alternate id (learned for next time),
/// or what was learned before.
async fn resolve(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    sender: &crate::ingress::evolution::Sender,
) -> Result<Option<String>, StoreError> {
    if let Some(phone) = phone_of(&sender.jid) {
        return Ok(Some(phone));
    }
    if !sender.jid.ends_with("@lid") {
        return Ok(None);
    }
    if let Some(phone) = sender.alternate.as_deref().and_then(phone_of) {
        sqlx::query(
            "INSERT INTO lid_map (instance_id, lid, phone, learned_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (instance_id, lid) DO UPDATE SET phone = excluded.phone, learned_at = excluded.learned_at",
        )
        .bind(&instance.id)
        .bind(&sender.jid)
        .bind(&phone)
        .bind(now_ms())
        .execute(&mut **tx)
        .await?;
        return Ok(Some(phone));
    }
    let row = sqlx::query("SELECT phone FROM lid_map WHERE instance_id = $1 AND lid = $2")
        .bind(&instance.id)
        .bind(&sender.jid)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.map(|r| r.try_get("phone")).transpose()?)
}

async fn apply(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    fact: &Fact,
    received_at: i64,
    state: &mut String,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    match fact {
        Fact::Inbound { external_id, sender, group_id, message_type, text, timestamp } => {
            let phone = resolve(tx, instance, sender).await?;
            let from = phone.clone().unwrap_or_else(|| sender.jid.clone());
            // The provider's clock, never later than when the event arrived (a time in
            // the future would hold a conversation window open for ever).
            let at = timestamp.and_then(|s| s.checked_mul(1000)).map_or(received_at, |at| at.min(received_at));
            let inserted = sqlx::query(
                "INSERT INTO inbound_messages (customer_id, instance_id, sender, group_id, message_type, text, \
                 external_message_id, message_at, received_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (instance_id, external_message_id) DO NOTHING",
            )
            .bind(&instance.customer_id)
            .bind(&instance.id)
            .bind(&from)
            .bind(group_id.clone())
            .bind(message_type)
            .bind(text.clone())
            .bind(external_id)
            .bind(at)
            .bind(received_at)
            .execute(&mut **tx)
            .await?;
            if inserted.rows_affected() == 0 {
                applied.skipped += 1;
                return Ok(());
            }
            if let Some(group_id) = group_id {
                let (group_id, from, text, id) =
                    (group_id.clone(), Some(from), text.clone(), Some(external_id.clone()));
                return emit!(
                    tx,
                    instance,
                    at,
                    applied,
                    GroupMessageReceived { group_id, from, message_text: text, external_message_id: id }
                )
                .await;
            }
            let (sender_id, message_text) = (from.clone(), text.clone().unwrap_or_default());
            let (kind, id) = (Some(message_type.clone()), Some(external_id.clone()));
            emit!(
                tx,
                instance,
                at,
                applied,
                MessageReceived { from: sender_id, message_text, message_type: kind, external_message_id: id }
            )
            .await?;
            let Some(phone) = phone else {
                return Ok(());
            };
            // A message after 24 hours of silence (or the first) opens a conversation window.
            let last: Option<i64> =
                sqlx::query("SELECT last_inbound_at FROM contact_activity WHERE instance_id = $1 AND phone = $2")
                    .bind(&instance.id)
                    .bind(&phone)
                    .fetch_optional(&mut **tx)
                    .await?
                    .map(|r| r.try_get("last_inbound_at"))
                    .transpose()?;
            if last.is_none_or(|last| last <= at - CONVERSATION_WINDOW_MS) {
                let conversation_id = Some(phone.clone());
                emit!(
                    tx,
                    instance,
                    at,
                    applied,
                    ConversationUpdated { conversation_id, conversation_state: Some("open".into()) }
                )
                .await?;
            }
            sqlx::query(
                "INSERT INTO contact_activity (instance_id, phone, last_inbound_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (instance_id, phone) DO UPDATE SET last_inbound_at = excluded.last_inbound_at \
                 WHERE contact_activity.last_inbound_at < excluded.last_inbound_at",
            )
            .bind(&instance.id)
            .bind(&phone)
            .bind(at)
            .execute(&mut **tx)
            .await?;
            // A reply: the pacing policy's never-replied rule no longer applies to them.
            sqlx::query(
                "INSERT INTO contacts (instance_id, phone, replies_total) VALUES ($1, $2, 1) \
                 ON CONFLICT (instance_id, phone) DO UPDATE SET replies_total = contacts.replies_total + 1",
            )
            .bind(&instance.id)
            .bind(&phone)
            .execute(&mut **tx)
            .await?;
            match text.as_deref().and_then(keyword) {
                Some(Keyword::OptOut) => {
                    // A manual suppression stays as it is; an opt-out adds one.
                    let added = sqlx::query(
                        "INSERT INTO suppressed_recipients (customer_id, phone, reason, source, created_at) \
                         VALUES ($1, $2, $3, 'opt_out', $4) ON CONFLICT (customer_id, phone) DO NOTHING",
                    )
                    .bind(&instance.customer_id)
                    .bind(&phone)
                    .bind(format!("opt-out keyword {:?}", text.as_deref().unwrap_or_default().trim()))
                    .bind(now_ms())
                    .execute(&mut **tx)
                    .await?;
                    if added.rows_affected() > 0 {
                        let text = text.clone();
                        emit!(
                            tx,
                            instance,
                            at,
                            applied,
                            RecipientOptedOut { from: phone, reason: "opt_out_keyword".into(), message_text: text }
                        )
                        .await?;
                    }
                }
                Some(Keyword::OptIn) => {
                    sqlx::query(
                        "DELETE FROM suppressed_recipients WHERE customer_id = $1 AND phone = $2 AND source = 'opt_out'",
                    )
                    .bind(&instance.customer_id)
                    .bind(&phone)
                    .execute(&mut **tx)
                    .await?;
                }
                None => {}
            }
            Ok(())
        }
        Fact::Status { external_id, remote_jid, status } => {
            let rank = status_rank(status);
            let previous: Option<i64> = sqlx::query(
                "SELECT status_rank FROM message_status WHERE instance_id = $1 AND external_message_id = $2",
            )
            .bind(&instance.id)
            .bind(external_id)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.try_get("status_rank"))
            .transpose()?;
            if previous.is_some_and(|p| p >= rank) {
                applied.skipped += 1;
                return Ok(());
            }
            // Each step keeps the time it was first reported (read implies delivered).
            let step = |reached: bool| reached.then_some(received_at);
            sqlx::query(
                "INSERT INTO message_status (instance_id, external_message_id, status, status_rank, updated_at, \
                 delivered_at, read_at, failed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (instance_id, external_message_id) DO UPDATE SET \
                 status = excluded.status, status_rank = excluded.status_rank, updated_at = excluded.updated_at, \
                 delivered_at = COALESCE(message_status.delivered_at, excluded.delivered_at), \
                 read_at = COALESCE(message_status.read_at, excluded.read_at), \
                 failed_at = COALESCE(message_status.failed_at, excluded.failed_at)",
            )
            .bind(&instance.id)
            .bind(external_id)
            .bind(status)
            .bind(rank)
            .bind(received_at)
            .bind(step((2..=4).contains(&rank)))
            .bind(step((3..=4).contains(&rank)))
            .bind(step(status == "ERROR"))
            .execute(&mut **tx)
            .await?;
            // The send the status is about (its events name it), settled by the
            // provider's own event if its outcome was unknown.
            let message = sent_message(tx, instance, external_id).await?;
            let log = message.as_ref().map(|m| m.id);
            if let Some(m) = message.as_ref().filter(|m| m.status == "unknown")
                && settle_unknown(tx, m.id, external_id).await?
            {
                let (to, message_purpose) = (m.recipient.clone(), m.purpose.clone());
                let message_id = Some(external_id.clone());
                emit!(tx, instance, received_at, applied, log = log, MessageSent { to, message_purpose, message_id })
                    .await?;
            }
            let from = remote_jid.as_deref().and_then(phone_of);
            let fields = events::StatusFields {
                from: from.clone(),
                external_message_id: Some(external_id.clone()),
                status: Some(status.clone()),
            };
            match status.as_str() {
                "DELIVERY_ACK" => {
                    emit!(tx, instance, received_at, applied, log = log, MessageDelivered { status: fields }).await
                }
                "READ" => emit!(tx, instance, received_at, applied, log = log, MessageRead { status: fields }).await,
                // Played is read, unless read was already reported.
                "PLAYED" if previous.is_none_or(|p| p < status_rank("READ")) => {
                    emit!(tx, instance, received_at, applied, log = log, MessageRead { status: fields }).await
                }
                "PLAYED" => Ok(()),
                "ERROR" => {
                    let (to, message_purpose) = match message {
                        Some(m) => (m.recipient, m.purpose),
                        None => (from.unwrap_or_default(), String::new()),
                    };
                    emit!(
                        tx,
                        instance,
                        received_at,
                        applied,
                        log = log,
                        MessageFailed { to, message_purpose, error: "provider_error".into() }
                    )
                    .await
                }
                _ => {
                    emit!(tx, instance, received_at, applied, log = log, MessageStatusUpdated { status: fields }).await
                }
            }
        }
        Fact::Connection { state: reported, reason } => {
            let stored = match reported.as_str() {
                "open" => "open",
                "connecting" => "connecting",
                _ => "close",
            };
            // Disconnect codes: 401 is a logout (the device was removed); 402 and 403
            // mean the network refuses the number: a suspected ban.
            let reported = match (stored, reason) {
                ("close", Some(402 | 403)) => "ban_suspected".to_string(),
                ("close", Some(401)) => "logged_out".to_string(),
                _ => reported.clone(),
            };
            change_state(tx, instance, stored, &reported, received_at, state, applied).await
        }
        Fact::SentEcho { external_id, remote_jid, timestamp } => {
            // The provider has the message. The row that already holds its id is the one
            // it belongs to: settled if its outcome was unknown, else nothing to do (the
            // echo of a send that was answered).
            if let Some(m) = sent_message(tx, instance, external_id).await? {
                if m.status == "unknown" && settle_unknown(tx, m.id, external_id).await? {
                    let (to, message_purpose, message_id) = (m.recipient, m.purpose, Some(external_id.clone()));
                    let log = Some(m.id);
                    return emit!(
                        tx,
                        instance,
                        received_at,
                        applied,
                        log = log,
                        MessageSent { to, message_purpose, message_id }
                    )
                    .await;
                }
                applied.skipped += 1;
                return Ok(());
            }
            // Else a send of this instance whose answer was lost (so it has no provider
            // id): by recipient, and only when nothing else can match.
            let Some(to) = phone_of(remote_jid) else {
                applied.skipped += 1;
                return Ok(());
            };
            let Some(m) = lost_send(tx, instance, &to, *timestamp, received_at).await? else {
                applied.skipped += 1;
                return Ok(());
            };
            if m.status != "unknown" || !settle_unknown(tx, m.id, external_id).await? {
                applied.skipped += 1;
                return Ok(());
            }
            let (message_purpose, message_id, log) = (m.purpose, Some(external_id.clone()), Some(m.id));
            emit!(tx, instance, received_at, applied, log = log, MessageSent { to, message_purpose, message_id }).await
        }
        Fact::LoggedOut => change_state(tx, instance, "close", "logged_out", received_at, state, applied).await,
        Fact::Qr { available, base64, .. } => {
            sqlx::query("UPDATE instances SET qr_code = $1, qr_updated_at = $2 WHERE id = $3")
                .bind(base64.clone().filter(|_| *available))
                .bind(received_at)
                .bind(&instance.id)
                .execute(&mut **tx)
                .await?;
            let qr_available = Some(*available);
            emit!(tx, instance, received_at, applied, InstanceQrUpdated { qr_available }).await
        }
        Fact::Call { id, from, status } => {
            let fields =
                events::CallFields { from: phone_of(from).or(Some(from.clone())), call_status: Some(status.clone()) };
            sqlx::query(
                "INSERT INTO calls (instance_id, call_id, seen_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (instance_id, call_id) DO NOTHING",
            )
            .bind(&instance.id)
            .bind(id)
            .bind(received_at)
            .execute(&mut **tx)
            .await?;
            match status.as_str() {
                "offer" => emit!(tx, instance, received_at, applied, CallReceived { call: fields }).await,
                "accept" => {
                    sqlx::query("UPDATE calls SET answered = 1 WHERE instance_id = $1 AND call_id = $2")
                        .bind(&instance.id)
                        .bind(id)
                        .execute(&mut **tx)
                        .await?;
                    Ok(())
                }
                // Not answered: timed out, rejected, or ended before anyone picked up.
                "timeout" | "reject" | "terminate" => {
                    let missed = sqlx::query(
                        "UPDATE calls SET missed = 1 WHERE instance_id = $1 AND call_id = $2 AND answered = 0 \
                         AND missed = 0",
                    )
                    .bind(&instance.id)
                    .bind(id)
                    .execute(&mut **tx)
                    .await?;
                    if missed.rows_affected() == 0 {
                        applied.skipped += 1;
                        return Ok(());
                    }
                    emit!(tx, instance, received_at, applied, CallMissed { call: fields }).await
                }
                _ => {
                    applied.skipped += 1;
                    Ok(())
                }
            }
        }
        Fact::Group { group_id } => {
            let group_id = Some(group_id.clone());
            emit!(tx, instance, received_at, applied, GroupUpdated { group_id }).await
        }
        Fact::Ignored(_) => {
            applied.skipped += 1;
            Ok(())
        }
    }
}

/// A send of an instance, as the provider's events about it need it.
struct SentMessage {
    id: i64,
    status: String,
    recipient: String,
    purpose: String,
}

fn sent_message_of(row: &sqlx::any::AnyRow) -> Result<SentMessage, StoreError> {
    Ok(SentMessage {
        id: row.try_get("id")?,
        status: row.try_get("status")?,
        recipient: row.try_get::<Option<String>, _>("recipient")?.unwrap_or_default(),
        purpose: row.try_get::<Option<String>, _>("purpose")?.unwrap_or_default(),
    })
}

/// The send of `instance` that the provider knows as `external_id` (by index).
async fn sent_message(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    external_id: &str,
) -> Result<Option<SentMessage>, StoreError> {
    let row = sqlx::query(
        "SELECT id, status, recipient, purpose FROM message_log WHERE instance_id = $1 AND provider_message_id = $2 \
         ORDER BY id DESC LIMIT 1",
    )
    .bind(&instance.id)
    .bind(external_id)
    .fetch_optional(&mut **tx)
    .await?;
    row.as_ref().map(sent_message_of).transpose()
}

/// The send of `instance` to `to` that a provider's echo without a known id belongs
/// to: of its sends to `to` that have no provider id and may have gone out (`unknown`,
/// or `pending`: the provider's answer is still on its way) within the settle window,
/// the one logged closest before the provider took the message (`timestamp`, Unix
/// seconds, else when the echo arrived); one logged just after that time only when
/// none was before (the provider's clock may lag ours). A `pending` one means the
/// echo is most likely that send's, whose answer will name it.
async fn lost_send(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    to: &str,
    timestamp: Option<i64>,
    received_at: i64,
) -> Result<Option<SentMessage>, StoreError> {
    // The provider counts whole seconds: the message was taken before the next one.
    let taken_at = timestamp
        .and_then(|s| s.checked_mul(1000))
        .and_then(|ms| ms.checked_add(999))
        .map_or(received_at, |ms| ms.min(received_at));
    let row = sqlx::query(
        "SELECT id, status, recipient, purpose FROM message_log WHERE instance_id = $1 AND recipient = $2 \
         AND status IN ('unknown', 'pending') AND provider_message_id IS NULL AND created_at >= $3 \
         AND created_at <= $4 ORDER BY CASE WHEN created_at <= $5 THEN 0 ELSE 1 END, ABS(created_at - $5), id \
         LIMIT 1",
    )
    .bind(&instance.id)
    .bind(to)
    .bind(received_at - UNKNOWN_SETTLE_WINDOW_MS)
    .bind(received_at)
    .bind(taken_at)
    .fetch_optional(&mut **tx)
    .await?;
    row.as_ref().map(sent_message_of).transpose()
}

/// Makes an `unknown` send `sent`, with the provider's id; whether this call did.
async fn settle_unknown(tx: &mut Transaction<'static, Any>, id: i64, external_id: &str) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE message_log SET status = 'sent', provider_message_id = $2 WHERE id = $1 AND status = 'unknown'",
    )
    .bind(id)
    .bind(external_id)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn set_state(tx: &mut Transaction<'static, Any>, instance: &Instance, state: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE instances SET connection_state = $1 WHERE id = $2")
        .bind(state)
        .bind(&instance.id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Stores a new connection state at once (sends use it) and records the change for
/// the customer event, which `emit_settled_connections` writes once it has held.
async fn change_state(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    stored: &str,
    reported: &str,
    at: i64,
    state: &mut String,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    if stored == state.as_str() {
        applied.skipped += 1;
        return Ok(());
    }
    set_state(tx, instance, stored).await?;
    // The first change of an instance starts from the state it had, as if told.
    let previous = std::mem::replace(state, stored.to_string());
    sqlx::query(
        "INSERT INTO connection_changes (instance_id, state, reported, changed_at, emitted_state) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (instance_id) DO UPDATE SET state = excluded.state, \
         reported = excluded.reported, changed_at = excluded.changed_at",
    )
    .bind(&instance.id)
    .bind(stored)
    .bind(reported)
    .bind(at)
    .bind(previous)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

const INSTANCE_SQL: &str = "SELECT id, customer_id, name, provider, connection_state, paused, paused_reason, created_at FROM instances \
     WHERE id = $1";

async fn instance_in(tx: &mut Transaction<'static, Any>, id: &str) -> Result<Instance, StoreError> {
    let row = sqlx::query(INSTANCE_SQL).bind(id).fetch_one(&mut **tx).await?;
    Ok(Instance {
        id: row.try_get("id")?,
        customer_id: row.try_get("customer_id")?,
        name: row.try_get("name")?,
        provider: row.try_get("provider")?,
        connection_state: row.try_get("connection_state")?,
        paused: row.try_get::<i64, _>("paused")? != 0,
        paused_reason: row.try_get("paused_reason")?,
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// Records a connection state read from the provider outside its events (pairing
    /// commands): stored at once, told to customers like any other change.
    pub async fn observe_connection(&self, instance_id: &str, reported: &str) -> Result<(), StoreError> {
        let stored = match reported {
            "open" => "open",
            "connecting" => "connecting",
            _ => "close",
        };
        let mut tx = write_transaction(&self.write).await?;
        let instance = instance_in(&mut tx, instance_id).await?;
        let mut state = instance.connection_state.clone();
        let mut applied = Applied::default();
        change_state(&mut tx, &instance, stored, reported, now_ms(), &mut state, &mut applied).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Writes the `instance.*` event of every connection change that has held since
    /// `settled_before` and differs from what customers were last told; how many.
    /// A connection that flapped back within the period gets no event at all.
    pub async fn emit_settled_connections(&self, settled_before: i64) -> Result<usize, StoreError> {
        let mut tx = write_transaction(&self.write).await?;
        let rows = sqlx::query(
            "SELECT instance_id, state, reported, changed_at FROM connection_changes \
             WHERE changed_at <= $1 AND (emitted_state IS NULL OR emitted_state <> state)",
        )
        .bind(settled_before)
        .fetch_all(&mut *tx)
        .await?;
        let mut applied = Applied::default();
        for row in &rows {
            let instance_id: String = row.try_get("instance_id")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let stored: String = row.try_get("state")?;
            let at: i64 = row.try_get("changed_at")?;
            let fields = events::ConnectionFields { connection_state: Some(row.try_get("reported")?) };
            match stored.as_str() {
                "open" => emit!(&mut tx, &instance, at, &mut applied, InstanceConnected { connection: fields }).await?,
                "close" => {
                    emit!(&mut tx, &instance, at, &mut applied, InstanceDisconnected { connection: fields }).await?
                }
                _ => {
                    emit!(&mut tx, &instance, at, &mut applied, InstanceConnectionUpdated { connection: fields })
                        .await?
                }
            }
            sqlx::query(
                "UPDATE connection_changes SET emitted_state = state WHERE instance_id = $1 AND changed_at = $2",
            )
            .bind(&instance.id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    /// Reports `conversation.updated` (closed) for every conversation whose window
    /// ended (no message from the contact for 24 hours at `now`); how many.
    pub async fn close_conversations(&self, now: i64) -> Result<usize, StoreError> {
        let mut tx = write_transaction(&self.write).await?;
        let rows = sqlx::query(
            "SELECT instance_id, phone, last_inbound_at FROM contact_activity WHERE last_inbound_at <= $1 \
             AND (window_closed_at IS NULL OR window_closed_at < last_inbound_at) LIMIT 500",
        )
        .bind(now - CONVERSATION_WINDOW_MS)
        .fetch_all(&mut *tx)
        .await?;
        let mut applied = Applied::default();
        for row in &rows {
            let instance_id: String = row.try_get("instance_id")?;
            let phone: String = row.try_get("phone")?;
            let last: i64 = row.try_get("last_inbound_at")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let conversation_id = Some(phone.clone());
            emit!(
                &mut tx,
                &instance,
                last + CONVERSATION_WINDOW_MS,
                &mut applied,
                ConversationUpdated { conversation_id, conversation_state: Some("closed".into()) }
            )
            .await?;
            sqlx::query("UPDATE contact_activity SET window_closed_at = $1 WHERE instance_id = $2 AND phone = $3")
                .bind(now)
                .bind(&instance_id)
                .bind(&phone)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    /// Delivery watchdog: every message an Evolution instance sent before `cutoff`
    /// (and after `since`) that the provider never acknowledged as delivered gets a
    /// `message.failed` with error `no_delivery_ack`, once; how many.
    ///
    /// The rows are looked for without the write lock (on SQLite, a scan under it
    /// stopped every send for as long as it ran, every second: BENCHMARKS.md); each is
    /// then marked by a conditional update that checks again that it is still
    /// unacknowledged and unmarked, and gets its event only if the update took it, in
    /// one transaction, so a report arriving meanwhile, or another replica, wins cleanly.
    pub async fn flag_unacknowledged(&self, cutoff: i64, since: i64) -> Result<usize, StoreError> {
        let rows = sqlx::query(
            "SELECT m.id, m.recipient, m.purpose, m.instance_id FROM message_log m \
             JOIN instances i ON i.id = m.instance_id AND i.provider = 'evolution' \
             WHERE m.status = 'sent' AND m.ack_checked_at IS NULL AND m.created_at <= $1 AND m.created_at > $2 \
             AND m.provider_message_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM message_status s \
             WHERE s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id \
             AND s.status_rank >= 2) LIMIT 500",
        )
        .bind(cutoff)
        .bind(since)
        .fetch_all(&self.read)
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut tx = write_transaction(&self.write).await?;
        let now = now_ms();
        let mut applied = Applied::default();
        let mut flagged = 0;
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            let taken = sqlx::query(
                "UPDATE message_log SET ack_checked_at = $1 WHERE id = $2 AND status = 'sent' \
                 AND ack_checked_at IS NULL AND NOT EXISTS (SELECT 1 FROM message_status s \
                 WHERE s.instance_id = message_log.instance_id \
                 AND s.external_message_id = message_log.provider_message_id AND s.status_rank >= 2)",
            )
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if taken == 0 {
                continue;
            }
            let instance_id: String = row.try_get("instance_id")?;
            let instance = instance_in(&mut tx, &instance_id).await?;
            let to: String = row.try_get::<Option<String>, _>("recipient")?.unwrap_or_default();
            let message_purpose: String = row.try_get::<Option<String>, _>("purpose")?.unwrap_or_default();
            emit!(
                &mut tx,
                &instance,
                now,
                &mut applied,
                log = Some(id),
                MessageFailed { to, message_purpose, error: "no_delivery_ack".into() }
            )
            .await?;
            flagged += 1;
        }
        tx.commit().await?;
        Ok(flagged)
    }
}
