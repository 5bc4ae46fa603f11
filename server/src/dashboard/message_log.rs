//! `/messages`: the message log, each row with what became of it (sent, delivered,
//! read, failed with its error, unknown, refused by a check) and when each step
//! happened; filters (state among them); one message in detail with its webhook
//! deliveries (`/messages/{id}`); the filtered log as CSV (`/exports/messages.csv`,
//! streamed). Pages by key, newest first ("Older →").

use super::export::{self, PAGE_ROWS};
use super::roles::Action;
use super::session::{self, Viewer};
use super::views;
use super::{Ctx, DashError, PAGE_SIZE, before_id, html, page, query, when};
use crate::phone;
use crate::store::insight::refusal_rule;
use crate::store::{DeliveryState, LogFilter, LogRow, MessageEvent};
use dropshot::{Body, HttpError, Path, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use std::collections::HashMap;

/// The viewer's instances: id → name (for filters and rows).
pub async fn instance_names(rqctx: &Ctx, viewer: &Viewer) -> Result<Vec<(String, String)>, DashError> {
    let (list, _) = rqctx.context().store.instances_page(viewer.customer_id()?, 500, 0).await?;
    Ok(list.into_iter().map(|i| (i.id, i.name)).collect())
}

/// The query parameters of the filters.
const FILTERS: [&str; 8] = ["instance", "decision", "state", "source", "recipient", "error", "since", "request"];

/// The filters of the query string, each checked against its allowed values.
fn filter_of(q: &HashMap<String, String>, instances: &[(String, String)]) -> LogFilter {
    let pick = |name: &str, allowed: &[&str]| {
        q.get(name).map(|v| v.trim().to_string()).filter(|v| allowed.contains(&v.as_str()))
    };
    LogFilter {
        instance_id: q.get("instance").filter(|id| instances.iter().any(|(i, _)| i == *id)).cloned(),
        decision: pick("decision", &["allowed", "refused"]),
        state: q.get("state").and_then(|s| DeliveryState::parse(s.trim())),
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
        request: q
            .get("request")
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty() && r.len() <= 128 && r.bytes().all(|b| (0x21..0x7f).contains(&b))),
    }
}

