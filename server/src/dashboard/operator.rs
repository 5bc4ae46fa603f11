//! The operator console (role `operator`): customers (approve Scale plans, assign
//! plans, turn modules on or off, raise limits after review, invite a customer's first
//! users) and instances (pause for review, resume).
//!
//! Adding a page: a line in `views::OPERATOR_NAV`, an endpoint that starts with
//! `operator_viewer`, and its `api.register`. The review queue and the policy modules
//! are in `policies.rs`.

use super::accounts;
use super::overview::{limits, plan_badge};
use super::roles::{Action, Role};
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, Form, PAGE_SIZE, html, page, page_number, query, redirect, when};
use crate::bounds;
use crate::ops;
use crate::store::{Customer, LimitOverrides, PlanStatus, now_ms};
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;
use slog::info;

#[derive(Deserialize, schemars::JsonSchema)]
struct IdPath {
    id: String,
}

/// The signed-in operator (customers' users get 403).
pub(super) async fn operator_viewer(rqctx: &Ctx) -> Result<Viewer, DashError> {
    let viewer = session::viewer(rqctx).await?;
    viewer.require(Action::Operate)?;
    Ok(viewer)
}

/// The form of an operator's POST and the operator (see `session::post_form`).
pub(super) async fn operator_post(rqctx: &Ctx, body: &UntypedBody) -> Result<(Form, Viewer), DashError> {
    session::post_form(rqctx, body, Action::Operate).await
}

/// The customers list.
#[endpoint { method = GET, path = "/operator", unpublished = true }]
async fn customers_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        Ok(html(StatusCode::OK, customers_page(&rqctx, &viewer, None, None).await?))
    })
    .await
}

async fn customers_page(
    rqctx: &Ctx,
    viewer: &Viewer,
    notice: Option<&Notice>,
    extra: Option<Markup>,
) -> Result<Markup, DashError> {
    let q = query(rqctx);
    let page_no = page_number(&q);
    let pending = q.get("pending").map(String::as_str) == Some("1");
    let search = q.get("q").map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let store = &rqctx.context().store;
    let (customers, total) =
        store.customers_page(pending, search.as_deref(), PAGE_SIZE, (page_no - 1) * PAGE_SIZE).await?;
    let (_, waiting) = store.customers_page(true, None, 1, 0).await?;
    let mut params: Vec<(&str, String)> = Vec::new();
    if pending {
        params.push(("pending", "1".into()));
    }
    if let Some(s) = &search {
        params.push(("q", s.clone()));
    }
    let base = if params.is_empty() {
        "/operator".to_string()
    } else {
        format!("/operator?{}", serde_urlencoded::to_string(&params).unwrap_or_default())
    };
    let now = now_ms();
    Ok(views::page(
        viewer,
        "/operator",
        "Customers",
        notice,
        html! {
            @if let Some(extra) = extra { (extra) }
            @if waiting > 0 && !pending {
                p.banner { (waiting) " customer(s) wait for plan approval. " a href="/operator?pending=1" { "Show them" } }
            }
            form.row.card method="get" action="/operator" {
                label { "Name" input type="text" name="q" value=[search.as_deref()]; }
                label { span { input type="checkbox" name="pending" value="1" checked[pending]; " waiting for approval only" } }
                button.secondary type="submit" { "Filter" }
            }
            table #customers {
                thead { tr { th { "Customer" } th { "Plan" } th { "Status" } th { "Modules" } th { "Created" } th {} } }
                tbody {
                    @for c in &customers {
                        @let status = c.plan_status(now);
                        tr {
                            td.long { a href=(format!("/operator/customers/{}", c.id)) { (c.name) } br; code { (c.id) } }
                            td { (c.plan.as_deref().unwrap_or("none")) }
                            td { (plan_badge(status)) }
                            td { "api " (if c.module_api { "on" } else { "off" }) ", pbx " (if c.module_pbx { "on" } else { "off" }) }
                            td { (when(c.created_at)) }
                            td { @if status == PlanStatus::PendingApproval { (views::button_form(&format!("/operator/customers/{}/approve", c.id), &viewer.csrf, "Approve plan", &[], "")) } }
                        }
                    }
                    @if customers.is_empty() { tr { td colspan="6" { "No customers match." } } }
                }
            }
            (views::pager(&base, page_no, total, PAGE_SIZE))
            h2 { "New customer" }
            form.row.card method="post" action="/operator/customers" {
                (views::csrf_field(&viewer.csrf))
                label { "Name" input type="text" name="name" required maxlength="100"; }
                label { "Plan" select name="plan" { option value="starter" { "starter" } option value="scale" { "scale (waits for approval)" } option value="none" { "none" } } }
                button type="submit" { "Create customer" }
            }
        },
    ))
}

