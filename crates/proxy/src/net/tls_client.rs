//! TLS towards backends (mode http): the client side of an upstream
//! connection, with rustls (the `ring` provider, TLS 1.2 and 1.3).
//!
//! One [`ClientConfig`] is made from the trusted CAs and shared by every
//! connection it is used for: rustls keeps its session cache in the config,
//! so a new connection to a backend resumes the last session instead of a
//! full handshake. The connection offers ALPN `http/1.1`, what the pool
//! speaks. A handshake that fails is an [`io::Error`] that
//! [`is_handshake_failure`] tells from a failed TCP connect, so it can be
//! counted as a connect failure of its own kind.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Why a client config could not be made from a CA file's contents.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CaError {
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("is not valid PEM: {0}")]
    BadPem(String),
    #[error("holds a certificate rustls cannot use as a root: {0}")]
    BadRoot(String),
}

/// A client config trusting the CA certificates in `ca_pem` (one or more
/// PEM `CERTIFICATE` blocks), offering ALPN `http/1.1`.
pub(crate) fn client_config(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, CaError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| CaError::BadPem(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| CaError::BadRoot(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(CaError::NoCertificate);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CaError::BadRoot(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The name a backend's certificate is checked against: `name` if given
/// (a DNS name, or an IP address written as text), else the backend's IP.
pub(crate) fn server_name(name: Option<&str>, ip: IpAddr) -> Result<ServerName<'static>, String> {
    match name {
        Some(name) => ServerName::try_from(name.to_string())
            .map_err(|_| format!("{name:?} is neither a DNS name nor an IP address")),
        None => Ok(ServerName::IpAddress(ip.into())),
    }
}

/// A TLS handshake with a backend failed (bad certificate, no common
/// version, the backend spoke no TLS, ...).
#[derive(Debug)]
struct HandshakeFailed(io::Error);

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS handshake failed: {}", self.0)
    }
}

impl std::error::Error for HandshakeFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Whether `error` is a failed handshake rather than a failed connect.
pub(crate) fn is_handshake_failure(error: &io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<HandshakeFailed>())
}

/// How one backend is reached over TLS: the config shared by all of them,
/// and the name its certificate must carry.
#[derive(Debug, Clone)]
pub struct BackendTls {
    pub(crate) config: Arc<ClientConfig>,
    pub name: ServerName<'static>,
    /// The certificate is checked (`upstream_tls.verify`, default true).
    pub verify: bool,
}

/// Equal when they share one config and check one name: a config parsed
/// again makes a new one (and a new session cache).
impl PartialEq for BackendTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
            && self.name == other.name
            && self.verify == other.verify
    }
}

impl Eq for BackendTls {}

impl BackendTls {
    /// The TLS handshake on a connected `stream`, within `deadline`. A
    /// failure (a timeout too) is [`is_handshake_failure`].
    pub(crate) async fn handshake(
        &self,
        stream: TcpStream,
        deadline: Duration,
    ) -> io::Result<TlsStream<TcpStream>> {
        let connect =
            TlsConnector::from(Arc::clone(&self.config)).connect(self.name.clone(), stream);
        let failed = |e| io::Error::other(HandshakeFailed(e));
        match tokio::time::timeout(deadline, connect).await {
            Ok(done) => done.map_err(failed),
            Err(_) => Err(failed(io::ErrorKind::TimedOut.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::HandshakeKind;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    fn ca() -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    /// A TLS server on loopback with a certificate from `ca` for 127.0.0.1
    /// and `backend.test`, answering each connection's first byte with the
    /// ALPN protocol it agreed; it runs until the test ends.
    async fn server(ca: &CertifiedIssuer<'static, KeyPair>) -> std::net::SocketAddr {
        let params = CertificateParams::new(vec!["127.0.0.1".into(), "backend.test".into()]);
        let key = KeyPair::generate().unwrap();
        let cert = params.unwrap().signed_by(&key, ca).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut byte = [0u8; 1];
                    if tls.read_exact(&mut byte).await.is_ok() {
                        let alpn = tls.get_ref().1.alpn_protocol().unwrap_or(b"none").to_vec();
                        let _ = tls.write_all(&alpn).await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        addr
    }

    /// A handshake to `addr` as `name`, one byte sent, the answer read.
    async fn exchange(
        config: &Arc<ClientConfig>,
        addr: std::net::SocketAddr,
        name: Option<&str>,
    ) -> io::Result<(Vec<u8>, Option<HandshakeKind>)> {
        let stream = TcpStream::connect(addr).await?;
        let tls = BackendTls {
            config: Arc::clone(config),
            name: server_name(name, addr.ip()).unwrap(),
            verify: true,
        };
        let mut tls = tls.handshake(stream, Duration::from_secs(10)).await?;
        let kind = tls.get_ref().1.handshake_kind();
        tls.write_all(b"x").await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok((answer, kind))
    }

    #[tokio::test]
    async fn a_backend_with_a_certificate_from_the_ca_is_trusted_and_resumed() {
        let ca = ca();
        let addr = server(&ca).await;
        let config = client_config(ca.pem().as_bytes()).unwrap();
        let (answer, kind) = exchange(&config, addr, None).await.unwrap();
        assert_eq!(answer, b"http/1.1");
        assert_eq!(kind, Some(HandshakeKind::Full));
        // The shared config's session cache resumes the next connection.
        let (_, kind) = exchange(&config, addr, None).await.unwrap();
        assert_eq!(kind, Some(HandshakeKind::Resumed));
        let (answer, _) = exchange(&config, addr, Some("backend.test")).await.unwrap();
        assert_eq!(answer, b"http/1.1");
    }

    #[tokio::test]
    async fn another_ca_or_name_fails_the_handshake_and_says_so() {
        let addr = server(&ca()).await;
        let stranger = client_config(ca().pem().as_bytes()).unwrap();
        let e = exchange(&stranger, addr, None).await.unwrap_err();
        assert!(is_handshake_failure(&e), "{e}");
        assert!(e.to_string().starts_with("TLS handshake failed"), "{e}");
        let ca = ca();
        let addr = server(&ca).await;
        let config = client_config(ca.pem().as_bytes()).unwrap();
        let e = exchange(&config, addr, Some("other.test"))
            .await
            .unwrap_err();
        assert!(is_handshake_failure(&e), "{e}");
        // A refused connect is not a handshake failure.
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(!is_handshake_failure(&refused));
    }

    #[tokio::test]
    async fn verify_false_takes_a_certificate_from_any_ca_under_any_name() {
        let addr = server(&ca()).await;
        let config = crate::net::tls_unverified::unverified_config().unwrap();
        let (answer, _) = exchange(&config, addr, Some("other.test")).await.unwrap();
        assert_eq!(answer, b"http/1.1");
    }

    #[test]
    fn a_ca_file_must_hold_a_usable_certificate() {
        assert_eq!(client_config(b"").unwrap_err(), CaError::NoCertificate);
        assert_eq!(
            client_config(b"not pem at all").unwrap_err(),
            CaError::NoCertificate
        );
        let bad = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(client_config(bad), Err(CaError::BadRoot(_))));
        assert!(server_name(Some("bad name!"), [127, 0, 0, 1].into()).is_err());
    }
}
