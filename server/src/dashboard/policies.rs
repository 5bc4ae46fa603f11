//! The operator console's policy pages: the review queue (messages a policy held,
//! dismissed as a false positive or confirmed as abuse) and the policy modules (what
//! every running gateway runs, reload, rollback, and uploading a module).
//!
//! Reload and rollback are the same store commands as `gateway policy reload /
//! rollback`: every gateway on the store carries them out within its poll interval,
//! and this page shows each gateway's answer. An uploaded module is checked here as a
//! gateway would check it (compile, sandbox checks, all of its fixtures) before it is
//! installed in the store (as `gateway policy install` does), and every gateway on the
//! store, on any machine, then loads it within a few seconds.

use super::operator::{operator_post, operator_viewer};
use super::policy_rollout;
use super::session::Viewer;
use super::views::{self, Notice};
use super::{Ctx, DashError, PAGE_SIZE, before_id, html, page, query, redirect, when};
use crate::policy::reload::HostStatus;
use crate::policy::tools::{self, ToolError};
use crate::store::{ReviewEntry, now_ms};
use base64::Engine as _;
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;
use slog::info;
use std::collections::HashMap;

/// Largest upload form (a module of at most 1 MiB, base64-encoded, and the form).
pub(super) const UPLOAD_MAX_BYTES: usize = 2 * 1024 * 1024;

#[derive(Deserialize, schemars::JsonSchema)]
struct ReviewPath {
    id: i64,
}

/// The review queue.
#[endpoint { method = GET, path = "/operator/reviews", unpublished = true }]
async fn reviews_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let q = query(&rqctx);
        let status = q
            .get("status")
            .map(String::as_str)
            .filter(|s| matches!(*s, "dismissed" | "confirmed" | "all"))
            .unwrap_or("pending");
        let before = before_id(&q);
        let store = &rqctx.context().store;
        let filter = (status != "all").then_some(status);
        let items = store.review_queue(filter, None, PAGE_SIZE, before).await?;
        let next = (items.len() as i64 == PAGE_SIZE).then(|| items.last().map(|r| r.id)).flatten();
        let mut customers: HashMap<String, String> = HashMap::new();
        let mut paused: HashMap<String, bool> = HashMap::new();
        for item in &items {
            if !customers.contains_key(&item.customer_id) {
                let name = store.customer(&item.customer_id).await.map(|c| c.name).unwrap_or_default();
                customers.insert(item.customer_id.clone(), name);
            }
            if !paused.contains_key(&item.instance_id) {
                let is_paused = store.instance(&item.instance_id).await.map(|i| i.paused).unwrap_or(false);
                paused.insert(item.instance_id.clone(), is_paused);
            }
        }
        let notice = match q.get("done").map(String::as_str) {
            Some("dismissed") => Some(Notice::Ok("Dismissed: the policy was wrong about it.".into())),
            Some("confirmed") => Some(Notice::Ok("Confirmed as abuse.".into())),
            _ => None,
        };
        let base = format!("/operator/reviews?status={status}");
        let body = html! {
            p { "Messages a policy held for review. They were refused (403 policy_violation, action review) and not sent. "
                "Three reviews of one instance within 24 hours pause it; resume it when you have looked." }
            form.row.card method="get" action="/operator/reviews" {
                label { "Status"
                    select name="status" {
                        @for s in ["pending", "dismissed", "confirmed", "all"] { option value=(s) selected[s == status] { (s) } }
                    }
                }
                button.secondary type="submit" { "Show" }
            }
            table #reviews {
                thead { tr { th { "Held" } th { "Customer / instance" } th { "Message" } th { "Policy" } th { "Status" } } }
                tbody {
                    @for item in &items { (review_row(&viewer, item, &customers, &paused)) }
                    @if items.is_empty() { tr { td colspan="5" { "Nothing here." } } }
                }
            }
            (views::key_pager(&base, before.is_none(), next))
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/operator/reviews", "Review queue", notice.as_ref(), body)))
    })
    .await
}

