//! `/integrations/pbx`: the customer's phone-system integrations: webhook address,
//! secrets (shown once, at creation or rotation), settings (business name, rate limit,
//! cooldown, strict conversation window, IP allowlist), message templates per event
//! type, and the received events. Owners and admins create integrations and rotate
//! secrets; developers change settings and templates too.
//!
//! The forms post to literal paths under `/integrations/pbx/` with the integration in
//! the form, because `/integrations/pbx/webhook/{integration_id}` (the public
//! endpoint) owns the variable segment there.

use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, Form, PAGE_SIZE, before_id, html, page, query, redirect, when};
use crate::bounds;
use crate::ops;
use crate::store::{PbxIntegration, PbxSettingsUpdate};
use dropshot::{Body, HttpError, UntypedBody, endpoint};
use gateway_api::{MessagePurpose, PbxEventType};
use http::{Response, StatusCode};
use maud::{Markup, html};
use slog::info;

/// A POST about one of the viewer's integrations (the form's `integration`): the form,
/// the viewer (see `session::post_form`) and the integration (404 when it is another
/// customer's, the same answer as for an id that does not exist).
async fn owned_post(
    rqctx: &Ctx,
    body: &UntypedBody,
    action: Action,
) -> Result<(Form, Viewer, PbxIntegration), DashError> {
    let (form, viewer) = session::post_form(rqctx, body, action).await?;
    let id: i64 = form.get("integration").parse().map_err(|_| DashError::NotFound)?;
    let integration = rqctx.context().store.pbx_integration(id).await?.ok_or(DashError::NotFound)?;
    if integration.customer_id != viewer.customer_id()? {
        return Err(DashError::NotFound);
    }
    Ok((form, viewer, integration))
}

