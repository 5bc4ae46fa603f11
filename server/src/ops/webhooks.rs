//! Customer webhooks: an instance's endpoint (set, shown, enabled, its secret rotated),
//! its delivery attempts, and deliveries outside the schedule.

use super::{OpsError, rfc3339};
use crate::config::Config;
use crate::store::{Store, WebhookAttempt, WebhookEndpoint, now_ms};
use crate::webhooks;
use serde_json::{Value, json};

/// An endpoint as printed (never its secrets).
pub fn webhook_json(w: &WebhookEndpoint) -> Value {
    let now = now_ms();
    json!({
        "instance_id": w.instance_id,
        "url": w.url,
        "events": w.events,
        "signed": w.secret.is_some(),
        "previous_secret_signs_until": w.previous_secret_until.filter(|t| *t > now).and_then(rfc3339),
        "enabled": w.disabled_at.is_none(),
        "disabled_at": w.disabled_at.and_then(rfc3339),
        "disabled_reason": w.disabled_reason,
        "failing_since": w.failing_since.and_then(rfc3339),
        "updated_at": rfc3339(w.updated_at),
    })
}

/// An attempt as printed.
pub fn attempt_json(a: &WebhookAttempt) -> Value {
    json!({
        "id": a.id,
        "event_id": a.outbox_id,
        "event": a.event_type,
        "url": a.url,
        "trigger": a.trigger,
        "attempt": a.attempt,
        "attempted_at": rfc3339(a.attempted_at),
        "status": a.status_code,
        "latency_ms": a.latency_ms,
        "succeeded": a.succeeded,
        "error": a.error,
        "response_body": a.response_body,
    })
}

/// The event names of `--events`: a comma-separated list of the 16 names, or `all`.
pub fn parse_events(list: &str) -> Result<Vec<String>, OpsError> {
    if list.trim() == "all" {
        return Ok(gateway_api::events::EVENT_NAMES.iter().map(|e| e.to_string()).collect());
    }
    let mut events = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !gateway_api::events::EVENT_NAMES.contains(&name) {
            return Err(OpsError::Invalid(format!(
                "{name:?} is not an event; use all or some of {}",
                gateway_api::events::EVENT_NAMES.join(", ")
            )));
        }
        if !events.iter().any(|e| e == name) {
            events.push(name.to_string());
        }
    }
    if events.is_empty() {
        return Err(OpsError::Invalid("choose at least one event".into()));
    }
    Ok(events)
}

/// How `webhook set` treats the signing secret.
pub enum SecretChoice {
    /// Keep the current one (a new endpoint gets a generated one).
    Keep,
    /// Use this one.
    Given(String),
    /// Deliver unsigned.
    None,
}

/// Creates or replaces an instance's endpoint: the URL is checked now (https; http only
/// to loopback with the development flag; every resolved address allowed), the events
/// must be known. A generated or given secret is in the returned JSON, shown this once.
pub async fn set_webhook(
    store: &Store,
    config: &Config,
    instance_id: &str,
    url: &str,
    events: &str,
    secret: SecretChoice,
) -> Result<Value, OpsError> {
    let events = parse_events(events)?;
    webhooks::check_url(url, config.allow_loopback_targets)
        .await
        .map_err(|e| OpsError::Invalid(format!("the URL is refused: {e}")))?;
    let current = store.webhook(instance_id).await?;
    let (secret, shown) = match secret {
        SecretChoice::Given(s) if s.len() < 16 => {
            return Err(OpsError::Invalid("a signing secret has at least 16 characters".into()));
        }
        SecretChoice::Given(s) => (Some(s.clone()), Some(s)),
        SecretChoice::None => (None, None),
        SecretChoice::Keep => match current {
            Some(c) => (c.secret, None),
            None => {
                let s = webhooks::new_secret();
                (Some(s.clone()), Some(s))
            }
        },
    };
    let endpoint = store.set_webhook(instance_id, url, &events, secret.as_deref()).await?;
    let mut out = webhook_json(&endpoint);
    if let Some(s) = shown {
        out["secret"] = Value::String(s);
    }
    Ok(out)
}

/// An instance's endpoint, as printed.
pub async fn show_webhook(store: &Store, instance_id: &str) -> Result<Value, OpsError> {
    let endpoint = store
        .webhook(instance_id)
        .await?
        .ok_or_else(|| OpsError::Invalid(format!("instance {instance_id} has no webhook")))?;
    Ok(webhook_json(&endpoint))
}

/// Re-enables a disabled endpoint; returns it as printed.
pub async fn enable_webhook(store: &Store, instance_id: &str) -> Result<Value, OpsError> {
    store.enable_webhook(instance_id).await?;
    show_webhook(store, instance_id).await
}

/// Replaces the signing secret; the previous one keeps signing for 24 hours. The new
/// secret is in the returned JSON, shown this once.
pub async fn rotate_webhook_secret(store: &Store, instance_id: &str) -> Result<Value, OpsError> {
    let secret = webhooks::new_secret();
    store.rotate_webhook_secret(instance_id, &secret, now_ms() + webhooks::ROTATION_OVERLAP_MS).await?;
    let endpoint = store.webhook(instance_id).await?.ok_or_else(|| OpsError::Invalid("no endpoint".into()))?;
    let mut out = webhook_json(&endpoint);
    out["secret"] = Value::String(secret);
    Ok(out)
}

/// The latest `limit` delivery attempts to an instance's endpoint, newest first.
pub async fn webhook_attempts(store: &Store, instance_id: &str, limit: i64) -> Result<Value, OpsError> {
    let attempts = store.recent_attempts(instance_id, limit).await?;
    Ok(json!({"instance_id": instance_id, "attempts": attempts.iter().map(attempt_json).collect::<Vec<_>>()}))
}

/// Puts every event of the instance since `since_ms` that was not delivered (failed,
/// 410, or skipped while the endpoint was disabled) back on a fresh schedule.
pub async fn recover_webhook_events(store: &Store, instance_id: &str, since_ms: i64) -> Result<Value, OpsError> {
    let recovered = store.recover_events(instance_id, since_ms).await?;
    Ok(json!({"instance_id": instance_id, "recovered": recovered}))
}

/// One attempt outside the schedule: a resend of event `event_id`, or a test event to
/// `instance_id`'s endpoint when `event_id` is `None`.
pub async fn webhook_attempt_now(
    store: &Store,
    config: &Config,
    instance_id: Option<&str>,
    event_id: Option<i64>,
) -> Result<Value, OpsError> {
    let (event, trigger) = match event_id {
        Some(id) => {
            let event = store.outbox_event(id).await?.ok_or_else(|| OpsError::Invalid(format!("no event {id}")))?;
            (Some(event), "manual")
        }
        None => (None, "test"),
    };
    let instance = match (&event, instance_id) {
        (Some(e), _) => e.instance_id.clone(),
        (None, Some(i)) => Some(i.to_string()),
        (None, None) => None,
    };
    let instance = instance.ok_or_else(|| OpsError::Invalid("the event has no instance".into()))?;
    let endpoint = store
        .webhook(&instance)
        .await?
        .ok_or_else(|| OpsError::Invalid(format!("instance {instance} has no webhook endpoint")))?;
    let event = event.unwrap_or_else(|| webhooks::test_event(&endpoint));
    let client = webhooks::http_client(&config.webhooks, config.allow_loopback_targets);
    let attempt =
        webhooks::deliver_once(store, &client, &endpoint, &event, trigger, config.allow_loopback_targets).await?;
    Ok(attempt_json(&attempt))
}
