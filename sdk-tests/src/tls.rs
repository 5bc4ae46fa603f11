//! Certificates a test makes for itself: self-signed, for `localhost` and 127.0.0.1.

use std::path::{Path, PathBuf};

/// A certificate and its key, written as PEM files.
pub struct TestCert {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The certificate, PEM (what a client trusts).
    pub pem: String,
}

/// Writes a new self-signed certificate for `localhost` and 127.0.0.1 to
/// `dir/{name}.crt` and `dir/{name}.key`.
pub fn self_signed(dir: &Path, name: &str) -> TestCert {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("a certificate");
    let pem = cert.pem();
    let (cert_file, key_file) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_file, &pem).unwrap();
    std::fs::write(&key_file, signing_key.serialize_pem()).unwrap();
    TestCert { cert_file, key_file, pem }
}

/// Puts `cert`'s files in place of `at`'s (as an operator renewing it would).
pub fn replace(at: &TestCert, cert: &TestCert) {
    std::fs::copy(&cert.cert_file, &at.cert_file).unwrap();
    std::fs::copy(&cert.key_file, &at.key_file).unwrap();
}
