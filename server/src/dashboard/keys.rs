//! `/api-keys`: the customer's keys (prefix, name, created, last used, revoked), creating
//! one (the key is shown once, only its hash is kept) and revoking one (effective on
//! the next request). Owners and admins only change them.

use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, PAGE_SIZE, html, page, page_number, query, when};
use crate::ops;
use dropshot::{Body, HttpError, Path, UntypedBody, endpoint};
use http::{Response, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;
use slog::info;

#[derive(Deserialize, schemars::JsonSchema)]
struct KeyPath {
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
    let (keys, total) =
        rqctx.context().store.api_keys_page(viewer.customer_id()?, PAGE_SIZE, (page_no - 1) * PAGE_SIZE).await?;
    let may = viewer.role.may(Action::ManageKeys);
    Ok(views::page(
        viewer,
        "/api-keys",
        "API keys",
        notice,
        html! {
            @if let Some(extra) = extra { (extra) }
            p { "Programs send with " code { "Authorization: Bearer <API_KEY>" } " on " code { "POST /api/send-message" } ". Only a hash of each key is kept: a key is shown once, when it is created." }
            @if may {
                form.row.card method="post" action="/api-keys" {
                    (views::csrf_field(&viewer.csrf))
                    label { "Name" input type="text" name="name" maxlength="64" required placeholder="billing-service"; }
                    button type="submit" { "Create key" }
                }
            }
            table #keys {
                thead { tr { th { "Name" } th { "Key" } th { "Created" } th { "Last used" } th { "State" } th {} } }
                tbody {
                    @for k in &keys {
                        tr {
                            td.long { (k.name) }
                            td { code { (k.prefix) "…" } }
                            td { (when(k.created_at)) }
                            td { (k.last_used_at.map(when).unwrap_or_else(|| "never".into())) }
                            td { @if let Some(at) = k.revoked_at { (views::badge("revoked", "bad")) " " (when(at)) } @else { (views::badge("active", "ok")) } }
                            td { @if may && k.revoked_at.is_none() { (views::button_form(&format!("/api-keys/{}/revoke", k.id), &viewer.csrf, "Revoke", &[], "danger")) } }
                        }
                    }
                    @if keys.is_empty() { tr { td colspan="6" { "No keys yet." } } }
                }
            }
            (views::pager("/api-keys", page_no, total, PAGE_SIZE))
        },
    ))
}

/// The keys page.
#[endpoint { method = GET, path = "/api-keys", unpublished = true }]
async fn keys_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let notice = (query(&rqctx).get("done").map(String::as_str) == Some("revoked"))
            .then(|| Notice::Ok("The key is revoked: requests with it now get 401 revoked_api_key.".into()));
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, notice.as_ref(), None).await?))
    })
    .await
}

/// Creates a key and shows it once.
#[endpoint { method = POST, path = "/api-keys", unpublished = true }]
async fn keys_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageKeys).await?;
        let name = form.get("name");
        if name.is_empty() || name.chars().count() > 64 {
            let notice = Notice::Error("Give the key a name of 1 to 64 characters.".into());
            return Ok(html(StatusCode::BAD_REQUEST, render(&rqctx, &viewer, Some(&notice), None).await?));
        }
        let created = ops::create_key(&rqctx.context().store, viewer.customer_id()?, name).await?;
        info!(rqctx.log, "api key created"; "user_id" => &viewer.user.id, "key_id" => created["id"].as_str());
        let key = created["api_key"].as_str().unwrap_or_default();
        let extra = html! { div #new-key { (views::shown_once(&format!("API key {name}"), key)) } };
        let notice = Notice::Ok("Key created.".into());
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice), Some(extra)).await?))
    })
    .await
}

/// Revokes a key of the viewer's customer.
#[endpoint { method = POST, path = "/api-keys/{id}/revoke", unpublished = true }]
async fn key_revoke_post(rqctx: Ctx, path: Path<KeyPath>, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (_, viewer) = session::post_form(&rqctx, &body, Action::ManageKeys).await?;
        let store = &rqctx.context().store;
        let id = path.into_inner().id;
        let key = store.api_key(&id).await?.filter(|k| k.customer_id == viewer.customer_id().unwrap_or(""));
        let key = key.ok_or(DashError::NotFound)?;
        ops::keys::revoke_key(store, &key.id).await?;
        info!(rqctx.log, "api key revoked"; "user_id" => &viewer.user.id, "key_id" => &key.id);
        Ok(super::redirect("/api-keys?done=revoked"))
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(keys_get).map_err(|e| e.to_string())?;
    api.register(keys_post).map_err(|e| e.to_string())?;
    api.register(key_revoke_post).map_err(|e| e.to_string())?;
    Ok(())
}
