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

/// Two owners demoting (or removing) each other at the same moment: one of them wins,
/// and the customer always keeps an owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_owners_demoting_each_other_at_once_leave_one_owner() {
    let cx = TestContext::new("last_owner").await;
    let store = cx.store();
    let customer = cx.tenant.customer_id.as_str();
    let a = store.create_dashboard_user(Some(customer), "a@example.com", "owner", "test").await.unwrap();
    let b = store.create_dashboard_user(Some(customer), "b@example.com", "owner", "test").await.unwrap();
    for round in 0..10 {
        let (x, y) = tokio::join!(store.set_user_role(&a.id, "admin"), store.set_user_role(&b.id, "admin"));
        assert_eq!([x.unwrap(), y.unwrap()].iter().filter(|d| **d).count(), 1, "round {round}: one demotion");
        assert_eq!(store.active_owner_count(customer).await.unwrap(), 1);
        assert!(
            store.set_user_role(&a.id, "owner").await.unwrap() && store.set_user_role(&b.id, "owner").await.unwrap()
        );
    }
    let (x, y) = tokio::join!(store.disable_user(&a.id), store.disable_user(&b.id));
    assert_eq!([x.unwrap(), y.unwrap()].iter().filter(|d| **d).count(), 1, "one removal");
    assert_eq!(store.active_owner_count(customer).await.unwrap(), 1);
    cx.teardown().await;
}