/// Creates a customer.
#[endpoint { method = POST, path = "/operator/customers", unpublished = true }]
async fn customer_create_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let plan = Some(form.get("plan")).filter(|p| *p != "none");
        let customer = ops::create_customer(&rqctx.context().store, form.get("name"), plan, false).await?;
        info!(rqctx.log, "customer created"; "by" => &viewer.user.id, "customer_id" => &customer.id);
        Ok(redirect(&format!("/operator/customers/{}", customer.id)))
    })
    .await
}

async fn customer_page(
    rqctx: &Ctx,
    viewer: &Viewer,
    customer: &Customer,
    notice: Option<&Notice>,
    extra: Option<Markup>,
) -> Result<Markup, DashError> {
    let state = rqctx.context();
    let store = &state.store;
    let q = query(rqctx);
    let number =
        |name: &str| q.get(name).and_then(|p| p.parse::<i64>().ok()).filter(|p| (1..=100_000).contains(p)).unwrap_or(1);
    let (ipage, upage) = (number("ipage"), number("upage"));
    let (instances, instance_total) = store.instances_page(&customer.id, PAGE_SIZE, (ipage - 1) * PAGE_SIZE).await?;
    let (users, user_total) = store.customer_users(&customer.id, PAGE_SIZE, (upage - 1) * PAGE_SIZE).await?;
    let base = format!("/operator/customers/{}", customer.id);
    let now = now_ms();
    let status = customer.plan_status(now);
    let limits = limits(&state.config, customer);
    let o = &customer.overrides;
    let id = &customer.id;
    Ok(views::page(
        viewer,
        "/operator",
        &customer.name,
        notice,
        html! {
            @if let Some(extra) = extra { (extra) }
            section.card {
                h2 { "Plan" }
                dl.facts {
                    dt { "Customer id" } dd { code { (id) } }
                    dt { "Plan" } dd { (customer.plan.as_deref().unwrap_or("none")) " " (plan_badge(status)) }
                    @if let Some(end) = customer.plan_period_end { dt { "Period ends" } dd { (when(end)) } }
                }
                div.row {
                    @if status == PlanStatus::PendingApproval {
                        (views::button_form(&format!("/operator/customers/{id}/approve"), &viewer.csrf, "Approve the Scale plan", &[], ""))
                    }
                    form.inline method="post" action=(format!("/operator/customers/{id}/plan")) {
                        (views::csrf_field(&viewer.csrf))
                        " Assign or renew: "
                        select name="plan" { option value="starter" { "starter" } option value="scale" { "scale" } }
                        " " label { input type="checkbox" name="approve"; " approved" } " "
                        button.secondary type="submit" { "Assign (new 30-day period)" }
                    }
                }
            }
            section.card {
                h2 { "Modules" }
                form.row method="post" action=(format!("/operator/customers/{id}/modules")) {
                    (views::csrf_field(&viewer.csrf))
                    label { span { input type="checkbox" name="api" checked[customer.module_api]; " api" } }
                    label { span { input type="checkbox" name="pbx" checked[customer.module_pbx]; " pbx" } }
                    button.secondary type="submit" { "Save modules" }
                }
            }
            section.card {
                h2 { "Limits" }
                p.hint { "In force: " (limits.daily) " a day, " (limits.monthly) " a period, " (limits.instance_per_minute) " a minute per instance, " (limits.recipient_per_minute) " a minute per recipient. Raise them only after reviewing the use case (never for marketing, spam or cold outreach); empty keeps a value." }
                form.row method="post" action=(format!("/operator/customers/{id}/limits")) {
                    (views::csrf_field(&viewer.csrf))
                    label { "Daily" input type="number" name="daily" min=(bounds::DAILY_MESSAGES.start()) max=(bounds::DAILY_MESSAGES.end()) value=[o.daily]; }
                    label { "Period" input type="number" name="monthly" min=(bounds::MONTHLY_MESSAGES.start()) max=(bounds::MONTHLY_MESSAGES.end()) value=[o.monthly]; }
                    label { "Per instance a minute" input type="number" name="instance_per_minute" min=(bounds::INSTANCE_PER_MINUTE.start()) max=(bounds::INSTANCE_PER_MINUTE.end()) value=[o.instance_per_minute]; }
                    label { "Per recipient a minute" input type="number" name="recipient_per_minute" min=(bounds::RECIPIENT_PER_MINUTE.start()) max=(bounds::RECIPIENT_PER_MINUTE.end()) value=[o.recipient_per_minute]; }
                    button type="submit" { "Set limits" }
                }
            }
            h2 { "Instances" }
            (instances_table(viewer, &instances.iter().map(|i| (i, customer.name.as_str())).collect::<Vec<_>>()))
            (views::pager_named(&base, "ipage", ipage, instance_total, PAGE_SIZE))
            h2 { "Users" }
            table {
                thead { tr { th { "Email" } th { "Role" } th { "Last sign-in" } } }
                tbody {
                    @for u in &users { tr { td.long { (u.email) } td { (u.role) } td { (u.last_sign_in_at.map(when).unwrap_or_else(|| "never".into())) } } }
                    @if users.is_empty() { tr { td colspan="3" { "No users yet: invite the owner." } } }
                }
            }
            (views::pager_named(&base, "upage", upage, user_total, PAGE_SIZE))
            form.row.card method="post" action=(format!("/operator/customers/{id}/invite")) {
                (views::csrf_field(&viewer.csrf))
                label { "Email" input type="email" name="email" required; }
                label { "Role" select name="role" { @for r in Role::CUSTOMER { option value=(r.as_str()) { (r.as_str()) } } } }
                button type="submit" { "Invite" }
            }
        },
    ))
}