/// The query string of the filters in force (for the pager and the export); an instance
/// that is not the viewer's is dropped, never echoed.
fn filter_query(q: &HashMap<String, String>, instances: &[(String, String)]) -> String {
    let params: Vec<(&str, &String)> = FILTERS
        .iter()
        .filter_map(|k| q.get(*k).filter(|v| !v.is_empty()).map(|v| (*k, v)))
        .filter(|(k, v)| *k != "instance" || instances.iter().any(|(i, _)| i == *v))
        .collect();
    serde_urlencoded::to_string(&params).unwrap_or_default()
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

/// A state as a badge.
pub fn state_badge(state: DeliveryState) -> Markup {
    let kind = match state {
        DeliveryState::Read | DeliveryState::Delivered | DeliveryState::Sent => "ok",
        DeliveryState::Pending | DeliveryState::Unknown => "warn",
        DeliveryState::Failed | DeliveryState::Refused => "bad",
    };
    views::badge(state.as_str(), kind)
}

/// The steps of a message with their times: (step, time).
fn steps(r: &LogRow) -> Vec<(&'static str, i64)> {
    let d = &r.delivery;
    let mut steps = vec![(if r.entry.decision == "refused" { "refused" } else { "attempted" }, r.entry.created_at)];
    for (name, at) in [("delivered", d.delivered_at), ("read", d.read_at), ("failed", d.failed_at)] {
        if let Some(at) = at {
            steps.push((name, at));
        }
    }
    if let (Some(at), None) = (d.ack_checked_at, d.delivered_at) {
        steps.push(("no delivery acknowledgement", at));
    }
    steps
}

/// One row of the message log.
fn log_row(r: &LogRow, names: &HashMap<&str, &str>) -> Markup {
    let e = &r.entry;
    let instance = e.instance_id.as_deref().map(|i| names.get(i).copied().unwrap_or(i)).unwrap_or("—");
    let (state, error) = r.state();
    let last = steps(r).last().map(|(_, at)| *at).unwrap_or(e.created_at);
    html! {
        tr {
            td {
                a href=(format!("/messages/{}", r.id)) { (when(e.created_at)) } br; span.hint { "#" (r.id) " · " (e.source) }
            }
            td { (instance) }
            td { code { (e.recipient.as_deref().unwrap_or("—")) } }
            td { (e.purpose.as_deref().unwrap_or("—")) br; span.hint { (e.message_type.as_deref().unwrap_or("—")) } }
            td.state {
                (state_badge(state))
                @if let Some(error) = &error { br; code { (error) } }
                @if last != e.created_at { br; span.hint { (when(last)) } }
            }
            td {
                @if let Some(code) = &e.error_code { code { (refusal_rule(Some(code), e.policy_trace.as_deref())) } br; }
                @if let Some(p) = &e.policy { span.hint { (p) } }
                @if e.policy_trace.is_some() {
                    details.fold { summary { "every module" } (policy_trace(e.policy_trace.as_deref())) }
                }
            }
            td { (views::folded(e.reason.as_deref().unwrap_or(""), 60)) }
        }
    }
}

/// Every policy module's verdict on the attempt: module, version (hash on hover),
/// decision, rule or fault, risk, and fuel.
pub(super) fn policy_trace(trace: Option<&str>) -> Markup {
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
                        @match t["mode"].as_str() {
                            Some("shadow") => { " " (views::badge("shadow: did not decide", "muted")) }
                            Some(mode) => { " " (views::badge(mode, "muted")) }
                            None => {}
                        }
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
        let next = (rows.len() as i64 == PAGE_SIZE).then(|| rows.last().map(|r| r.id)).flatten();
        let names: HashMap<&str, &str> = instances.iter().map(|(i, n)| (i.as_str(), n.as_str())).collect();
        let filters = filter_query(&q, &instances);
        let base = if filters.is_empty() { "/messages".to_string() } else { format!("/messages?{filters}") };
        let export = if filters.is_empty() {
            "/exports/messages.csv".to_string()
        } else {
            format!("/exports/messages.csv?{filters}")
        };
        let states: Vec<&str> = DeliveryState::ALL.iter().map(|s| s.as_str()).collect();
        let body = html! {
            p { "Every send attempt, allowed or refused, from the API, the PBX and this dashboard, with the check that decided and what became of the message." }
            form.row.card method="get" action="/messages" {
                label { "Instance"
                    select name="instance" {
                        option value="" { "any" }
                        @for (id, name) in &instances { option value=(id) selected[filter.instance_id.as_deref() == Some(id.as_str())] { (name) } }
                    }
                }
                (select("state", "State", &states, filter.state.map(|s| s.as_str())))
                (select("decision", "Decision", &["allowed", "refused"], filter.decision.as_deref()))
                (select("source", "Source", &["api", "pbx", "dashboard"], filter.source.as_deref()))
                label { "Recipient" input type="text" name="recipient" value=[filter.recipient.as_deref()] placeholder="+14155550123"; }
                label { "Error code" input type="text" name="error" value=[filter.error_code.as_deref()] placeholder="recipient_suppressed"; }
                label { "Since (UTC day)" input type="date" name="since" value=[q.get("since")]; }
                label { "Request or correlation id" input type="text" name="request" value=[filter.request.as_deref()] placeholder="x-request-id"; }
                button type="submit" { "Filter" }
                a href="/messages" { "Clear" }
                a #export href=(export) download { "Export CSV" }
            }
            table #message-log {
                thead { tr { th { "Time" } th { "Instance" } th { "Recipient" } th { "Purpose" } th { "State" } th { "Check" } th { "Reason" } } }
                tbody {
                    @for r in &rows { (log_row(r, &names)) }
                    @if rows.is_empty() { tr { td colspan="7" { "No messages match." } } }
                }
            }
            (views::key_pager(&base, before.is_none(), next))
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/messages", "Message log", None, body)))
    })
    .await
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct MessagePath {
    id: i64,
}

/// One message: its steps, the checks, and the webhook deliveries of its events.
#[endpoint { method = GET, path = "/messages/{id}", unpublished = true }]
async fn message_get(rqctx: Ctx, path: Path<MessagePath>) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let id = path.into_inner().id;
        let store = &rqctx.context().store;
        let row = store.customer_log_row(viewer.customer_id()?, id).await?.ok_or(DashError::NotFound)?;
        let events = store.message_events(viewer.customer_id()?, &row).await?;
        let instances = instance_names(&rqctx, &viewer).await?;
        let e = &row.entry;
        let instance = e
            .instance_id
            .as_deref()
            .map(|i| instances.iter().find(|(id, _)| id == i).map_or(i, |(_, n)| n.as_str()))
            .unwrap_or("—");
        let (state, error) = row.state();
        let body = html! {
            p { a href="/messages" { "← Message log" } }
            section.card {
                dl.facts {
                    dt { "State" } dd #state { (state_badge(state)) @if let Some(error) = &error { " " code { (error) } } }
                    dt { "Instance" } dd { (instance) }
                    dt { "Recipient" } dd { code { (e.recipient.as_deref().unwrap_or("—")) } }
                    dt { "Purpose" } dd { (e.purpose.as_deref().unwrap_or("—")) " · " (e.message_type.as_deref().unwrap_or("—")) }
                    dt { "Source" } dd { (e.source) }
                    @if let Some(id) = &e.provider_message_id { dt { "Message id" } dd { code { (id) } } }
                    @if let Some(r) = &e.request_id { dt { "Request id" } dd { code { (r) } } }
                    @if let Some(c) = &e.correlation_id { dt { "Correlation id" } dd { code { (c) } } }
                    @if let Some(code) = &e.error_code { dt { "Error" } dd { code { (refusal_rule(Some(code), e.policy_trace.as_deref())) } } }
                    @if let Some(reason) = &e.reason { dt { "Reason" } dd { (reason) } }
                    @if let Some(p) = &e.policy { dt { "Decided by" } dd { code { (p) } } }
                }
            }
            h2 { "Steps" }
            ol #steps {
                @for (step, at) in steps(&row) { li { strong { (step) } " " span.hint { (when(at)) } } }
            }
            @if e.policy_trace.is_some() { h2 { "Policies" } (policy_trace(e.policy_trace.as_deref())) }
            h2 { "Webhook deliveries" }
            @if events.is_empty() {
                p.hint { "No webhook event was written about this message." }
            } @else {
                table #deliveries {
                    thead { tr { th { "Event" } th { "Written" } th { "Attempts" } th { "Outcome" } } }
                    tbody {
                        @for ev in &events {
                            tr {
                                td { code { (ev.event_type) } br; span.hint { "#" (ev.id) } }
                                td { (when(ev.created_at)) }
                                td {
                                    @for a in &ev.attempts {
                                        div {
                                            (if a.succeeded { views::badge("ok", "ok") } else { views::badge("failed", "bad") })
                                            " " (when(a.at))
                                            @if let Some(s) = a.status { " · " (s) }
                                            @if let Some(l) = a.latency_ms { " · " (l) " ms" }
                                            @if let Some(err) = &a.error { " · " (views::folded(err, 60)) }
                                        }
                                    }
                                    @if ev.attempts.is_empty() { span.hint { "none yet" } }
                                }
                                td { (event_outcome(ev)) }
                            }
                        }
                    }
                }
            }
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/messages", &format!("Message #{id}"), None, body)))
    })
    .await
}

