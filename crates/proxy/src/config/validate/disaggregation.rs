//! Validation of `disaggregation` and the backends' `role` and
//! `bootstrap_port`.
//!
//! Part of [`Validator`]. The section is mode http's; a `role` other than
//! `both`, or a `bootstrap_port`, needs it (a silent mistake otherwise);
//! SGLang's protocol needs every backend that prefills to name its
//! bootstrap port; and each half needs a backend that takes it.

use serde_saphyr::{Location, Spanned};

use super::Validator;
use crate::config::disaggregation::RawDisaggregation;
use crate::config::raw::RawBackend;
use crate::config::{
    BackendConfig, DEFAULT_PREFILL_TIMEOUT, DEFAULT_SKIP_BELOW_TOKENS, DisaggregationConfig,
    MAX_PREFILL_TIMEOUT, MAX_SKIP_BELOW_TOKENS, Mode, Protocol, Role,
};

impl Validator<'_> {
    /// The `disaggregation` section: mode http only. Also where it is, for
    /// [`Validator::pools`].
    pub(super) fn disaggregation(
        &mut self,
        raw: Option<Spanned<RawDisaggregation>>,
        mode: Mode,
    ) -> Option<(DisaggregationConfig, Location)> {
        let raw = raw?;
        if mode != Mode::Http {
            self.err(&raw.referenced, "disaggregation needs mode: http");
        }
        let at = raw.referenced;
        let raw = raw.value;
        let skip_below_tokens = self.count(
            raw.skip_below_tokens,
            "disaggregation.skip_below_tokens",
            DEFAULT_SKIP_BELOW_TOKENS,
            0..=MAX_SKIP_BELOW_TOKENS,
        );
        let prefill_timeout = self.positive(
            raw.prefill_timeout,
            "disaggregation.prefill_timeout",
            DEFAULT_PREFILL_TIMEOUT,
            MAX_PREFILL_TIMEOUT,
        );
        let config = DisaggregationConfig {
            protocol: raw.protocol.value,
            skip_below_tokens,
            prefill_timeout,
        };
        Some((config, at))
    }

    /// A written backend's `role` and `bootstrap_port`, under `protocol`
    /// (`None`: no `disaggregation` section).
    pub(super) fn backend_role(
        &mut self,
        (role, port): (Option<Spanned<Role>>, Option<Spanned<u16>>),
        name: &str,
        protocol: Option<Protocol>,
    ) -> (Role, Option<u16>) {
        let role = role.map_or(Role::Both, |r| {
            if protocol.is_none() && r.value != Role::Both {
                self.err(
                    &r.referenced,
                    format!("backend {name:?} has role: {} but there is no disaggregation section (add one, or leave role out)", r.value.as_str()),
                );
            }
            r.value
        });
        let port = port.map(|p| {
            if protocol != Some(Protocol::Sglang) {
                self.err(
                    &p.referenced,
                    "bootstrap_port only applies with disaggregation.protocol: sglang",
                );
            } else if !role.prefills() {
                self.err(
                    &p.referenced,
                    format!(
                        "backend {name:?} has role: decode: a bootstrap_port is a prefill engine's"
                    ),
                );
            } else if p.value == 0 {
                self.err(&p.referenced, "bootstrap_port must be 1 to 65535");
            }
            p.value
        });
        (role, port)
    }

    /// A `dns` or `srv` entry plays both roles: `role` and
    /// `bootstrap_port` are refused there.
    pub(super) fn no_role_on_source(&mut self, b: &RawBackend) {
        if let Some(r) = &b.role {
            self.err(
                &r.referenced,
                "role is not supported on a dns or srv entry yet: its backends take both halves (write prefill and decode backends with addr)",
            );
        }
        if let Some(p) = &b.bootstrap_port {
            self.err(
                &p.referenced,
                "bootstrap_port is not supported on a dns or srv entry yet: write its backends with addr",
            );
        }
    }

    /// With `disaggregation` at `at`: each half has a backend to take it
    /// (`discovered`: a `dns` or `srv` entry adds backends of both roles),
    /// and under SGLang's protocol every backend that prefills names its
    /// bootstrap port.
    pub(super) fn pools(
        &mut self,
        section: Option<(DisaggregationConfig, Location)>,
        backends: &[BackendConfig],
        discovered: bool,
    ) -> Option<DisaggregationConfig> {
        let (config, at) = section?;
        let prefills = backends.iter().any(|b| b.role.prefills());
        let decodes = backends.iter().any(|b| b.role.decodes());
        let both_halves_taken = prefills && decodes;
        if !(discovered || backends.is_empty() || both_halves_taken) {
            let half = if prefills { "decode" } else { "prefill" };
            self.err(
                &at,
                format!("disaggregation needs a backend that takes the {half} half: give one role: {half} (or both)"),
            );
        }
        if config.protocol == Protocol::Sglang {
            let missing: Vec<&str> = (backends.iter())
                .filter(|b| b.role.prefills() && b.bootstrap_port.is_none())
                .map(|b| b.name.as_str())
                .collect();
            if !missing.is_empty() {
                self.err(
                    &at,
                    format!("disaggregation.protocol: sglang needs a bootstrap_port on every backend that prefills (role prefill or both); missing on {}", missing.join(", ")),
                );
            }
        }
        Some(config)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, Protocol, Role};

    const HEAD: &str =
        "mode: http\nlisten: 127.0.0.1:7000\nkey:\n  from: header\n  header: x-session-id\n";

    fn parse(text: &str) -> Result<Config, Vec<String>> {
        Config::parse(Path::new("test.yaml"), text)
            .map_err(|e| e.0.iter().map(|p| p.to_string()).collect())
    }

    fn problem(text: &str) -> String {
        let problems = parse(text).expect_err("the config is refused");
        assert_eq!(problems.len(), 1, "{problems:?}");
        problems[0].clone()
    }

    #[test]
    fn pools_with_roles_parse() {
        let text = format!(
            "{HEAD}disaggregation:\n  protocol: sglang\n  skip_below_tokens: 0\n  prefill_timeout: 5s\nbackends:\n  - {{name: p, addr: 127.0.0.1:8001, role: prefill, bootstrap_port: 8998}}\n  - {{name: d, addr: 127.0.0.1:8002, role: decode}}\n  - {{name: b, addr: 127.0.0.1:8003, bootstrap_port: 8999}}\n"
        );
        let config = parse(&text).expect("it parses");
        let split = config.disaggregation.expect("the section");
        assert_eq!(split.protocol, Protocol::Sglang);
        assert_eq!(split.skip_below_tokens, 0);
        assert_eq!(split.prefill_timeout.as_secs(), 5);
        let roles: Vec<_> = config
            .backends
            .iter()
            .map(|b| (b.role, b.bootstrap_port))
            .collect();
        assert_eq!(
            roles,
            [
                (Role::Prefill, Some(8998)),
                (Role::Decode, None),
                (Role::Both, Some(8999))
            ]
        );
        let defaults = parse(&format!(
            "{HEAD}disaggregation: {{protocol: vllm}}\nbackends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n"
        ))
        .expect("it parses");
        let split = defaults.disaggregation.expect("the section");
        assert_eq!(
            split.skip_below_tokens,
            crate::config::DEFAULT_SKIP_BELOW_TOKENS
        );
        assert_eq!(
            split.prefill_timeout,
            crate::config::DEFAULT_PREFILL_TIMEOUT
        );
    }

    #[test]
    fn mistakes_are_named_where_they_were_written() {
        let cases = [
            (
                "backends:\n  - {name: p, addr: 127.0.0.1:8001, role: prefill}\n".to_string(),
                "test.yaml:7:",
                "no disaggregation section",
            ),
            (
                "disaggregation: {protocol: vllm}\nbackends:\n  - {name: p, addr: 127.0.0.1:8001, role: prefill}\n".to_string(),
                "test.yaml:6:",
                "takes the decode half",
            ),
            (
                "disaggregation: {protocol: sglang}\nbackends:\n  - {name: p, addr: 127.0.0.1:8001, role: prefill}\n  - {name: d, addr: 127.0.0.1:8002, role: decode}\n".to_string(),
                "test.yaml:6:",
                "missing on p",
            ),
            (
                "disaggregation: {protocol: vllm}\nbackends:\n  - {name: p, addr: 127.0.0.1:8001, bootstrap_port: 9}\n".to_string(),
                "test.yaml:8:",
                "only applies with disaggregation.protocol: sglang",
            ),
            (
                "disaggregation: {protocol: vllm, skip_below_tokens: 2000000}\nbackends:\n  - {name: p, addr: 127.0.0.1:8001}\n".to_string(),
                "test.yaml:6:",
                "at most 1000000",
            ),
            (
                "disaggregation: {protocol: vllm}\nbackends:\n  - {dns: 'localhost:8000', role: decode}\n".to_string(),
                "test.yaml:8:",
                "not supported on a dns or srv entry",
            ),
        ];
        for (tail, at, says) in cases {
            let text = format!("{HEAD}{tail}");
            let problem = problem(&text);
            assert!(problem.starts_with(at), "{problem}\n{text}");
            assert!(problem.contains(says), "{problem}");
        }
        let tcp = "listen: 127.0.0.1:7000\ndisaggregation: {protocol: vllm}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n";
        assert!(problem(tcp).contains("disaggregation needs mode: http"));
    }
}