fn instances_table(viewer: &Viewer, rows: &[(&crate::store::Instance, &str)]) -> Markup {
    html! {
        table.instances {
            thead { tr { th { "Instance" } th { "Customer" } th { "Connection" } th { "Review" } th {} } }
            tbody {
                @for (i, customer) in rows {
                    tr {
                        td.long { (i.name) br; code { (i.id) } }
                        td { a href=(format!("/operator/customers/{}", i.customer_id)) { (customer) } }
                        td { (i.connection_state) }
                        td.long { @if i.paused { (views::badge("paused", "bad")) " " (i.paused_reason.as_deref().unwrap_or("")) } @else { (views::badge("sending", "ok")) } }
                        td {
                            @if i.paused {
                                (views::button_form(&format!("/operator/instances/{}/resume", i.id), &viewer.csrf, "Resume", &[], ""))
                            } @else {
                                form.inline method="post" action=(format!("/operator/instances/{}/pause", i.id)) {
                                    (views::csrf_field(&viewer.csrf))
                                    input type="text" name="reason" placeholder="reason" maxlength="200";
                                    " " button.danger type="submit" { "Pause" }
                                }
                            }
                        }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" { "No instances." } } }
            }
        }
    }
}

/// One customer.
#[endpoint { method = GET, path = "/operator/customers/{id}", unpublished = true }]
async fn customer_get(rqctx: Ctx, path: Path<IdPath>) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let customer = rqctx.context().store.customer(&path.into_inner().id).await?;
        let notice = query(&rqctx).get("done").and_then(|d| done_text(d)).map(|t| Notice::Ok(t.into()));
        Ok(html(StatusCode::OK, customer_page(&rqctx, &viewer, &customer, notice.as_ref(), None).await?))
    })
    .await
}