/// How an event of the message page finished: delivered (when), or why it was not; an
/// event skipped for want of an endpoint is done when it is written.
fn event_outcome(ev: &MessageEvent) -> Markup {
    let when_done = ev.delivered_at.map(when).unwrap_or_default();
    match ev.outcome.as_deref() {
        None => html! { span.hint { "pending" } },
        Some("delivered") => html! { "delivered " (when_done) },
        Some("skipped_no_endpoint") => html! { span.hint { "not sent: no endpoint" } },
        Some("skipped_disabled") => html! { span.hint { "not sent: endpoint disabled" } },
        Some("skipped_not_subscribed") => html! { span.hint { "not sent: event not selected" } },
        Some(other) => html! { (other) " " (when_done) },
    }
}

/// The message log with the filters applied, as CSV, streamed.
#[endpoint { method = GET, path = "/exports/messages.csv", unpublished = true }]
async fn messages_export_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let q = query(&rqctx);
        let instances = instance_names(&rqctx, &viewer).await?;
        let filter = filter_of(&q, &instances);
        let customer = viewer.customer_id()?.to_string();
        let store = rqctx.context().store.clone();
        let log = rqctx.log.clone();
        let names: HashMap<String, String> = instances.into_iter().collect();
        let read = move |before| {
            let (store, customer, filter) = (store.clone(), customer.clone(), filter.clone());
            async move { store.message_log_page(&customer, &filter, before, PAGE_ROWS).await }
        };
        Ok(export::paged(
            "message-log.csv",
            log,
            read,
            |r: &LogRow| r.id,
            move |rows, header| csv_page(rows, &names, header),
        ))
    })
    .await
}

/// Columns of the message log export.
const CSV_HEADER: [&str; 19] = [
    "id",
    "time",
    "instance",
    "source",
    "recipient",
    "purpose",
    "type",
    "decision",
    "state",
    "state_error",
    "delivered_at",
    "read_at",
    "failed_at",
    "error_code",
    "rule",
    "decided_by",
    "reason",
    "request_id",
    "correlation_id",
];

fn rfc3339(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis).map(|t| t.to_rfc3339()).unwrap_or_default()
}

/// One page of rows as CSV (with the header first).
fn csv_page(rows: &[LogRow], names: &HashMap<String, String>, header: bool) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    if header {
        let _ = writer.write_record(CSV_HEADER);
    }
    for r in rows {
        let e = &r.entry;
        let (state, error) = r.state();
        let instance = e.instance_id.as_deref().map(|i| names.get(i).map_or(i, String::as_str)).unwrap_or("");
        let record = [
            r.id.to_string(),
            rfc3339(Some(e.created_at)),
            instance.to_string(),
            e.source.clone(),
            e.recipient.clone().unwrap_or_default(),
            e.purpose.clone().unwrap_or_default(),
            e.message_type.clone().unwrap_or_default(),
            e.decision.clone(),
            state.as_str().to_string(),
            error.unwrap_or_default(),
            rfc3339(r.delivery.delivered_at),
            rfc3339(r.delivery.read_at),
            rfc3339(r.delivery.failed_at),
            e.error_code.clone().unwrap_or_default(),
            e.error_code.as_deref().map(|c| refusal_rule(Some(c), e.policy_trace.as_deref())).unwrap_or_default(),
            e.policy.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.request_id.clone().unwrap_or_default(),
            e.correlation_id.clone().unwrap_or_default(),
        ];
        let _ = writer.write_record(record.iter().map(|v| export::cell(v)));
    }
    writer.into_inner().unwrap_or_default()
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(messages_get).map_err(|e| e.to_string())?;
    api.register(messages_export_get).map_err(|e| e.to_string())?;
    api.register(message_get).map_err(|e| e.to_string())?;
    Ok(())
}
