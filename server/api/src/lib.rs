//! The Gateway's public HTTP interface: the Dropshot API trait and its wire types.
//!
//! This crate is the single source of `openapi/openapi.json`. It holds the trait, the
//! request and response types, the error body and the JSON body extractor, and nothing
//! else: no storage, no policy, no provider. The server implements the trait; the
//! client is generated from the committed JSON, never from this crate.
//!
//! Shape, after omicron's `dns-server-api`: one trait, `GatewayApi`, whose stub
//! description produces the contract. Dashboard, ingress and informational routes are
//! registered by the server as unpublished endpoints and never appear here.

mod body;
mod contract;
mod error;
pub mod events;
mod reply;
pub mod request_schemas;
mod types;

pub use body::{JsonBody, PbxBody, is_json_content_type, parse_json};
pub use contract::{CONTRACT_TITLE, CONTRACT_VERSION, openapi_document};
pub use error::{ApiError, ErrorBody};
pub use reply::{JsonReply, PbxReply, SendReply};
pub use types::*;

use dropshot::{Path, RequestContext};

/// Largest accepted body of `POST /api/send-message`: a 16 MiB media file in base64
/// (4/3 of its size) plus the other fields.
pub const SEND_MESSAGE_MAX_BYTES: usize = 23 * 1024 * 1024;

/// Largest accepted body of the PBX webhook (the specification's 256 KB).
pub const PBX_WEBHOOK_MAX_BYTES: usize = 256 * 1024;

/// The v1 API of the gateway.
#[dropshot::api_description]
pub trait GatewayApi {
    /// Per-server state handed to every handler.
    type Context: Send + Sync + 'static;

    /// Send a text or media message
    ///
    /// Sends a text or media message to one recipient through one of the customer's
    /// connected instances. Every send is checked before delivery, in this order: API
    /// key (401), content type (415), JSON (400), schema (422), instance (404), plan and
    /// module (403), paused instance (423), message purpose (422), suppression (403),
    /// content policy (403), velocity (429), daily and monthly quota (429), provider
    /// (502). Every error has the error body.
    #[endpoint {
        method = POST,
        path = "/api/send-message",
        tags = ["messages"],
        request_body_max_bytes = SEND_MESSAGE_MAX_BYTES,
    }]
    async fn message_send(
        rqctx: RequestContext<Self::Context>,
        body: JsonBody<SendMessageRequest>,
    ) -> Result<SendReply, ApiError>;

    /// Receive a PBX event
    ///
    /// Receives a call event from the customer's phone system (PBX). Authentication:
    /// header `X-Gateway-3CX-Secret` with the integration's webhook secret; when HMAC
    /// signing is configured also `X-Gateway-Timestamp` (Unix seconds, within 300 s of
    /// the gateway's clock) and `X-Gateway-Signature` (`sha256=<hex>` or `<hex>`:
    /// HMAC-SHA256 of timestamp + "." + raw body); a signature is accepted once. Checks,
    /// in order: body size (413), integration, secret and signature (401, one generic
    /// answer for every cause), JSON (400), event payload (400 `validation_error`), PBX
    /// module (403), rate limit (429), then the action. A message the event causes goes
    /// through the send pipeline (policy and suppression 403, quota 429, provider 502).
    #[endpoint {
        method = POST,
        path = "/integrations/pbx/webhook/{integration_id}",
        tags = ["pbx"],
        request_body_max_bytes = PBX_WEBHOOK_MAX_BYTES,
    }]
    async fn pbx_webhook(
        rqctx: RequestContext<Self::Context>,
        path: Path<PbxPath>,
        body: PbxBody,
    ) -> Result<PbxReply, ApiError>;
}
