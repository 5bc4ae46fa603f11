//! The message log as the dashboard reads it: each row with its delivery state
//! (`delivery`), filtered, paged by key (newest first, `before` a log id), streamed in
//! chunks for the CSV export, and one message with the webhook events about it.

use super::delivery::{Delivery, DeliveryState, STATUS_COLUMNS, STATUS_JOIN};
use super::{Backend, Cols, FromCols, LogEntry, Store, StoreError, bind_all};
use rusqlite::types::Value as SqlValue;
use sqlx::Row;

/// Filters of the message log (all optional, combined with AND).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFilter {
    pub instance_id: Option<String>,
    /// `allowed` or `refused`.
    pub decision: Option<String>,
    /// What became of the message (sent, delivered, read, failed, ...).
    pub state: Option<DeliveryState>,
    pub source: Option<String>,
    pub recipient: Option<String>,
    pub error_code: Option<String>,
    /// Rows created at or after this time (Unix ms).
    pub since: Option<i64>,
    /// Rows of the request with this `x-request-id` or `X-Correlation-Id`.
    pub request: Option<String>,
}

/// A log row with the provider's reports on it.
#[derive(Clone, Debug)]
pub struct LogRow {
    pub id: i64,
    pub entry: LogEntry,
    pub delivery: Delivery,
}

impl FromCols for LogRow {
    fn from_cols(r: &impl Cols) -> Result<LogRow, StoreError> {
        Ok(LogRow { id: r.col("id")?, entry: LogEntry::from_cols(r)?, delivery: Delivery::from_cols(r)? })
    }
}

impl LogRow {
    /// The row's state and the error of a failure.
    pub fn state(&self) -> (DeliveryState, Option<String>) {
        DeliveryState::of(&self.entry, &self.delivery)
    }
}

/// A webhook event that carries a message, and its delivery attempts.
#[derive(Clone, Debug)]
pub struct MessageEvent {
    pub id: i64,
    pub event_type: String,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
    /// How it finished (`delivered`, `failed`, `gone`, `skipped_...`); none while due.
    pub outcome: Option<String>,
    pub attempts: Vec<EventAttempt>,
}

/// One delivery attempt of a message's event.
#[derive(Clone, Debug)]
pub struct EventAttempt {
    pub at: i64,
    /// The endpoint's HTTP status, when it answered.
    pub status: Option<i64>,
    pub succeeded: bool,
    pub latency_ms: Option<i64>,
    pub error: Option<String>,
}

impl FromCols for EventAttempt {
    fn from_cols(r: &impl Cols) -> Result<EventAttempt, StoreError> {
        Ok(EventAttempt {
            at: r.col("attempted_at")?,
            status: r.col("status_code")?,
            succeeded: r.col::<Option<i64>>("succeeded")?.unwrap_or(0) != 0,
            latency_ms: r.col("latency_ms")?,
            error: r.col("error")?,
        })
    }
}

fn log_columns() -> String {
    super::messages::LOG_COLUMNS.split(", ").map(|c| format!("m.{c}")).collect::<Vec<_>>().join(", ")
}

fn text(s: &str) -> SqlValue {
    SqlValue::Text(s.to_string())
}

/// The query of a customer's log rows matching `filter`, newest first, below `before`.
/// On SQLite a state with an index of its own names it (`DeliveryState::index`);
/// PostgreSQL chooses by its statistics.
fn log_query(
    backend: Backend,
    customer_id: &str,
    filter: &LogFilter,
    before: Option<i64>,
    limit: i64,
) -> (String, Vec<SqlValue>) {
    let index = match (backend, filter.state.and_then(DeliveryState::index)) {
        (Backend::Sqlite, Some(index)) => format!(" INDEXED BY {index}"),
        _ => String::new(),
    };
    let mut sql = format!(
        "SELECT m.id, {}, {STATUS_COLUMNS} FROM message_log m{index} {STATUS_JOIN} WHERE m.customer_id = $1",
        log_columns()
    );
    let mut values = vec![text(customer_id)];
    // Each clause names its value `$?` (once or more).
    let mut add = |clause: &str, value: Option<SqlValue>| {
        match value {
            Some(value) => {
                values.push(value);
                sql.push_str(&format!(" AND {}", clause.replace("$?", &format!("${}", values.len()))));
            }
            None => sql.push_str(&format!(" AND {clause}")),
        };
    };
    if let Some(v) = &filter.instance_id {
        add("m.instance_id = $?", Some(text(v)));
    }
    if let Some(v) = &filter.decision {
        add("m.decision = $?", Some(text(v)));
    }
    if let Some(state) = filter.state {
        add(&format!("({})", state.condition()), None);
    }
    if let Some(v) = &filter.source {
        add("m.source = $?", Some(text(v)));
    }
    if let Some(v) = &filter.recipient {
        add("m.recipient = $?", Some(text(v)));
    }
    if let Some(v) = &filter.error_code {
        add("m.error_code = $?", Some(text(v)));
    }
    if let Some(v) = filter.since {
        add("m.created_at >= $?", Some(SqlValue::Integer(v)));
    }
    if let Some(v) = &filter.request {
        add("(m.request_id = $? OR m.correlation_id = $?)", Some(text(v)));
    }
    if let Some(v) = before {
        add("m.id < $?", Some(SqlValue::Integer(v)));
    }
    values.push(SqlValue::Integer(limit));
    sql.push_str(&format!(" ORDER BY m.id DESC LIMIT ${}", values.len()));
    (sql, values)
}

