//! The page shell and the pieces every page uses: navigation, notices, CSRF fields,
//! pagination.
//!
//! Navigation lives in two lists here, one per side; a page is a line in one of them
//! and its routes registered by its module (the operator's policy pages are in
//! `policies.rs`).

use super::roles::Role;
use super::session::Viewer;
use http::StatusCode;
use maud::{DOCTYPE, Markup, PreEscaped, html};

/// The customer pages in the navigation: (path, label).
pub const CUSTOMER_NAV: &[(&str, &str)] = &[
    ("/dashboard", "Overview"),
    ("/instances", "Instances"),
    ("/messages", "Message log"),
    ("/inbound-logs", "Inbound"),
    ("/suppressed-recipients", "Suppressed"),
    ("/api-keys", "API keys"),
    ("/integrations/pbx", "PBX"),
    ("/users", "Users"),
    ("/docs/responsible-messaging", "Guide"),
];

/// The operator console's pages in the navigation: (path, label). The review queue and
/// the policy modules pages of the policy engine go here.
pub const OPERATOR_NAV: &[(&str, &str)] = &[
    ("/operator", "Customers"),
    ("/operator/fleet", "Fleet"),
    ("/operator/instances", "Instances"),
    ("/operator/reviews", "Review queue"),
    ("/operator/policies", "Policy modules"),
];

/// A message shown at the top of a page.
#[derive(Clone, Debug)]
pub enum Notice {
    Ok(String),
    Error(String),
}

impl Notice {
    pub fn render(&self) -> Markup {
        match self {
            Notice::Ok(text) => html! { p.notice.ok role="status" { (text) } },
            Notice::Error(text) => html! { p.notice.error role="alert" { (text) } },
        }
    }
}

/// A signed-in page: header with navigation, then `body`.
pub fn page(viewer: &Viewer, current: &str, title: &str, notice: Option<&Notice>, body: Markup) -> Markup {
    let (nav, home) = match viewer.role {
        Role::Operator => (OPERATOR_NAV, "/operator"),
        _ => (CUSTOMER_NAV, "/dashboard"),
    };
    let account = viewer.customer.as_ref().map(|c| c.name.clone()).unwrap_or_else(|| "Operator console".into());
    shell(
        title,
        html! {
            header.top {
                a.brand href=(home) { "Gateway" }
                span.account { (account) }
                nav aria-label="Main" {
                    @for (path, label) in nav {
                        @let here = current == *path || (current.starts_with(path) && *path != "/dashboard" && *path != "/operator");
                        a href=(path) aria-current=[here.then_some("page")] { (label) }
                    }
                }
                div.me {
                    span { (viewer.user.email) " · " (viewer.role.as_str()) }
                    form method="post" action="/logout" {
                        (csrf_field(&viewer.csrf))
                        button.link type="submit" { "Sign out" }
                    }
                }
            }
            main {
                h1 { (title) }
                @if let Some(notice) = notice { (notice.render()) }
                (body)
            }
        },
    )
}

/// A page without navigation (sign-in, errors, public pages).
pub fn bare(title: &str, notice: Option<&Notice>, body: Markup) -> Markup {
    shell(
        title,
        html! {
            header.top {
                a.brand href="/" { "Gateway" }
                nav aria-label="Public" {
                    a href="/docs/responsible-messaging" { "Responsible messaging" }
                    a href="/acceptable-use" { "Acceptable use" }
                    a href="/login" { "Sign in" }
                }
            }
            main.narrow {
                h1 { (title) }
                @if let Some(notice) = notice { (notice.render()) }
                (body)
            }
        },
    )
}

fn shell(title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Gateway" }
                link rel="stylesheet" href="/assets/dashboard.css";
                script src="/assets/dashboard.js" defer {}
            }
            body { (content) }
        }
    }
}

/// The hidden synchronizer-token field of a form.
pub fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

/// A one-button POST form.
pub fn button_form(action: &str, csrf: &str, label: &str, hidden: &[(&str, &str)], class: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            (csrf_field(csrf))
            @for (name, value) in hidden { input type="hidden" name=(name) value=(value); }
            button class=(class) type="submit" { (label) }
        }
    }
}

/// "Page 2 of 7" with previous and next links; `base` is the path with its filters.
pub fn pager(base: &str, page: i64, total: i64, page_size: i64) -> Markup {
    pager_named(base, "page", page, total, page_size)
}

/// [`pager`] with another query parameter (a page with two lists).
pub fn pager_named(base: &str, param: &str, page: i64, total: i64, page_size: i64) -> Markup {
    let pages = ((total + page_size - 1) / page_size).max(1);
    let join = if base.contains('?') { '&' } else { '?' };
    html! {
        nav.pager aria-label="Pages" {
            @if page > 1 { a rel="prev" href=(format!("{base}{join}{param}={}", page - 1)) { "← Previous" } }
            span { "Page " (page) " of " (pages) " · " (total) " in all" }
            @if page < pages { a rel="next" href=(format!("{base}{join}{param}={}", page + 1)) { "Next →" } }
        }
    }
}

/// "Older →" for lists paged by key; `next_before` is the last id shown when the page
/// was full.
pub fn key_pager(base: &str, first_page: bool, next_before: Option<i64>) -> Markup {
    let join = if base.contains('?') { '&' } else { '?' };
    html! {
        nav.pager aria-label="Pages" {
            @if !first_page { a href=(base) { "← Newest" } }
            @if let Some(before) = next_before { a rel="next" href=(format!("{base}{join}before={before}")) { "Older →" } }
            @if first_page && next_before.is_none() { span { "All rows are shown." } }
        }
    }
}

/// A value in a `<code>` box meant to be copied, with a warning that it is shown once.
pub fn shown_once(label: &str, value: &str) -> Markup {
    html! {
        div.secret {
            p { strong { (label) } " — copy it now; it is shown only this once." }
            code.copy { (value) }
        }
    }
}

/// An error page.
pub fn error_page(status: StatusCode, text: &str) -> Markup {
    let title = match status.as_u16() {
        403 => "Not allowed",
        404 => "Not found",
        429 => "Slow down",
        400 | 415 => "That did not work",
        _ => "Something went wrong",
    };
    bare(title, Some(&Notice::Error(text.to_string())), html! { p { a href="/" { "Back to the start" } } })
}

/// Marks a SVG string (generated here) as markup.
pub fn trusted_svg(svg: &str) -> PreEscaped<String> {
    PreEscaped(svg.to_string())
}

/// A state as a coloured label.
pub fn badge(text: &str, kind: &str) -> Markup {
    html! { span class=(format!("badge {kind}")) { (text) } }
}

/// A long text folded into a `<details>` after `short` characters, so a table keeps its
/// width: the start as the summary, the whole text when opened.
pub fn folded(text: &str, short: usize) -> Markup {
    html! {
        @if text.chars().count() <= short { (text) }
        @else {
            details.fold { summary { (text.chars().take(short).collect::<String>()) "…" } (text) }
        }
    }
}
