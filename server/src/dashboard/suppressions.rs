//! `/suppressed-recipients`: who is suppressed, why (`reason`) and how (`source`:
//! `opt_out` from a keyword the contact sent, `manual` added here or by the CLI,
//! `import` from a CSV); adding, removing, importing and exporting CSV.
//!
//! CSV is `phone,reason` on import (a header line is recognised and skipped; numbers
//! in international format; at most 10,000 rows) and `phone,reason,source,created_at`
//! on export. Exported text cells that a spreadsheet would run as a formula (starting
//! with `=`, `+`, `-`, `@`) get a leading apostrophe (OWASP CSV injection), except the
//! phone, whose `+` is part of E.164 and never a formula with text in it.

use super::export::cell;
use super::roles::Action;
use super::session::{self, Viewer};
use super::views::{self, Notice};
use super::{Ctx, DashError, PAGE_SIZE, html, page, page_number, query, when};
use crate::phone;
use dropshot::{Body, HttpError, UntypedBody, endpoint};
use http::{HeaderValue, Response, StatusCode, header};
use maud::{Markup, html};
use slog::info;

/// Largest import accepted.
const MAX_IMPORT_ROWS: usize = 10_000;
/// Largest export.
const MAX_EXPORT_ROWS: i64 = 100_000;

async fn render(rqctx: &Ctx, viewer: &Viewer, notice: Option<&Notice>) -> Result<Markup, DashError> {
    let q = query(rqctx);
    let page_no = page_number(&q);
    let search = q.get("q").map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let (rows, total) = rqctx
        .context()
        .store
        .suppressions_page(viewer.customer_id()?, search.as_deref(), PAGE_SIZE, (page_no - 1) * PAGE_SIZE)
        .await?;
    let may = viewer.role.may(Action::ManageSuppressions);
    let base = match &search {
        Some(s) => format!("/suppressed-recipients?q={}", urlencode(s)),
        None => "/suppressed-recipients".to_string(),
    };
    Ok(views::page(
        viewer,
        "/suppressed-recipients",
        "Suppressed recipients",
        notice,
        html! {
            p { "Sends to these numbers are refused with " code { "recipient_suppressed" } ". A contact who writes STOP (or another " a href="/docs/responsible-messaging" { "opt-out keyword" } ") is added here by itself." }
            @if may {
                div.grid {
                    form.stack.card method="post" action="/suppressed-recipients" {
                        (views::csrf_field(&viewer.csrf))
                        label for="phone" { "Phone (international format)" }
                        input #phone type="text" name="phone" required placeholder="+14155550123";
                        label for="reason" { "Reason" }
                        input #reason type="text" name="reason" maxlength="200" placeholder="asked not to be contacted";
                        button type="submit" { "Suppress" }
                    }
                    form.stack.card method="post" action="/suppressed-recipients/import" {
                        (views::csrf_field(&viewer.csrf))
                        label for="csv" { "Import CSV (phone,reason per line)" }
                        input #csv-file type="file" accept=".csv,text/csv,text/plain" data-fill="csv" hidden;
                        textarea #csv name="csv" placeholder="phone,reason\n+14155550123,complaint" {}
                        p.hint { "Paste the file's text" span.js-only hidden { ", or choose the file above" } "; at most 10,000 rows." }
                        button type="submit" { "Import" }
                    }
                }
            }
            form.row method="get" action="/suppressed-recipients" {
                label { "Find a number" input type="text" name="q" value=[search.as_deref()]; }
                button.secondary type="submit" { "Search" }
                a href="/suppressed-recipients/export" { "Export CSV" }
            }
            table #suppressions {
                thead { tr { th { "Phone" } th { "Reason" } th { "Source" } th { "Since" } th {} } }
                tbody {
                    @for s in &rows {
                        tr {
                            td { code { (s.phone) } }
                            td.long { (s.reason) }
                            td { (views::badge(&s.source, if s.source == "opt_out" { "warn" } else { "muted" })) }
                            td { (when(s.created_at)) }
                            td { @if may { (views::button_form("/suppressed-recipients/remove", &viewer.csrf, "Remove", &[("phone", &s.phone)], "secondary")) } }
                        }
                    }
                    @if rows.is_empty() { tr { td colspan="5" { "Nobody is suppressed." } } }
                }
            }
            (views::pager(&base, page_no, total, PAGE_SIZE))
        },
    ))
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("", s)]).unwrap_or_default().trim_start_matches('=').to_string()
}

/// The suppression list.
#[endpoint { method = GET, path = "/suppressed-recipients", unpublished = true }]
async fn suppressions_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let notice = match query(&rqctx).get("done").map(String::as_str) {
            Some("added") => Some(Notice::Ok("Suppressed: sends to this number are refused.".into())),
            Some("removed") => Some(Notice::Ok("Removed: this number can be messaged again.".into())),
            _ => None,
        };
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, notice.as_ref()).await?))
    })
    .await
}

/// Adds one suppression.
#[endpoint { method = POST, path = "/suppressed-recipients", unpublished = true }]
async fn suppressions_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageSuppressions).await?;
        let Some(number) = phone::normalize(form.get("phone")) else {
            let notice =
                Notice::Error(format!("{:?} is not a phone number in international format.", form.get("phone")));
            return Ok(html(StatusCode::BAD_REQUEST, render(&rqctx, &viewer, Some(&notice)).await?));
        };
        let reason: String = form.opt("reason").unwrap_or("manual").chars().take(200).collect();
        rqctx.context().store.add_suppression(viewer.customer_id()?, &number.e164, &reason, "manual").await?;
        info!(rqctx.log, "suppression added"; "user_id" => &viewer.user.id);
        Ok(super::redirect("/suppressed-recipients?done=added"))
    })
    .await
}