async fn render(
    rqctx: &Ctx,
    viewer: &Viewer,
    notice: Option<&Notice>,
    extra: Option<Markup>,
) -> Result<Markup, DashError> {
    let state = rqctx.context();
    let store = &state.store;
    let customer = viewer.customer()?;
    let q = query(rqctx);
    let ids = store.pbx_integration_ids(&customer.id).await?;
    let (instances, _) = store.instances_page(&customer.id, 500, 0).await?;
    let may_configure = viewer.role.may(Action::ConfigurePbx);
    let may_secrets = viewer.role.may(Action::ManagePbxSecrets);
    let base_url = state.config.public_base_url();
    let mut sections = Vec::new();
    for id in ids {
        let Some(p) = store.pbx_integration(id).await? else { continue };
        let templates = store.pbx_templates(id).await?;
        let before = if q.get("events").map(String::as_str) == Some(&id.to_string()) { before_id(&q) } else { None };
        let events = store.pbx_events_page(id, before, PAGE_SIZE).await?;
        let next = (events.len() as i64 == PAGE_SIZE).then(|| events.last().map(|e| e.id)).flatten();
        let instance_name =
            instances.iter().find(|i| i.id == p.instance_id).map(|i| i.name.clone()).unwrap_or(p.instance_id.clone());
        let sid = id.to_string();
        let cfg = &state.config.pbx;
        sections.push(html! {
            section.card id=(format!("pbx-{id}")) {
                h2 { "Integration " (id) " · instance " (instance_name) }
                dl.facts {
                    dt { "Webhook URL" } dd { code { (base_url.trim_end_matches('/')) "/integrations/pbx/webhook/" (id) } }
                    dt { "Secret header" } dd { code { "X-Gateway-3CX-Secret" } " · starts with " code { (p.secret_prefix) "…" } }
                    dt { "Signing (HMAC)" } dd { @if p.hmac_secret.is_some() { (views::badge("required", "ok")) } @else { (views::badge("off", "muted")) } }
                    @if let Some(at) = p.secret_rotated_at { dt { "Secret rotated" } dd { (when(at)) } }
                }
                @if may_secrets {
                    form.row method="post" action="/integrations/pbx/rotate-secret" {
                        (views::csrf_field(&viewer.csrf))
                        input type="hidden" name="integration" value=(sid);
                        label { span { input type="checkbox" name="hmac" checked[p.hmac_secret.is_some()]; " new signing secret too" } }
                        button.secondary type="submit" { "Rotate secrets" }
                        span.hint { "The old secret stops working at once." }
                    }
                }
                h2 { "Settings" }
                @if may_configure {
                    form.stack method="post" action="/integrations/pbx/settings" {
                        (views::csrf_field(&viewer.csrf))
                        input type="hidden" name="integration" value=(sid);
                        div.grid {
                            div { label { "Business name ({{business_name}})" } input type="text" name="business_name" value=[p.business_name.as_deref()] maxlength="100"; }
                            div { label { "Requests a minute" } input type="number" name="rate_per_minute" min=(bounds::PBX_RATE_PER_MINUTE.start()) max=(bounds::PBX_RATE_PER_MINUTE.end()) value=(p.rate_per_minute.unwrap_or(cfg.rate_per_minute)); }
                            div { label { "Burst" } input type="number" name="burst" min=(bounds::PBX_BURST.start()) max=(bounds::PBX_BURST.end()) value=(p.burst.unwrap_or(cfg.burst)); }
                            div { label { "Cooldown per caller (minutes, 0: none)" } input type="number" name="cooldown_minutes" min=(bounds::PBX_COOLDOWN_MINUTES.start()) max=(bounds::PBX_COOLDOWN_MINUTES.end()) value=(p.cooldown_seconds.map(|s| s / 60).unwrap_or(cfg.cooldown_minutes)); }
                            div { label { "Strict window (hours; empty: off)" } input type="number" name="strict_window_hours" min=(bounds::PBX_STRICT_WINDOW_HOURS.start()) max=(bounds::PBX_STRICT_WINDOW_HOURS.end()) value=[p.strict_window_hours]; }
                            div { label { "IP allowlist (empty: any)" } input type="text" name="ip_allowlist" value=[p.ip_allowlist.as_deref()] placeholder="203.0.113.0/24, 198.51.100.7"; }
                        }
                        button type="submit" { "Save settings" }
                    }
                } @else {
                    dl.facts {
                        dt { "Business name" } dd { (p.business_name.as_deref().unwrap_or("—")) }
                        dt { "Rate limit" } dd { (p.rate_per_minute.unwrap_or(cfg.rate_per_minute)) " a minute, burst " (p.burst.unwrap_or(cfg.burst)) }
                        dt { "Cooldown per caller" } dd { (p.cooldown_seconds.map(|s| s / 60).unwrap_or(cfg.cooldown_minutes)) " minutes" }
                        dt { "Strict window" } dd { (p.strict_window_hours.map(|h| format!("{h} hours")).unwrap_or_else(|| "off".into())) }
                        dt { "IP allowlist" } dd { (p.ip_allowlist.as_deref().unwrap_or("any address")) }
                    }
                }
                h2 { "Templates" }
                table {
                    thead { tr { th { "Event" } th { "Purpose" } th { "Message" } th {} } }
                    tbody {
                        @for t in &templates {
                            tr {
                                td { code { (t.event_type) } } td { (t.purpose) } td { (t.body) }
                                td { @if may_configure { (views::button_form("/integrations/pbx/template/remove", &viewer.csrf, "Remove", &[("integration", &sid), ("event", &t.event_type)], "secondary")) } }
                            }
                        }
                        @if templates.is_empty() { tr { td colspan="4" { "No templates: call events are received but send nothing." } } }
                    }
                }
                @if may_configure {
                    form.stack method="post" action="/integrations/pbx/template" {
                        (views::csrf_field(&viewer.csrf))
                        input type="hidden" name="integration" value=(sid);
                        div.grid {
                            div { label { "Event" } select name="event" { @for e in PbxEventType::ALL { @if e.is_templatable() { option value=(e.as_str()) { (e.as_str()) } } } } }
                            div { label { "Purpose" } select name="purpose" { @for pu in MessagePurpose::ALL { option value=(pu.as_str()) selected[pu.as_str() == "support"] { (pu.as_str()) } } } }
                        }
                        label { "Message" }
                        textarea name="text" required placeholder="{{business_name}}: sorry we missed your call at {{call_time}}. We will call you back." {}
                        p.hint { "Placeholders: {{customer_phone}}, {{agent_extension}}, {{queue}}, {{call_time}}, {{business_name}}." }
                        button type="submit" { "Save template" }
                    }
                }
                h2 { "Received events" }
                table {
                    thead { tr { th { "Received" } th { "Event" } th { "Action" } th.num { "Answer" } th { "Error" } th { "Phone" } th { "Message" } } }
                    tbody {
                        @for e in &events {
                            tr {
                                td { (when(e.created_at)) } td { (e.event_type) } td { (e.action) } td.num { (e.status_code) }
                                td.long { (e.error_code.as_deref().unwrap_or("")) } td { (e.phone.as_deref().unwrap_or("")) } td.long { (e.message_id.as_deref().unwrap_or("")) }
                            }
                        }
                        @if events.is_empty() { tr { td colspan="7" { "No events yet." } } }
                    }
                }
                (views::key_pager(&format!("/integrations/pbx?events={id}"), before.is_none(), next))
            }
        });
    }
    Ok(views::page(
        viewer,
        "/integrations/pbx",
        "PBX integration",
        notice,
        html! {
            @if !customer.module_pbx {
                div.banner { "The pbx module is off for your account: events are refused with module_not_enabled. Ask an operator to turn it on." }
            }
            p { "Your phone system (3CX or anything that can POST JSON) reports call events here, and the gateway messages the caller from your templates through the same checks as every other send." }
            @if let Some(extra) = extra { (extra) }
            @if may_secrets {
                form.row.card method="post" action="/integrations/pbx" {
                    (views::csrf_field(&viewer.csrf))
                    label { "Instance" select name="instance" required { @for i in &instances { option value=(i.id) { (i.name) } } } }
                    label { "Business name" input type="text" name="business_name" maxlength="100"; }
                    label { span { input type="checkbox" name="hmac" checked; " require signed requests (HMAC)" } }
                    button type="submit" { "Create integration" }
                }
            }
            @for s in &sections { (s) }
            @if sections.is_empty() { p { "No integration yet." } }
        },
    ))
}

