//! `store::customer_days`: the overview's answer from kept days against the log's, after
//! each kind of change, on both stores; a keep waiting for a change in flight; SQLite's plans.

use super::super::test_postgres::{drop_database, migrated_sqlite, postgres_store};
use super::*;
use crate::ingress::evolution::Fact;
use crate::store::now_ms;

const TRACE: &str = r#"[{"module":"content","decision":"deny","code":"marketing_content"}]"#;

/// The overview's three answers counted from the log as before (the oracle).
async fn from_the_log(store: &Store, customer: &str, since: i64) -> Result<Activity, StoreError> {
    Ok(Activity {
        days: store.sends_per_day(Some(customer), since).await?,
        delivery: store.delivery_counts(customer, since).await?,
        refusals: store.refusals_by_rule(Some(customer), since, 10).await?,
    })
}

/// `activity` with the days that have no attempt left out, as the log's answer has them.
async fn activity(store: &Store, customer: &str, since: i64, now: i64) -> Result<Activity, StoreError> {
    let mut activity = store.activity(customer, since, now, i64::MIN, 10).await?;
    activity.days.retain(|d| d.sent + d.refused + d.failed + d.unknown > 0);
    Ok(activity)
}

async fn kept_days(store: &Store, customer: &str) -> Result<Vec<i64>, StoreError> {
    Ok(kept(store, customer).await?.iter().map(|d| d.0).collect())
}

async fn kept(store: &Store, customer: &str) -> Result<Vec<(i64, i64)>, StoreError> {
    let rows = sqlx::query("SELECT day, delivered FROM customer_days WHERE customer_id = $1 ORDER BY day")
        .bind(customer)
        .fetch_all(&store.write)
        .await?;
    rows.iter().map(|r| Ok((r.try_get("day")?, r.try_get("delivered")?))).collect()
}

