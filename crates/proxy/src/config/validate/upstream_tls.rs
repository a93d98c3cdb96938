//! Validation of TLS towards backends: `backends[].tls` and `upstream_tls`.
//!
//! Part of [`Validator`]. TLS to backends needs mode http (mode tcp copies
//! bytes, and a TLS client there talks to its backend itself). The CA file
//! is read and its client config made here, once per validated config, so
//! every connection it is used for shares one session cache. The name a
//! backend's certificate must carry is `upstream_tls.server_name`, else the
//! host its `addr` was written with, else its IP.

use std::sync::Arc;

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::raw::RawUpstreamTls;
use crate::config::{BackendConfig, Mode};
use crate::net::tls_client::{BackendTls, client_config, server_name};
use crate::net::tls_unverified::unverified_config;

impl Validator<'_> {
    /// Sets `tls` on the backends written with `tls: true` (`wanted`: their
    /// index and place).
    pub(super) fn upstream_tls(
        &mut self,
        raw: Option<Spanned<RawUpstreamTls>>,
        mode: Mode,
        backends: &mut [BackendConfig],
        wanted: Vec<(usize, Location)>,
    ) {
        if mode != Mode::Http {
            let places = wanted.iter().map(|(_, at)| *at);
            for at in raw.iter().map(|r| r.referenced).chain(places) {
                self.err(&at, "TLS to backends needs mode: http (in mode tcp a TLS client talks to its backend itself, see key.from: sni; in mode udp QUIC carries its own)");
            }
            return;
        }
        let Some(raw) = raw else {
            if let Some((_, at)) = wanted.first() {
                self.err(at, "tls: true needs upstream_tls.ca: a PEM file of the CAs that sign the backends' certificates");
            }
            return;
        };
        if wanted.is_empty() {
            self.err(
                &raw.referenced,
                "upstream_tls is set but no backend has tls: true",
            );
            return;
        }
        let verify = raw.value.verify.as_ref().is_none_or(|v| v.value);
        let config = if verify {
            self.ca(raw.value.ca.as_ref(), &raw.referenced)
        } else {
            self.unverified(raw.value.ca.as_ref(), &raw.referenced)
        };
        let Some(config) = config else {
            return;
        };
        let written = raw.value.server_name.as_ref();
        for (i, at) in wanted {
            let backend = &mut backends[i];
            let name = match written {
                Some(n) => Some(n.value.trim().to_string()),
                None => host_of(&backend.addr_text),
            };
            match server_name(name.as_deref(), backend.addr.ip()) {
                Ok(name) => {
                    backend.tls = Some(BackendTls {
                        config: Arc::clone(&config),
                        name,
                        verify,
                    })
                }
                Err(e) => {
                    let at = written.map_or(at, |n| n.referenced);
                    self.err(&at, format!("upstream_tls.server_name {e}"));
                }
            }
        }
    }

    /// The client config of `verify: false`; a `ca` beside it would be
    /// read for nothing, so it is an error.
    fn unverified(
        &mut self,
        ca: Option<&Spanned<String>>,
        section: &Location,
    ) -> Option<Arc<rustls::ClientConfig>> {
        if let Some(ca) = ca {
            self.err(
                &ca.referenced,
                "upstream_tls.ca is unused with verify: false (no certificate is checked); remove one of them",
            );
            return None;
        }
        match unverified_config() {
            Ok(config) => Some(config),
            Err(e) => {
                self.err(section, format!("upstream_tls: {e}"));
                None
            }
        }
    }

    /// The client config from `upstream_tls.ca`, a path relative to the
    /// config file's directory.
    fn ca(
        &mut self,
        ca: Option<&Spanned<String>>,
        section: &Location,
    ) -> Option<Arc<rustls::ClientConfig>> {
        let Some(ca) = ca else {
            self.err(section, "upstream_tls.ca is missing: a PEM file of the CAs that sign the backends' certificates");
            return None;
        };
        let written = ca.value.trim();
        let path = self
            .file
            .parent()
            .map_or_else(|| written.into(), |dir| dir.join(written));
        let problem = match std::fs::read(&path) {
            Ok(pem) => match client_config(&pem) {
                Ok(config) => return Some(config),
                Err(e) => e.to_string(),
            },
            Err(e) => format!("cannot be read: {e}"),
        };
        self.err(
            &ca.referenced,
            format!("upstream_tls.ca {}: {problem}", path.display()),
        );
        None
    }
}

/// The host `addr` was written with, when it is a name (not an IP).
fn host_of(addr_text: &str) -> Option<String> {
    let (host, _) = addr_text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.parse::<std::net::IpAddr>().is_err() && !host.is_empty()).then(|| host.to_string())
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};

    fn config(mode: &str, section: &str, tls: bool) -> String {
        format!(
            "mode: {mode}\nlisten: 127.0.0.1:7000\n{section}backends:\n  - {{name: a, addr: 127.0.0.1:8001, tls: {tls}}}\n"
        )
    }

    #[test]
    fn tls_to_backends_needs_mode_http_and_a_readable_ca() {
        assert_eq!(
            problems(&config("tcp", "", true)),
            [
                "test.yaml:4:42: TLS to backends needs mode: http (in mode tcp a TLS client talks to its backend itself, see key.from: sni; in mode udp QUIC carries its own)"
            ]
        );
        assert_eq!(
            problems(&config("http", "", true)),
            [
                "test.yaml:4:42: tls: true needs upstream_tls.ca: a PEM file of the CAs that sign the backends' certificates"
            ]
        );
        let p = problems(&config(
            "http",
            "upstream_tls: {ca: /nonexistent/ca.pem}\n",
            true,
        ));
        assert_eq!(p.len(), 1);
        assert!(
            p[0].starts_with(
                "test.yaml:3:20: upstream_tls.ca /nonexistent/ca.pem: cannot be read:"
            ),
            "{p:?}"
        );
        assert_eq!(
            problems(&config("http", "upstream_tls: {ca: x.pem}\n", false)),
            ["test.yaml:3:15: upstream_tls is set but no backend has tls: true"]
        );
        // Off is the default, and written off is off.
        assert!(
            parse(&config("http", "", false)).unwrap().backends[0]
                .tls
                .is_none()
        );
    }

    #[test]
    fn verify_false_needs_no_ca_and_refuses_one() {
        let parsed = parse(&config("http", "upstream_tls: {verify: false}\n", true)).unwrap();
        let tls = parsed.backends[0].tls.as_ref().unwrap();
        assert!(!tls.verify);
        assert_eq!(
            problems(&config(
                "http",
                "upstream_tls: {verify: false, ca: x.pem}\n",
                true
            )),
            [
                "test.yaml:3:35: upstream_tls.ca is unused with verify: false (no certificate is checked); remove one of them"
            ]
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_named() {
        let dir = std::env::temp_dir().join(format!("magpie-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("empty.pem");
        std::fs::write(&file, "no certificates here\n").unwrap();
        let section = format!("upstream_tls: {{ca: {}}}\n", file.display());
        let p = problems(&config("http", &section, true));
        assert_eq!(
            p,
            [format!(
                "test.yaml:3:20: upstream_tls.ca {}: holds no PEM certificate",
                file.display()
            )]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
