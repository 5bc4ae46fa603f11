//! Instances: the list (and creating one), and `/instances/{id}/manage` with its tabs:
//! connection (pairing with a live QR, the ban-risk signals of `instance_health`, test
//! sends through the real send pipeline with source `dashboard`) and `?tab=webhook`
//! (in `instance_webhook`).
//!
//! `status.json` is what the page's script polls while pairing. Every route looks the
//! instance up and answers 404 unless it belongs to the viewer's customer.

use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, Form, PAGE_SIZE, html, page, page_number, query, redirect, when};
use crate::ops;
use crate::send::SendInput;
use crate::store::{Instance, now_ms};
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use gateway_api::{MessagePurpose, SendMessageRequest};
use http::{HeaderValue, Response, StatusCode, header};
use maud::{Markup, html};
use serde::Deserialize;
use slog::info;

/// Path of the instance routes.
#[derive(Deserialize, schemars::JsonSchema)]
pub(super) struct InstancePath {
    pub(super) id: String,
}

/// The instance `id` if it belongs to the viewer's customer; otherwise 404, the same
/// answer as for an id that does not exist.
pub(super) async fn owned(rqctx: &Ctx, viewer: &Viewer, id: &str) -> Result<Instance, DashError> {
    let customer_id = viewer.customer_id()?;
    match rqctx.context().store.instance(id).await {
        Ok(instance) if instance.customer_id == customer_id => Ok(instance),
        Ok(_) | Err(crate::store::StoreError::NotFound(_)) => Err(DashError::NotFound),
        Err(e) => Err(e.into()),
    }
}

/// A POST about one of the viewer's instances: the form, the viewer (CSRF and `action`
/// checked) and the instance (404 when it is another customer's).
pub(super) async fn owned_post(
    rqctx: &Ctx,
    body: &UntypedBody,
    id: &str,
    action: Action,
) -> Result<(Form, Viewer, Instance), DashError> {
    let (form, viewer) = session::post_form(rqctx, body, action).await?;
    let instance = owned(rqctx, &viewer, id).await?;
    Ok((form, viewer, instance))
}

/// How a lifecycle state is shown.
fn lifecycle_label(lifecycle: &str) -> &'static str {
    match lifecycle {
        "connected" => "Connected",
        "qr_pending" => "Waiting for the phone to scan the QR code",
        "disconnected" => "Disconnected",
        "ban_suspected" => "Disconnected: the network may have banned this number",
        _ => "Not paired yet",
    }
}

fn lifecycle_badge(lifecycle: &str) -> Markup {
    let kind = match lifecycle {
        "connected" => "ok",
        "qr_pending" => "warn",
        "ban_suspected" | "disconnected" => "bad",
        _ => "muted",
    };
    views::badge(lifecycle_label(lifecycle), kind)
}

/// The instances list.
#[endpoint { method = GET, path = "/instances", unpublished = true }]
async fn instances_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        Ok(html(StatusCode::OK, list_page(&rqctx, &viewer, None).await?))
    })
    .await
}

async fn list_page(rqctx: &Ctx, viewer: &Viewer, notice: Option<&Notice>) -> Result<Markup, DashError> {
    let store = &rqctx.context().store;
    let q = query(rqctx);
    let page_no = page_number(&q);
    let (instances, total) = store.instances_page(viewer.customer_id()?, PAGE_SIZE, (page_no - 1) * PAGE_SIZE).await?;
    let mut rows = Vec::new();
    for i in &instances {
        rows.push((i, store.lifecycle(i).await?));
    }
    Ok(views::page(
        viewer,
        "/instances",
        "Instances",
        notice,
        html! {
            @if viewer.role.may(Action::CreateInstance) {
                form.row.card method="post" action="/instances" {
                    (views::csrf_field(&viewer.csrf))
                    label { "New instance name" input type="text" name="name" maxlength="64" required placeholder="front-desk"; }
                    button type="submit" { "Create instance" }
                    span.hint { "Then pair it with the phone by scanning a QR code." }
                }
            }
            table #instances {
                thead { tr { th { "Name" } th { "Id" } th { "Connection" } th { "Provider" } th { "Review" } th { "Created" } } }
                tbody {
                    @for (i, lifecycle) in &rows {
                        tr {
                            td.long { a href=(format!("/instances/{}/manage", i.id)) { (i.name) } }
                            td { code { (i.id) } }
                            td { (lifecycle_badge(lifecycle)) }
                            td { (i.provider) }
                            td { @if i.paused { (views::badge("paused", "bad")) } @else { "—" } }
                            td { (when(i.created_at)) }
                        }
                    }
                    @if rows.is_empty() { tr { td colspan="6" { "No instances yet." } } }
                }
            }
            (views::pager("/instances", page_no, total, PAGE_SIZE))
        },
    ))
}