/// Sends of five days (one of them with a send still pending), their reports, then
/// a late delivery report, the echo of a send whose outcome was unknown, a count
/// taken while a change committed, and an erasure: after each, the overview's answer
/// is the log's, and the closed days are read from what was kept.
async fn exercise(store: &Store) -> Result<(), StoreError> {
    let now = now_ms();
    let today = day_of(now);
    let since = today - 29 * DAY_MS;
    let customer = store.create_customer("Days", None, true).await?.id;
    let other = store.create_customer("Others", None, true).await?.id;
    let instance = store.create_instance(&customer, "days", "simulator", true, None).await?;
    let mut n = 0;
    // (days back, decision, status, with a provider id, delivered, read, recipient)
    let rows: &[(i64, &str, &str, bool, bool, bool, &str)] = &[
        (5, "allowed", "sent", true, true, false, "+14155550101"),
        (5, "allowed", "sent", true, false, false, "+14155550102"),
        (5, "refused", "refused", false, false, false, "+14155550101"),
        (5, "allowed", "failed", false, false, false, "+14155550103"),
        (3, "allowed", "sent", true, true, true, "+14155550101"),
        (3, "allowed", "unknown", true, false, false, "+14155550104"),
        (3, "refused", "refused", false, false, false, "+14155550102"),
        (2, "allowed", "sent", true, true, false, "+14155550101"),
        (2, "allowed", "pending", false, false, false, "+14155550105"),
        (0, "allowed", "sent", true, true, true, "+14155550101"),
        (0, "refused", "refused", false, false, false, "+14155550101"),
        (4, "allowed", "unknown", true, true, false, "+14155550106"),
    ];
    for &(back, decision, status, with_id, delivered, read, to) in rows {
        n += 1;
        let at = if back == 0 { now } else { today - back * DAY_MS + 3_600_000 + n };
        let provider_id = with_id.then(|| format!("p{n}"));
        let trace = (decision == "refused").then_some(TRACE);
        let code = (decision == "refused").then_some("policy_violation");
        for owner in [&customer, &other] {
            sqlx::query(
                "INSERT INTO message_log (customer_id, instance_id, source, recipient, decision, status, \
                 provider_message_id, created_at, policy_trace, error_code) \
                 VALUES ($1, $2, 'api', $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(owner)
            .bind(&instance.id)
            .bind(to)
            .bind(decision)
            .bind(status)
            .bind(provider_id.as_deref().filter(|_| *owner == customer))
            .bind(at)
            .bind(trace)
            .bind(code)
            .execute(&store.write)
            .await?;
        }
        if let Some(id) = provider_id.filter(|_| delivered) {
            sqlx::query(
                "INSERT INTO message_status (instance_id, external_message_id, status, status_rank, updated_at, \
                 delivered_at, read_at) VALUES ($1, $2, $3, $4, $5, $5, $6)",
            )
            .bind(&instance.id)
            .bind(id)
            .bind(if read { "READ" } else { "DELIVERY_ACK" })
            .bind(if read { 3 } else { 2 })
            .bind(at)
            .bind(read.then_some(at))
            .execute(&store.write)
            .await?;
        }
    }
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!(log.days.len(), 5, "{log:?}");
    assert_eq!(activity(store, &customer, since, now).await?, log, "first view");
    // Every closed day but the one with a pending send is kept (yesterday only from an
    // hour after midnight), today is not.
    let closed = |d: &i64| *d + DAY_MS + CLOSED_AFTER_MS <= now;
    let days: Vec<i64> = (1..=29).rev().map(|back| today - back * DAY_MS).filter(closed).collect();
    let pending_day = today - 2 * DAY_MS;
    assert_eq!(
        kept_days(store, &customer).await?,
        days.iter().copied().filter(|d| *d != pending_day).collect::<Vec<_>>()
    );
    // Once its send is settled (here as the sweep of orphans does), that day is kept too,
    // and a view counts only today from the log (on PostgreSQL by looking each report up).
    sqlx::query("UPDATE message_log SET status = 'unknown' WHERE status = 'pending'").execute(&store.write).await?;
    assert_eq!(activity(store, &customer, since, now).await?, log, "the pending day counted again");
    assert_eq!(kept_days(store, &customer).await?, days);
    assert_eq!(activity(store, &customer, since, now).await?, log, "from the kept days");

    // A late report: the kept day counts it, and its generation moves on.
    let report = |id: &str, status: &str| Fact::Status {
        external_id: id.into(),
        remote_jid: Some("14155550102@s.whatsapp.net".into()),
        status: status.into(),
    };
    store.apply_facts(&instance, &[report("p2", "DELIVERY_ACK")], now_ms()).await?;
    let day5 = today - 5 * DAY_MS;
    assert!(kept(store, &customer).await?.contains(&(day5, 2)), "the kept day counted the report");
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!(log.delivery.delivered, 5);
    assert_eq!(activity(store, &customer, since, now).await?, log, "after a late report");
    // A report settles a send whose outcome was unknown: sent, delivered and read.
    store.apply_facts(&instance, &[report("p6", "READ")], now_ms()).await?;
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!((log.delivery.sent, log.delivery.read), (6, 3), "{log:?}");
    assert_eq!(activity(store, &customer, since, now).await?, log, "after an unknown send settled");
    // The provider's echo of a send whose outcome was unknown, already reported delivered.
    let echo =
        Fact::SentEcho { external_id: "p12".into(), remote_jid: "14155550106@s.whatsapp.net".into(), timestamp: None };
    store.apply_facts(&instance, &[echo], now_ms()).await?;
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!((log.delivery.sent, log.delivery.delivered), (7, 7), "{log:?}");
    assert_eq!(activity(store, &customer, since, now).await?, log, "after an echo");

    // A count taken with the generations read before the changes above moved their
    // days on is not kept; with the generations as they are, it is.
    sqlx::query("DELETE FROM customer_days WHERE customer_id = $1").bind(&customer).execute(&store.write).await?;
    let counted = store.count_days(&customer, since, today).await?;
    let closed_days: Vec<Day> = counted.into_values().filter(|d| d.pending == 0).collect();
    let with_rows: Vec<i64> = (2..=5).rev().map(|back| today - back * DAY_MS).collect();
    assert_eq!(closed_days.iter().map(|d| d.counts.day).collect::<Vec<_>>(), with_rows);
    store.keep_days(&customer, &BTreeMap::new(), &closed_days).await?;
    assert_eq!(kept_days(store, &customer).await?, vec![pending_day], "only the day no change reached");
    let generations = store.generations(&customer, since).await?;
    store.keep_days(&customer, &generations, &closed_days).await?;
    assert_eq!(kept_days(store, &customer).await?, with_rows);
    sqlx::query("DELETE FROM customer_days WHERE customer_id = $1").bind(&customer).execute(&store.write).await?;

    // An erasure: the kept days go, and the next view counts the log as it is now.
    assert_eq!(activity(store, &customer, since, now).await?, log);
    store.erase_person(&customer, "+14155550101").await?;
    assert!(kept(store, &customer).await?.is_empty());
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!(log.refusals, vec![("policy_violation".into(), 2), ("policy_violation: marketing_content".into(), 1)]);
    // A view keeps no day before `keep_from` (retention may be deleting its rows).
    let keep_from = today - 3 * DAY_MS;
    let mut fresh = store.activity(&customer, since, now, keep_from, 10).await?;
    fresh.days.retain(|d| d.sent + d.refused + d.failed + d.unknown > 0);
    assert_eq!(fresh, log, "after an erasure");
    assert_eq!(
        kept_days(store, &customer).await?,
        days.iter().copied().filter(|d| *d >= keep_from).collect::<Vec<_>>()
    );
    // The other customer's days were counted apart all along.
    assert_eq!(activity(store, &other, since, now).await?, from_the_log(store, &other, since).await?);
    Ok(())
}

/// Two posts at once about one send of a kept day (its delivery and its read): the kept
/// day counts each once, as the log does.
async fn at_once(store: &Store) -> Result<(), StoreError> {
    let now = now_ms();
    let day = day_of(now) - 3 * DAY_MS;
    let customer = store.create_customer("At once", None, true).await?.id;
    let instance = store.create_instance(&customer, "at-once", "simulator", true, None).await?;
    for i in 0..10 {
        sqlx::query(
            "INSERT INTO message_log (customer_id, instance_id, source, recipient, decision, status, \
             provider_message_id, created_at) VALUES ($1, $2, 'api', '+14155550101', 'allowed', 'sent', $3, $4)",
        )
        .bind(&customer)
        .bind(&instance.id)
        .bind(format!("q{i}"))
        .bind(day + i)
        .execute(&store.write)
        .await?;
    }
    let since = day_of(now) - 29 * DAY_MS;
    activity(store, &customer, since, now).await?;
    assert_eq!(kept(store, &customer).await?.iter().find(|d| d.0 == day), Some(&(day, 0)));
    for i in 0..10 {
        let report = |status: &str| {
            let (store, instance) = (store.clone(), instance.clone());
            let fact = Fact::Status { external_id: format!("q{i}"), remote_jid: None, status: status.into() };
            tokio::spawn(async move { store.apply_facts(&instance, &[fact], now_ms()).await })
        };
        let (delivered, read) = (report("DELIVERY_ACK"), report("READ"));
        delivered.await.expect("delivery")?;
        read.await.expect("read")?;
    }
    let log = from_the_log(store, &customer, since).await?;
    assert_eq!((log.delivery.delivered, log.delivery.read), (10, 10));
    assert_eq!(activity(store, &customer, since, now).await?, log, "two posts at once");
    Ok(())
}

#[tokio::test]
async fn two_posts_at_once_about_one_send_count_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("once.db").display());
    let sqlite = Store::open(&url, 2, None).await.unwrap();
    at_once(&sqlite).await.expect("SQLite");
    sqlite.close().await;
    let Some((store, admin, db)) = postgres_store("customer_days_once").await else {
        return;
    };
    let done = at_once(&store).await;
    drop_database(store, &admin, &db).await;
    done.expect("PostgreSQL");
}