fn review_row(
    viewer: &Viewer,
    r: &ReviewEntry,
    customers: &HashMap<String, String>,
    paused: &HashMap<String, bool>,
) -> Markup {
    html! {
        tr {
            td { (when(r.created_at)) br; span.hint { "log #" (r.log_id) } }
            td {
                a href=(format!("/operator/customers/{}", r.customer_id)) { (customers.get(&r.customer_id).map(String::as_str).unwrap_or("")) }
                br; code { (r.instance_id) }
                @if paused.get(&r.instance_id).copied().unwrap_or(false) {
                    br; (views::badge("paused", "bad")) " "
                    (views::button_form(&format!("/operator/instances/{}/resume", r.instance_id), &viewer.csrf, "Resume", &[], ""))
                }
            }
            td {
                span.hint { (r.source) " · " (r.purpose.as_deref().unwrap_or("")) " · " (r.message_type.as_deref().unwrap_or("text")) " · to " (r.recipient.as_deref().unwrap_or("")) }
                pre.message { (r.text.as_deref().unwrap_or("(no text)")) }
            }
            td.long { code { (r.policy) } br; (r.reason) br; span.hint { "risk " (r.risk_score) } }
            td {
                @if r.status == "pending" {
                    form.stack method="post" action=(format!("/operator/reviews/{}/decide", r.id)) {
                        (views::csrf_field(&viewer.csrf))
                        input type="text" name="note" placeholder="note (optional)" maxlength="500";
                        div.row {
                            button.secondary type="submit" name="verdict" value="dismissed" { "Dismiss: not abuse" }
                            button.danger type="submit" name="verdict" value="confirmed" { "Confirm abuse" }
                        }
                    }
                } @else {
                    (views::badge(&r.status, if r.status == "confirmed" { "bad" } else { "muted" }))
                    br; span.hint { (r.decided_by.as_deref().unwrap_or("")) " " (r.decided_at.map(when).unwrap_or_default()) }
                    @if let Some(note) = &r.note { br; (note) }
                }
            }
        }
    }
}

/// Records an operator's decision on a held message.
#[endpoint { method = POST, path = "/operator/reviews/{id}/decide", unpublished = true }]
async fn review_decide_post(
    rqctx: Ctx,
    path: Path<ReviewPath>,
    body: UntypedBody,
) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let verdict = match form.get("verdict") {
            v @ ("dismissed" | "confirmed") => v,
            _ => return Err(DashError::BadRequest("Choose dismiss or confirm.".into())),
        };
        let note: Option<String> = form.opt("note").map(|n| n.chars().take(500).collect());
        let id = path.into_inner().id;
        let entry = crate::ops::reviews::decide_review(
            &rqctx.context().store,
            id,
            verdict,
            &viewer.user.email,
            note.as_deref(),
        )
        .await?;
        info!(rqctx.log, "review decided"; "by" => &viewer.user.id, "review_id" => id, "verdict" => verdict,
              "instance_id" => &entry.instance_id);
        Ok(redirect(&format!("/operator/reviews?done={verdict}")))
    })
    .await
}

/// The policy modules each running gateway uses.
#[endpoint { method = GET, path = "/operator/policies", unpublished = true }]
async fn policies_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let notice = match query(&rqctx).get("done").map(String::as_str) {
            Some("reload") => {
                Some(Notice::Ok("Reload sent: every gateway reads its policies directory within a second.".into()))
            }
            Some("rollback") => Some(Notice::Ok("Rollback sent to every gateway; their answers are below.".into())),
            Some("promote") => Some(Notice::Ok(
                "Promoted: every gateway makes it the live module within a few seconds; the one before is kept for rollback."
                    .into(),
            )),
            _ => None,
        };
        Ok(html(StatusCode::OK, policies_page(&rqctx, &viewer, notice.as_ref(), None).await?))
    })
    .await
}