/// Creates an instance (then pairing starts on its page).
#[endpoint { method = POST, path = "/instances", unpublished = true }]
async fn instances_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::CreateInstance).await?;
        let state = rqctx.context();
        match ops::create_instance(&state.store, &state.config, viewer.customer_id()?, form.get("name"), false).await {
            Ok(instance) => {
                info!(rqctx.log, "instance created"; "user_id" => &viewer.user.id, "instance_id" => &instance.id);
                Ok(redirect(&format!("/instances/{}/manage", instance.id)))
            }
            Err(e) => {
                let notice = Notice::Error(super::DashError::from(e).to_string());
                Ok(html(StatusCode::BAD_REQUEST, list_page(&rqctx, &viewer, Some(&notice)).await?))
            }
        }
    })
    .await
}

/// Which tab of the instance page.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    Connection,
    Webhook,
}

/// The instance page.
#[endpoint { method = GET, path = "/instances/{id}/manage", unpublished = true }]
async fn manage_get(rqctx: Ctx, path: Path<InstancePath>) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let instance = owned(&rqctx, &viewer, &path.into_inner().id).await?;
        let q = query(&rqctx);
        let tab = if q.get("tab").map(String::as_str) == Some("webhook") { Tab::Webhook } else { Tab::Connection };
        let notice = q.get("done").and_then(|d| done_text(d)).map(|t| Notice::Ok(t.to_string()));
        Ok(html(StatusCode::OK, manage_page(&rqctx, &viewer, &instance, tab, notice.as_ref(), None).await?))
    })
    .await
}

/// Fixed texts of `?done=` after a redirect.
fn done_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "pairing" => "A pairing QR code is ready: scan it with the phone.",
        "connected" => "The instance is connected.",
        "logged_out" => "The phone was logged out.",
        "webhook_enabled" => "The endpoint is enabled again.",
        _ => return None,
    })
}

pub(super) async fn manage_page(
    rqctx: &Ctx,
    viewer: &Viewer,
    instance: &Instance,
    tab: Tab,
    notice: Option<&Notice>,
    extra: Option<Markup>,
) -> Result<Markup, DashError> {
    let base = format!("/instances/{}/manage", instance.id);
    let content = match tab {
        Tab::Connection => connection_tab(rqctx, viewer, instance).await?,
        Tab::Webhook => super::instance_webhook::webhook_tab(rqctx, viewer, instance).await?,
    };
    Ok(views::page(
        viewer,
        "/instances",
        &format!("Instance {}", instance.name),
        notice,
        html! {
            @if instance.paused {
                div.banner role="alert" {
                    strong { "Paused for review. " }
                    "An operator paused this instance" @if let Some(r) = &instance.paused_reason { " (" (r) ")" } "; every send is refused with instance_paused_for_review until it is resumed."
                }
            }
            nav.tabs {
                a href=(base) aria-current=[(tab == Tab::Connection).then_some("page")] { "Connection and test send" }
                a href=(format!("{base}?tab=webhook")) aria-current=[(tab == Tab::Webhook).then_some("page")] { "Webhook" }
            }
            @if let Some(extra) = extra { (extra) }
            (content)
        },
    ))
}