/// A keep waits for a change in flight to the same customer's days (its lock), and
/// then does not keep the day that change moved on.
async fn waits(store: &Store) -> Result<(), StoreError> {
    let customer = store.create_customer("Waits", None, true).await?.id;
    let day = day_of(now_ms()) - 3 * DAY_MS;
    let generations = store.generations(&customer, day).await?;
    let send = |status: &str| SendCount {
        customer_id: customer.clone(),
        created_at: day + 1,
        decision: "allowed".into(),
        status: status.into(),
        delivered: false,
        read: false,
    };
    let mut tx = super::super::ingress::write_transaction(&store.write).await?;
    apply_changes(&mut tx, &[(send("unknown"), send("sent"))], now_ms()).await?;
    let keeping = {
        let (store, customer) = (store.clone(), customer.clone());
        tokio::spawn(async move { store.keep_days(&customer, &generations, &[Day::empty(day)]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!keeping.is_finished(), "the keep waited for the change");
    tx.commit().await?;
    keeping.await.expect("keep")?;
    assert_eq!(kept(store, &customer).await?, vec![], "the day the change moved on was not kept");
    Ok(())
}

#[tokio::test]
async fn a_keep_waits_for_a_change_in_flight_and_drops_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("waits.db").display());
    let sqlite = Store::open(&url, 2, None).await.unwrap();
    waits(&sqlite).await.expect("SQLite");
    sqlite.close().await;
    let Some((store, admin, db)) = postgres_store("customer_days_wait").await else {
        return;
    };
    let done = waits(&store).await;
    drop_database(store, &admin, &db).await;
    done.expect("PostgreSQL");
}

#[tokio::test]
async fn a_customers_closed_days_are_kept_and_stay_what_the_log_says() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("days.db").display());
    let sqlite = Store::open(&url, 2, None).await.unwrap();
    exercise(&sqlite).await.expect("SQLite");
    sqlite.close().await;
    let Some((store, admin, db)) = postgres_store("customer_days").await else {
        return;
    };
    let done = exercise(&store).await;
    drop_database(store, &admin, &db).await;
    done.expect("PostgreSQL");
}

/// On SQLite (no statistics) a day's count reads the customer's index from the
/// range's first id, found in the time index alone: neither the customer's whole log
/// nor every customer's rows of the range.
#[tokio::test]
async fn a_days_count_reads_the_customers_rows_of_its_range() {
    let (_dir, conn) = migrated_sqlite("plan.db").await;
    let plan = |sql: &str| -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let lines: Vec<String> = stmt
            .query_map(rusqlite::params!["cus_1", 0, 1, 5], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        lines.join("; ")
    };
    for sql in [OUTCOMES[0], REPORTS[0], REFUSALS[0]] {
        let plan = plan(sql);
        assert!(plan.contains("USING INDEX message_log_customer (customer_id=? AND id>?)"), "{plan}");
        assert!(!plan.contains("message_log_created"), "{plan}");
    }
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {FIRST_ID}")).unwrap();
    let first: Vec<String> =
        stmt.query_map(rusqlite::params![0, 1], |r| r.get::<_, String>(3)).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        first,
        vec!["SEARCH message_log USING COVERING INDEX message_log_created (created_at>? AND created_at<?)"]
    );
}
