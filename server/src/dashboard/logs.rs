//! `/messages`: the message log with filters, each row with its decision, the check or
//! policy that made it and why; `/inbound-logs`: messages received by the instances.
//! Both page by key (newest first, "Older →").

use super::roles::Action;
use super::session::{self, Viewer};
use super::views;
use super::{Ctx, DashError, PAGE_SIZE, before_id, html, page, query, when};
use crate::send::phone;
use crate::store::{LogEntry, LogFilter};
use dropshot::{Body, HttpError, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use std::collections::HashMap;

/// The viewer's instances: id → name (for filters and rows).
async fn instance_names(rqctx: &Ctx, viewer: &Viewer) -> Result<Vec<(String, String)>, DashError> {
    let (list, _) = rqctx.context().store.instances_page(viewer.customer_id()?, 500, 0).await?;
    Ok(list.into_iter().map(|i| (i.id, i.name)).collect())
}

/// The filters of the query string, each checked against its allowed values.
fn filter_of(q: &HashMap<String, String>, instances: &[(String, String)]) -> LogFilter {
    let pick = |name: &str, allowed: &[&str]| {
        q.get(name).map(|v| v.trim().to_string()).filter(|v| allowed.contains(&v.as_str()))
    };
    LogFilter {
        instance_id: q.get("instance").filter(|id| instances.iter().any(|(i, _)| i == *id)).cloned(),
        decision: pick("decision", &["allowed", "refused"]),
        status: pick("status", &["sent", "failed", "refused", "unknown"]),
        source: pick("source", &["api", "pbx", "dashboard"]),
        recipient: q.get("recipient").and_then(|r| phone::normalize(r.trim())).map(|p| p.e164),
        error_code: q
            .get("error")
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty() && e.len() <= 64 && e.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')),
        since: q
            .get("since")
            .and_then(|d| chrono::NaiveDate::parse_from_str(d.trim(), "%Y-%m-%d").ok())
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc().timestamp_millis()),
    }
}

fn select(name: &str, label: &str, options: &[&str], current: Option<&str>) -> Markup {
    html! {
        label { (label)
            select name=(name) {
                option value="" { "any" }
                @for o in options { option value=(o) selected[current == Some(*o)] { (o) } }
            }
        }
    }
}

/// One row of the message log. The per-module policy trace of the policy engine is
/// shown in this row when the log carries it.
fn log_row(id: i64, e: &LogEntry, names: &HashMap<&str, &str>) -> Markup {
    let instance = e.instance_id.as_deref().map(|i| names.get(i).copied().unwrap_or(i)).unwrap_or("—");
    html! {
        tr {
            td { (when(e.created_at)) br; span.hint { "#" (id) } }
            td { (instance) }
            td { (e.source) }
            td { code { (e.recipient.as_deref().unwrap_or("—")) } }
            td { (e.purpose.as_deref().unwrap_or("—")) }
            td { (e.message_type.as_deref().unwrap_or("—")) }
            td {
                @if e.decision == "allowed" { (views::badge("allowed", "ok")) } @else { (views::badge("refused", "bad")) }
                br; span.hint { (e.status) }
            }
            td { @if let Some(code) = &e.error_code { code { (code) } } }
            td {
                @if let Some(p) = &e.policy { code { (p) } }
                (policy_trace(e.policy_trace.as_deref()))
            }
            td { (e.reason.as_deref().unwrap_or("")) }
        }
    }
}

/// Every policy module's verdict on the attempt: module, version (hash on hover),
/// decision, rule or fault, risk, and fuel.
fn policy_trace(trace: Option<&str>) -> Markup {
    let entries: Vec<serde_json::Value> = trace.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
    html! {
        @if !entries.is_empty() {
            ul.trace {
                @for t in &entries {
                    @let decision = t["decision"].as_str().unwrap_or("");
                    @let kind = match decision { "allow" => "ok", "review" => "warn", _ => "bad" };
                    li title=(format!("{} stage, sha256 {}…, {} fuel, {} µs", t["stage"].as_str().unwrap_or(""),
                                      t["sha256"].as_str().unwrap_or(""), t["fuel"], t["us"])) {
                        (t["module"].as_str().unwrap_or("?")) " " span.hint { (t["version"].as_str().unwrap_or("")) } " "
                        (views::badge(decision, kind))
                        @if let Some(code) = t["code"].as_str().or(t["fault"].as_str()) { " " code { (code) } }
                        @if let Some(risk) = t["risk"].as_u64() { " " span.hint { "risk " (risk) } }
                    }
                }
            }
        }
    }
}

