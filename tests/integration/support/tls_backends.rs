//! TLS behind magpie, for the SNI and upstream TLS tests: a test CA whose certificates rcgen makes, rustls
//! configs (ring provider) trusting it, TLS echo backends, and a client
//! stream that writes in small pieces.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::within;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate authority made for one test.
pub struct BackendCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl BackendCa {
    pub fn new(name: &str) -> BackendCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        BackendCa { issuer }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server config with a certificate for `names` (DNS names or IPs).
    pub fn server_config(&self, names: &[&str], alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = CertificateParams::new(names).expect("leaf params");
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a leaf certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("a server config");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A client config trusting this CA alone.
    pub fn client_config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.issuer.der().clone())
            .expect("the CA as a root");
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}

/// TLS backends that, once the handshake is done, write their name and a
/// newline, then echo. Each accepted connection is reported by name first,
/// handshake or not.
pub struct TlsEchoBackends {
    pub list: Vec<(String, SocketAddr)>,
    accepted: mpsc::UnboundedReceiver<String>,
}

impl TlsEchoBackends {
    pub async fn start(names: &[&str], config: Arc<rustls::ServerConfig>) -> TlsEchoBackends {
        let (report, accepted) = mpsc::unbounded_channel();
        let mut list = Vec::new();
        for &name in names {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a TLS backend");
            list.push((name.to_string(), listener.local_addr().expect("an address")));
            let acceptor = TlsAcceptor::from(Arc::clone(&config));
            let (name, report) = (name.to_string(), report.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let _ = report.send(name.clone());
                    tokio::spawn(echo(acceptor.clone(), stream, name.clone()));
                }
            });
        }
        TlsEchoBackends { list, accepted }
    }

    /// The backend that accepted the next connection.
    pub async fn next_accepted(&mut self) -> String {
        within("a TLS backend to accept", self.accepted.recv())
            .await
            .expect("the backends run")
    }
}

async fn echo(acceptor: TlsAcceptor, stream: TcpStream, name: String) {
    let Ok(mut tls) = acceptor.accept(stream).await else {
        return;
    };
    if tls.write_all(format!("{name}\n").as_bytes()).await.is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = tls.read(&mut buf).await {
        if tls.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// TLS over `stream` asking for `name` (its hello written `piece` bytes
/// at a time), and the name of the backend that answered.
pub async fn tls_hello(
    stream: TcpStream,
    name: &str,
    config: rustls::ClientConfig,
    piece: usize,
) -> (TlsStream<Pieces>, String) {
    stream.set_nodelay(true).expect("nodelay");
    let server = ServerName::try_from(name.to_string()).expect("a server name");
    let connector = TlsConnector::from(Arc::new(config));
    let mut tls = within(
        "the TLS handshake through magpie",
        connector.connect(server, Pieces { stream, piece }),
    )
    .await
    .unwrap_or_else(|e| panic!("TLS handshake for {name}: {e}"));
    let mut backend = Vec::new();
    loop {
        let byte = within("the backend's name", tls.read_u8())
            .await
            .expect("the backend's name");
        if byte == b'\n' {
            break;
        }
        backend.push(byte);
    }
    (tls, String::from_utf8(backend).expect("a name"))
}

/// A TCP stream whose writes take at most `piece` bytes each (with
/// `TCP_NODELAY`, each its own segment).
pub struct Pieces {
    pub stream: TcpStream,
    pub piece: usize,
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Pieces {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.piece);
        Pin::new(&mut self.stream).poll_write(cx, &buf[..n])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// An HTTP/1.1 backend over TLS: `GET /health` answers with the status the
/// test set (200 at start), anything else `backend: NAME`. It counts the
/// TCP connections it accepted and the TLS handshakes that completed.
pub struct TlsHttpBackend {
    pub name: String,
    pub addr: SocketAddr,
    pub accepted: std::sync::atomic::AtomicU64,
    pub handshakes: std::sync::atomic::AtomicU64,
    pub health: std::sync::atomic::AtomicU16,
}

impl TlsHttpBackend {
    pub async fn start(name: &str, config: Arc<rustls::ServerConfig>) -> Arc<TlsHttpBackend> {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a TLS HTTP backend");
        let backend = Arc::new(TlsHttpBackend {
            name: name.to_string(),
            addr: listener.local_addr().expect("an address"),
            accepted: Default::default(),
            handshakes: Default::default(),
            health: std::sync::atomic::AtomicU16::new(200),
        });
        let acceptor = TlsAcceptor::from(config);
        let b = Arc::clone(&backend);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                b.accepted.fetch_add(1, Ordering::SeqCst);
                let (acceptor, b) = (acceptor.clone(), Arc::clone(&b));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    b.handshakes.fetch_add(1, Ordering::SeqCst);
                    let service = hyper::service::service_fn(move |req| {
                        let b = Arc::clone(&b);
                        async move { Ok::<_, std::convert::Infallible>(b.answer(&req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        backend
    }

    fn answer<B>(
        &self,
        req: &hyper::Request<B>,
    ) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
        use std::sync::atomic::Ordering;
        let (status, body) = if req.uri().path() == "/health" {
            (self.health.load(Ordering::SeqCst), "health\n".to_string())
        } else {
            (200, format!("backend: {}\n", self.name))
        };
        hyper::Response::builder()
            .status(status)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .expect("a response")
    }

    pub fn pair(&self) -> (String, SocketAddr) {
        (self.name.clone(), self.addr)
    }
}
