//! Provider ingress: the unpublished route where the provider posts an instance's
//! events, and what becomes of them.
//!
//! `POST /internal/provider/evolution/{instance_id}` must carry the instance's secret in
//! `X-Gateway-Ingress` (the gateway sets it when it configures the provider's webhook);
//! an unknown instance or a wrong secret is refused (401) and logged. An accepted post
//! is stored (`provider_events`) before the route answers, so nothing acknowledged is
//! lost, and then applied in one transaction: the inbound log, opt-outs, the `@lid`
//! map, delivery statuses (never backwards), connection state, and the customer
//! events in the outbox.

pub mod evolution;

/// Header carrying the instance's ingress secret.
pub const SECRET_HEADER: &str = "x-gateway-ingress";

/// A new ingress secret (shown to no one: the gateway gives it to the provider).
pub fn new_secret() -> String {
    format!("ing_{}", crate::apikey::random_base62(43))
}

/// The URL the provider posts an instance's events to.
pub fn url(public_url: &str, instance_id: &str) -> String {
    format!("{}/internal/provider/evolution/{instance_id}", public_url.trim_end_matches('/'))
}
