//! The dashboard's paged reads: every list a page shows, always scoped to one customer
//! (or, for the operator console, to every customer) and always bounded.
//!
//! Logs that grow without bound (message log, inbound messages, webhook attempts, PBX
//! events) page by key (`before` an id, newest first), so a deep page costs what the
//! first one does; short lists (keys, users, suppressions, instances, customers) page by
//! offset and also report their total.

use super::ApiKeyRecord;
use super::{Cols, Customer, FromCols, Instance, PbxEvent, Store, StoreError, WebhookAttempt};
use sqlx::Row;

/// A suppressed recipient with why and how it got there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suppression {
    pub phone: String,
    pub reason: String,
    /// `manual`, `opt_out`, `import` or `dashboard`.
    pub source: String,
    pub created_at: i64,
}

impl FromCols for Suppression {
    fn from_cols(r: &impl Cols) -> Result<Suppression, StoreError> {
        Ok(Suppression {
            phone: r.col("phone")?,
            reason: r.col("reason")?,
            source: r.col("source")?,
            created_at: r.col("created_at")?,
        })
    }
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboundRow {
    pub id: i64,
    pub instance_id: String,
    pub sender: String,
    pub group_id: Option<String>,
    pub message_type: String,
    pub text: Option<String>,
    pub received_at: i64,
}

impl FromCols for InboundRow {
    fn from_cols(r: &impl Cols) -> Result<InboundRow, StoreError> {
        Ok(InboundRow {
            id: r.col("id")?,
            instance_id: r.col("instance_id")?,
            sender: r.col("sender")?,
            group_id: r.col("group_id")?,
            message_type: r.col("message_type")?,
            text: r.col("text")?,
            received_at: r.col("received_at")?,
        })
    }
}

/// Counters of one customer against its limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub today: i64,
    pub period: i64,
    pub instances: i64,
}

impl Store {
    /// A page of a customer's suppressed recipients, newest first, optionally only
    /// phones containing `search`; and the total that match.
    pub async fn suppressions_page(
        &self,
        customer_id: &str,
        search: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Suppression>, i64), StoreError> {
        let pattern = format!("%{}%", search.unwrap_or("").replace(['%', '_'], ""));
        let rows = sqlx::query(
            "SELECT phone, reason, source, created_at FROM suppressed_recipients \
             WHERE customer_id = $1 AND phone LIKE $2 ORDER BY created_at DESC, phone LIMIT $3 OFFSET $4",
        )
        .bind(customer_id)
        .bind(&pattern)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM suppressed_recipients WHERE customer_id = $1 AND phone LIKE $2")
                .bind(customer_id)
                .bind(&pattern)
                .fetch_one(&self.read)
                .await?
                .try_get("n")?;
        let list = rows.iter().map(Suppression::from_cols).collect::<Result<_, StoreError>>()?;
        Ok((list, total))
    }

    /// Every suppressed recipient of a customer (at most `cap`), oldest first (export).
    pub async fn all_suppressions(&self, customer_id: &str, cap: i64) -> Result<Vec<Suppression>, StoreError> {
        let rows = sqlx::query(
            "SELECT phone, reason, source, created_at FROM suppressed_recipients WHERE customer_id = $1 \
             ORDER BY created_at, phone LIMIT $2",
        )
        .bind(customer_id)
        .bind(cap)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(Suppression::from_cols).collect()
    }

    /// Adds many suppressions in one transaction (import). A phone already suppressed
    /// keeps its entry (an opt-out stays an opt-out); returns how many were new.
    pub async fn import_suppressions(
        &self,
        customer_id: &str,
        rows: &[(String, String)],
        source: &str,
    ) -> Result<u64, StoreError> {
        let now = super::now_ms();
        let mut tx = self.write.begin().await?;
        let mut added = 0;
        for (phone, reason) in rows {
            let done = sqlx::query(
                "INSERT INTO suppressed_recipients (customer_id, phone, reason, source, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (customer_id, phone) DO NOTHING",
            )
            .bind(customer_id)
            .bind(phone)
            .bind(reason)
            .bind(source)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            added += done.rows_affected();
        }
        tx.commit().await?;
        Ok(added)
    }