/// The PBX page.
#[endpoint { method = GET, path = "/integrations/pbx", unpublished = true }]
async fn pbx_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let notice = match query(&rqctx).get("done").map(String::as_str) {
            Some("settings") => Some(Notice::Ok("Settings saved.".into())),
            Some("template") => Some(Notice::Ok("Template saved.".into())),
            Some("template_removed") => Some(Notice::Ok("Template removed.".into())),
            _ => None,
        };
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, notice.as_ref(), None).await?))
    })
    .await
}

fn secrets_box(answer: &serde_json::Value) -> Markup {
    html! {
        div #pbx-secrets {
            @if let Some(s) = answer["webhook_secret"].as_str() { (views::shown_once("Webhook secret (X-Gateway-3CX-Secret)", s)) }
            @if let Some(s) = answer["hmac_secret"].as_str() { (views::shown_once("Signing secret (HMAC)", s)) }
        }
    }
}

/// Creates an integration; its secrets are shown once.
#[endpoint { method = POST, path = "/integrations/pbx", unpublished = true }]
async fn pbx_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManagePbxSecrets).await?;
        let customer_id = viewer.customer_id()?.to_string();
        let store = &rqctx.context().store;
        // Only the customer's own instance (by id): `create_pbx` looks it up within the customer.
        let instance = store.find_instance(&customer_id, form.get("instance")).await?.ok_or(DashError::NotFound)?;
        let answer =
            ops::create_pbx(store, &customer_id, &instance.id, form.get("hmac") == "on", form.opt("business_name"))
                .await?;
        info!(rqctx.log, "pbx integration created"; "user_id" => &viewer.user.id, "integration_id" => answer["integration_id"].as_i64());
        let notice = Notice::Ok("Integration created. Configure the phone system with these secrets.".into());
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice), Some(secrets_box(&answer))).await?))
    })
    .await
}

