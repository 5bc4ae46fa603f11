//! Instances: creation, pairing (Evolution's QR, the simulator's confirmation), their
//! connection state, pausing and the warm-up age.

use super::{OpsError, in_range};
use crate::bounds;
use crate::config::Config;
use crate::pbx;
use crate::provider;
use crate::store::{Instance, PlanStatus, Store, now_ms};
use serde_json::{Value, json};

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

/// An instance with its lifecycle state and latest QR.
pub async fn show_instance(store: &Store, id: &str) -> Result<Value, OpsError> {
    let instance = store.instance(id).await?;
    let mut out = instance_json(&instance);
    out["lifecycle"] = json!(store.lifecycle(&instance).await?);
    let (qr, qr_updated_at) = store.latest_qr(id).await?;
    out["qr"] = json!(qr);
    out["qr_updated_at"] = json!(qr_updated_at);
    Ok(out)
}

/// Pauses an instance for responsible-messaging review (`reason` defaults to `review`).
pub async fn pause_instance(store: &Store, id: &str, reason: Option<&str>) -> Result<Instance, OpsError> {
    Ok(store.set_paused(id, true, Some(reason.unwrap_or("review"))).await?)
}

/// Resumes a paused instance.
pub async fn resume_instance(store: &Store, id: &str) -> Result<Instance, OpsError> {
    Ok(store.set_paused(id, false, None).await?)
}

/// Sets how many days an instance's number has been in use (its warm-up).
pub async fn set_instance_age(store: &Store, instance_id: &str, days: i64) -> Result<Instance, OpsError> {
    in_range("the age in days", Some(days), &bounds::INSTANCE_AGE_DAYS)?;
    Ok(store.set_instance_age(instance_id, days).await?)
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
