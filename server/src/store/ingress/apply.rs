//! The domain rules of a provider post: each fact it reports (a message from a contact,
//! a status of a send, a connection change, an echo of a send, a QR, a call, a group
//! change) changes the store and writes the customer events it means, all in the
//! post's one transaction (`Store::apply_facts`).

use super::super::customer_days::{self, SendCount};
use super::super::{Cols, FromCols, Instance, Store, StoreError, now_ms};
use super::connection::change_state;
use super::{Applied, CONVERSATION_WINDOW_MS, write_transaction};
use crate::ingress::evolution::{Fact, Keyword, Sender, keyword, phone_of, status_rank};
use gateway_api::events;
use sqlx::{Any, Row, Transaction};

/// How long after an unknown send the provider's echo may settle it.
const UNKNOWN_SETTLE_WINDOW_MS: i64 = 10 * 60 * 1000;

impl Store {
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
        // Last, so that the customer's lock is the last this transaction takes.
        customer_days::apply_changes(&mut tx, &std::mem::take(&mut applied.days), now_ms()).await?;
        tx.commit().await?;
        if state != instance.connection_state {
            self.forget_cached();
        }
        Ok(applied)
    }
}

/// One post being applied: its transaction, the instance it came for, when it
/// arrived, and what it did so far.
struct Post<'p> {
    tx: &'p mut Transaction<'static, Any>,
    instance: &'p Instance,
    received_at: i64,
    applied: &'p mut Applied,
}

async fn apply(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    fact: &Fact,
    received_at: i64,
    state: &mut String,
    applied: &mut Applied,
) -> Result<(), StoreError> {
    let post = Post { tx, instance, received_at, applied };
    match fact {
        Fact::Inbound { external_id, sender, group_id, message_type, text, timestamp } => {
            inbound(post, external_id, sender, group_id, message_type, text, *timestamp).await
        }
        Fact::Status { external_id, remote_jid, status } => {
            delivery_status(post, external_id, remote_jid, status).await
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
            change_state(post.tx, instance, stored, &reported, received_at, state, post.applied).await
        }
        Fact::SentEcho { external_id, remote_jid, timestamp } => {
            sent_echo(post, external_id, remote_jid, *timestamp).await
        }
        Fact::LoggedOut => {
            change_state(post.tx, instance, "close", "logged_out", received_at, state, post.applied).await
        }
        Fact::Qr { available, base64, .. } => qr(post, *available, base64).await,
        Fact::Call { id, from, status } => call(post, id, from, status).await,
        Fact::Group { group_id } => {
            let group_id = Some(group_id.clone());
            emit!(post.tx, instance, received_at, post.applied, GroupUpdated { group_id }).await
        }
        Fact::Ignored(_) => {
            post.applied.skipped += 1;
            Ok(())
        }
    }
}

/// A message from a contact: recorded once (a repeat is skipped) and told to the
/// customer; from a phone, also what a contact's message means (`contact_wrote`).
async fn inbound(
    post: Post<'_>,
    external_id: &str,
    sender: &Sender,
    group_id: &Option<String>,
    message_type: &str,
    text: &Option<String>,
    timestamp: Option<i64>,
) -> Result<(), StoreError> {
    let Post { tx, instance, received_at, applied } = post;
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
        let (group_id, from, text, id) = (group_id.clone(), Some(from), text.clone(), Some(external_id.to_string()));
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
    let (kind, id) = (Some(message_type.to_string()), Some(external_id.to_string()));
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
    contact_wrote(tx, instance, phone, at, text, applied).await
}

