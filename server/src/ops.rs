//! Operator actions: what the `gateway` CLI (and, later, the operator console) does to
//! customers, instances, keys and suppression. Each returns a JSON record to print.

use crate::apikey;
use crate::bounds;
use crate::config::Config;
use crate::pbx;
use crate::phone;
use crate::provider;
use crate::store::{
    ApiKeyRecord, Customer, Instance, LimitOverrides, PbxEvent, PbxIntegration, PbxSettingsUpdate, PbxTemplate,
    PlanStatus, Store, StoreError, WebhookAttempt, WebhookEndpoint, now_ms,
};
use crate::webhooks;
use gateway_api::{MessagePurpose, PbxEventType};
use serde_json::{Value, json};

/// An operator action that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// A customer as printed.
pub fn customer_json(c: &Customer) -> Value {
    let now = now_ms();
    json!({
        "id": c.id,
        "name": c.name,
        "plan": c.plan,
        "plan_status": c.plan_status(now).as_str(),
        "plan_period_start": c.plan_period_start.and_then(rfc3339),
        "plan_period_end": c.plan_period_end.and_then(rfc3339),
        "modules": {"api": c.module_api, "pbx": c.module_pbx},
        "limit_overrides": {
            "daily": c.overrides.daily,
            "monthly": c.overrides.monthly,
            "instance_per_minute": c.overrides.instance_per_minute,
            "recipient_per_minute": c.overrides.recipient_per_minute,
        },
        "approved_purposes": match &c.approved_purposes {
            Some(p) => json!(p),
            None => json!(gateway_policy_model::PURPOSES),
        },
    })
}

/// A comma-separated list of purposes, each one of the five.
pub fn purposes_arg(raw: &str) -> anyhow::Result<Vec<String>> {
    let purposes: Vec<String> = raw.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if let Some(bad) = purposes.iter().find(|p| !gateway_policy_model::PURPOSES.contains(&p.as_str())) {
        anyhow::bail!("{bad:?} is not a purpose (use {})", gateway_policy_model::PURPOSES.join(", "));
    }
    Ok(purposes)
}

/// A review-queue item as printed.
pub fn review_json(r: &crate::store::ReviewEntry) -> Value {
    json!({
        "id": r.id, "log_id": r.log_id, "customer_id": r.customer_id, "instance_id": r.instance_id,
        "source": r.source, "purpose": r.purpose, "recipient": r.recipient, "message_type": r.message_type,
        "text": r.text, "policy": r.policy, "reason": r.reason, "risk_score": r.risk_score,
        "status": r.status, "created_at": rfc3339(r.created_at), "decided_at": r.decided_at.and_then(rfc3339),
        "decided_by": r.decided_by, "note": r.note,
    })
}

/// An instance as printed.
pub fn instance_json(i: &Instance) -> Value {
    json!({
        "id": i.id,
        "customer_id": i.customer_id,
        "name": i.name,
        "provider": i.provider,
        "connection_state": i.connection_state,
        "paused": i.paused,
        "paused_reason": i.paused_reason,
    })
}

/// A key as printed (never the key itself; see [`create_key`]).
pub fn key_json(k: &ApiKeyRecord) -> Value {
    json!({
        "id": k.id,
        "customer_id": k.customer_id,
        "name": k.name,
        "prefix": k.prefix,
        "revoked": k.revoked_at.is_some(),
        "revoked_at": k.revoked_at.and_then(rfc3339),
        "last_used_at": k.last_used_at.and_then(rfc3339),
    })
}

fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn check_plan(plan: &str) -> Result<(), OpsError> {
    match plan {
        "starter" | "scale" => Ok(()),
        other => Err(OpsError::Invalid(format!("plan must be starter or scale, not {other:?}"))),
    }
}

/// Creates a customer; `plan` None means no plan yet.
pub async fn create_customer(
    store: &Store,
    name: &str,
    plan: Option<&str>,
    approve: bool,
) -> Result<Customer, OpsError> {
    if name.trim().is_empty() {
        return Err(OpsError::Invalid("the name must not be empty".into()));
    }
    if let Some(plan) = plan {
        check_plan(plan)?;
    }
    Ok(store.create_customer(name.trim(), plan, approve).await?)
}

