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

/// A body of the chunks a producer sends; ends when the producer does.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// Where a producer writes its CSV: a page at a time.
pub struct Sink(mpsc::Sender<Bytes>);

impl Sink {
    /// Sends one page; false when the browser went away (stop reading).
    pub async fn send(&self, page: Vec<u8>) -> bool {
        self.0.send(Bytes::from(page)).await.is_ok()
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
    let mut response = Response::new(Body::wrap(ChannelBody(rx)));
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

/// A cell as a spreadsheet may safely open it: text that would start a formula (`=`,
/// `@`, a tab, a carriage return, or `+`/`-` not followed by a number) gets a leading
/// apostrophe. Phone numbers (`+14155550123`) stay as they are.
pub fn cell(value: &str) -> String {
    let mut chars = value.chars();
    let formula = match chars.next() {
        Some('=' | '@' | '\t' | '\r') => true,
        // A signed number stays a number; anything else after a sign is a formula.
        Some('+' | '-') => {
            let rest = chars.as_str();
            rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        }
        _ => false,
    };
    if formula { format!("'{value}") } else { value.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

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
