//! The HTTPS certificate and key, read and checked here before Dropshot sees them.
//!
//! Dropshot's own loading (`ConfigTls::AsFile`, turned into a rustls `ServerConfig`
//! by its `TryFrom`) panics on a key that does not match the certificate or a
//! certificate rustls cannot parse (`.expect("bad certificate/key")`), and its
//! `refresh_tls` unwraps every other error too (a missing file, an empty key file, a
//! truncated PEM section): a renewal half written when `systemctl reload` ran would
//! stop the process. It also reads PKCS #8 keys only. So the gateway reads both files
//! itself, checks that the key is usable and is the certificate's, and hands Dropshot
//! a finished configuration (`ConfigTls::Dynamic`), which it takes as is.
//!
//! The errors name the file and the fault, never the contents.

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A certificate chain or a key file larger than this is not one.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Which of the two files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    Certificate,
    Key,
}

impl std::fmt::Display for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            File::Certificate => "certificate file",
            File::Key => "key file",
        })
    }
}

/// A certificate and key that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("HTTPS is not configured")]
    NotConfigured,
    #[error("TLS {file} {}: cannot read it: {error}", path.display())]
    Read { file: File, path: PathBuf, error: std::io::Error },
    #[error("TLS {file} {}: is empty", path.display())]
    Empty { file: File, path: PathBuf },
    #[error("TLS {file} {}: is larger than 1 MiB", path.display())]
    TooLarge { file: File, path: PathBuf },
    #[error("TLS {file} {}: is not valid PEM: {problem}", path.display())]
    Pem { file: File, path: PathBuf, problem: &'static str },
    #[error("TLS certificate file {}: holds no certificate (no PEM CERTIFICATE section)", path.display())]
    NoCertificate { path: PathBuf },
    #[error(
        "TLS key file {}: holds no private key (PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY; \
         an encrypted key is not supported)",
        path.display()
    )]
    NoKey { path: PathBuf },
    #[error("TLS key file {}: holds {count} private keys, not one", path.display())]
    SeveralKeys { path: PathBuf, count: usize },
    #[error("TLS certificate file {}: the first certificate cannot be used: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("TLS key file {}: the private key cannot be used: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error(
        "TLS key file {}: the private key does not match the certificate in {}",
        key.display(),
        cert.display()
    )]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS: checking the certificate and key failed unexpectedly")]
    Panicked,
    #[error("TLS: the HTTP server did not take the new certificate: {0}")]
    Refresh(String),
}

/// The two files the listener serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS #8, PKCS #1 or SEC1), unencrypted.
    pub key: PathBuf,
}

/// A checked pair, ready to serve.
pub struct Loaded {
    pub config: rustls::ServerConfig,
    /// SHA-256 of the server's certificate (DER), hex: which one is served, for the
    /// logs.
    pub sha256: String,
}

impl TlsFiles {
    /// Reads both files and checks them: one certificate chain, one private key the
    /// crypto provider can use, and that key is the first certificate's. Never panics.
    pub fn load(&self) -> Result<Loaded, TlsError> {
        let cert = read(File::Certificate, &self.cert)?;
        let key = read(File::Key, &self.key)?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
            .collect::<Result<_, _>>()
            .map_err(|e| pem_error(File::Certificate, &self.cert, e))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate { path: self.cert.clone() });
        }
        let mut keys: Vec<PrivateKeyDer<'static>> = PrivateKeyDer::pem_slice_iter(&key)
            .collect::<Result<_, _>>()
            .map_err(|e| pem_error(File::Key, &self.key, e))?;
        let key = match keys.len() {
            0 => return Err(TlsError::NoKey { path: self.key.clone() }),
            1 => keys.remove(0),
            count => return Err(TlsError::SeveralKeys { path: self.key.clone(), count }),
        };
        let sha256 = hex::encode(Sha256::digest(certs[0].as_ref()));
        let builder = rustls::ServerConfig::builder().with_no_client_auth();
        let signing_key = builder
            .crypto_provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::BadKey { path: self.key.clone(), reason: e.to_string() })?;
        let certified = CertifiedKey::new(certs, signing_key);
        match certified.keys_match() {
            // What rustls's own `with_single_cert` accepts: a key that cannot tell its
            // public half is not a mismatch.
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(TlsError::Mismatch { cert: self.cert.clone(), key: self.key.clone() });
            }
            Err(e) => return Err(TlsError::BadCertificate { path: self.cert.clone(), reason: e.to_string() }),
        }
        let resolver = rustls::sign::SingleCertAndKey::from(certified);
        let mut config = builder.with_cert_resolver(std::sync::Arc::new(resolver));
        // What Dropshot offers with files of its own.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Loaded { config, sha256 })
    }

    /// [`TlsFiles::load`] off the async threads, a panic turned into
    /// [`TlsError::Panicked`].
    pub async fn load_guarded(&self) -> Result<Loaded, TlsError> {
        let files = self.clone();
        tokio::task::spawn_blocking(move || files.load()).await.unwrap_or(Err(TlsError::Panicked))
    }
}

