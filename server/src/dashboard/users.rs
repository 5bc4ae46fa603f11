//! `/users`: the customer's accounts; owners and admins invite people (a one-time
//! sign-in link, shown once, to hand over), change roles, issue a new link (a
//! forgotten password) and remove accounts. Admins cannot touch owners; the last
//! owner cannot be removed or demoted; nobody changes their own role.

use super::accounts;
use super::roles::{Action, Role};
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, PAGE_SIZE, html, page, page_number, query, redirect, when};
use crate::store::DashUser;
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;
use slog::info;

#[derive(Deserialize, schemars::JsonSchema)]
struct UserPath {
    id: String,
}

async fn render(
    rqctx: &Ctx,
    viewer: &Viewer,
    notice: Option<&Notice>,
    extra: Option<Markup>,
) -> Result<Markup, DashError> {
    let q = query(rqctx);
    let page_no = page_number(&q);
    let (users, total) =
        rqctx.context().store.customer_users(viewer.customer_id()?, PAGE_SIZE, (page_no - 1) * PAGE_SIZE).await?;
    let may = viewer.role.may(Action::ManageUsers);
    let grantable: Vec<Role> = Role::CUSTOMER.into_iter().filter(|r| viewer.role.may_manage_role(*r)).collect();
    Ok(views::page(
        viewer,
        "/users",
        "Users",
        notice,
        html! {
            @if let Some(extra) = extra { (extra) }
            @if may {
                form.row.card method="post" action="/users" {
                    (views::csrf_field(&viewer.csrf))
                    label { "Email" input type="email" name="email" required; }
                    label { "Role" select name="role" { @for r in &grantable { option value=(r.as_str()) selected[*r == Role::Viewer] { (r.as_str()) } } } }
                    button type="submit" { "Invite" }
                    span.hint { "You get a one-time sign-in link to give them." }
                }
            }
            table #users {
                thead { tr { th { "Email" } th { "Role" } th { "State" } th { "Last sign-in" } th {} } }
                tbody {
                    @for u in &users { (user_row(viewer, u, &grantable)) }
                }
            }
            (views::pager("/users", page_no, total, PAGE_SIZE))
            p.hint { "Owners: everything, and the only ones who manage owners. Admins: everything else, including users and API keys. Developers: instances, webhooks, suppressions, PBX, test sends. Viewers: read only." }
        },
    ))
}

fn user_row(viewer: &Viewer, u: &DashUser, grantable: &[Role]) -> Markup {
    let role = Role::parse(&u.role).unwrap_or(Role::Viewer);
    let manageable = viewer.role.may(Action::ManageUsers)
        && viewer.role.may_manage_role(role)
        && u.id != viewer.user.id
        && u.disabled_at.is_none();
    let state = if u.disabled_at.is_some() {
        views::badge("removed", "muted")
    } else if u.password_hash.is_none() {
        views::badge("invited", "warn")
    } else if u.totp_secret.is_none() {
        views::badge("two-step not set up", "warn")
    } else {
        views::badge("active", "ok")
    };
    html! {
        tr {
            td.long { (u.email) @if u.id == viewer.user.id { " (you)" } }
            td {
                @if manageable {
                    form.inline method="post" action=(format!("/users/{}/role", u.id)) {
                        (views::csrf_field(&viewer.csrf))
                        select name="role" { @for r in grantable { option value=(r.as_str()) selected[*r == role] { (r.as_str()) } } }
                        " " button.secondary type="submit" { "Change" }
                    }
                } @else { (u.role) }
            }
            td { (state) }
            td { (u.last_sign_in_at.map(when).unwrap_or_else(|| "never".into())) }
            td {
                @if manageable {
                    (views::button_form(&format!("/users/{}/link", u.id), &viewer.csrf, "New sign-in link", &[], "secondary"))
                    " "
                    (views::button_form(&format!("/users/{}/remove", u.id), &viewer.csrf, "Remove", &[], "danger"))
                }
            }
        }
    }
}

/// The users page.
#[endpoint { method = GET, path = "/users", unpublished = true }]
async fn users_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let notice = match query(&rqctx).get("done").map(String::as_str) {
            Some("role") => Some(Notice::Ok("Role changed.".into())),
            Some("removed") => Some(Notice::Ok("Removed: their sessions ended.".into())),
            _ => None,
        };
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, notice.as_ref(), None).await?))
    })
    .await
}

fn link_box(email: &str, link: &str) -> Markup {
    html! {
        div #invite-link {
            (views::shown_once(&format!("One-time sign-in link for {email} (valid 7 days)"), link))
            p.hint { "Give it to them privately. It lets them choose a password and set up two-step sign-in." }
        }
    }
}

