//! The TLS families' readers: handshakes by how they ended, and when each
//! certificate a listener presents expires (read from the published
//! snapshot, so a renewed certificate shows at once).

use super::series::{Scrape, Series};
use crate::telemetry::stats::{Handshake, TlsVersion};

/// `magpie_tls_handshakes_total`: finished ones by version, failed ones by
/// how (with an empty version).
pub(super) fn handshakes(g: &Scrape<'_>, s: &mut Series<'_>) {
    for &version in &TlsVersion::ALL {
        let ok = g.stats.tls_handshakes_ok(version);
        s.value(&[Handshake::Ok.as_str(), version.as_str()], ok as f64);
    }
    for &how in &Handshake::ALL[1..] {
        let failed = g.stats.tls_handshakes_failed(how);
        s.value(&[how.as_str(), ""], failed as f64);
    }
}

/// `magpie_tls_certificate_expiry_timestamp_seconds`, one series per
/// listener and certificate.
pub(super) fn expiry(g: &Scrape<'_>, s: &mut Series<'_>) {
    let config = &g.snapshot.config;
    for (addr, tls) in config.listen.iter().zip(&config.tls) {
        let listener = addr.to_string();
        for c in tls.iter().flat_map(|t| &t.certificates) {
            let file = c.cert_file.display().to_string();
            let name = c.names.first().map_or("", String::as_str);
            s.value(&[&listener, &file, name], c.not_after as f64);
        }
    }
}
