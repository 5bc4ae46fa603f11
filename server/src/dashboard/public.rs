//! Public pages: `/` (reachability and TLS smoke test), `/acceptable-use`, and
//! `/docs/responsible-messaging` (allowed purposes, limits per plan, opt-out keywords,
//! what each check of a send does). Anyone may read them; signed-in people see them
//! in their own navigation.

use super::views::{self, Notice};
use super::{Ctx, DashError, html, page, session};
use crate::ingress::evolution::{OPT_IN, OPT_OUT};
use dropshot::{Body, HttpError, endpoint};
use gateway_api::MessagePurpose;
use http::{HeaderValue, Response, StatusCode, header};
use maud::{Markup, html};

/// How the request reached us: `https` (TLS here, or a proxy says so) or `http`.
fn scheme(rqctx: &Ctx) -> &'static str {
    let forwarded = rqctx
        .request
        .headers()
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    if forwarded || rqctx.request.uri().scheme_str() == Some("https") { "https" } else { "http" }
}

/// Reachability smoke test: an HTML page for browsers (`Accept: text/html`), the JSON
/// `{"service":"gateway","status":"ok",...}` for everything else (monitors, curl).
#[endpoint { method = GET, path = "/", unpublished = true }]
async fn root_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    let wants_html = rqctx
        .request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if !wants_html {
        let mut response =
            Response::new(Body::from(r#"{"service":"gateway","status":"ok","contract":"/openapi.json"}"#));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    page(&rqctx, async {
        let tls = scheme(&rqctx) == "https";
        let host = rqctx.request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let local = host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]");
        let body = html! {
            section.card {
                p.big { "The gateway is reachable." }
                dl.facts {
                    dt { "Connection" }
                    dd {
                        @if tls { (views::badge("HTTPS", "ok")) " This page came over TLS." }
                        @else if local { (views::badge("HTTP (local)", "warn")) " Plain HTTP on this machine: fine for development; browsers accept the secure sign-in cookie on localhost only." }
                        @else { (views::badge("HTTP", "bad")) " Plain HTTP: put the gateway behind TLS (a reverse proxy that sets X-Forwarded-Proto), or sign-in will not work." }
                    }
                    dt { "Host" } dd { code { (host) } }
                    dt { "Contract" } dd { a href="/openapi.json" { "/openapi.json" } " (OpenAPI 3.0.3, version " (gateway_api::CONTRACT_VERSION) ")" }
                }
            }
            p { a href="/login" { "Sign in to the dashboard" } " · " a href="/docs/responsible-messaging" { "Responsible-messaging guide" } " · " a href="/acceptable-use" { "Acceptable use" } }
        };
        Ok(html(StatusCode::OK, views::bare("Gateway", None, body)))
    })
    .await
}

/// A public page in the signed-in shell when there is a session, else the bare one.
async fn public_page(rqctx: &Ctx, path: &str, title: &str, body: Markup) -> Result<Response<Body>, DashError> {
    let markup = match session::viewer(rqctx).await {
        Ok(viewer) => views::page(&viewer, path, title, None, body),
        Err(DashError::SignIn) => views::bare(title, None, body),
        Err(e) => return Err(e),
    };
    Ok(html(StatusCode::OK, markup))
}

