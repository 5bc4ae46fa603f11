//! The operator console's side of shipping a policy module safely (docs/policies.md,
//! "Ship safely"): a backtest of an uploaded module on the kept inputs, each running
//! shadow's agreement with what decided over the last 24 hours, promoting a shadow or
//! canary, and one message as the operator sees it (each example links to it). The
//! numbers are those of `gateway policy backtest` and `gateway policy shadow`
//! (`policy::backtest`), and a promotion is `gateway policy promote`'s.

use super::message_log::policy_trace;
use super::operator::{operator_post, operator_viewer};
use super::policies::{decode_module, policies_page};
use super::views::{self, Notice};
use super::{Ctx, DashError, html, page, redirect, when};
use crate::bounds;
use crate::policy::backtest::{self, Window};
use crate::policy::reload::HostStatus;
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use serde_json::Value;
use slog::info;

/// Sends a console backtest reads at most (the CLI reads more, with progress).
const CONSOLE_LIMIT: u64 = 100_000;
/// How far back the shadows' agreement is read, and how many sends at most (the newest).
const SHADOW_WINDOW_MS: i64 = 24 * 3_600_000;
const SHADOW_LIMIT: u64 = 10_000;

/// A backtest or shadow report (`policy::backtest::Tally::report`) as a card: the
/// counts, the agreement, each change, and the changed sends linked to their messages.
pub(super) fn report_card(title: &str, report: &Value) -> Markup {
    let evaluated = report["evaluated"].as_u64().unwrap_or(0);
    let same = report["same"].as_u64().unwrap_or(0);
    let agreement =
        if evaluated == 0 { "—".to_string() } else { format!("{:.1} %", 100.0 * same as f64 / evaluated as f64) };
    let changes = report["changes"].as_object().cloned().unwrap_or_default();
    let examples = report["examples"].as_array().cloned().unwrap_or_default();
    html! {
        section.card.report {
            h3 { (title) " " code { (report["module"].as_str().unwrap_or("?")) } }
            dl.facts {
                dt { "Sends evaluated" } dd.evaluated { (evaluated) }
                dt { "Same verdict" } dd.same { (same) " (" (agreement) ")" }
                dt { "Changed" } dd.changed { (report["changed"].as_u64().unwrap_or(0)) }
                dt { "Errors" } dd.errors { (report["errors"].as_u64().unwrap_or(0)) }
                dt { "Fuel" } dd { "p50 " (report["fuel"]["p50"]) ", max " (report["fuel"]["max"]) }
            }
            @if !changes.is_empty() {
                table.changes {
                    thead { tr { th { "Change" } th { "Sends" } } }
                    tbody { @for (change, n) in &changes { tr { td { code { (change) } } td { (n) } } } }
                }
            }
            @if !examples.is_empty() {
                table.examples {
                    thead { tr { th { "Message" } th { "Before" } th { "After" } th { "Rule" } th { "Reason" } } }
                    tbody {
                        @for e in &examples {
                            @let id = e["log_id"].as_i64().unwrap_or(0);
                            tr {
                                td { a href=(format!("/operator/messages/{id}")) { "#" (id) } }
                                td { (e["before"].as_str().unwrap_or("")) }
                                td { (e["after"].as_str().unwrap_or("")) }
                                td { code { (e["rule"].as_str().unwrap_or("—")) } }
                                td { (views::folded(e["reason"].as_str().unwrap_or("—"), 80)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Each shadow running on a gateway of the store, with its agreement over the last
/// 24 hours of live traffic.
pub(super) async fn shadows_section(rqctx: &Ctx, statuses: &[HostStatus]) -> Result<Markup, DashError> {
    let mut names: Vec<String> =
        statuses.iter().flat_map(|s| s.modules.iter().filter(|m| m.mode == "shadow").map(|m| m.name.clone())).collect();
    names.sort();
    names.dedup();
    let window = Window { since_ms: SHADOW_WINDOW_MS, customer: None, limit: SHADOW_LIMIT };
    let mut cards = Vec::new();
    for name in &names {
        let report = backtest::shadow(&rqctx.context().store, name, &window).await.map_err(tool_error)?;
        cards.push(report_card("Shadow of", &report));
    }
    Ok(html! {
        @if !cards.is_empty() {
            h2 #shadows { "Shadows: their verdicts against what decided" }
            p.hint { "The newest " (SHADOW_LIMIT) " sends of the last 24 hours; " code { "gateway policy shadow NAME --since 7d" } " reads further." }
            p.hint { "A shadow is evaluated on every send beside the live module of its name and never changes an answer. Promote it to let it decide, or roll it back to end it." }
            @for card in &cards { (card) }
        }
    })
}

fn tool_error(e: crate::policy::tools::ToolError) -> DashError {
    match e {
        crate::policy::tools::ToolError::Store(e) => DashError::Store(e),
        other => DashError::BadRequest(other.to_string()),
    }
}

/// The backtest form.
pub(super) fn backtest_form(csrf: &str) -> Markup {
    html! {
        h2 #backtest { "Backtest a module" }
        p { "Evaluates a module on the sends of the recent past exactly as the live modules saw them (kept "
            code { "[policies] input_retention_days" } "), and shows what it would have changed. Nothing is installed." }
        form.stack.card method="post" action="/operator/policies/backtest" {
            (views::csrf_field(csrf))
            label.js-only hidden { "Module file" input type="file" accept=".wasm" data-fill="backtest-base64" data-encoding="base64" hidden; }
            label { "Module, base64 (filled from the file)" textarea #backtest-base64 name="module" rows="3" required {} }
            div.row {
                label { "Since" input type="text" name="since" value="7d" size="6"; }
                label { "Customer (optional)" input type="text" name="customer"; }
                label { "At most" input type="number" name="limit" value="10000" min="1" max=(CONSOLE_LIMIT); }
            }
            button type="submit" { "Backtest" }
        }
    }
}

/// Runs a backtest of an uploaded module and shows it on the policy page.
#[endpoint {
    method = POST,
    path = "/operator/policies/backtest",
    unpublished = true,
    request_body_max_bytes = super::policies::UPLOAD_MAX_BYTES,
}]
async fn backtest_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let state = rqctx.context();
        let refuse = |message: String| async {
            let notice = Notice::Error(message);
            Ok(html(StatusCode::BAD_REQUEST, policies_page(&rqctx, &viewer, Some(&notice), None).await?))
        };
        if state.config.policies.input_retention_days == 0 {
            return refuse("Backtesting is off: [policies] input_retention_days is 0, so no inputs are kept.".into())
                .await;
        }
        let host = state.policies.as_ref().map(|p| p.host().clone()).ok_or_else(|| {
            DashError::BadRequest("This gateway runs no policy host to evaluate the module with.".into())
        })?;
        let since_ms = match bounds::duration_ms("Since", form.get("since")) {
            Ok(ms) => ms,
            Err(e) => return refuse(e).await,
        };
        let limit = form.get("limit").parse::<u64>().ok().filter(|n| (1..=CONSOLE_LIMIT).contains(n));
        let Some(limit) = limit else {
            return refuse(format!("At most: a number of sends from 1 to {CONSOLE_LIMIT}.")).await;
        };
        let bytes = decode_module(&form)?;
        let loading = host.clone();
        let module = tokio::task::spawn_blocking(move || loading.load(&bytes, "console backtest", false))
            .await
            .map_err(|e| DashError::Internal(e.to_string()))?;
        let module = match module {
            Ok(module) => std::sync::Arc::new(module),
            Err(e) => return refuse(format!("Refused: the module {e}.")).await,
        };
        let window = Window { since_ms, customer: form.opt("customer").map(str::to_string), limit };
        let started = std::time::Instant::now();
        let report = backtest::backtest(&state.store, &host, module, &window, |_| {}).await.map_err(tool_error)?;
        info!(rqctx.log, "policy backtest"; "by" => &viewer.user.id, "module" => report["module"].as_str(),
              "evaluated" => report["evaluated"].as_u64(), "ms" => started.elapsed().as_millis() as u64);
        let card = report_card("Backtest of", &report);
        Ok(html(StatusCode::OK, policies_page(&rqctx, &viewer, None, Some(card)).await?))
    })
    .await
}

/// Makes the shadow or canary of a module its live module on every gateway.
#[endpoint { method = POST, path = "/operator/policies/promote", unpublished = true }]
async fn promote_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let name = form.get("name");
        if name.is_empty() || name.len() > 64 {
            return Err(DashError::BadRequest("Which module?".into()));
        }
        let by = format!("console {}", viewer.user.email);
        let Some((trial, live)) = rqctx.context().store.promote_policy_module(name, &by).await? else {
            let notice = Notice::Error(format!("No shadow or canary of {name} runs."));
            return Ok(html(StatusCode::BAD_REQUEST, policies_page(&rqctx, &viewer, Some(&notice), None).await?));
        };
        info!(rqctx.log, "policy promoted"; "by" => &viewer.user.id, "module" => name, "version" => &live.version,
              "was" => trial.rollout.mode_label(), "stored_id" => live.id);
        Ok(redirect("/operator/policies?done=promote"))
    })
    .await
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct MessagePath {
    id: i64,
}

/// One message-log row as the operator sees it: what it became and every module's
/// verdict, the shadows' included.
#[endpoint { method = GET, path = "/operator/messages/{id}", unpublished = true }]
async fn message_get(rqctx: Ctx, path: Path<MessagePath>) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let id = path.into_inner().id;
        let store = &rqctx.context().store;
        let e = store.log_entry(id).await?;
        let customer = store.customer(&e.customer_id).await.map(|c| c.name).unwrap_or_default();
        let body = html! {
            p { a href="/operator/policies" { "← Policy modules" } }
            section.card {
                dl.facts {
                    dt { "Customer" } dd { (customer) " " code { (e.customer_id) } }
                    dt { "Written" } dd { (when(e.created_at)) }
                    dt { "Decision" } dd #decision { (e.decision) " · " (e.status) }
                    dt { "Recipient" } dd { code { (e.recipient.as_deref().unwrap_or("—")) } }
                    dt { "Purpose" } dd { (e.purpose.as_deref().unwrap_or("—")) " · " (e.message_type.as_deref().unwrap_or("—")) }
                    dt { "Source" } dd { (e.source) }
                    @if let Some(code) = &e.error_code { dt { "Error" } dd { code { (crate::store::insight::refusal_rule(Some(code), e.policy_trace.as_deref())) } } }
                    @if let Some(p) = &e.policy { dt { "Decided by" } dd { code { (p) } } }
                    @if let Some(reason) = &e.reason { dt { "Reason" } dd { (reason) } }
                }
            }
            h2 { "Policies" }
            @if e.policy_trace.is_some() { (policy_trace(e.policy_trace.as_deref())) } @else { p.hint { "No policy module was asked." } }
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/operator/policies", &format!("Message #{id}"), None, body)))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [api.register(backtest_post), api.register(promote_post), api.register(message_get)] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