/// A contact's message from `phone` at `at`: it may open a conversation window, it
/// counts as a reply, and its text may be an opt-out or opt-in keyword.
async fn contact_wrote(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    phone: String,
    at: i64,
    text: &Option<String>,
    applied: &mut Applied,
) -> Result<(), StoreError> {
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

/// A delivery status of a send: kept per message (a stale or repeated status is
/// skipped), settling the send if its outcome was unknown, and told to the customer.
async fn delivery_status(
    post: Post<'_>,
    external_id: &str,
    remote_jid: &Option<String>,
    status: &str,
) -> Result<(), StoreError> {
    let Post { tx, instance, received_at, applied } = post;
    let rank = status_rank(status);
    // The send the status is about (its events name it), settled below by the
    // provider's own event if its outcome was unknown.
    let mut message = sent_message(tx, instance, external_id).await?;
    if message.as_ref().is_some_and(|m| closed(m.created_at)) && lock_message(tx, instance, external_id).await? {
        message = sent_message(tx, instance, external_id).await?;
    }
    let reported = reports_of(tx, instance, external_id).await?;
    let previous = reported.as_ref().map(|r| r.rank);
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
    let log = message.as_ref().map(|m| m.id);
    let settled = match message.as_ref().filter(|m| m.status == "unknown") {
        Some(m) => settle_unknown(tx, m.id, external_id).await?,
        None => false,
    };
    if let Some(m) = &message {
        // Its customer's kept day, if the send's day has closed (`store::customer_days`).
        let before = reported.as_ref().map_or((false, false), |r| (r.delivered, r.read));
        let after = (before.0 || (2..=4).contains(&rank), before.1 || (3..=4).contains(&rank));
        let status = if settled { "sent" } else { m.status.as_str() };
        recount(applied, m, before, (status, after));
    }
    if let Some(m) = message.as_ref().filter(|_| settled) {
        let (to, message_purpose) = (m.recipient.clone(), m.purpose.clone());
        let message_id = Some(external_id.to_string());
        emit!(tx, instance, received_at, applied, log = log, MessageSent { to, message_purpose, message_id }).await?;
    }
    let from = remote_jid.as_deref().and_then(phone_of);
    let fields = events::StatusFields {
        from: from.clone(),
        external_message_id: Some(external_id.to_string()),
        status: Some(status.to_string()),
    };
    match status {
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
        _ => emit!(tx, instance, received_at, applied, log = log, MessageStatusUpdated { status: fields }).await,
    }
}

/// The provider's own record of a send: settles the send it belongs to when that
/// send's outcome was unknown.
async fn sent_echo(
    post: Post<'_>,
    external_id: &str,
    remote_jid: &str,
    timestamp: Option<i64>,
) -> Result<(), StoreError> {
    let Post { tx, instance, received_at, applied } = post;
    // The provider has the message. The row that already holds its id is the one
    // it belongs to: settled if its outcome was unknown, else nothing to do (the
    // echo of a send that was answered).
    let mut message = sent_message(tx, instance, external_id).await?;
    if message.as_ref().is_some_and(|m| closed(m.created_at)) && lock_message(tx, instance, external_id).await? {
        message = sent_message(tx, instance, external_id).await?;
    }
    if let Some(m) = message {
        if m.status == "unknown" && settle_unknown(tx, m.id, external_id).await? {
            recount_settled(tx, instance, applied, &m, external_id).await?;
            let (to, message_purpose, message_id) = (m.recipient, m.purpose, Some(external_id.to_string()));
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
    // No lock here: such a send is at most the settle window old, and a day is kept only
    // an hour after it ended (`store::customer_days`). Another echo of the same message
    // must not move on to another send once this one is settled.
    let Some(m) = lost_send(tx, instance, &to, timestamp, received_at).await? else {
        applied.skipped += 1;
        return Ok(());
    };
    if m.status != "unknown" || !settle_unknown(tx, m.id, external_id).await? {
        applied.skipped += 1;
        return Ok(());
    }
    recount_settled(tx, instance, applied, &m, external_id).await?;
    let (message_purpose, message_id, log) = (m.purpose, Some(external_id.to_string()), Some(m.id));
    emit!(tx, instance, received_at, applied, log = log, MessageSent { to, message_purpose, message_id }).await
}

/// A new pairing QR (or none: the provider stopped issuing codes).
async fn qr(post: Post<'_>, available: bool, base64: &Option<String>) -> Result<(), StoreError> {
    let Post { tx, instance, received_at, applied } = post;
    sqlx::query("UPDATE instances SET qr_code = $1, qr_updated_at = $2 WHERE id = $3")
        .bind(base64.clone().filter(|_| available))
        .bind(received_at)
        .bind(&instance.id)
        .execute(&mut **tx)
        .await?;
    let qr_available = Some(available);
    emit!(tx, instance, received_at, applied, InstanceQrUpdated { qr_available }).await
}

/// A call: an offer is told, an answer recorded, and one that ends unanswered is a
/// missed call (once).
async fn call(post: Post<'_>, id: &str, from: &str, status: &str) -> Result<(), StoreError> {
    let Post { tx, instance, received_at, applied } = post;
    let fields =
        events::CallFields { from: phone_of(from).or(Some(from.to_string())), call_status: Some(status.to_string()) };
    sqlx::query(
        "INSERT INTO calls (instance_id, call_id, seen_at) VALUES ($1, $2, $3) \
         ON CONFLICT (instance_id, call_id) DO NOTHING",
    )
    .bind(&instance.id)
    .bind(id)
    .bind(received_at)
    .execute(&mut **tx)
    .await?;
    match status {
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

/// A send of an instance, as the provider's events about it need it.
struct SentMessage {
    id: i64,
    status: String,
    recipient: String,
    purpose: String,
    /// What its customer's day counts of it (`store::customer_days`).
    customer_id: String,
    decision: String,
    created_at: i64,
}

impl FromCols for SentMessage {
    fn from_cols(r: &impl Cols) -> Result<SentMessage, StoreError> {
        Ok(SentMessage {
            id: r.col("id")?,
            status: r.col("status")?,
            recipient: r.col::<Option<String>>("recipient")?.unwrap_or_default(),
            purpose: r.col::<Option<String>>("purpose")?.unwrap_or_default(),
            customer_id: r.col("customer_id")?,
            decision: r.col("decision")?,
            created_at: r.col("created_at")?,
        })
    }
}

/// The send of `instance` that the provider knows as `external_id` (by index).
async fn sent_message(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    external_id: &str,
) -> Result<Option<SentMessage>, StoreError> {
    let row = sqlx::query(
        "SELECT id, status, recipient, purpose, customer_id, decision, created_at FROM message_log \
         WHERE instance_id = $1 AND provider_message_id = $2 \
         ORDER BY id DESC LIMIT 1",
    )
    .bind(&instance.id)
    .bind(external_id)
    .fetch_optional(&mut **tx)
    .await?;
    row.as_ref().map(SentMessage::from_cols).transpose()
}

/// `lost_send`'s read, one part a status, so that each reads by its own partial index
/// on both stores: the pending rows (`message_log_pending`: the sends in flight; `+`
/// keeps the time index out of it) and the unknown ones (`message_log_unknown`). The
/// time index alone would read every send of the window, inside the write transaction
/// (docs/architecture.md; `store::schema_tests` holds each part's plan).
pub(in crate::store) const LOST_SEND: &str = "SELECT id, status, recipient, purpose, customer_id, decision, created_at \
     FROM (SELECT id, status, recipient, purpose, customer_id, decision, created_at FROM message_log \
     WHERE status = 'pending' \
     AND instance_id = $1 AND recipient = $2 AND provider_message_id IS NULL \
     AND +created_at >= $3 AND +created_at <= $4 \
     UNION ALL SELECT id, status, recipient, purpose, customer_id, decision, created_at FROM message_log \
     WHERE status = 'unknown' \
     AND instance_id = $1 AND recipient = $2 AND provider_message_id IS NULL \
     AND created_at >= $3 AND created_at <= $4) m \
     ORDER BY CASE WHEN created_at <= $5 THEN 0 ELSE 1 END, ABS(created_at - $5), id LIMIT 1";

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
    let row = sqlx::query(LOST_SEND)
        .bind(&instance.id)
        .bind(to)
        .bind(received_at - UNKNOWN_SETTLE_WINDOW_MS)
        .bind(received_at)
        .bind(taken_at)
        .fetch_optional(&mut **tx)
        .await?;
    row.as_ref().map(SentMessage::from_cols).transpose()
}

/// What the provider reported of a message so far: its status's rank, and whether it
/// was delivered and read.
struct Reported {
    rank: i64,
    delivered: bool,
    read: bool,
}

async fn reports_of(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    external_id: &str,
) -> Result<Option<Reported>, StoreError> {
    let row = sqlx::query(
        "SELECT status_rank, delivered_at, read_at FROM message_status \
         WHERE instance_id = $1 AND external_message_id = $2",
    )
    .bind(&instance.id)
    .bind(external_id)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|r| {
        Ok(Reported {
            rank: r.try_get("status_rank")?,
            delivered: r.try_get::<Option<i64>, _>("delivered_at")?.is_some(),
            read: r.try_get::<Option<i64>, _>("read_at")?.is_some(),
        })
    })
    .transpose()
}

/// Whether a send of `created_at` is of a UTC day that has closed (its customer's day
/// may be kept: `store::customer_days`).
fn closed(created_at: i64) -> bool {
    customer_days::closed(created_at, now_ms())
}

/// On PostgreSQL, takes the lock of the provider's message `external_id` of `instance`
/// until the transaction ends (whether it did): posts about a send of a closed day are
/// applied one at a time, so that what each reads of the send and its reports is what
/// its change starts from. On SQLite every post already is.
async fn lock_message(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    external_id: &str,
) -> Result<bool, StoreError> {
    if tx.backend_name() != "PostgreSQL" {
        return Ok(false);
    }
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 0))")
        .bind(&instance.id)
        .bind(external_id)
        .execute(&mut **tx)
        .await?;
    Ok(true)
}

/// A send changed from its status in `m` with `before` (delivered, read) to `after`:
/// its customer's kept day follows, at the end of the post (`store::customer_days`).
fn recount(applied: &mut Applied, m: &SentMessage, before: (bool, bool), after: (&str, (bool, bool))) {
    if !closed(m.created_at) {
        return;
    }
    let count = |status: &str, (delivered, read): (bool, bool)| SendCount {
        customer_id: m.customer_id.clone(),
        created_at: m.created_at,
        decision: m.decision.clone(),
        status: status.to_string(),
        delivered,
        read,
    };
    applied.days.push((count(&m.status, before), count(after.0, after.1)));
}

/// An unknown send `m` was settled `sent` by the provider's `external_id`: its customer's
/// kept day counts it sent, with what the provider already reported of it.
async fn recount_settled(
    tx: &mut Transaction<'static, Any>,
    instance: &Instance,
    applied: &mut Applied,
    m: &SentMessage,
    external_id: &str,
) -> Result<(), StoreError> {
    if !closed(m.created_at) {
        return Ok(()); // a send of today: no kept day to follow, and no read needed
    }
    let reported = reports_of(tx, instance, external_id).await?;
    let now = reported.as_ref().map_or((false, false), |r| (r.delivered, r.read));
    recount(applied, m, now, ("sent", now));
    Ok(())
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
