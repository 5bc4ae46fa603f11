//! HTTP requests counted by route template: the route table the server serves, and
//! the logger drain that counts Dropshot's "request completed" records (Dropshot has
//! no middleware; that record is the one place that sees every answer).

use super::get;
use std::sync::Arc;

/// The route templates the HTTP server serves (`/instances/{id}/manage`), to label its
/// answers by: the label's values are these and `unmatched`, never request input.
#[derive(Default)]
pub struct Routes {
    routes: Vec<Route>,
}

struct Route {
    template: String,
    segments: Vec<Segment>,
}

enum Segment {
    Literal(String),
    /// `{name}`: any one segment.
    Variable,
    /// `{name:.*}`: the rest of the path.
    Rest,
}

impl Routes {
    /// From each route's template, as the router lists it.
    pub fn new<'a>(templates: impl IntoIterator<Item = &'a str>) -> Routes {
        let mut routes: Vec<Route> = Vec::new();
        for template in templates {
            if routes.iter().any(|r| r.template == template) {
                continue;
            }
            let segments = split(template)
                .map(|s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(var) if var.ends_with(":.*") => Segment::Rest,
                    Some(_) => Segment::Variable,
                    None => Segment::Literal(s.to_string()),
                })
                .collect();
            routes.push(Route { template: template.to_string(), segments });
        }
        Routes { routes }
    }

    /// Every template.
    pub fn templates(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|r| r.template.as_str())
    }

    /// The template a request URI (origin or absolute form, with or without a query)
    /// falls under, or `unmatched`. Segments are compared percent-decoded and empty
    /// ones skipped, as the router does. At most one template matches: the router
    /// refuses a literal and a variable at the same place.
    pub fn label(&self, uri: &str) -> &str {
        let Ok(uri) = uri.parse::<http::Uri>() else { return UNMATCHED };
        let segments: Vec<std::borrow::Cow<'_, str>> =
            split(uri.path()).map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy()).collect();
        self.routes
            .iter()
            .find(|route| matches(&route.segments, &segments))
            .map_or(UNMATCHED, |route| route.template.as_str())
    }
}

/// The `route` label of a request that no template matches.
pub const UNMATCHED: &str = "unmatched";

fn split(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

fn matches(route: &[Segment], path: &[std::borrow::Cow<'_, str>]) -> bool {
    let mut path = path.iter();
    for segment in route {
        match segment {
            Segment::Rest => return true,
            Segment::Variable => {
                if path.next().is_none() {
                    return false;
                }
            }
            Segment::Literal(literal) => {
                if path.next().is_none_or(|s| s != literal) {
                    return false;
                }
            }
        }
    }
    path.next().is_none()
}

/// The HTTP server's logger: counts Dropshot's "request completed" records (see the
/// module docs) by route template, then passes every record on to `next`, except the
/// completion of a request to a `quiet` route answered below 500, whose handler writes
/// the request's one line itself (with its decision).
pub struct HttpDrain<D> {
    routes: Arc<Routes>,
    /// `(method, route)` pairs whose handler logs the request's line.
    quiet: Vec<(&'static str, &'static str)>,
    next: D,
}

impl<D> HttpDrain<D> {
    pub fn new(routes: Arc<Routes>, quiet: Vec<(&'static str, &'static str)>, next: D) -> HttpDrain<D> {
        HttpDrain { routes, quiet, next }
    }
}

impl<D: slog::Drain> slog::Drain for HttpDrain<D> {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        if record.msg().as_str() == Some("request completed") {
            let mut fields = Fields::default();
            let _ = slog::KV::serialize(&record.kv(), record, &mut fields);
            let _ = slog::KV::serialize(values, record, &mut fields);
            if let (Some(status), Some(uri)) = (fields.status, &fields.uri) {
                let route = self.routes.label(uri);
                let m = get();
                m.http_requests.with_label_values(&[route, &status.to_string()]).inc();
                if let Some(us) = fields.latency_us {
                    m.http_duration.with_label_values(&[route]).observe(us as f64 / 1e6);
                }
                let method = fields.method.as_deref().unwrap_or("");
                if status < 500 && self.quiet.iter().any(|(m, r)| *m == method && *r == route) {
                    return Ok(());
                }
            }
        }
        let _ = self.next.log(record, values);
        Ok(())
    }
}

#[derive(Default)]
struct Fields {
    status: Option<u16>,
    uri: Option<String>,
    method: Option<String>,
    latency_us: Option<u64>,
}

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        self.emit_str(key, &val.to_string())
    }

    fn emit_u16(&mut self, key: slog::Key, val: u16) -> slog::Result {
        if key == "response_code" {
            self.status = Some(val);
        }
        Ok(())
    }

    fn emit_u64(&mut self, key: slog::Key, val: u64) -> slog::Result {
        if key == "latency_us" {
            self.latency_us = Some(val);
        }
        Ok(())
    }

    fn emit_u128(&mut self, key: slog::Key, val: u128) -> slog::Result {
        if key == "latency_us" {
            self.latency_us = Some(val as u64);
        }
        Ok(())
    }

    fn emit_str(&mut self, key: slog::Key, val: &str) -> slog::Result {
        if key == "uri" && self.uri.is_none() {
            self.uri = Some(val.to_string());
        } else if key == "method" && self.method.is_none() {
            self.method = Some(val.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Routes, UNMATCHED};

    #[test]
    fn a_request_is_labelled_by_its_template_or_unmatched() {
        let routes = Routes::new([
            "/api/send-message",
            "/integrations/pbx/webhook/{integration_id}",
            "/instances/{id}",
            "/instances/{id}/manage",
            "/assets/{path:.*}",
            "/",
        ]);
        assert_eq!(routes.label("/api/send-message"), "/api/send-message");
        assert_eq!(routes.label("/api/send-message?x=1"), "/api/send-message");
        assert_eq!(routes.label("/api/send%2Dmessage"), "/api/send-message", "decoded, as the router does");
        assert_eq!(routes.label("//api//send-message/"), "/api/send-message", "empty segments skipped");
        assert_eq!(routes.label("http://gw.example/api/send-message"), "/api/send-message", "absolute form");
        assert_eq!(
            routes.label("/integrations/pbx/webhook/pbx_3f2a9c?x=1"),
            "/integrations/pbx/webhook/{integration_id}"
        );
        assert_eq!(routes.label("/instances/anything-at-all/manage"), "/instances/{id}/manage");
        assert_eq!(routes.label("/instances/x"), "/instances/{id}");
        assert_eq!(routes.label("/assets/a/b/c.css"), "/assets/{path:.*}");
        assert_eq!(routes.label("/"), "/");
        for made_up in ["/no/such/thing", "/instances/x/y/z", "/api", "/api/send-messages", "/integrations/pbx/webhook"]
        {
            assert_eq!(routes.label(made_up), UNMATCHED, "{made_up}");
        }
        assert_eq!(Routes::default().label("/api/send-message"), UNMATCHED);
    }
}
