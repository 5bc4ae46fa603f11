//! Following one request across the load balancer, the replica, the provider and the
//! dashboard: the id Dropshot gives every request (logged as `req_id` on each of its
//! log lines and answered as `x-request-id`) and the caller's own `X-Correlation-Id`
//! (logged beside it as `hdr_x_correlation_id`) are kept in the message-log row, and the
//! request id is sent to the provider as `X-Request-Id`.

/// The caller's correlation header.
pub const CORRELATION_HEADER: &str = "x-correlation-id";

/// Longest correlation id kept; a longer or unprintable one is ignored.
const MAX_CORRELATION_LEN: usize = 128;

/// A request's ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub request_id: Option<String>,
    pub correlation_id: Option<String>,
}

impl Trace {
    /// The ids of a request: Dropshot's id and the caller's header, when it is 1 to 128
    /// printable ASCII characters.
    pub fn new(request_id: &str, headers: &http::HeaderMap) -> Trace {
        let correlation_id = headers
            .get(CORRELATION_HEADER)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty() && v.len() <= MAX_CORRELATION_LEN)
            .filter(|v| v.iter().all(|b| (0x20..0x7f).contains(b)))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        Trace { request_id: Some(request_id.to_string()), correlation_id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correlation_id_is_kept_only_when_short_and_printable() {
        let with = |v: &[u8]| {
            let mut headers = http::HeaderMap::new();
            headers.insert(CORRELATION_HEADER, http::HeaderValue::from_bytes(v).unwrap());
            Trace::new("req-1", &headers).correlation_id
        };
        assert_eq!(with(b"ticket-4711").as_deref(), Some("ticket-4711"));
        assert_eq!(with(&[b'a'; 128]).map(|s| s.len()), Some(128));
        assert_eq!(with(&[b'a'; 129]), None);
        assert_eq!(with(b"caf\xc3\xa9"), None);
        assert_eq!(with(b""), None);
        let none = Trace::new("req-2", &http::HeaderMap::new());
        assert_eq!((none.request_id.as_deref(), none.correlation_id), (Some("req-2"), None));
    }
}
