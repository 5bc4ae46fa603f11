//! `[tls]`: HTTPS on the public listener (the certificate and key files).

use serde::Deserialize;

/// HTTPS served by the gateway itself (rustls): both files set, or neither (plain
/// HTTP, e.g. behind a proxy that ends TLS). The certificate is read again on SIGHUP;
/// a pair that does not load is refused and the current one stays.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: Option<String>,
    /// PEM private key (PKCS #8, PKCS #1 or SEC1), unencrypted.
    pub key_file: Option<String>,
}

impl TlsSettings {
    /// The two files, when both are set (HTTPS); read and checked by
    /// [`crate::tls::TlsFiles::load`].
    pub fn files(&self) -> Option<crate::tls::TlsFiles> {
        let cert = self.cert_file.as_deref().filter(|f| !f.is_empty())?;
        let key = self.key_file.as_deref().filter(|f| !f.is_empty())?;
        Some(crate::tls::TlsFiles { cert: cert.into(), key: key.into() })
    }
}
