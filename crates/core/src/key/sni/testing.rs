//! ClientHellos for tests, written by a real TLS client (rustls): for this
//! crate's tests, and with the feature `testing` for the proxy's.

use std::sync::Arc;

use super::RECORD_HEADER;

/// The first flight of a rustls client asking for `name`: a ClientHello
/// in one record. An IP address as `name` sends no server name.
pub fn client_hello(name: &str) -> Vec<u8> {
    client_hello_in(name, None)
}

/// [`client_hello`] with rustls's `max_fragment_size`.
pub fn client_hello_in(name: &str, fragment: Option<usize>) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.max_fragment_size = fragment;
    let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut client = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut flight = Vec::new();
    client.write_tls(&mut flight).unwrap();
    flight
}

/// `hello` (one handshake record) sent again in records of at most `size`
/// bytes of payload each.
pub fn in_records(hello: &[u8], size: usize) -> Vec<u8> {
    let payload = &hello[RECORD_HEADER..];
    let mut out = Vec::new();
    for part in payload.chunks(size) {
        out.extend_from_slice(&[0x16, 0x03, 0x01]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}
