//! The review queue: sends a policy held for an operator, and the operator's verdict.

use super::{OpsError, rfc3339};
use crate::store::{ReviewEntry, Store};
use serde_json::{Value, json};

/// A review-queue item as printed.
pub fn review_json(r: &ReviewEntry) -> Value {
    json!({
        "id": r.id, "log_id": r.log_id, "customer_id": r.customer_id, "instance_id": r.instance_id,
        "source": r.source, "purpose": r.purpose, "recipient": r.recipient, "message_type": r.message_type,
        "text": r.text, "policy": r.policy, "reason": r.reason, "risk_score": r.risk_score,
        "status": r.status, "created_at": rfc3339(r.created_at), "decided_at": r.decided_at.and_then(rfc3339),
        "decided_by": r.decided_by, "note": r.note,
    })
}

/// The latest `limit` items with this status (all when `None`), of one customer or
/// all, newest first, as printed.
pub async fn list_reviews(
    store: &Store,
    status: Option<&str>,
    customer_id: Option<&str>,
    limit: i64,
) -> Result<Value, OpsError> {
    let items = store.review_queue(status, customer_id, limit, None).await?;
    Ok(json!({"items": items.iter().map(review_json).collect::<Vec<_>>()}))
}

/// One item, with the message text.
pub async fn review(store: &Store, id: i64) -> Result<ReviewEntry, OpsError> {
    Ok(store.review_entry(id).await?)
}

/// Closes a pending item: `dismissed` (the policy was wrong) or `confirmed` (abuse).
pub async fn decide_review(
    store: &Store,
    id: i64,
    verdict: &str,
    by: &str,
    note: Option<&str>,
) -> Result<ReviewEntry, OpsError> {
    Ok(store.decide_review(id, verdict, by, note).await?)
}