/// Invites a person.
#[endpoint { method = POST, path = "/users", unpublished = true }]
async fn invite_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageUsers).await?;
        let role = Role::parse(form.get("role")).filter(|r| viewer.role.may_manage_role(*r)).ok_or(DashError::Forbidden)?;
        let state = rqctx.context();
        let created =
            accounts::create(&state.store, &state.config, Some(viewer.customer_id()?), form.get("email"), role, &viewer.user.id)
                .await;
        match created {
            Ok((user, link)) => {
                info!(rqctx.log, "user invited"; "by" => &viewer.user.id, "user_id" => &user.id, "role" => role.as_str());
                let notice = Notice::Ok(format!("{} is invited as {}.", user.email, role.as_str()));
                Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice), Some(link_box(&user.email, &link))).await?))
            }
            Err(e) => {
                let notice = Notice::Error(DashError::from(e).to_string());
                Ok(html(StatusCode::BAD_REQUEST, render(&rqctx, &viewer, Some(&notice), None).await?))
            }
        }
    })
    .await
}

/// A user of the viewer's customer that the viewer may manage (404 for other customers'
/// users; 403 for the viewer's own account and for roles above theirs).
async fn manageable(rqctx: &Ctx, viewer: &Viewer, id: &str) -> Result<DashUser, DashError> {
    let user = rqctx.context().store.dashboard_user(id).await?.ok_or(DashError::NotFound)?;
    if user.customer_id.as_deref() != Some(viewer.customer_id()?) {
        return Err(DashError::NotFound);
    }
    let role = Role::parse(&user.role).ok_or(DashError::Forbidden)?;
    if user.id == viewer.user.id || !viewer.role.may_manage_role(role) || user.disabled_at.is_some() {
        return Err(DashError::Forbidden);
    }
    Ok(user)
}

/// A change the store refused because it would leave the customer without an active
/// owner (checked in the same write, so two owners demoting each other cannot both).
fn keep_an_owner(done: bool) -> Result<(), DashError> {
    if done { Ok(()) } else { Err(DashError::BadRequest("The account needs at least one owner.".into())) }
}

/// Changes a user's role.
#[endpoint { method = POST, path = "/users/{id}/role", unpublished = true }]
async fn role_post(rqctx: Ctx, path: Path<UserPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageUsers).await?;
        let user = manageable(&rqctx, &viewer, &path.into_inner().id).await?;
        let role = Role::parse(form.get("role")).filter(|r| viewer.role.may_manage_role(*r) && *r != Role::Operator);
        let role = role.ok_or(DashError::Forbidden)?;
        keep_an_owner(rqctx.context().store.set_user_role(&user.id, role.as_str()).await?)?;
        info!(rqctx.log, "user role changed"; "by" => &viewer.user.id, "user_id" => &user.id, "role" => role.as_str());
        Ok(redirect("/users?done=role"))
    })
    .await
}

/// Removes a user (disables the account; its sessions end at once).
#[endpoint { method = POST, path = "/users/{id}/remove", unpublished = true }]
async fn remove_post(rqctx: Ctx, path: Path<UserPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = session::post_form(&rqctx, &body, Action::ManageUsers).await?;
        let user = manageable(&rqctx, &viewer, &path.into_inner().id).await?;
        keep_an_owner(rqctx.context().store.disable_user(&user.id).await?)?;
        info!(rqctx.log, "user removed"; "by" => &viewer.user.id, "user_id" => &user.id);
        Ok(redirect("/users?done=removed"))
    })
    .await
}

/// A new one-time sign-in link for a user (a forgotten password; the authenticator stays).
#[endpoint { method = POST, path = "/users/{id}/link", unpublished = true }]
async fn link_post(rqctx: Ctx, path: Path<UserPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = session::post_form(&rqctx, &body, Action::ManageUsers).await?;
        let user = manageable(&rqctx, &viewer, &path.into_inner().id).await?;
        let state = rqctx.context();
        let link = accounts::new_link(&state.store, &state.config, &user).await?;
        info!(rqctx.log, "sign-in link issued"; "by" => &viewer.user.id, "user_id" => &user.id);
        let notice = Notice::Ok(format!("A new sign-in link for {}; earlier links stop working.", user.email));
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice), Some(link_box(&user.email, &link))).await?))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    for result in [
        api.register(users_get),
        api.register(invite_post),
        api.register(role_post),
        api.register(remove_post),
        api.register(link_post),
    ] {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}
