use super::*;
use base64::engine::general_purpose::STANDARD;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

fn fetcher(allow_loopback: bool) -> Fetcher {
    Fetcher::new(allow_loopback, Duration::from_millis(500), slog::Logger::root(slog::Discard, slog::o!()))
}

async fn check(t: MediaType, mime: &str, media: &str) -> Result<Media, MediaError> {
    validate(t, mime, "f", media, &MediaLimits::default(), &fetcher(false)).await
}

#[tokio::test]
async fn inline_forms() {
    let b64 = STANDARD.encode(PNG);
    let m = check(MediaType::Image, "image/png", &b64).await.unwrap();
    assert_eq!((m.bytes.as_slice(), m.fetched), (PNG, false));
    let data_url = format!("data:image/png;base64,{b64}");
    assert_eq!(check(MediaType::Image, "image/png", &data_url).await.unwrap().size(), PNG.len());
    let pdf = STANDARD.encode(b"%PDF-1.7 ...");
    assert!(check(MediaType::Document, "application/pdf", &pdf).await.is_ok());
}

#[tokio::test]
async fn problems_name_their_field() {
    let png = STANDARD.encode(PNG);
    assert_eq!(check(MediaType::Image, "application/pdf", &png).await.unwrap_err().field, "mime_type");
    assert_eq!(check(MediaType::Audio, "image/png", &png).await.unwrap_err().field, "mime_type");
    assert_eq!(check(MediaType::Image, "image/png", "%%%not base64%%%").await.unwrap_err().field, "media");
    assert_eq!(check(MediaType::Image, "image/jpeg", &png).await.unwrap_err().field, "media");
    let mismatched_url = format!("data:image/jpeg;base64,{png}");
    assert_eq!(check(MediaType::Image, "image/png", &mismatched_url).await.unwrap_err().field, "mime_type");
    assert_eq!(check(MediaType::Image, "image/png", "data:image/png,raw").await.unwrap_err().field, "media");
    assert_eq!(check(MediaType::Image, "image/png", "http://example.com/a.png").await.unwrap_err().field, "media");
    let refused = check(MediaType::Image, "image/png", "https://127.0.0.1/a.png").await.unwrap_err();
    assert_eq!(refused.field, "media");
    assert!(!refused.reason.contains("127.0.0.1"), "a refusal never names the address: {}", refused.reason);
}

#[tokio::test]
async fn size_cap_applies_to_decoded_bytes() {
    let limits = MediaLimits { max_image_bytes: 16, ..MediaLimits::default() };
    let mut big = PNG.to_vec();
    big.resize(17, 0);
    let f = fetcher(false);
    let e = validate(MediaType::Image, "image/png", "a.png", &STANDARD.encode(&big), &limits, &f).await;
    assert!(e.unwrap_err().reason.contains("larger than 16"));
    big.truncate(16);
    assert!(validate(MediaType::Image, "image/png", "a.png", &STANDARD.encode(&big), &limits, &f).await.is_ok());
}

/// A loopback web server with fixed answers by path; `/hang` never answers.
async fn media_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let answer = |status: &str, headers: &str, body: &[u8]| {
                    let mut out = format!(
                        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(body);
                    out
                };
                let response = match path.as_str() {
                    "/a.png" => answer("200 OK", "Content-Type: image/png\r\n", PNG),
                    "/redirect" => answer("302 Found", "Location: /a.png\r\n", b""),
                    "/redirect-metadata" => answer("302 Found", "Location: http://169.254.169.254/latest\r\n", b""),
                    "/redirect-private" => answer("301 Moved", "Location: https://10.0.0.1/a.png\r\n", b""),
                    "/redirect-localhost" => answer("302 Found", "Location: https://localhost:9/a.png\r\n", b""),
                    "/loop" => answer("302 Found", "Location: /loop\r\n", b""),
                    "/page" => answer("200 OK", "Content-Type: text/html\r\n", b"<!DOCTYPE html><p>x"),
                    "/big" => answer("200 OK", "", &[0x89; 64]),
                    "/chunked" => {
                        let mut out =
                            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
                        for _ in 0..8 {
                            out.extend_from_slice(b"10\r\n\x89PNG\r\n\x1a\n00000000\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                        out
                    }
                    "/hang" => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        return;
                    }
                    _ => answer("404 Not Found", "", b"no"),
                };
                let _ = socket.write_all(&response).await;
            });
        }
    });
    port
}

async fn fetch_png(port: u16, path: &str, allow_loopback: bool) -> Result<Media, MediaError> {
    let limits = MediaLimits { max_image_bytes: 32, ..MediaLimits::default() };
    let url = format!("http://127.0.0.1:{port}{path}");
    validate(MediaType::Image, "image/png", "a.png", &url, &limits, &fetcher(allow_loopback)).await
}

#[tokio::test]
async fn a_media_url_is_fetched_by_the_gateway_through_the_guard() {
    let port = media_server().await;
    let fetched = fetch_png(port, "/a.png", true).await.unwrap();
    assert_eq!((fetched.bytes.as_slice(), fetched.fetched), (PNG, true), "the provider gets the content");
    assert_eq!(fetch_png(port, "/redirect", true).await.unwrap().bytes, PNG, "a redirect is followed");

    let reason = |r: Result<Media, MediaError>| r.unwrap_err().reason;
    // Each hop is checked again: a redirect to an internal address is refused before
    // any connection, even with the loopback flag (metadata and private ranges are
    // never allowed); nothing is sent there.
    for path in ["/redirect-metadata", "/redirect-private"] {
        let why = reason(fetch_png(port, path, true).await);
        assert!(why.contains("refused"), "{path}: {why}");
        assert!(!why.contains("169.254") && !why.contains("10.0.0.1"), "{path}: the address is not told: {why}");
    }
    assert!(reason(fetch_png(port, "/loop", true).await).contains("redirected more than 3 times"));
    assert!(reason(fetch_png(port, "/big", true).await).contains("larger than 32 bytes"), "declared length");
    assert!(reason(fetch_png(port, "/chunked", true).await).contains("larger than 32 bytes"), "streamed");
    assert!(reason(fetch_png(port, "/page", true).await).contains("web page"));
    assert!(reason(fetch_png(port, "/missing", true).await).contains("answered 404"));
    assert!(reason(fetch_png(port, "/hang", true).await).contains("took longer than 500 ms"));

    // Without the development flag loopback is refused: the literal before the request,
    // a name by the resolver the client connects with.
    let literal = reason(fetch_png(port, "/a.png", false).await);
    assert!(literal.contains("only https"), "{literal}");
    let f = fetcher(false);
    let limits = MediaLimits::default();
    let name = validate(MediaType::Image, "image/png", "a", "https://localhost:9/a.png", &limits, &f).await;
    let why = name.unwrap_err().reason;
    assert!(why.contains("refused address") && !why.contains("127.0.0.1"), "{why}");
}