/// The policy page, with a backtest's result (`result`) when one was run.
pub(super) async fn policies_page(
    rqctx: &Ctx,
    viewer: &Viewer,
    notice: Option<&Notice>,
    result: Option<Markup>,
) -> Result<Markup, DashError> {
    let state = rqctx.context();
    let now = now_ms();
    let gateways = state.store.policy_gateways(now - 3_600_000).await?;
    let statuses: Vec<HostStatus> =
        gateways.iter().map(|g| serde_json::from_str(&g.status).unwrap_or_default()).collect();
    let shadows = policy_rollout::shadows_section(rqctx, &statuses).await?;
    let dir = state.config.policies_dir.as_deref().filter(|d| !d.is_empty());
    Ok(views::page(
        viewer,
        "/operator/policies",
        "Policy modules",
        notice,
        html! {
            p { "Every send is decided by these WebAssembly modules. A module goes live only after it compiles, passes the sandbox checks and all of its own fixtures; otherwise the version it would replace stays. "
                a href="/docs/responsible-messaging" { "What the default policies check." } }
            div.row {
                (views::button_form("/operator/policies/reload", &viewer.csrf, "Reload on every gateway", &[], "secondary"))
            }
            @if let Some(result) = &result { (result) }
            @for (g, status) in gateways.iter().zip(&statuses) {
                @let live = now - g.heartbeat_at <= 30_000;
                section.card.gateway {
                    h2 { "Gateway " code { (g.host) } " pid " (g.pid) " " @if live { (views::badge("live", "ok")) } @else { (views::badge("silent", "warn")) } }
                    p.hint { "started " (when(g.started_at)) ", last report " (when(g.heartbeat_at)) ", set generation " (status.generation) }
                    table.modules {
                        thead { tr { th { "Module" } th { "Version" } th { "Mode" } th { "SHA-256" } th { "Stages" } th { "Source" } th { "Fixtures" } th { "Previous" } th {} } }
                        tbody {
                            @for m in &status.modules {
                                tr {
                                    td.long { (m.name) @if m.pinned { " " (views::badge("rolled back", "warn")) } }
                                    td { (m.version) }
                                    td.mode {
                                        (views::badge(&m.mode, if m.mode == "live" { "ok" } else { "warn" }))
                                        @if !m.customers.is_empty() { " " span.hint { "customers " (m.customers.join(", ")) } }
                                        @if !m.plans.is_empty() { " " span.hint { "plans " (m.plans.join(", ")) } }
                                    }
                                    td { code title=(m.sha256) { (m.sha256.get(..12).unwrap_or(&m.sha256)) } }
                                    td { (m.stages.join(", ")) }
                                    td { (m.source) }
                                    td { (m.fixtures) }
                                    td { (m.previous.as_deref().unwrap_or("—")) }
                                    td {
                                        @if m.mode != "live" { (views::button_form("/operator/policies/promote", &viewer.csrf, "Promote", &[("name", m.name.as_str())], "")) " " }
                                        @if m.previous.is_some() || m.source.starts_with("store") { (views::button_form("/operator/policies/rollback", &viewer.csrf, "Roll back", &[("name", m.name.as_str())], "secondary")) }
                                    }
                                }
                            }
                        }
                    }
                    @if !status.refused.is_empty() {
                        h3 { "Refused" }
                        ul { @for r in &status.refused { li { code { (r.source) } " (" code { (r.sha256.get(..12).unwrap_or("")) } ", " (when(r.at)) "): " (r.error) } } }
                    }
                    @if let Some(c) = &status.last_command {
                        p.hint { "Last command #" (c.id) " " (c.command) ": " @if c.ok { (views::badge("ok", "ok")) } @else { (views::badge("failed", "bad")) } " " (c.message) }
                    }
                }
            }
            @if gateways.is_empty() { p { "No gateway has reported in the last hour." } }
            (shadows)
            (policy_rollout::backtest_form(&viewer.csrf))
            h2 { "Upload a module" }
            p { "A module built with " code { "gateway policy build IN.wasm --fixtures FIXTURES.json -o OUT.wasm" } ". It is checked here first, then installed in the store (a module named like a running one replaces it); every gateway on the store loads it within a few seconds. "
                @if let Some(dir) = dir { "Files in " code { (dir) } " stay a local source of this machine's gateways; a stored module of the same name takes precedence." } }
            form.stack.card method="post" action="/operator/policies/upload" {
                (views::csrf_field(&viewer.csrf))
                label.js-only hidden { "Module file" input type="file" accept=".wasm" data-fill="module-base64" data-encoding="base64" hidden; }
                label { "Module, base64 (filled from the file)" textarea #module-base64 name="module" rows="3" required {} }
                div.row {
                    label { "Run as"
                        select name="mode" {
                            option value="live" selected { "live" }
                            option value="shadow" { "shadow (evaluated, never deciding)" }
                            option value="canary" { "canary (decides a share of sends)" }
                        }
                    }
                    label { "Canary share, %" input type="number" name="percent" min="1" max="99" placeholder="10"; }
                }
                div.row {
                    label { "Only these customers (ids, comma-separated)" input type="text" name="customers"; }
                    label { "Only these plans" input type="text" name="plans" placeholder="starter,scale"; }
                }
                button type="submit" { "Check and install" }
            }
        },
    ))
}

/// Tells every gateway to read its policies directory now.
#[endpoint { method = POST, path = "/operator/policies/reload", unpublished = true }]
async fn policies_reload_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = operator_post(&rqctx, &body).await?;
        let id = rqctx.context().store.add_policy_command("reload", None).await?;
        info!(rqctx.log, "policy reload requested"; "by" => &viewer.user.id, "command_id" => id);
        Ok(redirect("/operator/policies?done=reload"))
    })
    .await
}

