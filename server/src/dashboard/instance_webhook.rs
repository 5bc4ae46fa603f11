//! The webhook tab of an instance (`/instances/{id}/manage?tab=webhook`): the endpoint
//! (URL, events, secret), attempts by outcome and answer time over the last 24 hours
//! and the backlog (charts), every delivery attempt with resend, a test event, and the
//! disabled-endpoint banner.

use super::charts::{self, Series};
use super::instances::{InstancePath, Tab, manage_page, owned_post};
use super::roles::Action;
use super::session::Viewer;
use super::views::{self, Notice};
use super::{Ctx, DashError, PAGE_SIZE, before_id, html, page, query, redirect, when};
use crate::ops::{self, SecretChoice};
use crate::store::{Instance, WebhookEndpoint, now_ms};
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use slog::info;

/// Attempts by outcome and answer times per hour over the last 24 hours, and the backlog.
async fn last_day(rqctx: &Ctx, instance: &Instance, now: i64) -> Result<Markup, DashError> {
    const HOUR_MS: i64 = 3_600_000;
    let store = &rqctx.context().store;
    let this_hour = now - now.rem_euclid(HOUR_MS);
    let hours: Vec<i64> = (0..24).rev().map(|back| this_hour - back * HOUR_MS).collect();
    let rows = store.webhook_hours(&instance.id, hours[0]).await?;
    let pick = |f: fn(&crate::store::insight::HourAttempts) -> u64| -> Vec<u64> {
        hours.iter().map(|h| rows.iter().find(|r| r.hour == *h).map_or(0, f)).collect()
    };
    let labels: Vec<String> = hours
        .iter()
        .map(|h| chrono::DateTime::from_timestamp_millis(*h).map(|t| t.format("%H:00").to_string()).unwrap_or_default())
        .collect();
    let outcomes = [
        Series { name: "delivered".into(), class: "delivered".into(), values: pick(|r| r.delivered) },
        Series { name: "failed".into(), class: "failed".into(), values: pick(|r| r.failed) },
    ];
    let latency = [
        Series { name: "median ms".into(), class: "p50".into(), values: pick(|r| r.p50_ms) },
        Series { name: "longest ms".into(), class: "max".into(), values: pick(|r| r.max_ms) },
    ];
    let (delivered, failed): (u64, u64) = (outcomes[0].values.iter().sum(), outcomes[1].values.iter().sum());
    let (backlog, oldest) = store.instance_backlog(&instance.id).await?;
    Ok(html! {
        h2 { "The last 24 hours" }
        div.grid.charts {
            (charts::stacked_columns("webhook-attempts", "Delivery attempts per hour",
                &format!("{} attempts delivered and {} failed in the last 24 hours (UTC hours).", charts::thousands(delivered), charts::thousands(failed)),
                &labels, &outcomes))
            (charts::grouped_columns("webhook-latency", "Answer time per hour",
                "The endpoint's median and longest answer time per hour, in milliseconds.", &labels, &latency))
        }
        p #backlog {
            strong { (charts::thousands(backlog)) } " events waiting for delivery"
            @if let Some(at) = oldest { "; the oldest since " (when(at)) }
            "."
        }
    })
}