/// Assigns (or renews) a plan.
pub async fn assign_plan(store: &Store, customer_id: &str, plan: &str, approve: bool) -> Result<Customer, OpsError> {
    check_plan(plan)?;
    Ok(store.assign_plan(customer_id, plan, approve).await?)
}

/// Checks `value` (when given) against its documented range.
fn in_range(name: &str, value: Option<i64>, range: &std::ops::RangeInclusive<i64>) -> Result<(), OpsError> {
    match value {
        Some(v) => bounds::within(name, v, range).map(|_| ()).map_err(OpsError::Invalid),
        None => Ok(()),
    }
}

/// Sets an operator's reviewed limit overrides.
pub async fn set_limits(store: &Store, customer_id: &str, limits: &LimitOverrides) -> Result<Customer, OpsError> {
    in_range("the daily limit", limits.daily, &bounds::DAILY_MESSAGES)?;
    in_range("the monthly limit", limits.monthly, &bounds::MONTHLY_MESSAGES)?;
    in_range("sends a minute per instance", limits.instance_per_minute, &bounds::INSTANCE_PER_MINUTE)?;
    in_range("sends a minute per recipient", limits.recipient_per_minute, &bounds::RECIPIENT_PER_MINUTE)?;
    Ok(store.set_limits(customer_id, limits).await?)
}

/// Sets how many days an instance's number has been in use (its warm-up).
pub async fn set_instance_age(store: &Store, instance_id: &str, days: i64) -> Result<Instance, OpsError> {
    in_range("the age in days", Some(days), &bounds::INSTANCE_AGE_DAYS)?;
    Ok(store.set_instance_age(instance_id, days).await?)
}

/// A PBX cooldown given in minutes, as stored (seconds), checked before it is multiplied.
pub fn cooldown_seconds(minutes: i64) -> Result<i64, OpsError> {
    in_range("the cooldown in minutes", Some(minutes), &bounds::PBX_COOLDOWN_MINUTES)?;
    Ok(minutes * 60)
}

/// Creates an instance, within the plan's instance cap while the plan is active.
pub async fn create_instance(
    store: &Store,
    config: &Config,
    customer_id: &str,
    name: &str,
    connected: bool,
) -> Result<Instance, OpsError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 64 {
        return Err(OpsError::Invalid("the name must be 1 to 64 characters".into()));
    }
    create_instance_with(store, config, customer_id, name, &config.provider, connected).await
}

/// Creates an instance on a given provider. On `evolution` the instance is also created
/// at the provider (named by the gateway's instance id); if that fails, it is not kept.
/// `connected` applies to the simulator only; an Evolution instance connects by pairing.
pub async fn create_instance_with(
    store: &Store,
    config: &Config,
    customer_id: &str,
    name: &str,
    provider: &str,
    connected: bool,
) -> Result<Instance, OpsError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 64 {
        return Err(OpsError::Invalid("the name must be 1 to 64 characters".into()));
    }
    let evolution = match provider {
        "simulator" => None,
        "evolution" => Some(crate::provider::evolution::Evolution::from_config(config).ok_or_else(|| {
            OpsError::Invalid("the evolution provider needs evolution_url and evolution_api_key".into())
        })?),
        other => return Err(OpsError::Invalid(format!("provider must be simulator or evolution, not {other:?}"))),
    };
    let customer = store.customer(customer_id).await?;
    let cap = match customer.plan_status(now_ms()) {
        PlanStatus::Active => customer.plan.as_deref().and_then(|p| config.plan(p)).map(|p| p.instances),
        _ => None,
    };
    let instance = store.create_instance(customer_id, name, provider, connected && evolution.is_none(), cap).await?;
    if let Some(evolution) = evolution {
        // The provider posts this instance's events to the ingress with a secret of its
        // own, which only the provider is given.
        let secret = crate::ingress::new_secret();
        store.set_ingress_secret_hash(&instance.id, &pbx::auth::hash_secret(&secret)).await?;
        let webhook = provider::evolution::WebhookTarget {
            url: crate::ingress::url(&config.public_base_url(), &instance.id),
            header: crate::ingress::SECRET_HEADER.to_string(),
            secret,
        };
        if let Err(e) = evolution.create_instance(&instance.id, Some(&webhook)).await {
            store.delete_instance(&instance.id).await?;
            return Err(OpsError::Invalid(format!("the provider did not create the instance: {e}")));
        }
    }
    Ok(instance)
}

