//! The group-commit writer: one bad write in a batch fails alone.

use gateway_sdk_tests::TestContext;
use gateway_server::store::{LogEntry, now_ms};

#[tokio::test]
async fn one_bad_write_in_a_batch_fails_alone() {
    let cx = TestContext::new("bad_write").await;
    let entry = |decision: &str| LogEntry {
        customer_id: cx.tenant.customer_id.clone(),
        source: "api".into(),
        decision: decision.into(),
        status: "refused".into(),
        created_at: now_ms(),
        ..LogEntry::default()
    };
    let good = entry("refused");
    let bad = entry("bogus"); // violates the decision CHECK constraint
    // Queued together, these land in one batch (or a few): the batch that holds the bad
    // write fails as a whole and is retried one write at a time.
    let mut writes: Vec<_> = (0..50).map(|_| cx.store().record_attempt(&good, None)).collect();
    writes.insert(25, cx.store().record_attempt(&bad, None));
    let results = futures::future::join_all(writes).await;
    assert!(results[25].is_err(), "the bad write fails");
    let mut ids: Vec<i64> =
        results.iter().enumerate().filter(|(i, _)| *i != 25).map(|(_, r)| *r.as_ref().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 50, "every good write has its own row");
    assert_eq!(cx.store().recent_log(&cx.tenant.customer_id, 100).await.unwrap().len(), 50);
    cx.teardown().await;
}
