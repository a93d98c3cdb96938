//! The `metrics` section's validated type: what the admin endpoint's
//! `/metrics` writes for a pool too large for one series per backend.
//!
//! Validation ([`super::validate`]) fills it in; the exporter
//! ([`crate::ops::metrics`]) reads it at every scrape, so a reload applies it.

use serde::Deserialize;

/// `metrics.per_backend: auto` writes per-backend series up to this many
/// backends (in the table and draining), pool totals above. About 11 KB of
/// text per backend: 256 backends make a scrape of about 2.8 MB, 2,001 one
/// of 22 MB (1.2 MB gzipped, a quarter of a second to render), against
/// 21 KB as totals; per-backend detail is not worth that at such a size.
pub const PER_BACKEND_AUTO_MAX: usize = 256;

/// `metrics.per_backend`: whether the backend families carry one series
/// per backend (labelled `backend` and `addr`) or pool totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PerBackend {
    /// Per backend up to [`PER_BACKEND_AUTO_MAX`] backends, then totals.
    #[default]
    Auto,
    /// Always per backend.
    On,
    /// Always totals.
    Off,
}

impl PerBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            PerBackend::Auto => "auto",
            PerBackend::On => "on",
            PerBackend::Off => "off",
        }
    }

    /// Whether a scrape of a pool of `backends` writes per-backend series.
    pub fn applies(self, backends: usize) -> bool {
        match self {
            PerBackend::Auto => backends <= PER_BACKEND_AUTO_MAX,
            PerBackend::On => true,
            PerBackend::Off => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsConfig {
    pub per_backend: PerBackend,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_stops_per_backend_series_above_its_limit() {
        assert!(PerBackend::Auto.applies(PER_BACKEND_AUTO_MAX));
        assert!(!PerBackend::Auto.applies(PER_BACKEND_AUTO_MAX + 1));
        assert!(PerBackend::On.applies(100_000));
        assert!(!PerBackend::Off.applies(1));
    }
}