fn done_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "approved" => "Plan approved: a new 30-day period started.",
        "plan" => "Plan assigned.",
        "modules" => "Modules saved.",
        "limits" => "Limits set.",
        _ => return None,
    })
}

/// Approves a customer's pending (Scale) plan.
#[endpoint { method = POST, path = "/operator/customers/{id}/approve", unpublished = true }]
async fn approve_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = operator_post(&rqctx, &body).await?;
        let store = &rqctx.context().store;
        let customer = store.customer(&path.into_inner().id).await?;
        if customer.plan_status(now_ms()) != PlanStatus::PendingApproval {
            return Err(DashError::BadRequest("This customer's plan is not waiting for approval.".into()));
        }
        let plan = customer.plan.clone().unwrap_or_else(|| "scale".into());
        ops::assign_plan(store, &customer.id, &plan, true).await?;
        info!(rqctx.log, "plan approved"; "by" => &viewer.user.id, "customer_id" => &customer.id, "plan" => &plan);
        Ok(redirect(&format!("/operator/customers/{}?done=approved", customer.id)))
    })
    .await
}

/// Assigns or renews a plan.
#[endpoint { method = POST, path = "/operator/customers/{id}/plan", unpublished = true }]
async fn plan_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let store = &rqctx.context().store;
        let customer = store.customer(&path.into_inner().id).await?;
        ops::assign_plan(store, &customer.id, form.get("plan"), form.get("approve") == "on").await?;
        info!(rqctx.log, "plan assigned"; "by" => &viewer.user.id, "customer_id" => &customer.id, "plan" => form.get("plan"));
        Ok(redirect(&format!("/operator/customers/{}?done=plan", customer.id)))
    })
    .await
}

/// Turns modules on or off.
#[endpoint { method = POST, path = "/operator/customers/{id}/modules", unpublished = true }]
async fn modules_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let store = &rqctx.context().store;
        let customer = store.customer(&path.into_inner().id).await?;
        ops::customers::set_modules(store, &customer.id, Some(form.get("api") == "on"), Some(form.get("pbx") == "on"))
            .await?;
        info!(rqctx.log, "modules set"; "by" => &viewer.user.id, "customer_id" => &customer.id);
        Ok(redirect(&format!("/operator/customers/{}?done=modules", customer.id)))
    })
    .await
}

/// Sets reviewed limits.
#[endpoint { method = POST, path = "/operator/customers/{id}/limits", unpublished = true }]
async fn limits_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let store = &rqctx.context().store;
        let customer = store.customer(&path.into_inner().id).await?;
        let number = |name: &str| -> Result<Option<i64>, DashError> {
            form.opt(name)
                .map(|v| v.parse::<i64>().map_err(|_| DashError::BadRequest(format!("{name} must be a whole number"))))
                .transpose()
        };
        let limits = LimitOverrides {
            daily: number("daily")?,
            monthly: number("monthly")?,
            instance_per_minute: number("instance_per_minute")?,
            recipient_per_minute: number("recipient_per_minute")?,
        };
        ops::set_limits(store, &customer.id, &limits).await?;
        info!(rqctx.log, "limits set"; "by" => &viewer.user.id, "customer_id" => &customer.id,
              "daily" => limits.daily, "monthly" => limits.monthly);
        Ok(redirect(&format!("/operator/customers/{}?done=limits", customer.id)))
    })
    .await
}

