//! `/operator/fleet`: the whole service at a glance for operators: sends a minute over
//! the last hour, refusals by rule across customers (24 hours), paused instances, the
//! review queue's oldest item, the webhook backlog and its age, and the policy module
//! versions each replica runs.

use super::charts::{self, Series};
use super::operator::operator_viewer;
use super::views;
use super::{Ctx, html, page, when};
use crate::policy::reload::HostStatus;
use crate::store::now_ms;
use dropshot::{Body, HttpError, endpoint};
use http::{Response, StatusCode};
use maud::html;

/// How long ago `at` was, in words ("3 min", "2 h").
fn age(now: i64, at: i64) -> String {
    let seconds = (now - at).max(0) / 1000;
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3_600),
        s => format!("{} days", s / 86_400),
    }
}

/// The fleet page.
#[endpoint { method = GET, path = "/operator/fleet", unpublished = true }]
async fn fleet_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let store = &rqctx.context().store;
        let now = now_ms();
        let fleet = store.fleet(now).await?;
        let refusals = store.refusals_by_rule(None, now - 24 * 3_600_000, 12).await?;
        let gateways = store.policy_gateways(now - 3_600_000).await?;
        let labels: Vec<String> = fleet
            .sends_per_minute
            .iter()
            .map(|(m, _)| {
                chrono::DateTime::from_timestamp_millis(*m).map(|t| t.format("%H:%M").to_string()).unwrap_or_default()
            })
            .collect();
        let per_minute = [Series {
            name: "sent".into(),
            class: "sent".into(),
            values: fleet.sends_per_minute.iter().map(|(_, n)| *n).collect(),
        }];
        let last_hour: u64 = per_minute[0].values.iter().sum();
        let body = html! {
            div.grid #fleet-facts {
                div.card { div { "Paused instances" } div.big #paused { (fleet.paused_instances) } a href="/operator/instances" { "Instances" } }
                div.card {
                    div { "Review queue" } div.big #reviews { (fleet.review_pending) }
                    @if let Some(at) = fleet.review_oldest_at { p.hint { "oldest waits " (age(now, at)) } }
                    a href="/operator/reviews" { "Review queue" }
                }
                div.card {
                    div { "Webhook backlog" } div.big #outbox { (charts::thousands(fleet.outbox_pending)) }
                    @if let Some(at) = fleet.outbox_oldest_at { p.hint { "oldest waits " (age(now, at)) } }
                }
            }
            div.grid.charts {
                (charts::stacked_columns("sends-per-minute", "Sends a minute",
                    &format!("{} messages sent in the last hour, across every customer, per minute.", charts::thousands(last_hour)),
                    &labels, &per_minute))
                (charts::horizontal_bars("fleet-refusals", "Refusals by rule, 24 hours",
                    "Refused attempts of every customer in the last 24 hours by the rule that refused them, most first.",
                    &refusals))
            }
            h2 { "Policy modules each replica runs" }
            table #replicas {
                thead { tr { th { "Replica" } th { "Last report" } th { "Modules" } } }
                tbody {
                    @for g in &gateways {
                        @let status: HostStatus = serde_json::from_str(&g.status).unwrap_or_default();
                        tr {
                            td { code { (g.host) } " pid " (g.pid) br;
                                 @if now - g.heartbeat_at <= 30_000 { (views::badge("live", "ok")) } @else { (views::badge("silent", "warn")) } }
                            td { (when(g.heartbeat_at)) }
                            td { @for m in &status.modules { code title=(m.sha256) { (m.name) "@" (m.version) } " " } }
                        }
                    }
                    @if gateways.is_empty() { tr { td colspan="3" { "No replica has reported in the last hour." } } }
                }
            }
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/operator/fleet", "Fleet", None, body)))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(fleet_get).map_err(|e| e.to_string())
}
