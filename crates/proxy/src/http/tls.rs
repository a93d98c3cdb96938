//! TLS termination on mode http listeners: the handshake, done in the
//! connection's task after the PROXY intake and before hyper takes the
//! stream, and the certificate each handshake presents.
//!
//! A listener's rustls `ServerConfig` is made once, at start (TLS 1.2 and
//! 1.3, rustls's default cipher suites with the ring provider, ALPN `h2`
//! and `http/1.1`). Its certificates are not in it: [`SnapshotCertificates`]
//! reads them from the published snapshot at every handshake, so a reload
//! (a changed config, or a renewed certificate file) gives new handshakes
//! the new certificate while open connections keep their session.
//!
//! The handshake must be done by `http.first_byte_timeout` from the
//! connection's start; each one is counted by how it ended
//! (`magpie_tls_handshakes_total`), and failures are logged at most once a
//! second.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, ProtocolVersion, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use crate::net::Client;
use crate::routing::instance::Instance;
use crate::telemetry::stats::Stats;
use crate::telemetry::stats::{Handshake, TlsVersion};
use crate::telemetry::throttle::Throttle;

/// ALPN protocols offered, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Reads a listener's certificates from the snapshot published now.
struct SnapshotCertificates {
    instance: Arc<Instance>,
    /// The listener's position in `listen`.
    listener: usize,
}

impl fmt::Debug for SnapshotCertificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotCertificates")
            .field("listener", &self.listener)
            .finish()
    }
}

impl ResolvesServerCert for SnapshotCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let snapshot = self.instance.snapshot.load();
        let tls = snapshot.config.tls.get(self.listener)?.as_ref()?;
        tls.choose(hello.server_name()).map(|c| Arc::clone(&c.key))
    }
}

/// One acceptor per `listen` address, in order: `None` for cleartext.
pub(crate) fn acceptors(
    instance: &Arc<Instance>,
) -> Result<Vec<Option<TlsAcceptor>>, rustls::Error> {
    let config = Arc::clone(&instance.snapshot.load().config);
    let mut out = Vec::with_capacity(config.listen.len());
    for (listener, tls) in config.tls.iter().enumerate() {
        let acceptor = match tls {
            None => None,
            Some(_) => Some(acceptor(Arc::clone(instance), listener)?),
        };
        out.push(acceptor);
    }
    Ok(out)
}

fn acceptor(instance: Arc<Instance>, listener: usize) -> Result<TlsAcceptor, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SnapshotCertificates { instance, listener }));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Whether the client chose HTTP/2 by ALPN (without ALPN: HTTP/1.1).
pub(crate) fn chose_h2<S>(stream: &TlsStream<S>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(ALPN[0])
}

/// The TLS handshake on `io`, finished by `deadline`; counted either way,
/// a failure logged at most once a second.
pub(crate) async fn handshake<S>(
    acceptor: &TlsAcceptor,
    io: S,
    deadline: Instant,
    stats: &Stats,
    client: Client,
) -> Option<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    static FAILED_LOG: Throttle = Throttle::new(Duration::from_secs(1));
    let (how, error) = match tokio::time::timeout_at(deadline, acceptor.accept(io)).await {
        Ok(Ok(stream)) => {
            let version = match stream.get_ref().1.protocol_version() {
                Some(ProtocolVersion::TLSv1_2) => TlsVersion::Tls12,
                _ => TlsVersion::Tls13,
            };
            stats.count_tls_handshake(Ok(version));
            return Some(stream);
        }
        Ok(Err(e)) => (failure(&e), e.to_string()),
        Err(_) => (
            Handshake::Timeout,
            "no handshake by http.first_byte_timeout".to_string(),
        ),
    };
    stats.count_tls_handshake(Err(how));
    if let Some(held_back) = FAILED_LOG.allow() {
        debug!(%client, how = how.as_str(), %error, held_back, "TLS handshake failed");
    }
    None
}

/// What a failed handshake's error says about how it failed.
fn failure(e: &io::Error) -> Handshake {
    if let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        return match tls {
            rustls::Error::PeerIncompatible(_) => Handshake::NoSharedCipher,
            rustls::Error::AlertReceived(alert) => alert_failure(*alert),
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. }
            | rustls::Error::PeerMisbehaved(_)
            | rustls::Error::DecryptError => Handshake::Protocol,
            _ => Handshake::Other,
        };
    }
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Handshake::Closed,
        _ => Handshake::Other,
    }
}

/// A fatal alert from the client, by what it is about.
fn alert_failure(alert: AlertDescription) -> Handshake {
    match alert {
        AlertDescription::BadCertificate
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateRevoked
        | AlertDescription::CertificateExpired
        | AlertDescription::CertificateUnknown
        | AlertDescription::UnknownCA
        | AlertDescription::BadCertificateStatusResponse => Handshake::BadCertificate,
        AlertDescription::HandshakeFailure
        | AlertDescription::ProtocolVersion
        | AlertDescription::InsufficientSecurity => Handshake::NoSharedCipher,
        AlertDescription::DecodeError
        | AlertDescription::IllegalParameter
        | AlertDescription::UnexpectedMessage => Handshake::Protocol,
        _ => Handshake::Other,
    }
}