/// `s` as a LIKE pattern matching it literally (escape character `\`).
fn like_escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Store {
    /// A customer's message log, newest first, `before` a log id, with filters.
    pub async fn message_log_page(
        &self,
        customer_id: &str,
        filter: &LogFilter,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<LogRow>, StoreError> {
        let (sql, values) = log_query(self.backend, customer_id, filter, before, limit);
        let rows = bind_all(sqlx::query(&sql), values).fetch_all(&self.read).await?;
        rows.iter().map(LogRow::from_cols).collect()
    }

    /// One log row of a customer, with its reports.
    pub async fn customer_log_row(&self, customer_id: &str, id: i64) -> Result<Option<LogRow>, StoreError> {
        let sql = format!(
            "SELECT m.id, {}, {STATUS_COLUMNS} FROM message_log m {STATUS_JOIN} WHERE m.id = $1 AND m.customer_id = $2",
            log_columns()
        );
        let row = sqlx::query(&sql).bind(id).bind(customer_id).fetch_optional(&self.read).await?;
        row.as_ref().map(LogRow::from_cols).transpose()
    }

    /// The webhook events of a customer's message (those written with its log row's
    /// id, by index), oldest first, with their attempts.
    ///
    /// A row logged before events named their row (migration postgres 0013, sqlite
    /// 0012) also finds the events written before then that carry its provider's
    /// message id in their body: searched among those older events of its instance
    /// only, and checked field by field (`message_id`, `external_message_id`). They
    /// leave with retention, and so does this search's work.
    pub async fn message_events(&self, customer_id: &str, message: &LogRow) -> Result<Vec<MessageEvent>, StoreError> {
        let mut rows = sqlx::query(
            "SELECT id, event_type, created_at, delivered_at, outcome FROM outbox WHERE log_id = $1 AND customer_id = $2 \
             ORDER BY id LIMIT 50",
        )
        .bind(message.id)
        .bind(customer_id)
        .fetch_all(&self.read)
        .await?;
        if let (Some(message_id), Some(instance_id)) = (&message.entry.provider_message_id, &message.entry.instance_id)
        {
            let mark = sqlx::query("SELECT log_through, outbox_through FROM outbox_unlinked")
                .fetch_optional(&self.read)
                .await?;
            if let Some(mark) = mark
                && message.id <= mark.try_get::<i64, _>("log_through")?
            {
                let quoted = serde_json::Value::String(message_id.clone()).to_string();
                let pattern = format!("%{}%", like_escaped(&quoted));
                let older = sqlx::query(
                    "SELECT id, event_type, created_at, delivered_at, outcome, payload FROM outbox WHERE id <= $1 \
                     AND customer_id = $2 AND instance_id = $3 AND created_at >= $4 AND log_id IS NULL \
                     AND payload LIKE $5 ESCAPE '\\' ORDER BY id LIMIT 50",
                )
                .bind(mark.try_get::<i64, _>("outbox_through")?)
                .bind(customer_id)
                .bind(instance_id)
                .bind(message.entry.created_at)
                .bind(&pattern)
                .fetch_all(&self.read)
                .await?;
                for row in older {
                    let payload: String = row.try_get("payload")?;
                    let body: serde_json::Value = serde_json::from_str(&payload).unwrap_or_default();
                    let names = |field: &str| body[field].as_str() == Some(message_id.as_str());
                    if names("message_id") || names("external_message_id") {
                        rows.push(row);
                    }
                }
                rows.sort_by_key(|r| r.try_get::<i64, _>("id").unwrap_or_default());
                rows.truncate(50);
            }
        }
        let mut events = Vec::new();
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            let attempts = sqlx::query(
                "SELECT attempted_at, status_code, succeeded, latency_ms, error FROM webhook_attempts \
                 WHERE outbox_id = $1 ORDER BY id LIMIT 20",
            )
            .bind(id)
            .fetch_all(&self.read)
            .await?
            .iter()
            .map(EventAttempt::from_cols)
            .collect::<Result<Vec<_>, StoreError>>()?;
            events.push(MessageEvent {
                id,
                event_type: row.try_get("event_type")?,
                created_at: row.try_get("created_at")?,
                delivered_at: row.try_get("delivered_at")?,
                outcome: row.try_get("outcome")?,
                attempts,
            });
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_postgres::{drop_database, migrated_sqlite, postgres_store, prepared_plans};
    use super::*;

    /// Two customers' rows in each state the pending and unknown filters tell apart, in
    /// id order: `(customer, decision, status)`.
    const ROWS: &[(&str, &str, &str)] = &[
        ("cus_a", "allowed", "pending"),
        ("cus_a", "allowed", "unknown"),
        ("cus_b", "allowed", "pending"),
        ("cus_b", "allowed", "unknown"),
        ("cus_a", "allowed", "sent"),
        ("cus_a", "refused", "refused"),
        ("cus_a", "allowed", "pending"),
        ("cus_a", "allowed", "unknown"),
        ("cus_a", "allowed", "failed"),
    ];

    fn state(state: DeliveryState) -> LogFilter {
        LogFilter { state: Some(state), ..Default::default() }
    }

    async fn pages_of(store: &Store) -> Result<Vec<Vec<i64>>, StoreError> {
        for (i, (customer, decision, status)) in ROWS.iter().enumerate() {
            sqlx::query(
                "INSERT INTO message_log (customer_id, instance_id, source, recipient, decision, status, created_at) \
                 VALUES ($1, 'ins_1', 'api', '+14155550101', $2, $3, $4)",
            )
            .bind(*customer)
            .bind(*decision)
            .bind(*status)
            .bind(1_000 + i as i64)
            .execute(&store.write)
            .await?;
        }
        let mut pages = Vec::new();
        for (filter, before, limit) in [
            (state(DeliveryState::Pending), None, 50),
            (state(DeliveryState::Pending), Some(7), 50),
            (state(DeliveryState::Pending), None, 1),
            (state(DeliveryState::Unknown), None, 50),
            (state(DeliveryState::Unknown), Some(8), 50),
            (LogFilter { instance_id: Some("ins_1".into()), ..state(DeliveryState::Pending) }, None, 50),
            (LogFilter { instance_id: Some("ins_1".into()), ..state(DeliveryState::Unknown) }, None, 50),
            (LogFilter { decision: Some("refused".into()), ..state(DeliveryState::Pending) }, None, 50),
        ] {
            let rows = store.message_log_page("cus_a", &filter, before, limit).await?;
            pages.push(rows.iter().map(|r| r.id).collect());
        }
        Ok(pages)
    }

    /// The pending and unknown filters answer a customer's own rows in those states,
    /// newest first, by page, on both stores (SQLite's statement names its index).
    #[tokio::test]
    async fn the_pending_and_unknown_filters_find_the_customers_rows_in_those_states() {
        let want: Vec<Vec<i64>> =
            vec![vec![7, 1], vec![1], vec![7], vec![8, 2], vec![2], vec![7, 1], vec![8, 2], vec![]];
        let dir = tempfile::tempdir().unwrap();
        let sqlite =
            Store::open(&format!("sqlite://{}?mode=rwc", dir.path().join("log.db").display()), 2, None).await.unwrap();
        assert_eq!(pages_of(&sqlite).await.unwrap(), want, "SQLite");
        sqlite.close().await;
        let Some((store, admin, db)) = postgres_store("log_states").await else {
            return;
        };
        let pages = pages_of(&store).await;
        drop_database(store, &admin, &db).await;
        assert_eq!(pages.unwrap(), want, "PostgreSQL");
    }

    /// A large customer's pending and unknown rows are read by the indexes of those rows
    /// alone, never by a read of the customer's whole log (`message_log_customer`), which
    /// took 354 ms for `state=pending` with a million rows. On SQLite the store has no
    /// statistics; on PostgreSQL sequential scans are priced out, since an empty table's
    /// plan would read it whole.
    #[tokio::test]
    async fn a_customers_pending_and_unknown_rows_are_read_by_their_own_indexes() {
        let (_dir, conn) = migrated_sqlite("plan.db").await;
        for (filter, index) in
            [(DeliveryState::Pending, "message_log_pending"), (DeliveryState::Unknown, "message_log_customer_unknown")]
        {
            let others = [
                LogFilter::default(),
                LogFilter { instance_id: Some("ins_1".into()), ..Default::default() },
                LogFilter { decision: Some("refused".into()), ..Default::default() },
                LogFilter { request: Some("req_1".into()), since: Some(0), ..Default::default() },
                LogFilter {
                    instance_id: Some("ins_1".into()),
                    source: Some("api".into()),
                    recipient: Some("+1".into()),
                    error_code: Some("E".into()),
                    ..Default::default()
                },
            ];
            for (other, before) in others.into_iter().flat_map(|o| [(o.clone(), None), (o, Some(100))]) {
                let filter = LogFilter { state: Some(filter), ..other };
                let (sql, values) = log_query(Backend::Sqlite, "cus_a", &filter, before, 50);
                let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
                let lines: Vec<String> = plan
                    .query_map(rusqlite::params_from_iter(values), |r| r.get(3))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let plan = lines.join("\n");
                assert!(plan.contains(&format!(" m USING INDEX {index}")), "SQLite, {filter:?}: {plan}");
            }
        }

        let Some((store, admin, db)) = postgres_store("log_states_plan").await else {
            return;
        };
        let (sql, _) = log_query(Backend::Postgres, "cus_a", &state(DeliveryState::Unknown), Some(100), 50);
        let prepare = format!("PREPARE page(text, bigint, bigint) AS {sql}");
        let plans = prepared_plans(store, &admin, &db, &prepare, "EXECUTE page('cus_a', 100, 50)").await;
        for (mode, plan) in plans {
            assert!(plan.contains("message_log_customer_unknown"), "PostgreSQL, {mode}: {plan}");
            assert!(!plan.contains("Seq Scan"), "PostgreSQL, {mode}: {plan}");
        }
    }

    /// 20,000 sends of `cus_a`, four in five delivered; of the rest, one in 200 has a
    /// report that is neither (still sent), and the others none: almost no report lacks
    /// a delivery, which is what PostgreSQL's estimate went by. Then the newest three
    /// sent rows.
    async fn sent_rows(store: &Store) -> Result<Vec<i64>, StoreError> {
        const SEQ: &str = "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 20000)";
        let seed = [
            format!(
                "{SEQ} INSERT INTO message_log (customer_id, instance_id, source, recipient, decision, status, \
                 provider_message_id, created_at) SELECT 'cus_a', 'ins_1', 'api', '+14155550101', 'allowed', \
                 'sent', 'p' || n, n FROM seq"
            ),
            format!(
                "{SEQ} INSERT INTO message_status (instance_id, external_message_id, status, status_rank, \
                 updated_at, delivered_at) SELECT 'ins_1', 'p' || n, 'x', 1, n, \
                 CASE WHEN n % 5 = 0 THEN NULL ELSE n END FROM seq WHERE n % 5 <> 0 OR n % 1000 = 0"
            ),
            "ANALYZE message_log".into(),
            "ANALYZE message_status".into(),
        ];
        for sql in seed {
            sqlx::query(&sql).execute(&store.write).await?;
        }
        let page = store.message_log_page("cus_a", &state(DeliveryState::Sent), None, 3).await?;
        Ok(page.iter().map(|r| r.id).collect())
    }

    /// The sent filter finds rows with no report and rows with a report of neither
    /// delivery nor failure, on both stores. On PostgreSQL, with statistics of a large
    /// customer whose sends are mostly delivered, its page reads the customer's log
    /// backward until it is full, where the left join's null test, estimated at a few
    /// rows, made it hash every report and sort the whole log (1.2 s at a million rows).
    #[tokio::test]
    async fn a_large_customers_sent_rows_are_read_newest_first_until_the_page_is_full() {
        let want = vec![20000, 19995, 19990];
        let dir = tempfile::tempdir().unwrap();
        let sqlite =
            Store::open(&format!("sqlite://{}?mode=rwc", dir.path().join("log.db").display()), 2, None).await.unwrap();
        assert_eq!(sent_rows(&sqlite).await.unwrap(), want, "SQLite");
        sqlite.close().await;
        let Some((store, admin, db)) = postgres_store("log_sent_plan").await else {
            return;
        };
        let checked = async {
            let page = sent_rows(&store).await?;
            let (sql, _) = log_query(Backend::Postgres, "cus_a", &state(DeliveryState::Sent), None, 51);
            let rows = sqlx::query(&format!("EXPLAIN {}", sql.replace("$1", "'cus_a'").replace("$2", "51")))
                .fetch_all(&store.write)
                .await?;
            let plan = rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<String>, _>>()?.join("\n");
            Ok::<_, StoreError>((page, plan))
        }
        .await;
        drop_database(store, &admin, &db).await;
        let (page, plan) = checked.unwrap();
        assert_eq!(page, want, "PostgreSQL");
        assert!(plan.contains("Backward"), "{plan}");
        assert!(!plan.contains("Sort") && !plan.contains("Hash"), "{plan}");
    }
}