/// The message log.
#[endpoint { method = GET, path = "/messages", unpublished = true }]
async fn messages_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let q = query(&rqctx);
        let instances = instance_names(&rqctx, &viewer).await?;
        let filter = filter_of(&q, &instances);
        let before = before_id(&q);
        let rows = rqctx.context().store.message_log_page(viewer.customer_id()?, &filter, before, PAGE_SIZE).await?;
        let next = (rows.len() as i64 == PAGE_SIZE).then(|| rows.last().map(|(id, _)| *id)).flatten();
        let names: HashMap<&str, &str> = instances.iter().map(|(i, n)| (i.as_str(), n.as_str())).collect();
        let mut base_params: Vec<(&str, String)> = Vec::new();
        for key in ["instance", "decision", "status", "source", "recipient", "error", "since"] {
            if let Some(v) = q.get(key).filter(|v| !v.is_empty()) {
                base_params.push((key, v.clone()));
            }
        }
        let base = if base_params.is_empty() {
            "/messages".to_string()
        } else {
            format!("/messages?{}", serde_urlencoded::to_string(&base_params).unwrap_or_default())
        };
        let body = html! {
            p { "Every send attempt, allowed or refused, from the API, the PBX and this dashboard, with the check that decided." }
            form.row.card method="get" action="/messages" {
                label { "Instance"
                    select name="instance" {
                        option value="" { "any" }
                        @for (id, name) in &instances { option value=(id) selected[filter.instance_id.as_deref() == Some(id.as_str())] { (name) } }
                    }
                }
                (select("decision", "Decision", &["allowed", "refused"], filter.decision.as_deref()))
                (select("status", "Status", &["sent", "failed", "refused", "unknown"], filter.status.as_deref()))
                (select("source", "Source", &["api", "pbx", "dashboard"], filter.source.as_deref()))
                label { "Recipient" input type="text" name="recipient" value=[filter.recipient.as_deref()] placeholder="+14155550123"; }
                label { "Error code" input type="text" name="error" value=[filter.error_code.as_deref()] placeholder="recipient_suppressed"; }
                label { "Since (UTC day)" input type="date" name="since" value=[q.get("since")]; }
                button type="submit" { "Filter" }
                a href="/messages" { "Clear" }
            }
            table #message-log {
                thead { tr { th { "Time" } th { "Instance" } th { "Source" } th { "Recipient" } th { "Purpose" } th { "Type" } th { "Decision" } th { "Error" } th { "Check / policy" } th { "Reason" } } }
                tbody {
                    @for (id, e) in &rows { (log_row(*id, e, &names)) }
                    @if rows.is_empty() { tr { td colspan="10" { "No messages match." } } }
                }
            }
            (views::key_pager(&base, before.is_none(), next))
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/messages", "Message log", None, body)))
    })
    .await
}

/// Received messages.
#[endpoint { method = GET, path = "/inbound-logs", unpublished = true }]
async fn inbound_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let q = query(&rqctx);
        let instances = instance_names(&rqctx, &viewer).await?;
        let instance = q.get("instance").filter(|id| instances.iter().any(|(i, _)| i == *id)).cloned();
        let before = before_id(&q);
        let rows =
            rqctx.context().store.inbound_page(viewer.customer_id()?, instance.as_deref(), before, PAGE_SIZE).await?;
        let next = (rows.len() as i64 == PAGE_SIZE).then(|| rows.last().map(|r| r.id)).flatten();
        let names: HashMap<&str, &str> = instances.iter().map(|(i, n)| (i.as_str(), n.as_str())).collect();
        let base = match &instance {
            Some(i) => format!("/inbound-logs?instance={i}"),
            None => "/inbound-logs".to_string(),
        };
        let body = html! {
            p { "Messages your instances received. Opt-out keywords among them suppressed their sender." }
            form.row.card method="get" action="/inbound-logs" {
                label { "Instance"
                    select name="instance" {
                        option value="" { "any" }
                        @for (id, name) in &instances { option value=(id) selected[instance.as_deref() == Some(id.as_str())] { (name) } }
                    }
                }
                button type="submit" { "Filter" }
            }
            table #inbound {
                thead { tr { th { "Received" } th { "Instance" } th { "From" } th { "Group" } th { "Type" } th { "Text" } } }
                tbody {
                    @for r in &rows {
                        tr {
                            td { (when(r.received_at)) }
                            td { (names.get(r.instance_id.as_str()).copied().unwrap_or(&r.instance_id)) }
                            td { code { (r.sender) } }
                            td { (r.group_id.as_deref().unwrap_or("")) }
                            td { (r.message_type) }
                            td { (r.text.as_deref().unwrap_or("")) }
                        }
                    }
                    @if rows.is_empty() { tr { td colspan="6" { "Nothing received yet." } } }
                }
            }
            (views::key_pager(&base, before.is_none(), next))
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/inbound-logs", "Inbound messages", None, body)))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(messages_get).map_err(|e| e.to_string())?;
    api.register(inbound_get).map_err(|e| e.to_string())?;
    Ok(())
}
