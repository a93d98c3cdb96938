//! For the TLS tests: a test CA made with the crate `rcgen`, the leaf
//! certificates it signs (written to files magpie loads), and a rustls
//! client that trusts it, with HTTP/1.1 or HTTP/2 on top.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    date_time_ymd,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::within;

/// A CA for one test.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
}

/// A leaf certificate and its key, in PEM, and the leaf in DER (to tell
/// which certificate a handshake presented).
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own: a client that trusts another test CA then
        // finds no issuer (unknown_ca), not a bad signature.
        static CAS: AtomicU64 = AtomicU64::new(0);
        let name = format!("magpie test CA {}", CAS.fetch_add(1, Ordering::Relaxed));
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("the CA certificate");
        TestCa {
            issuer: Issuer::new(params, key),
            der: cert.der().clone(),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), valid for
    /// centuries.
    pub fn issue(&self, names: &[&str]) -> Issued {
        self.issue_with(names, |_| {})
    }

    /// A certificate for `names` that expired in 2020.
    pub fn issue_expired(&self, names: &[&str]) -> Issued {
        self.issue_with(names, |p| {
            p.not_before = date_time_ymd(2019, 1, 1);
            p.not_after = date_time_ymd(2020, 1, 1);
        })
    }

    fn issue_with(&self, names: &[&str], edit: impl FnOnce(&mut CertificateParams)) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "magpie test leaf");
        edit(&mut params);
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A client that trusts this CA and offers `alpn` (none if empty).
    pub fn connector(&self, alpn: &[&str]) -> TlsConnector {
        self.connector_for(alpn, rustls::DEFAULT_VERSIONS)
    }

    /// [`TestCa::connector`] offering only `versions`.
    pub fn connector_for(
        &self,
        alpn: &[&str],
        versions: &[&'static SupportedProtocolVersion],
    ) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots.add(self.der.clone()).expect("the CA is a root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .expect("the versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

impl Issued {
    /// Writes `NAME.pem` and `NAME.key` into `dir`, each replaced at once
    /// (written aside, then renamed over), as a certificate manager does.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        replace(&key, &self.key_pem);
        replace(&cert, &self.cert_pem);
        (cert, key)
    }
}

/// Writes `text` to `path` by a rename over it.
pub fn replace(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, text).unwrap_or_else(|e| panic!("write {}: {e}", aside.display()));
    std::fs::rename(&aside, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// A TLS connection to `to` asking for `server_name` (a DNS name is sent
/// as SNI; an IP address is not).
pub async fn try_tls_connect(
    to: SocketAddr,
    connector: &TlsConnector,
    server_name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(server_name.to_string()).expect("a server name");
    within("a TLS handshake with magpie", async {
        let tcp = TcpStream::connect(to).await?;
        connector.connect(name, tcp).await
    })
    .await
}

/// [`try_tls_connect`], which must succeed.
pub async fn tls_connect(
    to: SocketAddr,
    connector: &TlsConnector,
    server_name: &str,
) -> TlsStream<TcpStream> {
    try_tls_connect(to, connector, server_name)
        .await
        .unwrap_or_else(|e| panic!("TLS handshake with {to} as {server_name}: {e}"))
}

/// The leaf certificate the server presented, in DER.
pub fn presented(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("a server certificate");
    certs[0].to_vec()
}

/// HTTP/1.1 over `stream`.
pub async fn h1_over(
    stream: TlsStream<TcpStream>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("an HTTP/1.1 handshake");
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("client connection: {e}");
        }
    });
    sender
}

/// HTTP/2 over `stream`.
pub async fn h2_over(
    stream: TlsStream<TcpStream>,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .expect("an HTTP/2 handshake");
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("client connection: {e}");
        }
    });
    sender
}
