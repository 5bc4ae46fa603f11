//! Erasure of one person's data for a data-subject request: `gateway privacy erase
//! --customer C --phone P` removes or redacts what the gateway holds about the phone
//! number P for the customer C, in every table, in one transaction, and says what it
//! touched.
//!
//! Redacted, not removed: the message log keeps each attempt (quotas, the audit of
//! decisions) with the recipient replaced and the policy's reason and trace dropped.
//! Kept on purpose: a suppression of P (an opt-out must go on being honoured; it holds
//! the number and nothing else). Idempotency keys hold no personal data (the answers
//! name message and log ids) and expire within 24 hours.

use super::{Store, StoreError};
use serde::Serialize;

/// What the recipient column of a redacted message-log row says.
pub const ERASED: &str = "(erased)";

/// What erasure did to one table.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Erased {
    pub table: &'static str,
    /// `deleted`, `redacted` or `kept`.
    pub action: &'static str,
    pub rows: u64,
}

/// The customer's instances, as a subquery on `$1`.
const INSTANCES: &str = "(SELECT id FROM instances WHERE customer_id = $1)";

/// How a statement's `$2` names the person.
#[derive(Clone, Copy)]
enum As {
    /// E.164, as the tables store it.
    Phone,
    /// A JSON string (`"+1..."`), inside event bodies.
    Json,
    /// The digits of a provider's jid (`1...@`), inside raw provider events.
    Jid,
}

/// (table, action, how `$2` names the person, statement with `$1` the customer). In
/// this order: rows found through others go before those others change.
fn steps() -> Vec<(&'static str, &'static str, As, String)> {
    vec![
        (
            "message_status",
            "deleted",
            As::Phone,
            format!(
                "DELETE FROM message_status WHERE instance_id IN {INSTANCES} AND external_message_id IN \
                 (SELECT provider_message_id FROM message_log WHERE customer_id = $1 AND recipient = $2 \
                 AND provider_message_id IS NOT NULL)"
            ),
        ),
        (
            "review_queue",
            "deleted",
            As::Phone,
            "DELETE FROM review_queue WHERE customer_id = $1 AND recipient = $2".into(),
        ),
        (
            "message_log",
            "redacted",
            As::Phone,
            format!(
                "UPDATE message_log SET recipient = '{ERASED}', reason = NULL, policy_trace = NULL \
                 WHERE customer_id = $1 AND recipient = $2"
            ),
        ),
        (
            "webhook_attempts",
            "deleted",
            As::Json,
            "DELETE FROM webhook_attempts WHERE outbox_id IN \
             (SELECT id FROM outbox WHERE customer_id = $1 AND payload LIKE '%' || $2 || '%')"
                .into(),
        ),
        (
            "outbox",
            "deleted",
            As::Json,
            "DELETE FROM outbox WHERE customer_id = $1 AND payload LIKE '%' || $2 || '%'".into(),
        ),
        (
            "inbound_messages",
            "deleted",
            As::Phone,
            "DELETE FROM inbound_messages WHERE customer_id = $1 AND sender = $2".into(),
        ),
        (
            "contacts",
            "deleted",
            As::Phone,
            format!("DELETE FROM contacts WHERE instance_id IN {INSTANCES} AND phone = $2"),
        ),
        (
            "contact_activity",
            "deleted",
            As::Phone,
            format!("DELETE FROM contact_activity WHERE instance_id IN {INSTANCES} AND phone = $2"),
        ),
        (
            "lid_map",
            "deleted",
            As::Phone,
            format!("DELETE FROM lid_map WHERE instance_id IN {INSTANCES} AND phone = $2"),
        ),
        (
            "provider_events",
            "deleted",
            As::Jid,
            format!("DELETE FROM provider_events WHERE instance_id IN {INSTANCES} AND payload LIKE '%' || $2 || '%'"),
        ),
        ("pbx_events", "deleted", As::Phone, "DELETE FROM pbx_events WHERE customer_id = $1 AND phone = $2".into()),
        (
            "pbx_cooldowns",
            "deleted",
            As::Phone,
            "DELETE FROM pbx_cooldowns WHERE phone = $2 AND integration_id IN \
             (SELECT id FROM pbx_integrations WHERE customer_id = $1)"
                .into(),
        ),
        (
            "usage_counters",
            "deleted",
            As::Phone,
            "DELETE FROM usage_counters WHERE scope LIKE '%:' || $2 AND EXISTS \
             (SELECT 1 FROM instances i WHERE i.customer_id = $1 AND usage_counters.scope LIKE '%:' || i.id || ':%')"
                .into(),
        ),
    ]
}

impl Store {
    /// Removes or redacts what the store holds about `phone` (E.164) for `customer_id`;
    /// what each table lost, and what was kept.
    pub async fn erase_person(&self, customer_id: &str, phone: &str) -> Result<Vec<Erased>, StoreError> {
        self.customer(customer_id).await?;
        let json = format!("\"{phone}\"");
        let jid = format!("{}@", phone.trim_start_matches('+'));
        let mut tx = self.write.begin().await?;
        let mut report = Vec::new();
        for (table, action, named, sql) in steps() {
            let person = match named {
                As::Phone => phone,
                As::Json => &json,
                As::Jid => &jid,
            };
            let done = sqlx::query(&sql).bind(customer_id).bind(person).execute(&mut *tx).await?.rows_affected();
            report.push(Erased { table, action, rows: done });
        }
        let kept: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM suppressed_recipients WHERE customer_id = $1 AND phone = $2")
                .bind(customer_id)
                .bind(phone)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        self.forget_cached();
        report.push(Erased { table: "suppressed_recipients", action: "kept", rows: kept as u64 });
        Ok(report)
    }
}
