//! `/inbound-logs`: messages the customer's instances received, newest first, paged by
//! key; and the same with the instance filter applied as CSV (`/exports/inbound.csv`,
//! streamed).

use super::export::{self, PAGE_ROWS};
use super::message_log::instance_names;
use super::roles::Action;
use super::session;
use super::views;
use super::{Ctx, PAGE_SIZE, before_id, html, page, query, when};
use crate::store::InboundRow;
use dropshot::{Body, HttpError, endpoint};
use http::{Response, StatusCode};
use maud::html;
use std::collections::HashMap;

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
        let export = match &instance {
            Some(i) => format!("/exports/inbound.csv?instance={i}"),
            None => "/exports/inbound.csv".to_string(),
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
                a #export href=(export) download { "Export CSV" }
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
                            td { (views::folded(r.text.as_deref().unwrap_or(""), 80)) }
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

/// Received messages (of one instance, or all), as CSV, streamed.
#[endpoint { method = GET, path = "/exports/inbound.csv", unpublished = true }]
async fn inbound_export_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let q = query(&rqctx);
        let instances = instance_names(&rqctx, &viewer).await?;
        let instance = q.get("instance").filter(|id| instances.iter().any(|(i, _)| i == *id)).cloned();
        let customer = viewer.customer_id()?.to_string();
        let store = rqctx.context().store.clone();
        let log = rqctx.log.clone();
        let names: HashMap<String, String> = instances.into_iter().collect();
        let read = move |before| {
            let (store, customer, instance) = (store.clone(), customer.clone(), instance.clone());
            async move { store.inbound_page(&customer, instance.as_deref(), before, PAGE_ROWS).await }
        };
        Ok(export::paged(
            "inbound.csv",
            log,
            read,
            |r: &InboundRow| r.id,
            move |rows, header| csv_page(rows, &names, header),
        ))
    })
    .await
}

/// One page of received messages as CSV (with the header first).
fn csv_page(rows: &[InboundRow], names: &HashMap<String, String>, header: bool) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    if header {
        let _ = writer.write_record(["id", "received_at", "instance", "from", "group", "type", "text"]);
    }
    for r in rows {
        let received =
            chrono::DateTime::from_timestamp_millis(r.received_at).map(|t| t.to_rfc3339()).unwrap_or_default();
        let record = [
            r.id.to_string(),
            received,
            names.get(&r.instance_id).cloned().unwrap_or_else(|| r.instance_id.clone()),
            r.sender.clone(),
            r.group_id.clone().unwrap_or_default(),
            r.message_type.clone(),
            r.text.clone().unwrap_or_default(),
        ];
        let _ = writer.write_record(record.iter().map(|v| export::cell(v)));
    }
    writer.into_inner().unwrap_or_default()
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(inbound_get).map_err(|e| e.to_string())?;
    api.register(inbound_export_get).map_err(|e| e.to_string())?;
    Ok(())
}
