//! The reads of concurrent sends in one statement (PostgreSQL, `SendReads`): held to
//! the read of each send alone, on one database.

use super::*;
use crate::store::test_postgres::{drop_database, postgres_store};
use crate::store::{Answer, Claim, IdemOwner, StoreOptions};

/// 2026-11-30 06:30 UTC: the hour of `since` (20 hours before) is in the previous day.
const NOW: i64 = 1_796_020_200_000;
const HOUR: i64 = 3_600_000;

/// A send's inputs.
fn args(customer: &str, instance: &str, phone: &str, api_key: Option<&str>, idem_key: Option<&str>) -> ReadArgs {
    ReadArgs {
        customer: customer.into(),
        instance: instance.into(),
        phone: phone.into(),
        api_key: api_key.map(str::to_string),
        idem_key: idem_key.map(str::to_string),
        now: NOW,
    }
}

async fn exec(store: &Store, sql: &str) {
    sqlx::query(sql).execute(&store.write).await.unwrap();
}

#[tokio::test]
async fn a_batch_of_reads_answers_each_as_its_read_alone() {
    let Some((store, admin, db)) = postgres_store("send_reads").await else { return };
    let customer = store.create_customer("reads", None, true).await.unwrap().id;
    let main = store.create_instance(&customer, "main", "simulator", true, None).await.unwrap().id;
    let paused = store.create_instance(&customer, "second", "simulator", true, None).await.unwrap().id;
    store.set_paused(&paused, true, Some("review")).await.unwrap();
    let other = store.create_customer("other", None, true).await.unwrap().id;
    let theirs = store.create_instance(&other, "main", "simulator", true, None).await.unwrap().id;
    store.add_suppression(&customer, "+15550000002", "stop", "api").await.unwrap();
    let live = store.insert_api_key(&customer, "live", "gw_a", "hash-a").await.unwrap().id;
    let revoked = store.insert_api_key(&customer, "old", "gw_b", "hash-b").await.unwrap().id;
    store.revoke_api_key(&revoked).await.unwrap();
    // Counters: to +1 now, 20 hours ago (the previous day) and 30 hours ago (too old);
    // the instance's sends and new recipients today and yesterday.
    let day = NOW - NOW.rem_euclid(24 * HOUR);
    let hour = NOW - NOW.rem_euclid(HOUR);
    for (scope, window, count) in [
        (format!("r24:{main}:+15550000001"), hour, 3),
        (format!("r24:{main}:+15550000001"), hour - 20 * HOUR, 5),
        (format!("r24:{main}:+15550000001"), hour - 30 * HOUR, 7),
        (format!("iday:{main}"), day, 11),
        (format!("iday:{main}"), day - 24 * HOUR, 13),
        (format!("inew:{main}"), day, 17),
        (format!("r24:{theirs}:+15550000001"), hour, 19),
    ] {
        exec(
            &store,
            &format!(
                "INSERT INTO usage_counters (scope, window_start, count, lim, expires_at) \
                 VALUES ('{scope}', {window}, {count}, 1000, {})",
                NOW + 48 * HOUR
            ),
        )
        .await;
    }
    exec(
        &store,
        &format!(
            "INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total, replies_total) \
             VALUES ('{main}', '+15550000001', 1, 2, 23, 29)"
        ),
    )
    .await;
    // An idempotency key taken and in progress, and one answered.
    for (key, answer) in [("order-1", None), ("order-2", Some(Answer { status: 200, body: "{}".into() }))] {
        let owner = IdemOwner {
            customer_id: customer.clone(),
            key: key.into(),
            owner: format!("req-{key}"),
            request_hash: format!("hash-{key}"),
        };
        assert_eq!(store.claim_idempotency(&owner, NOW - 1_000).await.unwrap(), Claim::Claimed);
        if let Some(answer) = answer {
            exec(
                &store,
                &format!(
                    "UPDATE idempotency_keys SET response_status = {}, response_body = '{}' WHERE idem_key = '{key}'",
                    answer.status, answer.body
                ),
            )
            .await;
        }
    }

    let reads = vec![
        args(&customer, &main, "+15550000001", Some(&live), None),
        args(&customer, &main, "+15550000002", Some(&live), None),
        args(&customer, &paused, "+15550000001", Some(&revoked), None),
        args(&customer, &main, "+15550000001", Some(&live), Some("order-1")),
        args(&customer, &main, "+15550000003", None, Some("order-2")),
        args(&customer, &main, "+15550000003", Some(&live), Some("order-3")),
        args(&customer, &theirs, "+15550000001", Some(&live), None),
        args(&other, &theirs, "+15550000001", None, Some("order-1")),
        args("cus_gone", &main, "+15550000001", Some(&live), None),
        args(&customer, "ins_gone", "+15550000001", Some(&live), None),
        // Each with its own time: 18 hours on (the next day: only the counter of the
        // hour 20 hours before that is within its 24 hours, and its key still lives),
        // and 25 hours on (the key has lapsed).
        ReadArgs { now: NOW + 18 * HOUR, ..args(&customer, &main, "+15550000001", Some(&live), Some("order-2")) },
        ReadArgs { now: NOW + 25 * HOUR, ..args(&customer, &main, "+15550000001", Some(&live), Some("order-2")) },
    ];
    let mut alone = Vec::new();
    for read in &reads {
        let context: Option<SendContext> = store.read_one(&SEND_FRESH_SQL[read.keyed()], read.params()).await.unwrap();
        alone.push(format!("{context:?}"));
    }
    // What the reads alone found, so that the comparison means something.
    let found = |i: usize| alone[i].clone();
    assert!(found(0).contains("to_recipient_24h: 8") && found(0).contains("to_recipient_hour: 3"), "{}", found(0));
    assert!(found(0).contains("to_recipient_total: 23") && found(0).contains("replies_from_recipient: 29"));
    assert!(found(0).contains("sent_today: 11") && found(0).contains("new_recipients_today: 17"));
    assert!(found(1).contains("suppressed: true") && found(0).contains("suppressed: false"));
    assert!(found(2).contains("paused: true") && found(2).contains("key_revoked: true"));
    assert!(found(3).contains("req-order-1") || found(3).contains("hash-order-1"), "{}", found(3));
    assert!(found(4).contains("response_status: Some(200)"), "{}", found(4));
    assert!(found(5).contains("key: KeySnapshot(None)") && found(7).contains("key: KeySnapshot(None)"));
    assert!(found(6).contains("instance: None") && found(9).contains("instance: None"));
    assert_eq!(found(8), "None");
    assert!(found(10).contains("to_recipient_24h: 3") && found(10).contains("to_recipient_hour: 0"));
    assert!(found(10).contains("sent_today: 0") && found(10).contains("response_status: Some(200)"));
    assert!(found(11).contains("to_recipient_24h: 0") && found(11).contains("key: KeySnapshot(None)"));

    // One statement over the batch.
    let queued: Vec<Queued> = reads.iter().map(|a| Queued { args: a.clone(), reply: oneshot::channel().0 }).collect();
    let batched = read_batch(&store.read, &queued).await.unwrap();
    assert_eq!(batched.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>(), alone);

    // Through the queue, all at once: one statement reads them all (other tests' reads
    // count in the same totals, each at most a statement of its own).
    let (batches, read_count) = read_stats();
    let answers = futures::future::join_all(reads.iter().map(|read| store.read_fresh(read))).await;
    let (batches_after, reads_after) = read_stats();
    let answers: Vec<String> = answers.into_iter().map(|a| format!("{:?}", a.unwrap())).collect();
    assert_eq!(answers, alone);
    let (statements, answered) = (batches_after - batches, reads_after - read_count);
    assert!(answered - statements >= reads.len() as u64 - 1, "{answered} reads in {statements} statements");

    drop_database(store, &admin, &db).await;
}

