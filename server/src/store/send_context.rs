//! The send path's one read: the customer, the instance, suppression, the pacing
//! counters, the API key's revocation and the idempotency key's state, as stored now.

use super::customers::{CUSTOMER_COLUMNS, INSTANCE_COLUMNS};
use super::idempotency::KeySnapshot;
use super::{Cols, Customer, FromCols, Instance, Store, StoreError};
use gateway_policy_model::Counters;
use rusqlite::types::Value as SqlValue;
use std::sync::LazyLock;

/// Customer, instance by id (or else name), suppression and the pacing counters, in
/// one read. Every counter is a bounded lookup (a few index entries), never a count
/// over the message log: $4 start of the UTC day, $5 start of the hour 24 hours ago,
/// $6..$8 the scope prefixes of the counters (see [`PacingScopes`]). Two forms: without
/// an idempotency key, and with the key's row joined (`$11` the key, `$12` now), so an
/// unkeyed send's read is no larger for it.
static SEND_CONTEXT_SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
    let (instance_match, order) = ("(i.id = $2 OR i.name = $2)", "ORDER BY CASE WHEN i.id = $2 THEN 0 ELSE 1 END");
    [send_context_sql(instance_match, order, false), send_context_sql(instance_match, order, true)]
});

/// `SEND_CONTEXT_SQL` for an instance the cache resolved: `$2` is its id, and the
/// customer and instance rows are read again by primary key, so what stops sending (a
/// revoked key, a paused instance, a plan or module change) holds from the moment it
/// is written, on every replica; the cache saves the name lookup, never a decision.
static SEND_FRESH_SQL: LazyLock<[String; 2]> =
    LazyLock::new(|| [send_context_sql("i.id = $2", "", false), send_context_sql("i.id = $2", "", true)]);

fn send_context_sql(instance_match: &str, order: &str, keyed: bool) -> String {
    let customer_cols: Vec<String> = CUSTOMER_COLUMNS.split(", ").map(|c| format!("c.{c}")).collect();
    let instance_cols: Vec<String> = INSTANCE_COLUMNS.split(", ").map(|c| format!("i.{c} AS i_{c}")).collect();
    let (key_cols, key_join) = match keyed {
        true => (
            KeySnapshot::joined_columns("ik"),
            "LEFT JOIN idempotency_keys ik ON ik.idem_key = $11 AND ik.customer_id = c.id AND ik.expires_at > $12",
        ),
        false => (KeySnapshot::no_joined_columns(), ""),
    };
    format!(
        "SELECT {}, {}, \
         (SELECT COUNT(*) FROM suppressed_recipients s WHERE s.customer_id = c.id AND s.phone = $3) AS suppressed, \
         (SELECT CAST(SUM(u.count) AS BIGINT) FROM usage_counters u WHERE u.scope = $7 || i.id || ':' || $3 \
            AND u.window_start >= $5) AS to_recipient_24h, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = $7 || i.id || ':' || $3 \
            AND u.window_start = $9) AS to_recipient_hour, \
         k.sent_total AS to_recipient_total, k.replies_total AS replies, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = $8 || i.id AND u.window_start = $4) AS new_today, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = $6 || i.id AND u.window_start = $4) AS sent_today, \
         (SELECT a.revoked_at FROM api_keys a WHERE a.id = $10) AS key_revoked_at, {key_cols} \
         FROM customers c LEFT JOIN instances i ON i.customer_id = c.id AND {instance_match} \
         LEFT JOIN contacts k ON k.instance_id = i.id AND k.phone = $3 {key_join} \
         WHERE c.id = $1 {order} LIMIT 1",
        customer_cols.join(", "),
        instance_cols.join(", "),
    )
}

/// Scope prefixes of the counters the pacing policy reads. They are taken with the
/// quota in the same reservation (never limits themselves) and given back with it if
/// the provider refuses, so they count what went out.
pub struct PacingScopes;

impl PacingScopes {
    /// `iday:{instance}`, per UTC day: the instance's sends.
    pub const INSTANCE_DAY: &str = "iday:";
    /// `r24:{instance}:{phone}`, per hour: sends to one recipient (24 buckets make
    /// the last 24 hours).
    pub const RECIPIENT_HOUR: &str = "r24:";
    /// `inew:{instance}`, per UTC day: sends to a recipient never messaged before.
    pub const NEW_RECIPIENT_DAY: &str = "inew:";
    /// `ifirst:{instance}:{phone}`, per UTC day, limit 1: the claim of a first contact,
    /// so that of concurrent first sends to one number only one counts as new.
    pub const FIRST_CONTACT: &str = "ifirst:";
}

