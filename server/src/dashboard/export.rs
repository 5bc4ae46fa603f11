//! CSV downloads streamed as they are read: a task reads the store a page at a time
//! (keyset, 1,000 rows) and sends each page's CSV down a short channel; the answer's
//! body is the channel. Memory stays at a few pages whatever the export's size, and a
//! browser that goes away stops the reading (the send fails).

use bytes::Bytes;
use dropshot::Body;
use http::{HeaderValue, Response, StatusCode, header};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// Rows read per page.
pub const PAGE_ROWS: i64 = 1_000;

/// What a producer sends down the channel: a page, or the end of a complete export.
enum Piece {
    Page(Bytes),
    Done,
}

/// The export stopped before its end (the store failed, or the producer panicked): the
/// body ends with an error, so the connection is cut and no client takes a truncated
/// file for a whole one.
#[derive(Debug, thiserror::Error)]
#[error("the export stopped before its end")]
struct ExportCut;

/// A body of the pages a producer sends; ends when the producer says it is done.
struct ChannelBody {
    rx: mpsc::Receiver<Piece>,
    done: bool,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = ExportCut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        self.rx.poll_recv(cx).map(|piece| match piece {
            Some(Piece::Page(page)) => Some(Ok(http_body::Frame::data(page))),
            Some(Piece::Done) => {
                self.done = true;
                None
            }
            None => Some(Err(ExportCut)),
        })
    }
}

/// Where a producer writes its CSV: a page at a time, then `done`. A producer that
/// returns without `done` cuts the download.
pub struct Sink(mpsc::Sender<Piece>);

impl Sink {
    /// Sends one page; false when the browser went away (stop reading).
    pub async fn send(&self, page: Vec<u8>) -> bool {
        self.0.send(Piece::Page(Bytes::from(page))).await.is_ok()
    }

    /// The export is complete.
    pub async fn done(self) {
        let _ = self.0.send(Piece::Done).await;
    }
}

/// A `200 text/csv` download named `filename`, its body written by `produce`.
pub fn stream<F, Fut>(filename: &str, produce: F) -> Response<Body>
where
    F: FnOnce(Sink) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(produce(Sink(tx)));
    let mut response = Response::new(Body::wrap(ChannelBody { rx, done: false }));
    *response.status_mut() = StatusCode::OK;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        h.insert(header::CONTENT_DISPOSITION, value);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// A keyset-paged export as a download: `read(before)` gives up to `PAGE_ROWS` rows
