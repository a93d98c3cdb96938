//! A `listen` entry's `tls`: only in mode http, one `{cert, key}` pair or a
//! `certificates` list of them, each loaded from its files (relative to the
//! config file's directory) by [`crate::config::tls::load`]; a file that
//! cannot be used is an error at the line that names it.

use std::path::{Path, PathBuf};

use serde_saphyr::Spanned;

use super::Validator;
use crate::config::Mode;
use crate::config::raw_listen::{ListenItem, RawTls};
use crate::config::tls::{self, ListenerTls, MAX_CERTIFICATES};

const TLS_FORMS: &str =
    "write tls: {cert: FILE, key: FILE} or tls: {certificates: [{cert: FILE, key: FILE}, ...]}";

/// A `listen` entry as its address and its `tls`, if any.
pub(super) fn split_item(item: Spanned<ListenItem>) -> (Spanned<String>, Option<Spanned<RawTls>>) {
    match item.value {
        ListenItem::Addr(addr) => (
            Spanned {
                value: addr,
                referenced: item.referenced,
                defined: item.defined,
            },
            None,
        ),
        ListenItem::Object(listener) => {
            let listener = *listener;
            (listener.addr, listener.tls)
        }
    }
}

impl Validator<'_> {
    /// The certificates of a listener's `tls`, loaded; `None` after an
    /// error (recorded).
    pub(super) fn listener_tls(&mut self, raw: Spanned<RawTls>, mode: Mode) -> Option<ListenerTls> {
        if mode != Mode::Http {
            self.err(
                &raw.referenced,
                "tls needs mode: http (mode tcp passes TLS through to the backends unchanged)",
            );
            return None;
        }
        let pairs = self.tls_pairs(raw)?;
        let now = tls::now();
        let mut certificates = Vec::new();
        for (cert, key) in &pairs {
            let (cert_file, key_file) = (self.relative(&cert.value), self.relative(&key.value));
            match tls::load(&cert_file, &key_file, now) {
                Ok(loaded) => certificates.push(loaded),
                Err(e) => {
                    let at = if e.what == "key" {
                        key.referenced
                    } else {
                        cert.referenced
                    };
                    self.err(&at, format!("tls: {e}"));
                }
            }
        }
        (certificates.len() == pairs.len()).then_some(ListenerTls { certificates })
    }

    /// The `{cert, key}` pairs `tls` names, in order.
    fn tls_pairs(
        &mut self,
        raw: Spanned<RawTls>,
    ) -> Option<Vec<(Spanned<String>, Spanned<String>)>> {
        let RawTls {
            cert,
            key,
            certificates,
        } = raw.value;
        match (cert, key, certificates) {
            (Some(cert), Some(key), None) => Some(vec![(cert, key)]),
            (None, None, Some(list)) => {
                let n = list.value.len();
                if n == 0 {
                    self.err(
                        &list.referenced,
                        "tls.certificates needs at least one {cert, key}",
                    );
                    return None;
                }
                if n > MAX_CERTIFICATES {
                    self.err(
                        &list.referenced,
                        format!("tls.certificates has {n} entries (at most {MAX_CERTIFICATES})"),
                    );
                    return None;
                }
                Some(
                    list.value
                        .into_iter()
                        .map(|p| (p.value.cert, p.value.key))
                        .collect(),
                )
            }
            (Some(one), None, None) | (None, Some(one), None) => {
                self.err(
                    &one.referenced,
                    format!("tls needs both cert and key: {TLS_FORMS}"),
                );
                None
            }
            _ => {
                self.err(&raw.referenced, TLS_FORMS);
                None
            }
        }
    }

    /// `path` as written, relative to the config file's directory.
    fn relative(&self, path: &str) -> PathBuf {
        let path = Path::new(path.trim());
        match self.file.parent() {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};

    const BACKENDS: &str = "backends:\n  - {name: a, addr: 127.0.0.1:8001}\n";

    #[test]
    fn tls_needs_mode_http_and_one_of_its_forms() {
        let tcp = format!(
            "listen:\n  - {{addr: 127.0.0.1:7443, tls: {{cert: a.pem, key: a.key}}}}\n{BACKENDS}"
        );
        assert_eq!(
            problems(&tcp),
            [
                "test.yaml:2:33: tls needs mode: http (mode tcp passes TLS through to the backends unchanged)"
            ]
        );
        let half = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:7443, tls: {{cert: a.pem}}}}\n{BACKENDS}"
        );
        assert!(problems(&half)[0].starts_with("test.yaml:3:40: tls needs both cert and key"));
        let both = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:7443, tls: {{cert: a.pem, key: a.key, certificates: []}}}}\n{BACKENDS}"
        );
        assert!(problems(&both)[0].contains("write tls: {cert: FILE, key: FILE} or"));
        let none = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:7443, tls: {{certificates: []}}}}\n{BACKENDS}"
        );
        assert!(problems(&none)[0].contains("tls.certificates needs at least one"));
    }

    #[test]
    fn a_missing_file_is_named_and_plain_entries_stay_cleartext() {
        let missing = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:7443, tls: {{cert: /nonexistent/a.pem, key: /nonexistent/a.key}}}}\n{BACKENDS}"
        );
        let p = problems(&missing);
        assert!(
            p[0].starts_with(
                "test.yaml:3:40: tls: certificate file /nonexistent/a.pem: cannot read"
            ),
            "{p:?}"
        );
        let c = parse(&format!(
            "mode: http\nlisten:\n  - 127.0.0.1:7000\n  - {{addr: 127.0.0.1:7001}}\n{BACKENDS}"
        ))
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.tls, [None, None]);
    }
}