    /// A customer's received messages, newest first, `before` an id, optionally of one
    /// instance.
    pub async fn inbound_page(
        &self,
        customer_id: &str,
        instance_id: Option<&str>,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<InboundRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, instance_id, sender, group_id, message_type, text, received_at FROM inbound_messages \
             WHERE customer_id = $1 AND ($2 = '' OR instance_id = $2) AND id < $3 ORDER BY id DESC LIMIT $4",
        )
        .bind(customer_id)
        .bind(instance_id.unwrap_or(""))
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(InboundRow::from_cols).collect()
    }

    /// Delivery attempts to an instance's endpoint, newest first, `before` an id.
    pub async fn attempts_page(
        &self,
        instance_id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<WebhookAttempt>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM webhook_attempts WHERE instance_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
            super::webhooks::ATTEMPT_COLUMNS
        ))
        .bind(instance_id)
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(WebhookAttempt::from_cols).collect()
    }

    /// A page of a customer's instances (by name) and their total.
    pub async fn instances_page(
        &self,
        customer_id: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Instance>, i64), StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM instances WHERE customer_id = $1 ORDER BY name, id LIMIT $2 OFFSET $3",
            super::customers::INSTANCE_COLUMNS
        ))
        .bind(customer_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total = self.instance_count(customer_id).await?;
        Ok((rows.iter().map(Instance::from_cols).collect::<Result<_, _>>()?, total))
    }

    /// A page of every customer's instances (operators; only paused ones when
    /// `paused_only`), newest first, and their total.
    pub async fn all_instances_page(
        &self,
        paused_only: bool,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Instance>, i64), StoreError> {
        let filter = if paused_only { "WHERE paused = 1" } else { "" };
        let rows = sqlx::query(&format!(
            "SELECT {} FROM instances {filter} ORDER BY created_at DESC, id LIMIT $1 OFFSET $2",
            super::customers::INSTANCE_COLUMNS
        ))
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total: i64 = sqlx::query(&format!("SELECT COUNT(*) AS n FROM instances {filter}"))
            .fetch_one(&self.read)
            .await?
            .try_get("n")?;
        Ok((rows.iter().map(Instance::from_cols).collect::<Result<_, _>>()?, total))
    }

    /// How many instances a customer has.
    pub async fn instance_count(&self, customer_id: &str) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM instances WHERE customer_id = $1")
            .bind(customer_id)
            .fetch_one(&self.read)
            .await?
            .try_get("n")?)
    }

    /// A page of a customer's API keys (newest first) and their total.
    pub async fn api_keys_page(
        &self,
        customer_id: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<ApiKeyRecord>, i64), StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM api_keys WHERE customer_id = $1 ORDER BY created_at DESC, id LIMIT $2 OFFSET $3",
            super::keys::KEY_COLUMNS
        ))
        .bind(customer_id)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) AS n FROM api_keys WHERE customer_id = $1")
            .bind(customer_id)
            .fetch_one(&self.read)
            .await?
            .try_get("n")?;
        Ok((rows.iter().map(ApiKeyRecord::from_cols).collect::<Result<_, _>>()?, total))
    }

    /// One API key by id.
    pub async fn api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row = sqlx::query(&format!("SELECT {} FROM api_keys WHERE id = $1", super::keys::KEY_COLUMNS))
            .bind(id)
            .fetch_optional(&self.write)
            .await?;
        row.as_ref().map(ApiKeyRecord::from_cols).transpose()
    }

    /// The ids of a customer's PBX integrations, oldest first.
    pub async fn pbx_integration_ids(&self, customer_id: &str) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query("SELECT id FROM pbx_integrations WHERE customer_id = $1 ORDER BY id LIMIT 100")
            .bind(customer_id)
            .fetch_all(&self.read)
            .await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// Received events of an integration, newest first, `before` an id.
    pub async fn pbx_events_page(&self, id: i64, before: Option<i64>, limit: i64) -> Result<Vec<PbxEvent>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM pbx_events WHERE integration_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
            super::pbx::EVENT_COLUMNS
        ))
        .bind(id)
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(PbxEvent::from_cols).collect()
    }

    /// A page of customers (newest first; only those waiting for approval when
    /// `pending_only`; names containing `search`) and their total.
    pub async fn customers_page(
        &self,
        pending_only: bool,
        search: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Customer>, i64), StoreError> {
        let pattern = format!("%{}%", search.unwrap_or("").replace(['%', '_'], ""));
        let status = if pending_only { "pending_approval" } else { "" };
        let filter = "WHERE name LIKE $1 AND ($2 = '' OR plan_status = $2)";
        let rows = sqlx::query(&format!(
            "SELECT {} FROM customers {filter} ORDER BY created_at DESC, id LIMIT $3 OFFSET $4",
            super::customers::CUSTOMER_COLUMNS
        ))
        .bind(&pattern)
        .bind(status)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.read)
        .await?;
        let total: i64 = sqlx::query(&format!("SELECT COUNT(*) AS n FROM customers {filter}"))
            .bind(&pattern)
            .bind(status)
            .fetch_one(&self.read)
            .await?
            .try_get("n")?;
        Ok((rows.iter().map(Customer::from_cols).collect::<Result<_, _>>()?, total))
    }

    /// Sends counted today (the UTC day starting at `day_start`) and in the plan period
    /// starting at `period_start`, and the customer's instances.
    pub async fn usage(&self, customer_id: &str, day_start: i64, period_start: i64) -> Result<Usage, StoreError> {
        let count = |scope: String, start: i64| async move {
            let row = sqlx::query("SELECT count FROM usage_counters WHERE scope = $1 AND window_start = $2")
                .bind(scope)
                .bind(start)
                .fetch_optional(&self.read)
                .await?;
            Ok::<i64, StoreError>(row.map(|r| r.try_get("count")).transpose()?.unwrap_or(0))
        };
        Ok(Usage {
            today: count(format!("day:{customer_id}"), day_start).await?,
            period: count(format!("month:{customer_id}"), period_start).await?,
            instances: self.instance_count(customer_id).await?,
        })
    }
}