async fn connection_tab(rqctx: &Ctx, viewer: &Viewer, instance: &Instance) -> Result<Markup, DashError> {
    let store = &rqctx.context().store;
    let lifecycle = store.lifecycle(instance).await?;
    let (qr, _) = store.latest_qr(&instance.id).await?;
    let may_pair = viewer.role.may(Action::PairInstance);
    let may_send = viewer.role.may(Action::TestSend);
    let id = &instance.id;
    let status_url = format!("/instances/{id}/status.json");
    let pair_url = format!("/instances/{id}/pair");
    let risk = super::instance_health::risk_card(rqctx, instance, now_ms()).await?;
    Ok(html! {
        (risk)
        section.card #connection data-status-url=(status_url) data-pair-url=(pair_url) data-csrf=[may_pair.then_some(&viewer.csrf)] {
            h2 { "Connection" }
            dl.facts {
                dt { "State" } dd { span #lifecycle data-state=(lifecycle) { (lifecycle_label(lifecycle)) } }
                dt { "Instance id" } dd { code { (id) } " (or its name, " code { (instance.name) } ", in " code { "instance_id" } ")" }
                dt { "Provider" } dd { (instance.provider) }
            }
            @if lifecycle == "qr_pending" {
                @if let Some(qr) = &qr {
                    p { "Open WhatsApp on the phone → Settings → Linked devices → Link a device, and scan:" }
                    div.qr { img.qr-image src=(qr) alt="Pairing QR code"; }
                    p.hint { "This page follows the pairing: the code refreshes by itself and the page changes once the phone is connected." }
                }
            }
            @if may_pair {
                div.row {
                    @if lifecycle != "connected" {
                        (views::button_form(&pair_url, &viewer.csrf, if lifecycle == "qr_pending" { "New QR code" } else { "Pair with a phone" }, &[], ""))
                    }
                    @if lifecycle == "qr_pending" && instance.provider == "simulator" {
                        " "
                        (views::button_form(&format!("/instances/{id}/confirm-pairing"), &viewer.csrf, "Simulate the phone scanning (simulator)", &[], "secondary"))
                    }
                    @if lifecycle == "connected" && instance.provider == "evolution" {
                        (views::button_form(&format!("/instances/{id}/logout"), &viewer.csrf, "Log the phone out", &[], "danger"))
                    }
                }
                @if instance.provider == "evolution" && lifecycle != "connected" {
                    form.row method="post" action=(pair_url) {
                        (views::csrf_field(&viewer.csrf))
                        label { "Or get a pairing code for the phone number" input type="text" name="number" placeholder="+5511..."; }
                        button.secondary type="submit" { "Get pairing code" }
                    }
                }
            }
        }
        section.card #test-send {
            h2 { "Test send" }
            p.hint { "A real message, through every check of the API (purpose, suppression, content policy, velocity, quota); it counts against your limits and is logged with source dashboard. Send only to people who expect it, such as your own phone." }
            @if may_send {
                form.stack method="post" action=(format!("/instances/{id}/test-send")) {
                    (views::csrf_field(&viewer.csrf))
                    label for="phone" { "Recipient (international format)" }
                    input #phone type="text" name="phone" required placeholder="+14155550123";
                    label for="purpose" { "Purpose" }
                    select #purpose name="purpose" {
                        @for p in MessagePurpose::ALL { option value=(p.as_str()) { (p.as_str()) } }
                    }
                    label for="message" { "Message" }
                    textarea #message name="message" maxlength="4096" required { "Test message from the Gateway dashboard." }
                    button type="submit" { "Send test message" }
                }
            } @else {
                p { "Your role cannot send test messages." }
            }
        }
    })
}

/// The connection state, for the page's script: lifecycle, current QR and its age.
#[endpoint { method = GET, path = "/instances/{id}/status.json", unpublished = true }]
async fn status_get(rqctx: Ctx, path: Path<InstancePath>) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let instance = owned(&rqctx, &viewer, &path.into_inner().id).await?;
        let store = &rqctx.context().store;
        let lifecycle = store.lifecycle(&instance).await?;
        let (qr, qr_at) = store.latest_qr(&instance.id).await?;
        let body = serde_json::json!({
            "instance_id": instance.id,
            "lifecycle": lifecycle,
            "lifecycle_label": lifecycle_label(lifecycle),
            "connection_state": instance.connection_state,
            "paused": instance.paused,
            "qr": if lifecycle == "qr_pending" { qr } else { None },
            "qr_age_seconds": qr_at.map(|t| (now_ms() - t) / 1000),
        });
        let mut response = Response::new(Body::from(body.to_string()));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(response)
    })
    .await
}

