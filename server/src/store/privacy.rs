//! Erasure of one person's data for a data-subject request: `gateway privacy erase
//! --customer C --phone P` removes or redacts what the gateway holds about the phone
//! number P for the customer C, in every table, in one transaction, and says what it
//! touched.
//!
//! Redacted, not removed: the message log keeps each attempt (quotas, the audit of
//! decisions) with the recipient replaced and the policy's reason and trace dropped.
//!
//! Every spelling of P counts: the log stores E.164, but a request refused before its
//! number was checked was logged with the number as given (`+1 415 555 0111`) until
//! the log normalised those too; any stored recipient of the customer that normalises
//! to P is erased with it (`spellings`).
//! Kept on purpose: a suppression of P (an opt-out must go on being honoured; it holds
//! the number and nothing else). Idempotency keys hold no personal data (the answers
//! name message and log ids) and expire within 24 hours.

use super::{Store, StoreError};
use crate::phone;
use serde::Serialize;
use sqlx::Row;

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
    /// As the tables store it: E.164, and each other spelling the message log holds.
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
            "policy_inputs",
            "deleted",
            As::Phone,
            "DELETE FROM policy_inputs WHERE log_id IN \
             (SELECT id FROM message_log WHERE customer_id = $1 AND recipient = $2)"
                .into(),
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

/// `column` without `+` and the separators a person types between digits (those that
/// `phone::normalize` ignores): the digits of any spelling of a number, in SQL that
/// SQLite and PostgreSQL read alike.
fn bare_digits(column: &str) -> String {
    ["+", " ", "-", ".", "(", ")", "\u{a0}"].iter().fold(column.to_string(), |e, c| format!("REPLACE({e}, '{c}', '')"))
}

/// Every spelling of `phone` (E.164) among the customer's message-log recipients: the
/// E.164 form, and each stored value that normalises to it. Candidates are the values
/// whose digits end with the number's national digits (found in SQL, over the
/// customer's rows), each then read as the API reads a number.
async fn spellings(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    customer_id: &str,
    e164: &str,
) -> Result<Vec<String>, StoreError> {
    let mut forms = vec![e164.to_string()];
    let Some(number) = phone::normalize(e164) else {
        return Ok(forms);
    };
    let national = &number.e164[1 + number.country_code.to_string().len()..];
    let sql = format!(
        "SELECT DISTINCT recipient FROM message_log WHERE customer_id = $1 AND recipient IS NOT NULL \
         AND recipient <> $2 AND {} LIKE $3",
        bare_digits("recipient")
    );
    let rows = sqlx::query(&sql).bind(customer_id).bind(e164).bind(format!("%{national}")).fetch_all(&mut **tx).await?;
    for row in rows {
        let stored: String = row.try_get("recipient")?;
        if phone::normalize(&stored).is_some_and(|n| n.e164 == number.e164) {
            forms.push(stored);
        }
    }
    Ok(forms)
}

impl Store {
    /// Removes or redacts what the store holds about `phone` (E.164) for `customer_id`,
    /// under any spelling the message log holds; what each table lost, and what was
    /// kept.
    pub async fn erase_person(&self, customer_id: &str, phone: &str) -> Result<Vec<Erased>, StoreError> {
        self.customer(customer_id).await?;
        let json = format!("\"{phone}\"");
        let jid = format!("{}@", phone.trim_start_matches('+'));
        // Reads first, so the write lock is taken at once (see `write_transaction`).
        let mut tx = super::ingress::write_transaction(&self.write).await?;
        let forms = spellings(&mut tx, customer_id, phone).await?;
        let mut report = Vec::new();
        for (table, action, named, sql) in steps() {
            let people: &[String] = match named {
                As::Phone => &forms,
                As::Json => std::slice::from_ref(&json),
                As::Jid => std::slice::from_ref(&jid),
            };
            let mut rows = 0;
            for person in people {
                rows += sqlx::query(&sql).bind(customer_id).bind(person).execute(&mut *tx).await?.rows_affected();
            }
            report.push(Erased { table, action, rows });
        }
        let kept: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM suppressed_recipients WHERE customer_id = $1 AND phone = $2")
                .bind(customer_id)
                .bind(phone)
                .fetch_one(&mut *tx)
                .await?;
        // The customer's kept days counted the person's rows as they were.
        super::customer_days::forget(&mut tx, customer_id).await?;
        tx.commit().await?;
        self.forget_cached();
        report.push(Erased { table: "suppressed_recipients", action: "kept", rows: kept as u64 });
        Ok(report)
    }
}