/// Pairing: the current QR (data URL) and pairing code of an Evolution instance, or
/// that it is connected (then the stored state says so). A QR the provider fails to
/// return (`count: 0`) is asked for again, then reported as expired, never as a blank.
pub async fn instance_qr(store: &Store, config: &Config, id: &str, number: Option<&str>) -> Result<Value, OpsError> {
    let instance = store.instance(id).await?;
    if instance.provider == "simulator" {
        return simulator_qr(store, &instance).await;
    }
    let (instance, evolution) = evolution_instance(store, config, id).await?;
    for _ in 0..3 {
        match evolution.connect(&instance.id, number).await.map_err(|e| OpsError::Invalid(e.to_string()))? {
            provider::evolution::Connect::Open => {
                store.observe_connection(&instance.id, "open").await?;
                return Ok(json!({"instance_id": instance.id, "state": "open"}));
            }
            provider::evolution::Connect::Qr(qr) if qr.is_present() => {
                store.observe_connection(&instance.id, "connecting").await?;
                return Ok(json!({"instance_id": instance.id, "state": "qr_pending", "qr": qr.base64,
                                 "qr_code": qr.code, "pairing_code": qr.pairing_code, "qr_count": qr.count}));
            }
            provider::evolution::Connect::Qr(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
    Ok(json!({"instance_id": instance.id, "state": "qr_expired",
              "hint": "the provider returned no QR code; run this again, or log the instance out and retry"}))
}

/// Simulated pairing: a real QR image (SVG data URL) of a fresh pairing token; the
/// instance connects when the operator confirms ([`confirm_pairing`]), as a phone
/// would after scanning.
async fn simulator_qr(store: &Store, instance: &Instance) -> Result<Value, OpsError> {
    if instance.connection_state == "open" {
        return Ok(json!({"instance_id": instance.id, "state": "open"}));
    }
    let token = format!("SIMPAIR-{}", crate::apikey::random_base62(24));
    let code = qrcode::QrCode::new(token.as_bytes()).map_err(|e| OpsError::Invalid(format!("QR: {e}")))?;
    let svg = code.render::<qrcode::render::svg::Color<'_>>().min_dimensions(200, 200).build();
    use base64::Engine;
    let data_url = format!("data:image/svg+xml;base64,{}", base64::engine::general_purpose::STANDARD.encode(svg));
    store.store_qr(&instance.id, Some(&data_url)).await?;
    store.observe_connection(&instance.id, "connecting").await?;
    Ok(json!({"instance_id": instance.id, "state": "qr_pending", "qr": data_url, "qr_code": token,
              "hint": "simulator: run `gateway instance confirm-pairing ID` to connect, as a phone would"}))
}

/// Simulated pairing: the operator confirms the QR was "scanned"; the instance connects.
pub async fn confirm_pairing(store: &Store, id: &str) -> Result<Instance, OpsError> {
    let instance = store.instance(id).await?;
    if instance.provider != "simulator" {
        return Err(OpsError::Invalid("only simulator instances are paired by confirmation".into()));
    }
    if instance.connection_state != "connecting" {
        return Err(OpsError::Invalid("show the QR first (`gateway instance qr ID`)".into()));
    }
    store.store_qr(id, None).await?;
    store.observe_connection(id, "open").await?;
    Ok(store.instance(id).await?)
}

/// Logs an Evolution instance out of the messaging network (to pair another phone, or
/// after a suspected ban); the stored state follows.
pub async fn logout_instance(store: &Store, config: &Config, id: &str) -> Result<Instance, OpsError> {
    let (instance, evolution) = evolution_instance(store, config, id).await?;
    evolution.logout(&instance.id).await.map_err(|e| OpsError::Invalid(e.to_string()))?;
    store.observe_connection(&instance.id, "logged_out").await?;
    Ok(store.instance(&instance.id).await?)
}

/// Reads an Evolution instance's connection state from the provider and stores it.
pub async fn sync_instance_state(store: &Store, config: &Config, id: &str) -> Result<Instance, OpsError> {
    let (instance, evolution) = evolution_instance(store, config, id).await?;
    let state = evolution.connection_state(&instance.id).await.map_err(|e| OpsError::Invalid(e.to_string()))?;
    store.observe_connection(&instance.id, &state).await?;
    Ok(store.instance(&instance.id).await?)
}

async fn evolution_instance(
    store: &Store,
    config: &Config,
    id: &str,
) -> Result<(Instance, provider::evolution::Evolution), OpsError> {
    let instance = store.instance(id).await?;
    if instance.provider != "evolution" {
        return Err(OpsError::Invalid(format!("instance {id} is on the {} provider", instance.provider)));
    }
    let evolution = crate::provider::evolution::Evolution::from_config(config)
        .ok_or_else(|| OpsError::Invalid("the evolution provider needs evolution_url and evolution_api_key".into()))?;
    Ok((instance, evolution))
}

/// Creates an API key; the returned JSON holds the key, shown this once.
pub async fn create_key(store: &Store, customer_id: &str, name: &str) -> Result<Value, OpsError> {
    let new = apikey::generate();
    let record = store.insert_api_key(customer_id, name, &new.prefix, &new.hash).await?;
    let mut out = key_json(&record);
    out["api_key"] = Value::String(new.plaintext);
    Ok(out)
}

/// Normalises a phone given on the command line.
pub fn phone_arg(raw: &str) -> Result<String, OpsError> {
    phone::normalize(raw)
        .map(|p| p.e164)
        .ok_or_else(|| OpsError::Invalid(format!("{raw:?} is not a valid number in international format")))
}

/// Name of the demo customer.
pub const DEMO_CUSTOMER: &str = "Demo customer";

/// The demo tenant: a Starter customer, a connected simulated instance named `demo`,
/// and a new API key. Running it again reuses the customer and the instance (renewing
/// an expired plan) and prints a fresh key.
pub async fn demo(store: &Store, config: &Config) -> Result<Value, OpsError> {
    let customer = match store.customer_by_name(DEMO_CUSTOMER).await? {
        Some(c) if c.plan_status(now_ms()) == PlanStatus::Active => c,
        Some(c) => store.assign_plan(&c.id, "starter", true).await?,
        None => store.create_customer(DEMO_CUSTOMER, Some("starter"), true).await?,
    };
    let instance = match store.find_instance(&customer.id, "demo").await? {
        Some(i) => i,
        None => create_instance(store, config, &customer.id, "demo", true).await?,
    };
    let key = create_key(store, &customer.id, "demo").await?;
    Ok(json!({
        "customer_id": customer.id,
        "instance_id": instance.id,
        "instance_name": instance.name,
        "api_key_id": key["id"],
        "api_key": key["api_key"],
    }))
}

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
    let secret = pbx::auth::new_webhook_secret();
    let signing = hmac.then(pbx::auth::new_signing_secret);
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
    let secret = pbx::auth::new_webhook_secret();
    let signing = hmac.then(pbx::auth::new_signing_secret);
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
    pbx::template::check(text).map_err(OpsError::Invalid)?;
    Ok(store.set_pbx_template(id, event_type.as_str(), text, purpose.as_str()).await?)
}

/// Checks and applies a settings change.
pub async fn update_pbx(store: &Store, id: i64, update: &PbxSettingsUpdate) -> Result<(), OpsError> {
    in_range("the rate per minute", update.rate_per_minute.flatten(), &bounds::PBX_RATE_PER_MINUTE)?;
    in_range("the burst", update.burst.flatten(), &bounds::PBX_BURST)?;
    in_range("the strict window in hours", update.strict_window_hours.flatten(), &bounds::PBX_STRICT_WINDOW_HOURS)?;
    let most = bounds::PBX_COOLDOWN_MINUTES.end() * 60;
    in_range("the cooldown in seconds", update.cooldown_seconds.flatten(), &(0..=most))?;
    if let Some(Some(list)) = &update.ip_allowlist {
        pbx::auth::parse_allowlist(list).map_err(OpsError::Invalid)?;
    }
    Ok(store.update_pbx_settings(id, update).await?)
}

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