fn read(file: File, path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |error| TlsError::Read { file, path: path.to_path_buf(), error };
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(err)?.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(TlsError::TooLarge { file, path: path.to_path_buf() });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(TlsError::Empty { file, path: path.to_path_buf() });
    }
    Ok(bytes)
}

/// A PEM fault in words (the parser's own messages quote the file's lines).
fn pem_error(file: File, path: &Path, error: pem::Error) -> TlsError {
    let problem = match error {
        pem::Error::MissingSectionEnd { .. } => "a section has no END line (cut short or half written?)",
        pem::Error::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        pem::Error::Base64Decode(_) => "a section's base64 is corrupt",
        pem::Error::SectionTooLarge => "a section is too large",
        _ => "it cannot be read as PEM",
    };
    TlsError::Pem { file, path: path.to_path_buf(), problem }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    struct Pair {
        cert_pem: String,
        key_pem: String,
    }

    fn pair(alg: &'static rcgen::SignatureAlgorithm) -> Pair {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// Writes `cert` and `key` to files and loads them.
    fn load(cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Result<Loaded, TlsError> {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        files.load()
    }

    #[test]
    fn a_matching_pair_loads_with_h2_and_its_fingerprint() {
        for alg in [&rcgen::PKCS_ECDSA_P256_SHA256, &rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_ED25519] {
            let p = pair(alg);
            let loaded = load(&p.cert_pem, &p.key_pem).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
            assert_eq!(loaded.config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
            let der = CertificateDer::from_pem_slice(p.cert_pem.as_bytes()).unwrap();
            assert_eq!(loaded.sha256, hex::encode(Sha256::digest(der.as_ref())));
        }
        // A chain: the server's certificate first, then others.
        let (p, q) = (pair(&rcgen::PKCS_ECDSA_P256_SHA256), pair(&rcgen::PKCS_ECDSA_P256_SHA256));
        load(format!("{}{}", p.cert_pem, q.cert_pem), &p.key_pem).unwrap();
    }

    #[test]
    fn a_key_of_another_pair_is_a_mismatch_of_either_algorithm() {
        let ec = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let ec2 = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let p384 = pair(&rcgen::PKCS_ECDSA_P384_SHA384);
        let ed = pair(&rcgen::PKCS_ED25519);
        for (cert, key) in [(&ec, &ec2), (&ec, &p384), (&ec, &ed), (&ed, &ec)] {
            let e = load(&cert.cert_pem, &key.key_pem).err().expect("refused");
            assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
            assert!(e.to_string().contains("does not match the certificate in"), "{e}");
        }
        // The certificate's file holds a chain whose first is another's.
        let chain = format!("{}{}", ec2.cert_pem, ec.cert_pem);
        assert!(matches!(load(chain, &ec.key_pem), Err(TlsError::Mismatch { .. })));
    }

    #[test]
    fn half_written_empty_and_swapped_files_are_refused_by_name() {
        let p = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let cases: [(String, String, &str); 9] = [
            (p.cert_pem[..p.cert_pem.len() / 2].into(), p.key_pem.clone(), "certificate file"),
            (p.cert_pem.clone(), p.key_pem[..p.key_pem.len() / 2].into(), "key file"),
            (String::new(), p.key_pem.clone(), "certificate file"),
            (p.cert_pem.clone(), String::new(), "key file"),
            (p.cert_pem.clone(), " \n\n".into(), "key file"),
            (p.key_pem.clone(), p.key_pem.clone(), "certificate file"),
            (p.cert_pem.clone(), p.cert_pem.clone(), "key file"),
            (p.cert_pem.clone(), format!("{}{}", p.key_pem, p.key_pem), "key file"),
            (p.cert_pem.replace("MII", "M*I"), p.key_pem.clone(), "certificate file"),
        ];
        for (i, (cert, key, named)) in cases.iter().enumerate() {
            let e = load(cert, key).err().unwrap_or_else(|| panic!("case {i} loaded"));
            let message = e.to_string();
            assert!(message.starts_with(&format!("TLS {named} ")), "case {i}: {message}");
            let name = if *named == "key file" { "tls.key" } else { "tls.crt" };
            assert!(message.contains(name), "case {i}: {message}");
        }
        assert!(matches!(load(&p.cert_pem[..300], &p.key_pem), Err(TlsError::Pem { .. })));
        assert!(matches!(load(&p.cert_pem, ""), Err(TlsError::Empty { file: File::Key, .. })));
        assert!(matches!(load(&p.key_pem, &p.key_pem), Err(TlsError::NoCertificate { .. })));
        assert!(matches!(load(&p.cert_pem, &p.cert_pem), Err(TlsError::NoKey { .. })));
        let two = format!("{}{}", p.key_pem, p.key_pem);
        assert!(matches!(load(&p.cert_pem, two), Err(TlsError::SeveralKeys { count: 2, .. })));
    }

    #[test]
    fn a_well_formed_pem_with_garbage_inside_is_refused_not_a_panic() {
        let p = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let junk_cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(load(junk_cert, &p.key_pem), Err(TlsError::BadCertificate { .. })));
        let junk_key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(matches!(load(&p.cert_pem, junk_key), Err(TlsError::BadKey { .. })));
    }

    #[test]
    fn missing_and_oversized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles { cert: dir.path().join("none.crt"), key: dir.path().join("none.key") };
        let e = files.load().err().unwrap();
        assert!(matches!(e, TlsError::Read { file: File::Certificate, .. }), "{e}");
        assert!(e.to_string().contains("none.crt: cannot read it"), "{e}");
        let p = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let big = p.cert_pem.repeat((MAX_FILE_BYTES as usize / p.cert_pem.len()) + 1);
        assert!(matches!(load(big, &p.key_pem), Err(TlsError::TooLarge { file: File::Certificate, .. })));
    }

    #[test]
    fn no_error_quotes_the_key() {
        let p = pair(&rcgen::PKCS_ECDSA_P256_SHA256);
        let body: Vec<&str> = p.key_pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let broken = p.key_pem.replacen(body[1], &format!("{}!", body[1]), 1);
        for key in [broken, p.key_pem[..p.key_pem.len() - 30].to_string()] {
            let e = load(&p.cert_pem, &key).err().unwrap().to_string();
            for line in &body {
                assert!(!e.contains(line), "{e}");
            }
        }
    }

    /// `openssl` (a Debian tool scripts/test installs), run in `dir`.
    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// RSA keys, and keys in PKCS #1 and SEC1 form (which Dropshot's own loading does
    /// not read): accepted with their certificate, refused with another's.
    #[test]
    fn rsa_pkcs1_and_sec1_keys_load_and_an_rsa_key_does_not_match_an_ec_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let subj = ["-subj", "/CN=localhost", "-days", "2"];
        openssl(
            d,
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rsa8.key", "-out", "rsa.crt"]
                .iter()
                .chain(&subj)
                .copied()
                .collect::<Vec<_>>(),
        );
        openssl(d, &["rsa", "-in", "rsa8.key", "-traditional", "-out", "rsa1.key"]);
        openssl(d, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ec1.key"]);
        openssl(
            d,
            &["req", "-x509", "-new", "-key", "ec1.key", "-out", "ec.crt"]
                .iter()
                .chain(&subj)
                .copied()
                .collect::<Vec<_>>(),
        );
        let text = |name: &str| std::fs::read_to_string(d.join(name)).unwrap();
        assert!(text("rsa8.key").contains("BEGIN PRIVATE KEY"));
        assert!(text("rsa1.key").contains("BEGIN RSA PRIVATE KEY"));
        assert!(text("ec1.key").contains("BEGIN EC PRIVATE KEY"));
        let files = |cert: &str, key: &str| TlsFiles { cert: d.join(cert), key: d.join(key) };
        for (cert, key) in [("rsa.crt", "rsa8.key"), ("rsa.crt", "rsa1.key"), ("ec.crt", "ec1.key")] {
            files(cert, key).load().unwrap_or_else(|e| panic!("{cert} {key}: {e}"));
        }
        for (cert, key) in [("ec.crt", "rsa8.key"), ("ec.crt", "rsa1.key"), ("rsa.crt", "ec1.key")] {
            let e = files(cert, key).load().err().expect("refused");
            assert!(matches!(e, TlsError::Mismatch { .. }), "{cert} {key}: {e}");
        }
    }
}
