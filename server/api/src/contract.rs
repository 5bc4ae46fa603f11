//! The OpenAPI document of the v1 contract, generated from the trait.
//!
//! Dropshot emits one shared error response under the `4XX` and `5XX` ranges and knows
//! nothing of authentication. The specification names each error status and a bearer
//! scheme, so the generated document is completed here, deterministically: a bearer
//! security scheme, and one response per error status of each endpoint, all with the
//! same error body (one error schema per operation, which Progenitor requires). The
//! result is written in struct order (never through `serde_json::Value`, whose key
//! order depends on crate features), so the bytes are stable.

use openapiv3::{
    Components, MediaType, OpenAPI, ReferenceOr, Response, SecurityRequirement, SecurityScheme, StatusCode,
};

/// `info.title` of the contract.
pub const CONTRACT_TITLE: &str = "Gateway API";
/// `info.version` of the contract.
pub const CONTRACT_VERSION: semver::Version = semver::Version::new(1, 0, 0);

const BEARER: &str = "bearerAuth";
const PBX_SECRET: &str = "pbxSecret";

/// Error statuses of `POST /api/send-message` with what each means.
const SEND_MESSAGE_ERRORS: &[(u16, &str)] = &[
    (400, "Invalid JSON (`invalid_json`)"),
    (401, "Missing, invalid or revoked API key (`invalid_api_key`, `revoked_api_key`)"),
    (
        403,
        "Module, plan, suppression or policy denial (`module_not_enabled`, `active_plan_required`, \
         `recipient_suppressed`, `policy_violation`)",
    ),
    (404, "Instance not found for this customer (`invalid_instance`)"),
    (413, "Request body larger than the endpoint's limit (`payload_too_large`)"),
    (415, "Content type is not JSON (`unsupported_media_type`)"),
    (
        422,
        "Validation or message-purpose error (`validation_error`, `missing_phone`, \
         `missing_message_text`, `message_purpose_required`, `message_purpose_not_allowed`)",
    ),
    (423, "Instance paused for review (`instance_paused_for_review`)"),
    (
        429,
        "Message limit or velocity control exceeded (`daily_message_limit_exceeded`, \
         `monthly_message_limit_exceeded`, `sending_throttled`)",
    ),
    (500, "Unexpected error (`internal_error`)"),
    (502, "Delivery could not be completed after the checks (`gateway_send_failed`)"),
];

/// Error statuses of `POST /integrations/pbx/webhook/{integration_id}`.
const PBX_WEBHOOK_ERRORS: &[(u16, &str)] = &[
    (400, "Invalid JSON or event payload (`invalid_json`, `validation_error` with `details.field`)"),
    (
        401,
        "Unknown integration, wrong secret, missing or bad signature, stale or replayed timestamp: one \
         generic answer (`invalid_pbx_webhook`)",
    ),
    (
        403,
        "PBX module or responsible-messaging denial (`module_not_enabled`, `active_plan_required`, \
         `recipient_suppressed`, `policy_violation`, `message_purpose_not_allowed`, \
         `instance_paused_for_review`)",
    ),
    (413, "Body larger than 256 KB (`payload_too_large`)"),
    (
        429,
        "PBX webhook rate limit (`webhook_rate_limited`, `details.retry_after_seconds`), or the message \
         quota of the resulting send (`sending_throttled`, `daily_message_limit_exceeded`, \
         `monthly_message_limit_exceeded`)",
    ),
    (500, "Unexpected error (`internal_error`)"),
    (502, "The resulting message could not be delivered after the checks (`gateway_send_failed`)"),
];

/// The contract as committed in `openapi/openapi.json`.
pub fn openapi_document() -> String {
    let description = crate::gateway_api_mod::stub_api_description().expect("the API trait is valid");
    let mut raw = Vec::new();
    description
        .openapi(CONTRACT_TITLE, CONTRACT_VERSION)
        .description(
            "Guarded sending of transactional, operational, support, internal-team and \
             authentication messages through customer-owned connected instances.",
        )
        .write(&mut raw)
        .expect("the document serialises");
    let mut doc: OpenAPI = serde_json::from_slice(&raw).expect("dropshot writes valid OpenAPI");
    complete(&mut doc);
    let mut out = serde_json::to_string_pretty(&doc).expect("the document serialises");
    out.push('\n');
    out
}

fn complete(doc: &mut OpenAPI) {
    let components = doc.components.get_or_insert_with(Components::default);
    components.security_schemes.insert(
        BEARER.to_string(),
        ReferenceOr::Item(SecurityScheme::HTTP {
            scheme: "bearer".to_string(),
            bearer_format: Some("API key".to_string()),
            description: Some("`Authorization: Bearer <API_KEY>`; keys are created in the dashboard.".to_string()),
            extensions: Default::default(),
        }),
    );
    components.security_schemes.insert(
        PBX_SECRET.to_string(),
        ReferenceOr::Item(SecurityScheme::APIKey {
            location: openapiv3::APIKeyLocation::Header,
            name: "X-Gateway-3CX-Secret".to_string(),
            description: Some("The PBX integration's webhook secret, from the dashboard.".to_string()),
            extensions: Default::default(),
        }),
    );
    let error_body = ReferenceOr::Reference { reference: "#/components/schemas/ErrorBody".to_string() };
    for (_, item) in doc.paths.paths.iter_mut() {
        let ReferenceOr::Item(item) = item else {
            continue;
        };
        for op in
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch].into_iter().flatten()
        {
            let (scheme, errors) = match op.operation_id.as_deref() {
                Some("message_send") => (BEARER, SEND_MESSAGE_ERRORS),
                Some("pbx_webhook") => (PBX_SECRET, PBX_WEBHOOK_ERRORS),
                _ => continue,
            };
            let mut requirement = SecurityRequirement::new();
            requirement.insert(scheme.to_string(), Vec::new());
            op.security = Some(vec![requirement]);
            for (status, what) in errors {
                let mut content = openapiv3::Content::default();
                content.insert(
                    "application/json".to_string(),
                    MediaType { schema: Some(error_body.clone()), ..Default::default() },
                );
                op.responses.responses.insert(
                    StatusCode::Code(*status),
                    ReferenceOr::Item(Response { description: (*what).to_string(), content, ..Default::default() }),
                );
            }
            op.responses.responses.sort_by(|a, _, b, _| status_rank(a).cmp(&status_rank(b)));
        }
    }
}

/// Orders responses by status; a range (`4XX`) follows the codes it covers.
fn status_rank(status: &StatusCode) -> u32 {
    match status {
        StatusCode::Code(n) => u32::from(*n) * 10,
        StatusCode::Range(r) => u32::from(*r) * 1000 + 999,
    }
}
