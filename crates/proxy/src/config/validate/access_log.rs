//! Validation of the `access_log` section: its path, field names, sample
//! share and queue bound.
//!
//! Part of [`Validator`]. `format` is one of two words, which serde already
//! checks; an unknown field name is an error at its own line and column.

use std::path::PathBuf;

use serde_saphyr::Spanned;

use super::Validator;
use crate::config::access_log::RawAccessLog;
use crate::config::{
    AccessLogConfig, DEFAULT_ACCESS_LOG_QUEUE, LogField, LogTarget, MAX_ACCESS_LOG_QUEUE,
};

impl Validator<'_> {
    /// The `access_log` section; `None` (no access log) when absent.
    pub(super) fn access_log(&mut self, raw: Option<RawAccessLog>) -> Option<AccessLogConfig> {
        let raw = raw?;
        let path = raw.path.value.trim();
        let target = match path {
            "" => {
                self.err(
                    &raw.path.referenced,
                    "access_log.path is empty (write a file, or stderr)",
                );
                LogTarget::Stderr
            }
            "stderr" => LogTarget::Stderr,
            file => LogTarget::File(PathBuf::from(file)),
        };
        let fields = match raw.fields {
            Some(fields) => self.log_fields(fields),
            None => LogField::ALL.to_vec(),
        };
        let sample = match raw.sample {
            Some(s) if !(0.0..=1.0).contains(&s.value) => {
                self.err(
                    &s.referenced,
                    format!("access_log.sample {} is not between 0.0 and 1.0", s.value),
                );
                1.0
            }
            Some(s) => s.value,
            None => 1.0,
        };
        let queue = self.count(
            raw.queue,
            "access_log.queue",
            DEFAULT_ACCESS_LOG_QUEUE,
            1..=MAX_ACCESS_LOG_QUEUE,
        );
        Some(AccessLogConfig {
            target,
            format: raw.format.unwrap_or_default(),
            fields,
            sample,
            log_keys: raw.log_keys.unwrap_or(false),
            log_query: raw.log_query.unwrap_or(false),
            // At most MAX_ACCESS_LOG_QUEUE, so this fits any usize.
            queue: queue as usize,
        })
    }

    /// `access_log.fields`: known names, each once, at least one.
    fn log_fields(&mut self, raw: Spanned<Vec<Spanned<String>>>) -> Vec<LogField> {
        if raw.value.is_empty() {
            self.err(
                &raw.referenced,
                "access_log.fields is empty (leave it out for every field)",
            );
        }
        let mut fields = Vec::new();
        for name in &raw.value {
            match LogField::named(name.value.trim()) {
                Some(f) if fields.contains(&f) => self.err(
                    &name.referenced,
                    format!("access_log.fields names {f} twice"),
                ),
                Some(f) => fields.push(f),
                None => {
                    let known: Vec<&str> = LogField::ALL.iter().map(|f| f.as_str()).collect();
                    self.err(
                        &name.referenced,
                        format!(
                            "access_log.fields: unknown field {:?} (known: {})",
                            name.value,
                            known.join(", ")
                        ),
                    );
                }
            }
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};
    use crate::config::{LogField, LogFormat, LogTarget};

    const BACKENDS: &str = "backends:\n  - {name: a, addr: 127.0.0.1:8001}\n";

    fn with(section: &str) -> String {
        format!("listen: 127.0.0.1:7000\n{section}{BACKENDS}")
    }

    #[test]
    fn absent_is_off_and_a_path_alone_takes_every_default() {
        assert!(parse(&with("")).unwrap().access_log.is_none());
        let log = parse(&with("access_log: {path: /var/log/magpie.log}\n"))
            .unwrap()
            .access_log
            .unwrap();
        assert_eq!(log.target, LogTarget::File("/var/log/magpie.log".into()));
        assert_eq!(log.format, LogFormat::Json);
        assert_eq!(log.fields, LogField::ALL.to_vec());
        assert_eq!(log.sample, 1.0);
        assert!(!log.log_keys && !log.log_query);
        assert_eq!(log.queue, 8192);
        let log = parse(&with(
            "access_log: {path: stderr, format: text, fields: [status, time], sample: 0.25}\n",
        ))
        .unwrap()
        .access_log
        .unwrap();
        assert_eq!(log.target, LogTarget::Stderr);
        assert_eq!(log.format, LogFormat::Text);
        assert_eq!(log.fields, vec![LogField::Status, LogField::Time]);
        assert_eq!(log.sample, 0.25);
    }

    #[test]
    fn unknown_fields_bad_shares_and_queues_name_their_place() {
        let p = problems(&with(
            "access_log:\n  path: a.log\n  fields:\n    - time\n    - tokens\n",
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("test.yaml:6:7:"), "{p:?}");
        assert!(p[0].contains("\"tokens\"") && p[0].contains("cached_tokens"));
        let p = problems(&with(
            "access_log: {path: a.log, sample: 1.5, queue: 0, fields: [time, time]}\n",
        ));
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.iter().all(|p| p.starts_with("test.yaml:2:")), "{p:?}");
        let p = problems(&with("access_log: {path: a.log, queue: 2000000}\n"));
        assert!(p[0].contains("at most 1048576"), "{p:?}");
        let p = problems(&with("access_log: {path: a.log, format: csv}\n"));
        assert!(p[0].contains("json") && p[0].contains("text"), "{p:?}");
        let p = problems(&with("access_log: {path: ' '}\n"));
        assert!(p[0].contains("empty"), "{p:?}");
    }
}
