//! `/dashboard`: the customer's plan, usage against its limits, and its instances.

use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, html, page, when};
use crate::config::PlanLimits;
use crate::store::{Customer, PlanStatus, now_ms};
use dropshot::{Body, HttpError, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};

const DAY_MS: i64 = 24 * 3_600_000;

/// The limits in force for a customer: plan values unless an operator raised them.
pub struct Limits {
    pub plan: Option<PlanLimits>,
    pub daily: i64,
    pub monthly: i64,
    pub instance_per_minute: i64,
    pub recipient_per_minute: i64,
}

/// The limits of `customer` under `config` (what the send pipeline applies).
pub fn limits(config: &crate::config::Config, customer: &Customer) -> Limits {
    let plan = customer.plan.as_deref().and_then(|p| config.plan(p)).cloned();
    let base = plan.clone().unwrap_or_else(|| config.plans.starter.clone());
    let o = &customer.overrides;
    Limits {
        daily: o.daily.unwrap_or(base.daily_messages),
        monthly: o.monthly.unwrap_or(base.monthly_messages),
        instance_per_minute: o
            .instance_per_minute
            .or(base.instance_per_minute)
            .unwrap_or(config.limits.instance_per_minute),
        recipient_per_minute: o
            .recipient_per_minute
            .or(base.recipient_per_minute)
            .unwrap_or(config.limits.recipient_per_minute),
        plan,
    }
}

fn meter(label: &str, used: i64, limit: i64, note: &str) -> Markup {
    html! {
        div.card {
            div { (label) }
            div.big { (used) " / " (limit) }
            progress value=(used.min(limit)) max=(limit.max(1)) { (used) " of " (limit) }
            p.hint { (note) }
        }
    }
}

/// Status label of a plan.
pub fn plan_badge(status: PlanStatus) -> Markup {
    match status {
        PlanStatus::Active => views::badge("active", "ok"),
        PlanStatus::PendingApproval => views::badge("waiting for approval", "warn"),
        PlanStatus::Expired => views::badge("expired", "bad"),
        PlanStatus::None => views::badge("no plan", "muted"),
    }
}

async fn render(rqctx: &Ctx, viewer: &Viewer) -> Result<Markup, DashError> {
    let state = rqctx.context();
    let customer = viewer.customer()?;
    let now = now_ms();
    let day = now - now.rem_euclid(DAY_MS);
    let usage = state.store.usage(&customer.id, day, customer.plan_period_start.unwrap_or(day)).await?;
    let limits = limits(&state.config, customer);
    let status = customer.plan_status(now);
    let notice = (status != PlanStatus::Active).then(|| {
        Notice::Error(
            match status {
                PlanStatus::PendingApproval => {
                    "Your plan waits for an operator's approval; sends are refused until then."
                }
                PlanStatus::Expired => "Your plan period ended; sends are refused until it is renewed.",
                _ => "Your account has no plan yet; sends are refused until one is assigned.",
            }
            .to_string(),
        )
    });
    let instance_cap = limits.plan.as_ref().map(|p| p.instances).unwrap_or(0);
    Ok(views::page(
        viewer,
        "/dashboard",
        "Overview",
        notice.as_ref(),
        html! {
            section.card {
                dl.facts {
                    dt { "Plan" } dd { (customer.plan.as_deref().unwrap_or("none")) " " (plan_badge(status)) }
                    @if let Some(end) = customer.plan_period_end { dt { "Current period ends" } dd { (when(end)) } }
                    dt { "Modules" } dd {
                        "api " (if customer.module_api { views::badge("on", "ok") } else { views::badge("off", "muted") })
                        " · pbx " (if customer.module_pbx { views::badge("on", "ok") } else { views::badge("off", "muted") })
                    }
                    dt { "Velocity" } dd { (limits.instance_per_minute) " sends a minute per instance, " (limits.recipient_per_minute) " a minute to one recipient" }
                }
            }
            h2 { "Usage against your limits" }
            div.grid #usage {
                (meter("Messages today (UTC)", usage.today, limits.daily, "Resets at midnight UTC."))
                (meter("Messages this period", usage.period, limits.monthly, "The 30-day plan period."))
                (meter("Instances", usage.instances, instance_cap, "Paired phone numbers."))
            }
            p.hint { "Only messages the network accepted count. Need more? Operators raise limits after a review of your use case; see the " a href="/docs/responsible-messaging" { "guide" } "." }
        },
    ))
}

/// The overview page.
#[endpoint { method = GET, path = "/dashboard", unpublished = true }]
async fn overview_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::viewer(&rqctx).await?;
        if viewer.customer.is_none() {
            return Ok(super::redirect("/operator"));
        }
        viewer.require(Action::Read)?;
        Ok(html(StatusCode::OK, render(&rqctx, &viewer).await?))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(overview_get).map_err(|e| e.to_string())
}