/// The responsible-messaging (acceptable use) policy.
#[endpoint { method = GET, path = "/acceptable-use", unpublished = true }]
async fn acceptable_use_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let body = html! {
            section.card {
                p { "The gateway sends messages that people expect, from numbers that belong to the business sending them. Every message goes through the gateway's API, the dashboard or the PBX integration, so that the checks below apply before anything is delivered." }
                h2 { "Allowed" }
                ul {
                    li { strong { "Transactional" } ": receipts, order and delivery updates, appointment confirmations." }
                    li { strong { "Operational" } ": service notices, outages, account changes." }
                    li { strong { "Support" } ": answers to a person who contacted you, callbacks, missed-call follow-ups." }
                    li { strong { "Internal team" } ": messages to your own staff." }
                    li { strong { "Authentication" } ": one-time codes and sign-in alerts." }
                }
                h2 { "Not allowed" }
                ul {
                    li { "Marketing, promotions, newsletters and bulk campaigns." }
                    li { "Cold outreach to people who did not contact you or agree to hear from you." }
                    li { "Political messages, and anything unlawful, deceptive, harassing or hateful." }
                    li { "Sending to anyone who opted out (STOP and the other keywords) or whom you suppressed." }
                    li { "Sharing an instance between businesses, or hiding who is sending." }
                }
                h2 { "What happens when this is broken" }
                p { "Refused sends are logged with the reason. An instance may be paused for review (sends answer 423 " code { "instance_paused_for_review" } ") while an operator looks at it; repeated or serious breaches end the service. Higher limits are granted only after review, and never for marketing, spam or cold outreach." }
                p { "See the " a href="/docs/responsible-messaging" { "responsible-messaging guide" } " for the purposes, limits and checks in detail." }
            }
        };
        public_page(&rqctx, "/acceptable-use", "Acceptable use policy", body).await
    })
    .await
}

/// The checks of a send, in order: (policy name as logged, error code, what it checks).
pub const CHECKS: &[(&str, &str, &str)] = &[
    ("gateway/request", "unsupported_media_type, invalid_json", "The request is JSON sent as application/json."),
    (
        "gateway/schema",
        "validation_error, missing_phone, missing_message_text, message_purpose_required",
        "Every field is known and well formed: an international phone number, a purpose, a text or a media file of an allowed type and size.",
    ),
    ("gateway/instance", "invalid_instance", "The instance (id or name) belongs to the API key's customer."),
    (
        "gateway/plan",
        "active_plan_required, module_not_enabled",
        "The customer has an active plan and the module (api or pbx) is on.",
    ),
    ("gateway/review", "instance_paused_for_review", "The instance is not paused for review by an operator."),
    (
        "purpose policy",
        "message_purpose_not_allowed",
        "The purpose is one of the five allowed purposes (policy modules may add rules).",
    ),
    (
        "gateway/suppression",
        "recipient_suppressed",
        "The recipient did not opt out and is not on the suppression list.",
    ),
    ("content policy", "policy_violation", "The text passes the content rules of the loaded policy modules."),
    ("gateway/velocity", "sending_throttled", "Not too many sends a minute from the instance, or to one recipient."),
    (
        "gateway/quota",
        "daily_message_limit_exceeded, monthly_message_limit_exceeded",
        "The daily and plan-period limits are not reached.",
    ),
    ("gateway/provider", "gateway_send_failed", "The messaging network accepted the message."),
];