/// Removes one suppression.
#[endpoint { method = POST, path = "/suppressed-recipients/remove", unpublished = true }]
async fn suppressions_remove_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageSuppressions).await?;
        let removed = rqctx.context().store.remove_suppression(viewer.customer_id()?, form.get("phone")).await?;
        if !removed {
            return Err(DashError::NotFound);
        }
        info!(rqctx.log, "suppression removed"; "user_id" => &viewer.user.id);
        Ok(super::redirect("/suppressed-recipients?done=removed"))
    })
    .await
}

/// Rows of an import: (E.164, reason), and the problems of the rows that were not.
pub fn parse_import(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    let (mut rows, mut problems) = (Vec::new(), Vec::new());
    for (i, record) in reader.records().enumerate() {
        let line = i + 1;
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("line {line}: {e}"));
                continue;
            }
        };
        let raw = record.get(0).unwrap_or("").trim_start_matches('\'');
        if raw.is_empty() || (line == 1 && raw.eq_ignore_ascii_case("phone")) {
            continue;
        }
        if rows.len() >= MAX_IMPORT_ROWS {
            problems
                .push(format!("line {line} and after: more than {MAX_IMPORT_ROWS} rows; import the rest separately"));
            break;
        }
        match phone::normalize(raw) {
            Some(p) => {
                let reason =
                    record.get(1).map(|r| r.trim_start_matches('\'')).filter(|r| !r.is_empty()).unwrap_or("imported");
                rows.push((p.e164, reason.chars().take(200).collect()));
            }
            None => problems.push(format!("line {line}: {raw:?} is not a phone number in international format")),
        }
    }
    (rows, problems)
}

/// Imports a CSV.
#[endpoint { method = POST, path = "/suppressed-recipients/import", unpublished = true, request_body_max_bytes = 1_048_576 }]
async fn suppressions_import_post(rqctx: Ctx, body: UntypedBody) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let (form, viewer) = session::post_form(&rqctx, &body, Action::ManageSuppressions).await?;
        let (rows, problems) = parse_import(form.raw("csv"));
        let added = rqctx.context().store.import_suppressions(viewer.customer_id()?, &rows, "import").await?;
        info!(rqctx.log, "suppressions imported"; "user_id" => &viewer.user.id, "rows" => rows.len(), "added" => added);
        let mut text = format!(
            "Imported {} row(s): {added} new, {} already suppressed.",
            rows.len(),
            rows.len() as u64 - added.min(rows.len() as u64)
        );
        let notice = if problems.is_empty() {
            Notice::Ok(text)
        } else {
            text.push_str(&format!(" {} row(s) skipped: ", problems.len()));
            text.push_str(&problems.iter().take(10).cloned().collect::<Vec<_>>().join("; "));
            if problems.len() > 10 {
                text.push_str("; ...");
            }
            Notice::Error(text)
        };
        Ok(html(StatusCode::OK, render(&rqctx, &viewer, Some(&notice)).await?))
    })
    .await
}

/// Exports the whole list as CSV.
#[endpoint { method = GET, path = "/suppressed-recipients/export", unpublished = true }]
async fn suppressions_export_get(rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    page(&rqctx, async {
        let viewer = session::customer_viewer(&rqctx, Action::Read).await?;
        let rows = rqctx.context().store.all_suppressions(viewer.customer_id()?, MAX_EXPORT_ROWS).await?;
        let mut writer = csv::Writer::from_writer(Vec::new());
        let io = |e: csv::Error| DashError::Internal(e.to_string());
        writer.write_record(["phone", "reason", "source", "created_at"]).map_err(io)?;
        for s in &rows {
            let at = chrono::DateTime::from_timestamp_millis(s.created_at)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_default();
            let record = [s.phone.as_str(), &s.reason, &s.source, &at];
            writer.write_record(record.iter().map(|v| cell(v))).map_err(io)?;
        }
        let bytes = writer.into_inner().map_err(|e| DashError::Internal(e.to_string()))?;
        let mut response = Response::new(Body::from(bytes));
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
        h.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment; filename=\"suppressed-recipients.csv\""),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        Ok(response)
    })
    .await
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(suppressions_get).map_err(|e| e.to_string())?;
    api.register(suppressions_post).map_err(|e| e.to_string())?;
    api.register(suppressions_remove_post).map_err(|e| e.to_string())?;
    api.register(suppressions_import_post).map_err(|e| e.to_string())?;
    api.register(suppressions_export_get).map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_reads_phone_and_reason_and_reports_bad_lines() {
        let (rows, problems) = parse_import(
            "phone,reason\n+14155550123,complaint\n'+442071838750\nnot-a-phone,x\n\n\"+14155550124\",\"a, b\"\n",
        );
        assert_eq!(
            rows,
            vec![
                ("+14155550123".into(), "complaint".into()),
                ("+442071838750".into(), "imported".into()),
                ("+14155550124".into(), "a, b".into()),
            ]
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("line 4:"), "{problems:?}");
    }

    #[test]
    fn export_cells_never_start_a_formula() {
        assert_eq!(cell("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(cell("complaint"), "complaint");
    }
}