#[tokio::test]
async fn a_batch_that_does_not_answer_in_time_answers_each_read_unavailable() {
    let Some((store, admin, db)) = postgres_store("send_reads_stall").await else { return };
    let customer = store.create_customer("stall", None, true).await.unwrap().id;
    let main = store.create_instance(&customer, "main", "simulator", true, None).await.unwrap().id;
    let timeout = Duration::from_millis(500);
    let quick =
        Store::open_with(&store.url, 4, None, StoreOptions { timeout, ..StoreOptions::default() }).await.unwrap();
    let reads: Vec<ReadArgs> = (0..3).map(|i| args(&customer, &main, &format!("+1555000000{i}"), None, None)).collect();

    // Another transaction holds the customers' table: the batch's statement waits on it.
    let mut holder = store.write.begin().await.unwrap();
    sqlx::query("LOCK TABLE customers IN ACCESS EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let stalled = futures::future::join_all(reads.iter().map(|read| quick.read_fresh(read)));
    let answers =
        tokio::time::timeout(Duration::from_secs(30), stalled).await.expect("each read answered, never a hang");
    for answer in answers {
        assert!(
            matches!(answer, Err(StoreError::Unavailable(ref why)) if why == "no answer within 500 ms"),
            "{answer:?}"
        );
    }
    holder.rollback().await.unwrap();

    // The next batch reads again.
    let answers = futures::future::join_all(reads.iter().map(|read| quick.read_fresh(read))).await;
    assert!(answers.iter().all(|a| matches!(a, Ok(Some(c)) if c.instance.is_some())), "{answers:?}");
    quick.close().await;
    drop_database(store, &admin, &db).await;
}

#[test]
fn the_batch_reads_the_counters_of_the_pacing_scopes() {
    let quoted = |s: &str| format!("'{s}'");
    assert_eq!(BATCHED.instance_day, quoted(PacingScopes::INSTANCE_DAY));
    assert_eq!(BATCHED.recipient_hour, quoted(PacingScopes::RECIPIENT_HOUR));
    assert_eq!(BATCHED.new_recipient_day, quoted(PacingScopes::NEW_RECIPIENT_DAY));
}

/// The send's reads on SQLite name their columns, so each thread keeps their maps of
/// columns (`rows::Columns`): a `*` in them would have each row build its map again,
/// a quarter of the read's CPU (BENCHMARKS.md, issue 22, thirtieth session).
#[test]
fn the_sends_reads_keep_their_maps_of_columns() {
    for sql in SEND_CONTEXT_SQL.iter().chain(SEND_FRESH_SQL.iter()) {
        assert!(!crate::store::rows::selects_star(sql), "{sql}");
    }
}
