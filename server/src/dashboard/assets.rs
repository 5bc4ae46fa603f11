//! The stylesheet and the one script, compiled into the binary and served as files so
//! that the Content-Security-Policy can forbid inline code.

use super::Ctx;
use dropshot::{Body, HttpError, endpoint};
use http::{HeaderValue, Response, header};

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

fn asset(body: &'static str, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// The dashboard's stylesheet.
#[endpoint { method = GET, path = "/assets/dashboard.css", unpublished = true }]
async fn css_get(_rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    Ok(asset(CSS, "text/css; charset=utf-8"))
}

/// The dashboard's script.
#[endpoint { method = GET, path = "/assets/dashboard.js", unpublished = true }]
async fn js_get(_rqctx: Ctx) -> Result<Response<Body>, HttpError> {
    Ok(asset(JS, "text/javascript; charset=utf-8"))
}

pub fn register(api: &mut dropshot::ApiDescription<std::sync::Arc<crate::state::AppState>>) -> Result<(), String> {
    api.register(css_get).map_err(|e| e.to_string())?;
    api.register(js_get).map_err(|e| e.to_string())?;
    Ok(())
}