/// older than the key `before` (newest first), `key` a row's key, `render(rows,
/// header)` a page's CSV. Pages are sent as they are read until a short page ends the
/// export; a store error is logged and cuts the download.
pub fn paged<R, Read, Fut>(
    filename: &str,
    log: slog::Logger,
    read: Read,
    key: fn(&R) -> i64,
    render: impl Fn(&[R], bool) -> Vec<u8> + Send + 'static,
) -> Response<Body>
where
    R: Send + 'static,
    Read: Fn(Option<i64>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<R>, crate::store::StoreError>> + Send,
{
    let what = filename.to_string();
    stream(filename, move |sink| async move {
        let mut before = None;
        let mut first = true;
        loop {
            let rows = match read(before).await {
                Ok(rows) => rows,
                Err(e) => {
                    slog::error!(log, "export failed"; "export" => &what, "error" => %e);
                    return;
                }
            };
            if !sink.send(render(&rows, first)).await {
                return; // the browser went away
            }
            first = false;
            if (rows.len() as i64) < PAGE_ROWS {
                return sink.done().await;
            }
            before = rows.last().map(key);
        }
    })
}

/// A cell as a spreadsheet may safely open it: text that a spreadsheet could read as a
/// formula gets a leading apostrophe (OWASP's CSV injection advice, widened). That is
/// text starting with `=`, `@`, or `+`/`-` not followed by a plain number; their
/// fullwidth forms (`＝` `＋` `－` `＠`, which some spreadsheets fold to the ASCII
/// ones); or any whitespace, control or invisible character (tab, CR, LF, a space, a
/// no-break space, NUL, a zero-width space, a byte-order mark ...), which spreadsheets
/// may strip before they look at what follows. Every CSV the dashboard writes passes
/// each cell through here. Phone numbers (`+14155550123`) and signed numbers stay as
/// they are.
pub fn cell(value: &str) -> String {
    let mut chars = value.chars();
    let formula = match chars.next() {
        None => false,
        // A signed number stays a number; anything else after a sign is a formula.
        Some('+' | '-') => {
            let rest = chars.as_str();
            rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        }
        Some(first) => starts_formula(first),
    };
    if formula { format!("'{value}") } else { value.to_string() }
}

/// Whether a cell starting with `c` (other than an ASCII sign) may be read as a formula.
fn starts_formula(c: char) -> bool {
    matches!(c, '=' | '@' | '\u{FF1D}' | '\u{FF0B}' | '\u{FF0D}' | '\u{FF20}')
        || c.is_whitespace()
        || c.is_control()
        // Invisible format characters: zero-width space, joiners, marks, word joiner, BOM.
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    /// The body's bytes, and whether it ended cleanly (the producer writes fewer pages
    /// than the channel holds, so it runs first).
    async fn drain(produce: impl AsyncFnOnce(Sink)) -> (Vec<u8>, bool) {
        let (tx, rx) = mpsc::channel(4);
        produce(Sink(tx)).await;
        let mut body = ChannelBody { rx, done: false };
        let mut out = Vec::new();
        let clean = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(frame)) => out.extend_from_slice(&frame.into_data().unwrap()),
                Some(Err(_)) => break false,
                None => break true,
            }
        };
        (out, clean)
    }

    #[tokio::test]
    async fn an_export_that_stops_early_ends_in_an_error_not_a_short_file() {
        let whole = drain(async |sink: Sink| {
            sink.send(b"a\n".to_vec()).await;
            sink.send(b"b\n".to_vec()).await;
            sink.done().await;
        })
        .await;
        assert_eq!(whole, (b"a\nb\n".to_vec(), true));
        let cut = drain(async |sink: Sink| {
            sink.send(b"a\n".to_vec()).await; // then the store fails: no done
        })
        .await;
        assert_eq!(cut, (b"a\n".to_vec(), false));
    }

    #[test]
    fn cells_starting_with_whitespace_or_a_control_character_are_defused() {
        for value in [
            " =1+1",
            "  @SUM(A1)",
            "\t=1+1",
            "\r=1+1",
            "\n=1+1",
            "\r\n=1+1",
            "\u{a0}=1+1",
            "\u{3000}=1+1",
            "\u{2028}=1+1",
            "\0=1+1",
            "\u{200B}=1+1",
            "\u{FEFF}=1+1",
            " plain",
            " -5",
        ] {
            assert_eq!(cell(value), format!("'{value}"), "{value:?}");
        }
    }

    #[test]
    fn fullwidth_formula_characters_are_defused() {
        for value in
            ["\u{FF1D}1+1", "\u{FF0B}cmd|' /C calc'!A0", "\u{FF0D}2+3", "\u{FF20}SUM(A1)", "\u{FF0B}14155550123"]
        {
            assert_eq!(cell(value), format!("'{value}"), "{value:?}");
        }
    }

    #[test]
    fn ordinary_text_numbers_and_phone_numbers_stay_as_they_are() {
        for value in
            ["", "plain", "Is my order ready?", "a=b", "+14155550123", "-5", "-2.5", "42", "Ünïcode", "\u{FF21}bc"]
        {
            assert_eq!(cell(value), value, "{value:?}");
        }
    }

    #[test]
    fn cells_that_would_be_formulas_are_defused_and_numbers_are_not() {
        assert_eq!(cell("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(cell("+cmd|' /C calc'!A0"), "'+cmd|' /C calc'!A0");
        assert_eq!(cell("-"), "'-");
        assert_eq!(cell("+14155550123"), "+14155550123");
        assert_eq!(cell("-5"), "-5");
        assert_eq!(cell("+1+cmd|' /C calc'!A0"), "'+1+cmd|' /C calc'!A0");
        assert_eq!(cell("-2.5"), "-2.5");
        assert_eq!(cell("plain"), "plain");
    }
}
