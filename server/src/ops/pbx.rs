//! PBX integrations: created (secrets shown once), shown, their settings, templates,
//! secrets and received events.

use super::{OpsError, in_range, rfc3339};
use crate::bounds;
use crate::config::Config;
use crate::pbx::{auth, template};
use crate::store::{PbxEvent, PbxIntegration, PbxSettingsUpdate, PbxTemplate, Store};
use gateway_api::{MessagePurpose, PbxEventType};
use serde_json::{Value, json};

/// An integration as printed (never its secrets; see [`create_pbx`]).
pub fn pbx_json(p: &PbxIntegration, templates: &[PbxTemplate], config: &Config) -> Value {
    json!({
        "integration_id": p.id,
        "customer_id": p.customer_id,
        "instance_id": p.instance_id,
        "webhook_path": format!("/integrations/pbx/webhook/{}", p.id),
        "secret_prefix": p.secret_prefix,
        "hmac": p.hmac_secret.is_some(),
        "business_name": p.business_name,
        "rate_per_minute": p.rate_per_minute.unwrap_or(config.pbx.rate_per_minute),
        "burst": p.burst.unwrap_or(config.pbx.burst),
        "cooldown_seconds": p.cooldown_seconds.unwrap_or(config.pbx.cooldown_minutes.saturating_mul(60)),
        "strict_window_hours": p.strict_window_hours,
        "ip_allowlist": p.ip_allowlist,
        "created_at": rfc3339(p.created_at),
        "secret_rotated_at": p.secret_rotated_at.and_then(rfc3339),
        "templates": templates.iter().map(|t| json!({"event_type": t.event_type, "text": t.body, "purpose": t.purpose}))
            .collect::<Vec<_>>(),
    })
}

/// A received PBX event as printed.
pub fn pbx_event_json(e: &PbxEvent) -> Value {
    json!({
        "id": e.id,
        "event_type": e.event_type,
        "action": e.action,
        "status": e.status_code,
        "error": e.error_code,
        "phone": e.phone,
        "message_id": e.message_id,
        "external_message_id": e.external_message_id,
        "received_at": rfc3339(e.created_at),
    })
}

/// An integration and its templates, as printed.
pub async fn show_pbx(store: &Store, config: &Config, id: i64) -> Result<Value, OpsError> {
    let integration =
        store.pbx_integration(id).await?.ok_or_else(|| OpsError::Invalid(format!("no PBX integration {id}")))?;
    Ok(pbx_json(&integration, &store.pbx_templates(id).await?, config))
}

/// A PBX cooldown given in minutes, as stored (seconds), checked before it is multiplied.
pub fn cooldown_seconds(minutes: i64) -> Result<i64, OpsError> {
    in_range("the cooldown in minutes", Some(minutes), &bounds::PBX_COOLDOWN_MINUTES)?;
    Ok(minutes * 60)
}

/// Creates a PBX integration on one of the customer's instances (id or name); the
/// returned JSON holds the webhook secret and, with `hmac`, the signing secret, shown
/// this once.
pub async fn create_pbx(
    store: &Store,
    customer_id: &str,
    instance: &str,
    hmac: bool,
    business_name: Option<&str>,
) -> Result<Value, OpsError> {
    let instance = store
        .find_instance(customer_id, instance)
        .await?
        .ok_or_else(|| OpsError::Invalid(format!("customer {customer_id} has no instance {instance:?}")))?;
    let secret = auth::new_webhook_secret();
    let signing = hmac.then(auth::new_signing_secret);
    let business_name = business_name.map(str::trim).filter(|n| !n.is_empty());
    let id = store
        .create_pbx_integration(
            customer_id,
            &instance.id,
            &secret.hash,
            &secret.prefix,
            signing.as_deref(),
            business_name,
        )
        .await?;
    let mut out = json!({
        "integration_id": id,
        "instance_id": instance.id,
        "webhook_path": format!("/integrations/pbx/webhook/{id}"),
        "webhook_secret": secret.plaintext,
    });
    if let Some(signing) = signing {
        out["hmac_secret"] = Value::String(signing);
    }
    // What would surprise: the PBX would get 403 module_not_enabled on every event.
    if !store.customer(customer_id).await?.module_pbx {
        out["warning"] = Value::String(format!(
            "the customer's pbx module is off: every event gets 403 module_not_enabled until \
             `gateway customer modules --customer {customer_id} --pbx on`"
        ));
    }
    Ok(out)
}

/// Replaces the webhook secret (and, with `hmac`, the signing secret); the old ones
/// stop working at once. The new secrets are in the returned JSON, shown this once.
pub async fn rotate_pbx_secret(store: &Store, id: i64, hmac: bool) -> Result<Value, OpsError> {
    let secret = auth::new_webhook_secret();
    let signing = hmac.then(auth::new_signing_secret);
    store.rotate_pbx_secret(id, &secret.hash, &secret.prefix, signing.as_deref().map(Some)).await?;
    let mut out = json!({"integration_id": id, "webhook_secret": secret.plaintext});
    if let Some(signing) = signing {
        out["hmac_secret"] = Value::String(signing);
    }
    Ok(out)
}

/// Sets the template of one event type (checked: known event, known placeholders).
pub async fn set_pbx_template(store: &Store, id: i64, event: &str, text: &str, purpose: &str) -> Result<(), OpsError> {
    let event_type = PbxEventType::parse(event)
        .filter(|e| e.is_templatable())
        .ok_or_else(|| OpsError::Invalid(format!("{event:?} is not an event type that takes a template")))?;
    let purpose = MessagePurpose::parse(purpose)
        .ok_or_else(|| OpsError::Invalid(format!("{purpose:?} is not a message purpose")))?;
    template::check(text).map_err(OpsError::Invalid)?;
    Ok(store.set_pbx_template(id, event_type.as_str(), text, purpose.as_str()).await?)
}

/// Removes the template of an event type (its events are then ignored); `removed`
/// says whether there was one.
pub async fn remove_pbx_template(store: &Store, id: i64, event: &str) -> Result<Value, OpsError> {
    let removed = store.remove_pbx_template(id, event).await?;
    Ok(json!({"integration_id": id, "event_type": event, "removed": removed}))
}

/// Checks and applies a settings change.
pub async fn update_pbx(store: &Store, id: i64, update: &PbxSettingsUpdate) -> Result<(), OpsError> {
    in_range("the rate per minute", update.rate_per_minute.flatten(), &bounds::PBX_RATE_PER_MINUTE)?;
    in_range("the burst", update.burst.flatten(), &bounds::PBX_BURST)?;
    in_range("the strict window in hours", update.strict_window_hours.flatten(), &bounds::PBX_STRICT_WINDOW_HOURS)?;
    let most = bounds::PBX_COOLDOWN_MINUTES.end() * 60;
    in_range("the cooldown in seconds", update.cooldown_seconds.flatten(), &(0..=most))?;
    if let Some(Some(list)) = &update.ip_allowlist {
        auth::parse_allowlist(list).map_err(OpsError::Invalid)?;
    }
    Ok(store.update_pbx_settings(id, update).await?)
}

/// The latest `limit` events an integration received, newest first.
pub async fn pbx_events(store: &Store, id: i64, limit: i64) -> Result<Value, OpsError> {
    let events = store.recent_pbx_events(id, limit).await?;
    Ok(json!({"integration_id": id, "events": events.iter().map(pbx_event_json).collect::<Vec<_>>()}))
}