impl FromCols for SendContext {
    fn from_cols(row: &impl Cols) -> Result<SendContext, StoreError> {
        let instance_id: Option<String> = row.col("i_id")?;
        let count = |name: &str| -> Result<u32, StoreError> {
            Ok(row.col::<Option<i64>>(name)?.unwrap_or(0).clamp(0, u32::MAX as i64) as u32)
        };
        Ok(SendContext {
            customer: Customer::from_cols(row)?,
            instance: instance_id.map(|_| Instance::from_prefixed_row(row, "i_")).transpose()?,
            suppressed: row.col::<i64>("suppressed")? > 0,
            counters: Counters {
                to_recipient_24h: count("to_recipient_24h")?,
                to_recipient_total: count("to_recipient_total")?,
                replies_from_recipient: count("replies")?,
                new_recipients_today: count("new_today")?,
                sent_today: count("sent_today")?,
            },
            to_recipient_hour: count("to_recipient_hour")?,
            key_revoked: row.col::<Option<i64>>("key_revoked_at")?.is_some(),
            key: KeySnapshot::from_joined(row)?,
        })
    }
}

/// What the send pipeline reads after the schema check, in one query.
#[derive(Clone, Debug)]
pub struct SendContext {
    pub customer: Customer,
    /// The customer's instance with the requested id or name.
    pub instance: Option<Instance>,
    /// Whether the customer suppressed the recipient.
    pub suppressed: bool,
    /// What the instance did recently, as the policies see it.
    pub counters: Counters,
    /// Of `counters.to_recipient_24h`, the sends of the current hour (the bucket a send
    /// takes).
    pub to_recipient_hour: u32,
    /// Whether the request's API key is revoked, as stored now.
    pub key_revoked: bool,
    /// The state of the request's idempotency key, when it has one (see
    /// `send::idempotency`): absent when it has none.
    pub key: KeySnapshot,
}

impl Store {
    /// The customer, its instance with this id (or else this name), whether `phone` is
    /// suppressed, the pacing counters, whether the request's API key is revoked and the
    /// state of its idempotency key `idem_key` (if it has one), in one read. The cache (see `cache`) only saves resolving an instance's name: the
    /// rows are always read as stored now.
    pub async fn send_context(
        &self,
        customer_id: &str,
        instance_ref: &str,
        phone: &str,
        api_key_id: Option<&str>,
        idem_key: Option<&str>,
        now: i64,
    ) -> Result<SendContext, StoreError> {
        const DAY_MS: i64 = 24 * 3_600_000;
        const HOUR_MS: i64 = 3_600_000;
        let cached = self.cache.instance_id(customer_id, instance_ref);
        let generation = self.cache.generation();
        let mut params = vec![
            SqlValue::Text(customer_id.to_string()),
            SqlValue::Text(cached.clone().unwrap_or_else(|| instance_ref.to_string())),
            SqlValue::Text(phone.to_string()),
            SqlValue::Integer(now - now.rem_euclid(DAY_MS)),
            SqlValue::Integer(now - now.rem_euclid(HOUR_MS) - 23 * HOUR_MS),
            SqlValue::Text(PacingScopes::INSTANCE_DAY.to_string()),
            SqlValue::Text(PacingScopes::RECIPIENT_HOUR.to_string()),
            SqlValue::Text(PacingScopes::NEW_RECIPIENT_DAY.to_string()),
            SqlValue::Integer(now - now.rem_euclid(HOUR_MS)),
            api_key_id.map_or(SqlValue::Null, |k| SqlValue::Text(k.to_string())),
        ];
        if let Some(idem_key) = idem_key {
            params.extend([SqlValue::Text(idem_key.to_string()), SqlValue::Integer(now)]);
        }
        let keyed = usize::from(idem_key.is_some());
        let missing = || StoreError::NotFound(format!("customer {customer_id}"));
        let mut context: Option<SendContext> = None;
        if cached.is_some() {
            context = Some(self.read_one(&SEND_FRESH_SQL[keyed], params.clone()).await?.ok_or_else(missing)?);
        }
        // Not cached, or the cached id is gone (the instance was removed meanwhile):
        // resolve the id or name as the request gave it.
        let resolved = context.as_ref().is_some_and(|c| c.instance.is_some());
        if !resolved {
            let mut params = params;
            params[1] = SqlValue::Text(instance_ref.to_string());
            context = Some(self.read_one(&SEND_CONTEXT_SQL[keyed], params).await?.ok_or_else(missing)?);
        }
        let context = context.ok_or_else(missing)?;
        if !resolved && let Some(instance) = &context.instance {
            self.cache.put_instance_id(customer_id, instance_ref, &instance.id, generation);
        }
        Ok(context)
    }
}