/// Invites a user of a customer (the first owner, typically).
#[endpoint { method = POST, path = "/operator/customers/{id}/invite", unpublished = true }]
async fn customer_invite_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let state = rqctx.context();
        let customer = state.store.customer(&path.into_inner().id).await?;
        let role = Role::parse(form.get("role")).filter(|r| *r != Role::Operator).ok_or(DashError::Forbidden)?;
        let (user, link) =
            accounts::create(&state.store, &state.config, Some(&customer.id), form.get("email"), role, &viewer.user.id)
                .await?;
        info!(rqctx.log, "user invited"; "by" => &viewer.user.id, "user_id" => &user.id, "role" => role.as_str());
        let extra = html! { div #invite-link { (views::shown_once(&format!("One-time sign-in link for {} (valid 7 days)", user.email), &link)) } };
        let notice = Notice::Ok(format!("{} is invited as {}.", user.email, role.as_str()));
        Ok(html(StatusCode::OK, customer_page(&rqctx, &viewer, &customer, Some(&notice), Some(extra)).await?))
    })
    .await
}

/// Every customer's instances (paused ones first when asked).
#[endpoint { method = GET, path = "/operator/instances", unpublished = true }]
async fn instances_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = operator_viewer(&rqctx).await?;
        let q = query(&rqctx);
        let page_no = page_number(&q);
        let paused = q.get("paused").map(String::as_str) == Some("1");
        let store = &rqctx.context().store;
        let (instances, total) = store.all_instances_page(paused, PAGE_SIZE, (page_no - 1) * PAGE_SIZE).await?;
        let mut names = std::collections::HashMap::new();
        for i in &instances {
            if !names.contains_key(&i.customer_id) {
                names.insert(i.customer_id.clone(), store.customer(&i.customer_id).await?.name);
            }
        }
        let rows: Vec<_> = instances.iter().map(|i| (i, names[&i.customer_id].as_str())).collect();
        let notice = match q.get("done").map(String::as_str) {
            Some("paused") => Some(Notice::Ok("Paused: its sends are refused with instance_paused_for_review.".into())),
            Some("resumed") => Some(Notice::Ok("Resumed: it sends again.".into())),
            _ => None,
        };
        let base = if paused { "/operator/instances?paused=1" } else { "/operator/instances" };
        let body = html! {
            form.row.card method="get" action="/operator/instances" {
                label { span { input type="checkbox" name="paused" value="1" checked[paused]; " paused only" } }
                button.secondary type="submit" { "Filter" }
            }
            (instances_table(&viewer, &rows))
            (views::pager(base, page_no, total, PAGE_SIZE))
        };
        Ok(html(StatusCode::OK, views::page(&viewer, "/operator/instances", "Instances", notice.as_ref(), body)))
    })
    .await
}

/// Pauses an instance for review.
#[endpoint { method = POST, path = "/operator/instances/{id}/pause", unpublished = true }]
async fn pause_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = operator_post(&rqctx, &body).await?;
        let reason: String = form.opt("reason").unwrap_or("review").chars().take(200).collect();
        let instance =
            ops::instances::pause_instance(&rqctx.context().store, &path.into_inner().id, Some(&reason)).await?;
        info!(rqctx.log, "instance paused"; "by" => &viewer.user.id, "instance_id" => &instance.id);
        Ok(redirect("/operator/instances?done=paused"))
    })
    .await
}

/// Resumes a paused instance.
#[endpoint { method = POST, path = "/operator/instances/{id}/resume", unpublished = true }]
async fn resume_post(rqctx: Ctx, path: Path<IdPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = operator_post(&rqctx, &body).await?;
        let instance = ops::instances::resume_instance(&rqctx.context().store, &path.into_inner().id).await?;
        info!(rqctx.log, "instance resumed"; "by" => &viewer.user.id, "instance_id" => &instance.id);
        Ok(redirect("/operator/instances?done=resumed"))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(customers_get),
        api.register(customer_create_post),
        api.register(customer_get),
        api.register(approve_post),
        api.register(plan_post),
        api.register(modules_post),
        api.register(limits_post),
        api.register(customer_invite_post),
        api.register(instances_get),
        api.register(pause_post),
        api.register(resume_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