/// Rotates an integration's secrets; the new ones are shown once.
#[endpoint { method = POST, path = "/integrations/pbx/rotate-secret", unpublished = true }]
async fn pbx_rotate_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, integration) = owned_post(&rqctx, &body, Action::ManagePbxSecrets).await?;
        let answer = ops::rotate_pbx_secret(&rqctx.context().store, integration.id, form.get("hmac") == "on").await?;
        info!(rqctx.log, "pbx secret rotated"; "user_id" => &viewer.user.id, "integration_id" => integration.id);
        let notice = Notice::Ok("New secrets issued; the old ones no longer work.".into());
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice), Some(secrets_box(&answer))).await?))
    })
    .await
}

fn number(form: &Form, name: &str) -> Result<Option<i64>, DashError> {
    form.opt(name)
        .map(|v| v.parse::<i64>().map_err(|_| DashError::BadRequest(format!("{name} must be a whole number"))))
        .transpose()
}

/// Saves an integration's settings.
#[endpoint { method = POST, path = "/integrations/pbx/settings", unpublished = true }]
async fn pbx_settings_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, integration) = owned_post(&rqctx, &body, Action::ConfigurePbx).await?;
        let update = PbxSettingsUpdate {
            business_name: Some(form.opt("business_name").map(str::to_string)),
            rate_per_minute: number(&form, "rate_per_minute")?.map(Some),
            burst: number(&form, "burst")?.map(Some),
            cooldown_seconds: number(&form, "cooldown_minutes")?
                .map(crate::ops::cooldown_seconds)
                .transpose()?
                .map(Some),
            strict_window_hours: Some(number(&form, "strict_window_hours")?),
            ip_allowlist: Some(form.opt("ip_allowlist").map(str::to_string)),
        };
        if let Err(e) = ops::update_pbx(&rqctx.context().store, integration.id, &update).await {
            let notice = Notice::Error(DashError::from(e).to_string());
            return Ok(html(StatusCode::BAD_REQUEST, render(&rqctx, &viewer, Some(&notice), None).await?));
        }
        info!(rqctx.log, "pbx settings changed"; "user_id" => &viewer.user.id, "integration_id" => integration.id);
        Ok(redirect("/integrations/pbx?done=settings"))
    })
    .await
}

/// Sets the template of an event type.
#[endpoint { method = POST, path = "/integrations/pbx/template", unpublished = true }]
async fn pbx_template_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer, integration) = owned_post(&rqctx, &body, Action::ConfigurePbx).await?;
        let store = &rqctx.context().store;
        if let Err(e) =
            ops::set_pbx_template(store, integration.id, form.get("event"), form.get("text"), form.get("purpose")).await
        {
            let notice = Notice::Error(DashError::from(e).to_string());
            return Ok(html(StatusCode::BAD_REQUEST, render(&rqctx, &viewer, Some(&notice), None).await?));
        }
        Ok(redirect("/integrations/pbx?done=template"))
    })
    .await
}

/// Removes the template of an event type.
#[endpoint { method = POST, path = "/integrations/pbx/template/remove", unpublished = true }]
async fn pbx_template_remove_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, _, integration) = owned_post(&rqctx, &body, Action::ConfigurePbx).await?;
        ops::pbx::remove_pbx_template(&rqctx.context().store, integration.id, form.get("event")).await?;
        Ok(redirect("/integrations/pbx?done=template_removed"))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(pbx_get),
        api.register(pbx_post),
        api.register(pbx_rotate_post),
        api.register(pbx_settings_post),
        api.register(pbx_template_post),
        api.register(pbx_template_remove_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
