//! Validation of the `metrics` section: what `/metrics` writes for a large
//! pool.
//!
//! Part of [`Validator`]. `per_backend` is one of three words, which serde
//! already checks (a wrong one is an error at its line and column, naming
//! the three); what is left is filling in the default.

use super::Validator;
use crate::config::MetricsConfig;
use crate::config::raw::RawMetrics;

impl Validator<'_> {
    /// The `metrics` section; its defaults when absent.
    pub(super) fn metrics(raw: Option<RawMetrics>) -> MetricsConfig {
        MetricsConfig {
            per_backend: raw.and_then(|m| m.per_backend).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::PerBackend;
    use crate::config::test_util::{parse, problems};

    const BACKENDS: &str = "backends:\n  - {name: a, addr: 127.0.0.1:8001}\n";

    fn per_backend(section: &str) -> PerBackend {
        let text = format!("listen: 127.0.0.1:7000\n{section}{BACKENDS}");
        parse(&text).unwrap().metrics.per_backend
    }

    #[test]
    fn per_backend_reads_its_three_words_and_defaults_to_auto() {
        assert_eq!(per_backend(""), PerBackend::Auto);
        assert_eq!(per_backend("metrics: {}\n"), PerBackend::Auto);
        assert_eq!(
            per_backend("metrics:\n  per_backend: auto\n"),
            PerBackend::Auto
        );
        // Unquoted `on` and `off` are words in YAML 1.2, not booleans.
        assert_eq!(per_backend("metrics:\n  per_backend: on\n"), PerBackend::On);
        assert_eq!(
            per_backend("metrics:\n  per_backend: off\n"),
            PerBackend::Off
        );
    }

    #[test]
    fn a_wrong_per_backend_names_its_place_and_the_choices() {
        let p = problems(&format!(
            "listen: 127.0.0.1:7000\nmetrics:\n  per_backend: sometimes\n{BACKENDS}"
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("test.yaml:3:"), "{p:?}");
        for word in ["auto", "on", "off"] {
            assert!(p[0].contains(word), "{p:?}");
        }
        let p = problems(&format!(
            "listen: 127.0.0.1:7000\nmetrics: {{per_backend: true}}\n{BACKENDS}"
        ));
        assert!(p[0].starts_with("test.yaml:2:"), "{p:?}");
        let p = problems(&format!(
            "listen: 127.0.0.1:7000\nmetrics: {{per_backends: on}}\n{BACKENDS}"
        ));
        assert!(p[0].contains("per_backends"), "{p:?}");
    }
}