/// Starts pairing (or refreshes the QR): simulator or provider.
#[endpoint { method = POST, path = "/instances/{id}/pair", unpublished = true }]
async fn pair_post(rqctx: Ctx, path: Path<InstancePath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::PairInstance).await?;
        let state = rqctx.context();
        let number = form.opt("number").map(ops::phone_arg).transpose()?;
        let answer = ops::instance_qr(&state.store, &state.config, &instance.id, number.as_deref()).await?;
        // The page shows the stored QR: keep the one the provider just answered with
        // (its later ones arrive as `qrcode.updated` events).
        if let Some(qr) = answer["qr"].as_str().filter(|_| instance.provider != "simulator") {
            state.store.store_qr(&instance.id, Some(qr)).await?;
        }
        info!(rqctx.log, "pairing started"; "user_id" => &viewer.user.id, "instance_id" => &instance.id,
              "state" => answer["state"].as_str().unwrap_or(""));
        if form.get("quiet") == "1" {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            return Ok(response);
        }
        if let Some(code) = answer["pairing_code"].as_str() {
            let extra = html! { div.secret { p { "Pairing code for the phone: " } code.copy { (code) } } };
            let page = manage_page(&rqctx, &viewer, &instance, Tab::Connection, None, Some(extra)).await?;
            return Ok(html(StatusCode::OK, page));
        }
        let done = if answer["state"] == "open" { "connected" } else { "pairing" };
        Ok(redirect(&format!("/instances/{}/manage?done={done}", instance.id)))
    })
    .await
}

/// Simulator: the phone "scanned" the QR; the instance connects.
#[endpoint { method = POST, path = "/instances/{id}/confirm-pairing", unpublished = true }]
async fn confirm_pairing_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, _, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::PairInstance).await?;
        ops::confirm_pairing(&rqctx.context().store, &instance.id).await?;
        Ok(redirect(&format!("/instances/{}/manage?done=connected", instance.id)))
    })
    .await
}

/// Evolution: logs the phone out.
#[endpoint { method = POST, path = "/instances/{id}/logout", unpublished = true }]
async fn logout_instance_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, _, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::PairInstance).await?;
        let state = rqctx.context();
        ops::logout_instance(&state.store, &state.config, &instance.id).await?;
        Ok(redirect(&format!("/instances/{}/manage?done=logged_out", instance.id)))
    })
    .await
}

/// A test send through the real pipeline (source `dashboard`).
#[endpoint { method = POST, path = "/instances/{id}/test-send", unpublished = true }]
async fn test_send_post(rqctx: Ctx, path: Path<InstancePath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::TestSend).await?;
        let state = rqctx.context();
        let input = SendInput {
            customer_id: instance.customer_id.clone(),
            api_key_id: None,
            source: "dashboard",
            body: SendMessageRequest {
                instance_id: Some(instance.id.clone()),
                phone: form.opt("phone").map(str::to_string),
                message_purpose: form.opt("purpose").map(str::to_string),
                message: form.opt("message").map(str::to_string),
                ..SendMessageRequest::default()
            },
            idempotency: None,
            trace: crate::trace::Trace::new(&rqctx.request_id, rqctx.request.headers()),
            progress: Default::default(),
        };
        let (status, notice) = match state.sender.send(&input).await {
            Ok(sent) => {
                info!(rqctx.log, "test send accepted"; "user_id" => &viewer.user.id, "log_id" => sent.log_id);
                (StatusCode::OK, Notice::Ok(format!("Sent: message {} (log entry {}).", sent.message_id, sent.log_id)))
            }
            Err(e) => {
                let code = e.code();
                info!(rqctx.log, "test send refused"; "user_id" => &viewer.user.id, "error" => code);
                let api = gateway_api::ApiError::from(e);
                (StatusCode::UNPROCESSABLE_ENTITY, Notice::Error(format!("Refused: {code}: {}", api.message)))
            }
        };
        Ok(html(status, manage_page(&rqctx, &viewer, &instance, Tab::Connection, Some(&notice), None).await?))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(instances_get),
        api.register(instances_post),
        api.register(manage_get),
        api.register(status_get),
        api.register(pair_post),
        api.register(confirm_pairing_post),
        api.register(logout_instance_post),
        api.register(test_send_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    super::instance_webhook::register(api)
}