pub(super) async fn webhook_tab(rqctx: &Ctx, viewer: &Viewer, instance: &Instance) -> Result<Markup, DashError> {
    let store = &rqctx.context().store;
    let endpoint = store.webhook(&instance.id).await?;
    let q = query(rqctx);
    let before = before_id(&q);
    let attempts = store.attempts_page(&instance.id, before, PAGE_SIZE).await?;
    let next = (attempts.len() as i64 == PAGE_SIZE).then(|| attempts.last().map(|a| a.id)).flatten();
    let may = viewer.role.may(Action::ConfigureWebhook);
    let id = &instance.id;
    let selected = |name: &str| endpoint.as_ref().is_none_or(|e: &WebhookEndpoint| e.wants(name));
    let now = now_ms();
    let health = last_day(rqctx, instance, now).await?;
    Ok(html! {
        @if let Some(e) = &endpoint {
            @if e.disabled_at.is_some() {
                div.banner #webhook-disabled role="alert" {
                    strong { "Deliveries to this endpoint are disabled" }
                    @if let Some(at) = e.disabled_at { " since " (when(at)) }
                    @if let Some(reason) = &e.disabled_reason { ": " (reason) }
                    ". Events are kept but not delivered. Fix the endpoint, then enable it (and resend what it missed)."
                    @if may { " " (views::button_form(&format!("/instances/{id}/webhook/enable"), &viewer.csrf, "Enable deliveries", &[], "")) }
                }
            }
        }
        section.card {
            h2 { "Endpoint" }
            @if let Some(e) = &endpoint {
                dl.facts {
                    dt { "URL" } dd { code { (e.url) } }
                    dt { "Signing" } dd {
                        @if e.secret.is_some() { "signed (X-Gateway-Signature)" } @else { "unsigned" }
                        @if let Some(until) = e.previous_secret_until.filter(|t| *t > now) { "; the previous secret also signs until " (when(until)) }
                    }
                    @if let Some(since) = e.failing_since { dt { "Failing since" } dd { (when(since)) } }
                }
            } @else {
                p { "No endpoint yet: events of this instance are not delivered anywhere." }
            }
            @if may {
                form.stack method="post" action=(format!("/instances/{id}/webhook")) {
                    (views::csrf_field(&viewer.csrf))
                    label for="url" { "Destination URL (https)" }
                    input #url type="url" name="url" required value=[endpoint.as_ref().map(|e| e.url.as_str())] placeholder="https://example.com/hooks/gateway";
                    label { "Events" }
                    div.checks {
                        @for name in gateway_api::events::EVENT_NAMES {
                            label { input type="checkbox" name=(format!("ev_{name}")) checked[selected(name)]; " " (name) }
                        }
                    }
                    label for="signing" { "Signing secret" }
                    select #signing name="signing" {
                        option value="keep" { @if endpoint.is_some() { "keep the current setting" } @else { "generate one (recommended)" } }
                        option value="unsigned" { "deliver unsigned" }
                    }
                    button type="submit" { "Save endpoint" }
                }
                @if endpoint.is_some() {
                    div.row {
                        (views::button_form(&format!("/instances/{id}/webhook/test"), &viewer.csrf, "Send a test event", &[], "secondary"))
                        " "
                        (views::button_form(&format!("/instances/{id}/webhook/rotate-secret"), &viewer.csrf, "Rotate the signing secret", &[], "secondary"))
                    }
                }
            }
        }
        (health)
        h2 { "Delivery attempts" }
        table #attempts {
            thead { tr { th { "Time" } th { "Event" } th { "Trigger" } th.num { "Attempt" } th { "Result" } th.num { "Latency" } th { "Answer" } th {} } }
            tbody {
                @for a in &attempts {
                    tr {
                        td { (when(a.attempted_at)) }
                        td { (a.event_type) @if let Some(e) = a.outbox_id { br; code { "evt_" (e) } } }
                        td { (a.trigger) }
                        td.num { (a.attempt) }
                        td {
                            @if a.succeeded { (views::badge(&a.status_code.map(|s| s.to_string()).unwrap_or_default(), "ok")) }
                            @else { (views::badge(&a.status_code.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into()), "bad")) }
                            @if let Some(err) = &a.error { br; span.hint { (err) } }
                        }
                        td.num { (a.latency_ms) " ms" }
                        td { @if let Some(body) = &a.response_body { details { summary { "body" } pre { (body) } } } }
                        td { @if may { @if let Some(event) = a.outbox_id { (views::button_form(&format!("/instances/{id}/webhook/resend"), &viewer.csrf, "Resend", &[("event", &event.to_string())], "secondary")) } } }
                    }
                }
                @if attempts.is_empty() { tr { td colspan="8" { "No attempts yet." } } }
            }
        }
        (views::key_pager(&format!("/instances/{id}/manage?tab=webhook"), before.is_none(), next))
    })
}

async fn webhook_result(
    rqctx: &Ctx,
    viewer: &Viewer,
    instance: &Instance,
    status: StatusCode,
    notice: Notice,
    extra: Option<Markup>,
) -> Result<Response<Body>, DashError> {
    Ok(html(status, manage_page(rqctx, viewer, instance, Tab::Webhook, Some(&notice), extra).await?))
}

