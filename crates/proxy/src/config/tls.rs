//! TLS on a listener (`mode: http`): the certificates it presents, loaded
//! from their PEM files together with the config, and the choice among them
//! by the server name a client asks for (SNI).
//!
//! Loading belongs to validation: a certificate that cannot be read, does
//! not parse, has expired or does not match its key makes the whole config
//! invalid, with the file named, so a reload that meets one keeps the
//! running snapshot (and its certificates). The loaded key is rustls's
//! [`CertifiedKey`] (ring provider); names and expiry are read with the
//! crate `x509-parser` for `check`, SNI and the expiry metric.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_parser::extensions::GeneralName;

use super::file;
use magpie_core::hash::h64;

/// The most certificates one listener may have (`tls.certificates`).
pub const MAX_CERTIFICATES: usize = 100;
/// `check` warns about a certificate that expires within this.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// One certificate chain with its key, as loaded.
#[derive(Clone)]
pub struct Certificate {
    /// The PEM chain (leaf first), as the config names it, made relative to
    /// the config file's directory.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The leaf's DNS and IP subject alternative names, lower case (its
    /// subject's common name when it has none); `*.` names match one label.
    pub names: Vec<String>,
    /// The leaf's notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
    pub key: Arc<CertifiedKey>,
    /// `h64` of both files' bytes: a reload compares it to tell a changed
    /// file from an untouched one.
    pub content_hash: u64,
}

impl PartialEq for Certificate {
    fn eq(&self, other: &Certificate) -> bool {
        self.cert_file == other.cert_file
            && self.key_file == other.key_file
            && self.content_hash == other.content_hash
    }
}

impl fmt::Debug for Certificate {
    // Not the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("names", &self.names)
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl Certificate {
    /// Whether the certificate is for `server_name` (a DNS name from SNI).
    pub fn matches(&self, server_name: &str) -> bool {
        let name = server_name.trim_end_matches('.').to_ascii_lowercase();
        self.names.iter().any(|n| name_matches(n, &name))
    }

    /// When it expires, as RFC 3339 text.
    pub fn expiry_text(&self) -> String {
        timestamp_text(self.not_after)
    }
}

/// A listener's certificates: the first is the default, for a client that
/// names no server or one no certificate is for.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    pub certificates: Vec<Certificate>,
}

impl ListenerTls {
    /// The certificate for a client that asked for `server_name`.
    pub fn choose(&self, server_name: Option<&str>) -> Option<&Certificate> {
        server_name
            .and_then(|n| self.certificates.iter().find(|c| c.matches(n)))
            .or_else(|| self.certificates.first())
    }
}

/// `pattern` (a certificate's name) covers `name`: equal, or `*.rest`
/// where `name` is one non-empty label before `rest`.
fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == name,
    }
}

/// A certificate or key file that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} file {}: {problem}", file.display())]
pub struct LoadError {
    pub what: &'static str,
    pub file: PathBuf,
    pub problem: String,
}

fn error(what: &'static str, file: &Path, problem: impl Into<String>) -> LoadError {
    LoadError {
        what,
        file: file.to_path_buf(),
        problem: problem.into(),
    }
}

/// Seconds since the Unix epoch, now.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `at` (seconds since the Unix epoch) as RFC 3339 text.
pub fn timestamp_text(at: i64) -> String {
    let secs = u64::try_from(at).unwrap_or(0);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// Loads the chain in `cert_file` and the key in `key_file`; an expired
/// chain (at `now`), a key that is not the leaf's, or a file that is not
/// PEM is an error naming the file.
pub fn load(cert_file: &Path, key_file: &Path, now: i64) -> Result<Certificate, LoadError> {
    let cert_pem =
        file::read_pem(cert_file).map_err(|e| error("certificate", cert_file, e.to_string()))?;
    let key_pem = file::read_pem(key_file).map_err(|e| error("key", key_file, e.to_string()))?;
    let content_hash = pem_hash(&cert_pem, &key_pem);
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error("certificate", cert_file, format!("is not PEM ({e})")))?;
    let Some(leaf) = chain.first() else {
        return Err(error(
            "certificate",
            cert_file,
            "holds no PEM CERTIFICATE block",
        ));
    };
    let (names, not_after) = describe(leaf)
        .map_err(|e| error("certificate", cert_file, format!("is not X.509 ({e})")))?;
    if not_after <= now {
        let when = timestamp_text(not_after);
        return Err(error(
            "certificate",
            cert_file,
            format!("expired at {when}"),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
        error(
            "key",
            key_file,
            format!("holds no PEM private key (PKCS#8, RSA or EC): {e}"),
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let key = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => error(
            "key",
            key_file,
            format!(
                "is not the key of the certificate in {}",
                cert_file.display()
            ),
        ),
        other => error("key", key_file, format!("cannot be used: {other}")),
    })?;
    Ok(Certificate {
        cert_file: cert_file.to_path_buf(),
        key_file: key_file.to_path_buf(),
        names,
        not_after,
        key: Arc::new(key),
        content_hash,
    })
}

/// The leaf's names (SANs, else its common name) and notAfter.
fn describe(leaf: &CertificateDer<'_>) -> Result<(Vec<String>, i64), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push(dns.to_ascii_lowercase()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    names.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    if names.is_empty() {
        let cn = cert.subject().iter_common_name().next();
        names.extend(
            cn.and_then(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok((names, cert.validity().not_after.timestamp()))
}

fn pem_hash(cert: &str, key: &str) -> u64 {
    let mut bytes = Vec::with_capacity(cert.len() + key.len() + 1);
    bytes.extend_from_slice(cert.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(key.as_bytes());
    h64(&bytes)
}

/// The [`Certificate::content_hash`] the two files would have now (0 if
/// either cannot be read: a reload then tries them and says why).
pub fn files_hash(cert_file: &Path, key_file: &Path) -> u64 {
    match (file::read_pem(cert_file), file::read_pem(key_file)) {
        (Ok(cert), Ok(key)) => pem_hash(&cert, &key),
        _ => 0,
    }
}

/// What a reload compares to tell a change: the config text's hash, and
/// with certificates, theirs too (the text's hash alone without).
pub fn content_hash(text: &str, certificates: impl Iterator<Item = u64>) -> u64 {
    let text_hash = h64(text.as_bytes());
    let mut bytes = text_hash.to_be_bytes().to_vec();
    for hash in certificates {
        bytes.extend_from_slice(&hash.to_be_bytes());
    }
    if bytes.len() == 8 {
        text_hash
    } else {
        h64(&bytes)
    }
}

impl super::Config {
    /// Every listener's certificates, listener by listener.
    pub fn certificates(&self) -> impl Iterator<Item = &Certificate> {
        self.tls.iter().flatten().flat_map(|t| &t.certificates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_covers_one_label() {
        assert!(name_matches("*.example.com", "a.example.com"));
        assert!(!name_matches("*.example.com", "example.com"));
        assert!(!name_matches("*.example.com", "a.b.example.com"));
        assert!(!name_matches("*.example.com", ".example.com"));
        assert!(name_matches("example.com", "example.com"));
        assert!(!name_matches("example.com", "www.example.com"));
    }

    #[test]
    fn no_certificates_hash_as_the_text_alone() {
        assert_eq!(content_hash("x", std::iter::empty()), h64(b"x"));
        assert_ne!(
            content_hash("x", [1].into_iter()),
            content_hash("x", [2].into_iter())
        );
    }
}