/// Allowed purposes, plan limits, opt-out keywords, the checks.
#[endpoint { method = GET, path = "/docs/responsible-messaging", unpublished = true }]
async fn guide_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let config = &rqctx.context().config;
        let running: Vec<String> = match &rqctx.context().policies {
            Some(p) => p.host().current().modules.iter().map(|m| m.label()).collect(),
            None => Vec::new(),
        };
        let plans = [("Starter", &config.plans.starter, "5 USD per 30 days; active at once"), ("Scale", &config.plans.scale, "30 USD per 30 days; after an operator's approval")];
        let body = html! {
            (Notice::Ok("Every send, from the API, the dashboard or the PBX, passes these checks in this order, and every attempt is logged with its decision.".into()).render())
            h2 { "Allowed purposes" }
            p { "Each send names its purpose in " code { "message_purpose" } ". Anything else is refused with " code { "message_purpose_not_allowed" } "." }
            table {
                thead { tr { th { "message_purpose" } th { "for" } } }
                tbody {
                    @for p in MessagePurpose::ALL {
                        tr { td { code { (p.as_str()) } } td { (purpose_text(p)) } }
                    }
                }
            }
            h2 { "Limits per plan" }
            table {
                thead { tr { th { "plan" } th.num { "instances" } th.num { "messages a day" } th.num { "messages a period (30 days)" } th.num { "sends a minute per instance" } th.num { "a minute per recipient" } th { "terms" } } }
                tbody {
                    @for (name, plan, terms) in plans {
                        tr {
                            td { (name) }
                            td.num { (plan.instances) }
                            td.num { (plan.daily_messages) }
                            td.num { (plan.monthly_messages) }
                            td.num { (plan.instance_per_minute.unwrap_or(config.limits.instance_per_minute)) }
                            td.num { (plan.recipient_per_minute.unwrap_or(config.limits.recipient_per_minute)) }
                            td { (terms) }
                        }
                    }
                }
            }
            p.hint { "The day is the UTC calendar day; the period starts when the plan is assigned. A refused or failed send uses no quota. Operators may raise one customer's limits after review; marketing, spam and cold outreach are never approved." }
            h2 { "Opt-out keywords" }
            p { "A message from a contact that is exactly one of these words (any case, accents and spaces ignored) suppresses that contact for your account, and your webhook gets " code { "recipient.opted_out" } ":" }
            p { @for (i, k) in OPT_OUT.iter().enumerate() { @if i > 0 { ", " } code { (k) } } }
            p { "These lift such an opt-out (never a suppression you added yourself): " @for (i, k) in OPT_IN.iter().enumerate() { @if i > 0 { ", " } code { (k) } } "." }
            p { "You can also suppress numbers yourself on the " a href="/suppressed-recipients" { "suppressed recipients" } " page." }
            h2 { "What each check does" }
            table {
                thead { tr { th { "#" } th { "check (policy in the log)" } th { "refusal" } th { "what it checks" } } }
                tbody {
                    @for (i, (name, codes, what)) in CHECKS.iter().enumerate() {
                        tr { td.num { (i + 1) } td { code { (name) } } td { code { (codes) } } td { (what) } }
                    }
                }
            }
            p.hint { "The message log shows, for each attempt, the decision, the check or policy that made it and why." }
            h2 #policies { "What the policies check" }
            p { "The purpose and content checks are policy modules. These are the rules and thresholds of the default modules; the operator may replace or add modules." }
            @if !running.is_empty() {
                p.hint { "Running now: " @for (i, m) in running.iter().enumerate() { @if i > 0 { ", " } code { (m) } } "." }
            }
            div.guide { (guide_sections()) }
        };
        public_page(&rqctx, "/docs/responsible-messaging", "Responsible messaging", body).await
    })
    .await
}

/// The policy sections of `docs/responsible-messaging.md` (purposes, content, pacing,
/// reviews), the one place their rules and thresholds are written, as HTML. The file
/// is the project's own, built in, so its HTML is trusted.
fn guide_sections() -> maud::PreEscaped<String> {
    const GUIDE: &str = include_str!("../../../docs/responsible-messaging.md");
    const SECTIONS: [&str; 4] = ["## Purposes", "## Content", "## Pacing", "## Reviews and pauses"];
    let mut markdown = String::new();
    for part in GUIDE.split("\n## ").skip(1).map(|p| format!("## {p}")) {
        if SECTIONS.iter().any(|h| part.starts_with(h)) {
            // One level down: the page's own headings are h2.
            markdown.push_str(&format!("#{}\n", part.trim_end()));
            markdown.push('\n');
        }
    }
    let mut html = String::new();
    let options = pulldown_cmark::Options::ENABLE_TABLES;
    pulldown_cmark::html::push_html(&mut html, pulldown_cmark::Parser::new_ext(&markdown, options));
    maud::PreEscaped(html)
}

fn purpose_text(p: MessagePurpose) -> &'static str {
    match p.as_str() {
        "transactional" => "receipts, orders, deliveries, bookings",
        "operational" => "service notices, outages, account changes",
        "support" => "answers and callbacks to people who contacted you",
        "internal_team" => "messages to your own staff",
        "authentication" => "one-time codes and sign-in alerts",
        _ => "",
    }
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(root_get).map_err(|e| e.to_string())?;
    api.register(acceptable_use_get).map_err(|e| e.to_string())?;
    api.register(guide_get).map_err(|e| e.to_string())?;
    Ok(())
}