/// Sets the endpoint; a generated secret is shown once.
#[endpoint { method = POST, path = "/instances/{id}/webhook", unpublished = true }]
async fn webhook_post(rqctx: Ctx, path: Path<InstancePath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, instance) =
            owned_post(&rqctx, &body, &path.into_inner().id, Action::ConfigureWebhook).await?;
        let state = rqctx.context();
        let events = form.checked("ev_").join(",");
        let choice = if form.get("signing") == "unsigned" { SecretChoice::None } else { SecretChoice::Keep };
        match ops::set_webhook(&state.store, &state.config, &instance.id, form.get("url"), &events, choice).await {
            Ok(saved) => {
                info!(rqctx.log, "webhook set"; "user_id" => &viewer.user.id, "instance_id" => &instance.id);
                let extra = saved["secret"].as_str().map(|s| views::shown_once("Signing secret", s));
                webhook_result(&rqctx, &viewer, &instance, StatusCode::OK, Notice::Ok("Endpoint saved.".into()), extra)
                    .await
            }
            Err(e) => {
                let notice = Notice::Error(DashError::from(e).to_string());
                webhook_result(&rqctx, &viewer, &instance, StatusCode::BAD_REQUEST, notice, None).await
            }
        }
    })
    .await
}

/// Rotates the signing secret (the old one signs for 24 more hours).
#[endpoint { method = POST, path = "/instances/{id}/webhook/rotate-secret", unpublished = true }]
async fn webhook_rotate_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::ConfigureWebhook).await?;
        let rotated = ops::rotate_webhook_secret(&rqctx.context().store, &instance.id).await?;
        info!(rqctx.log, "webhook secret rotated"; "user_id" => &viewer.user.id, "instance_id" => &instance.id);
        let extra = rotated["secret"].as_str().map(|s| views::shown_once("New signing secret", s));
        let notice = Notice::Ok("New secret issued; the previous one keeps signing for 24 hours.".into());
        webhook_result(&rqctx, &viewer, &instance, StatusCode::OK, notice, extra).await
    })
    .await
}

/// Enables a disabled endpoint.
#[endpoint { method = POST, path = "/instances/{id}/webhook/enable", unpublished = true }]
async fn webhook_enable_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, _, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::ConfigureWebhook).await?;
        rqctx.context().store.enable_webhook(&instance.id).await?;
        Ok(redirect(&format!("/instances/{}/manage?tab=webhook&done=webhook_enabled", instance.id)))
    })
    .await
}

/// Sends a `webhook.test` event now.
#[endpoint { method = POST, path = "/instances/{id}/webhook/test", unpublished = true }]
async fn webhook_test_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer, instance) = owned_post(&rqctx, &body, &path.into_inner().id, Action::ConfigureWebhook).await?;
        let state = rqctx.context();
        let attempt = ops::webhook_attempt_now(&state.store, &state.config, Some(&instance.id), None).await?;
        webhook_result(&rqctx, &viewer, &instance, StatusCode::OK, attempt_notice("Test event", &attempt), None).await
    })
    .await
}

fn attempt_notice(what: &str, attempt: &serde_json::Value) -> Notice {
    let status = attempt["status"].as_i64().map(|s| s.to_string()).unwrap_or_else(|| "no answer".into());
    if attempt["succeeded"] == true {
        Notice::Ok(format!("{what} delivered: {status} in {} ms.", attempt["latency_ms"]))
    } else {
        let error = attempt["error"].as_str().unwrap_or("");
        Notice::Error(format!("{what} not delivered: {status} {error}"))
    }
}

/// One more attempt of one event of this instance, now.
#[endpoint { method = POST, path = "/instances/{id}/webhook/resend", unpublished = true }]
async fn webhook_resend_post(
    rqctx: Ctx,
    path: Path<InstancePath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, instance) =
            owned_post(&rqctx, &body, &path.into_inner().id, Action::ConfigureWebhook).await?;
        let state = rqctx.context();
        let event_id: i64 = form.get("event").parse().map_err(|_| DashError::NotFound)?;
        let event = state.store.outbox_event(event_id).await?.ok_or(DashError::NotFound)?;
        if event.customer_id != instance.customer_id || event.instance_id.as_deref() != Some(instance.id.as_str()) {
            return Err(DashError::NotFound);
        }
        let attempt = ops::webhook_attempt_now(&state.store, &state.config, None, Some(event_id)).await?;
        info!(rqctx.log, "webhook resend"; "user_id" => &viewer.user.id, "event_id" => event_id);
        let notice = attempt_notice(&format!("Event evt_{event_id}"), &attempt);
        webhook_result(&rqctx, &viewer, &instance, StatusCode::OK, notice, None).await
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(webhook_post),
        api.register(webhook_rotate_post),
        api.register(webhook_enable_post),
        api.register(webhook_test_post),
        api.register(webhook_resend_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