/// Brings the previous version of a module back on every gateway.
#[endpoint { method = POST, path = "/operator/policies/rollback", unpublished = true }]
async fn policies_rollback_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let name = form.get("name");
        if name.is_empty() || name.len() > 64 {
            return Err(DashError::BadRequest("Which module?".into()));
        }
        let (id, retired) = crate::policy::tools::request_rollback(&rqctx.context().store, name).await?;
        info!(rqctx.log, "policy rollback requested"; "by" => &viewer.user.id, "module" => name, "command_id" => id,
              "retired_stored_id" => retired.map(|r| r.id));
        Ok(redirect("/operator/policies?done=rollback"))
    })
    .await
}

/// Checks an uploaded module as a gateway would and installs it in the store; every
/// gateway then loads it.
#[endpoint {
    method = POST,
    path = "/operator/policies/upload",
    unpublished = true,
    request_body_max_bytes = UPLOAD_MAX_BYTES,
}]
async fn policies_upload_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let state = rqctx.context();
        let host = state.policies.as_ref().map(|p| p.host().clone()).ok_or_else(|| {
            DashError::BadRequest("This gateway runs no policy host to check the module with.".into())
        })?;
        let bytes = decode_module(&form)?;
        let by = format!("console {}", viewer.user.email);
        let list = |field: &str| -> Vec<String> {
            form.get(field).split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
        };
        let canary = match form.get("mode") {
            "canary" => Some(form.get("percent").parse::<u8>().unwrap_or(0)),
            _ => None,
        };
        let shadow = form.get("mode") == "shadow";
        let rollout = match tools::rollout(&state.store, shadow, canary, &list("customers"), &list("plans")).await {
            Ok(rollout) => rollout,
            Err(ToolError::Store(e)) => return Err(e.into()),
            Err(e) => {
                let notice = Notice::Error(format!("Refused: {e}. Nothing was installed."));
                return Ok(html(StatusCode::BAD_REQUEST, policies_page(&rqctx, &viewer, Some(&notice), None).await?));
            }
        };
        let (module, stored) = match tools::install_as(&state.store, host, bytes, &by, rollout).await {
            Ok(installed) => installed,
            Err(ToolError::Store(e)) => return Err(e.into()),
            Err(e) => {
                let notice = Notice::Error(format!("Refused: the module {e}. Nothing was installed."));
                return Ok(html(StatusCode::BAD_REQUEST, policies_page(&rqctx, &viewer, Some(&notice), None).await?));
            }
        };
        info!(rqctx.log, "policy module installed"; "by" => &viewer.user.id, "module" => module.label(),
              "sha256" => module.short_hash(), "stored_id" => stored.id, "mode" => stored.rollout.mode_label(),
              "scope" => stored.rollout.scope_label());
        let notice = Notice::Ok(format!(
            "{} ({}) passed its {} fixtures and was installed in the store (#{}) as {} for {}; every gateway loads it within a few seconds.",
            module.label(),
            module.short_hash(),
            module.metadata.fixtures.len(),
            stored.id,
            stored.rollout.mode_label(),
            stored.rollout.scope_label()
        ));
        Ok(html(StatusCode::OK, policies_page(&rqctx, &viewer, Some(&notice), None).await?))
    })
    .await
}

/// The module of an upload form, from its base64 field.
pub(super) fn decode_module(form: &super::Form) -> Result<Vec<u8>, DashError> {
    let compact: String = form.raw("module").split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|_| DashError::BadRequest("The module is not base64: choose the .wasm file again.".into()))
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(reviews_get),
        api.register(review_decide_post),
        api.register(policies_get),
        api.register(policies_reload_post),
        api.register(policies_rollback_post),
        api.register(policies_upload_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
