//! The config file as YAML says it: serde types, before any meaning is checked.
//!
//! First step of the config arrow: text → [`RawConfig`] here, then
//! [`validate`](super::validate) turns it into a [`Config`](super::Config).
//! Parsing rejects unknown fields and duplicate keys and names their line and
//! column; everything semantic (ranges, addresses, cross-field rules) is left
//! to validation, and `Spanned` fields let its errors point at their values.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::access_log::RawAccessLog;
use super::disaggregation::{RawDisaggregation, Role};
pub use super::duration::HumanDuration;
use super::raw_listen::Listen;
pub(super) use super::raw_udp::{RawDatagram, RawUdp};
use super::{Algorithm, AllDown, ConfigError, CopyMode, LoadPreset, Mode, PerBackend, Reuse};
use magpie_core::key::Fallback;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub(super) mode: Option<Spanned<Mode>>,
    pub(super) listen: Spanned<Listen>,
    #[serde(default)]
    pub(super) admin: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) placement: Option<RawPlacement>,
    #[serde(default)]
    pub(super) key: Option<RawKey>,
    #[serde(default)]
    pub(super) connect: Option<RawConnect>,
    #[serde(default)]
    pub(super) idle_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) max_connections: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) copy: Option<Spanned<CopyMode>>,
    #[serde(default)]
    pub(super) shutdown_grace: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) drain_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) proxy_protocol: Option<RawProxyProtocol>,
    #[serde(default)]
    pub(super) health: Option<Spanned<RawHealth>>,
    #[serde(default)]
    pub(super) reload: Option<RawReload>,
    #[serde(default)]
    pub(super) http: Option<Spanned<RawHttp>>,
    #[serde(default)]
    pub(super) sessions: Option<Spanned<RawSessions>>,
    #[serde(default)]
    pub(super) limits: Option<Spanned<RawLimits>>,
    pub(super) backends: Spanned<Vec<Spanned<RawBackend>>>,
    #[serde(default)]
    pub(super) upstream_tls: Option<Spanned<RawUpstreamTls>>,
    #[serde(default)]
    pub(super) discovery: Option<Spanned<RawDiscovery>>,
    #[serde(default)]
    pub(super) metrics: Option<RawMetrics>,
    #[serde(default)]
    pub(super) access_log: Option<RawAccessLog>,
    #[serde(default)]
    pub(super) queue: Option<Spanned<RawQueue>>,
    #[serde(default)]
    pub(super) udp: Option<Spanned<RawUdp>>,
    #[serde(default)]
    pub(super) disaggregation: Option<Spanned<RawDisaggregation>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
/// `queue`: limits, and the queue in front of them.
pub(super) struct RawQueue {
    #[serde(default)]
    pub(super) max_inflight: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) max_prefill_tokens: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) size: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) max_body_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) affinity_wait: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) priority: Option<Spanned<RawPriority>>,
    #[serde(default)]
    pub(super) tenant: Option<Spanned<RawTenant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPriority {
    pub(super) header: Spanned<String>,
    pub(super) classes: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(super) default: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) aging: Option<Spanned<HumanDuration>>,
    #[serde(default)] // Each class's value of the body's `priority` field.
    pub(super) engine: Option<Spanned<std::collections::BTreeMap<String, Spanned<i64>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    #[serde(default)]
    pub(super) header: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) group: Option<Spanned<bool>>,
    #[serde(default)]
    pub(super) max_queued: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) across_classes: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    #[serde(default)]
    pub(super) per_backend: Option<PerBackend>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscovery {
    #[serde(default)]
    pub(super) interval: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) resolver: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlacement {
    #[serde(default)]
    pub(super) algorithm: Option<Spanned<Algorithm>>,
    #[serde(default)]
    pub(super) table_size: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) points_per_weight: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) bounded_load: Option<Spanned<f64>>,
    #[serde(default)]
    pub(super) spill_min_excess: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) slow_start: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum KeyFrom {
    SourceIp,
    SourceAddr,
    Header,
    Body,
    Conversation,
    Sni,
    Quic,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    #[serde(default)]
    pub(super) from: Option<Spanned<KeyFrom>>,
    #[serde(default)]
    pub(super) header: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) body_field: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) read_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) max_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) fallback: Option<Spanned<Fallback>>,
    #[serde(default)]
    pub(super) group: Option<Spanned<RawGroup>>,
    #[serde(default)]
    pub(super) group_choices: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) quic_cid_length: Option<Spanned<u64>>,
}

/// `key.group`: `system`, `conversation`, `{prefix_bytes: N}` or
/// `{header: NAME}`. Read by hand, so a wrong form is answered with the
/// four right ones.
#[derive(Debug)]
pub(super) enum RawGroup {
    System,
    Conversation,
    PrefixBytes(u64),
    Header(String),
}

const GROUP_FORMS: &str =
    "write key.group: system, conversation, {prefix_bytes: N} or {header: NAME}";

impl<'de> Deserialize<'de> for RawGroup {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct GroupVisitor;
        impl<'de> serde::de::Visitor<'de> for GroupVisitor {
            type Value = RawGroup;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(GROUP_FORMS)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawGroup, E> {
                match v.trim() {
                    "system" => Ok(RawGroup::System),
                    "conversation" => Ok(RawGroup::Conversation),
                    other => Err(E::custom(format!("key.group {other:?}: {GROUP_FORMS}"))),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawGroup, A::Error> {
                use serde::de::Error;
                let Some(name) = map.next_key::<String>()? else {
                    return Err(A::Error::custom(format!(
                        "key.group is empty: {GROUP_FORMS}"
                    )));
                };
                let group = match name.as_str() {
                    "prefix_bytes" => RawGroup::PrefixBytes(map.next_value()?),
                    "header" => RawGroup::Header(map.next_value()?),
                    other => {
                        return Err(A::Error::custom(format!(
                            "key.group has no field {other:?}: {GROUP_FORMS}"
                        )));
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(A::Error::custom(format!(
                        "key.group takes one form: {GROUP_FORMS}"
                    )));
                }
                Ok(group)
            }
        }
        d.deserialize_any(GroupVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConnect {
    #[serde(default)]
    pub(super) timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) attempts: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxyProtocol {
    #[serde(default)]
    pub(super) accept_from: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) send: Option<Spanned<ProxySend>>,
    #[serde(default)]
    pub(super) header_timeout: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum ProxySend {
    V2,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    #[serde(default)]
    pub(super) interval: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) rise: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) fall: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) passive_failures: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) when_all_down: Option<Spanned<AllDown>>,
    #[serde(default)]
    pub(super) http_path: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) expect_status: Option<Spanned<StatusRange>>,
    #[serde(default)]
    pub(super) passive_status: Option<Spanned<bool>>,
    #[serde(default)]
    pub(super) load: Option<Spanned<RawLoad>>,
    #[serde(default)]
    pub(super) port: Option<Spanned<u16>>,
    #[serde(default)]
    pub(super) datagram: Option<Spanned<RawDatagram>>,
}

/// `health.load`: engine load signals from each backend's metrics.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLoad {
    #[serde(default)]
    pub(super) preset: Option<Spanned<LoadPreset>>,
    #[serde(default)]
    pub(super) path: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) interval: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) waiting: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) running: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) kv_usage: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) kv_capacity: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) max_waiting: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) max_kv_usage: Option<Spanned<f64>>,
    #[serde(default)]
    pub(super) max_age: Option<Spanned<HumanDuration>>,
}

/// `health.expect_status`: one code (`200`) or a range (`200-399`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StatusRange(pub u16, pub u16);

impl<'de> Deserialize<'de> for StatusRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(u16),
            Text(String),
        }
        let bad = |text: &str| {
            serde::de::Error::custom(format!(
                "invalid status range {text:?}; write e.g. 200 or 200-399"
            ))
        };
        match Written::deserialize(d).map_err(|_| bad("?"))? {
            Written::One(code) => Ok(StatusRange(code, code)),
            Written::Text(text) => {
                let (lo, hi) = text.split_once('-').unwrap_or((&text, &text));
                match (lo.trim().parse(), hi.trim().parse()) {
                    (Ok(lo), Ok(hi)) => Ok(StatusRange(lo, hi)),
                    _ => Err(bad(&text)),
                }
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    #[serde(default)]
    pub(super) expose_backend: Option<bool>,
    #[serde(default)]
    pub(super) response_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) stream_idle_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) body_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) keepalive_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) first_byte_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) pool_idle_timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) pool_max_idle_per_backend: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) reuse: Option<Reuse>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    #[serde(default)]
    pub(super) max_head_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) key_buffer_bytes: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) h2_resets_per_second: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    #[serde(default)]
    pub(super) ttl: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) max: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) store: Option<Spanned<StoreKind>>,
    #[serde(default)]
    pub(super) redis: Option<Spanned<RawRedis>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum StoreKind {
    Local,
    Redis,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    #[serde(default)]
    pub(super) addr: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) prefix: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) timeout: Option<Spanned<HumanDuration>>,
    #[serde(default)]
    pub(super) username: Option<String>,
    #[serde(default)]
    pub(super) password: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReload {
    #[serde(default)]
    pub(super) watch: Option<bool>,
    #[serde(default)]
    pub(super) poll_interval: Option<Spanned<HumanDuration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    #[serde(default)]
    pub(super) name: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) addr: Option<Spanned<String>>,
    /// `host:port`: every address the name resolves to is a backend.
    #[serde(default)]
    pub(super) dns: Option<Spanned<String>>,
    /// `_service._proto.name`: targets, ports and weights from SRV records.
    #[serde(default)]
    pub(super) srv: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) weight: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) zone: Option<Spanned<String>>,
    /// mode http: TLS to this backend.
    #[serde(default)]
    pub(super) tls: Option<Spanned<bool>>,
    /// With `queue`: this backend's own `queue.max_inflight`.
    #[serde(default)]
    pub(super) max_inflight: Option<Spanned<u64>>,
    /// With `disaggregation`: which halves it takes.
    #[serde(default)]
    pub(super) role: Option<Spanned<Role>>,
    /// With `disaggregation.protocol: sglang`: its KV bootstrap port.
    #[serde(default)]
    pub(super) bootstrap_port: Option<Spanned<u16>>,
}

/// `upstream_tls`: how TLS backends are checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamTls {
    /// A PEM file of the CAs that sign the backends' certificates.
    #[serde(default)]
    pub(super) ca: Option<Spanned<String>>,
    /// The name the certificates must carry, for every TLS backend.
    #[serde(default)]
    pub(super) server_name: Option<Spanned<String>>,
    /// `false`: take any certificate (HAProxy's `verify none`).
    #[serde(default)]
    pub(super) verify: Option<Spanned<bool>>,
}

/// Parses `text` into a [`RawConfig`]; a syntax error, unknown field or
/// duplicate key comes back as one [`ConfigError`] with its place. `file`
/// only names the source.
pub(super) fn from_yaml(file: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: MAX_YAML_NODES,
            max_events: 4 * MAX_YAML_NODES,
        },
    };
    serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((0, 0));
        let problem = match e.without_snippet() {
            serde_saphyr::Error::Budget { breach, .. } => over_budget(breach),
            _ => first_line_of(&e.to_string()),
        };
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            problem,
        }
    })
}

/// The most YAML values (scalars, lists, maps) a config may hold: room for
/// about 200,000 backends written one per line.
pub(super) const MAX_YAML_NODES: usize = 1_000_000;

/// A YAML parsing limit, said in words.
fn over_budget(breach: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    match breach {
        B::Nodes { .. } | B::Events { .. } => {
            format!(
                "the file holds more than {MAX_YAML_NODES} YAML values, more than a config may have"
            )
        }
        B::Depth { depth } => {
            format!("the YAML is nested {depth} levels deep; a config needs a handful")
        }
        B::Aliases { .. } | B::Anchors { .. } | B::AliasAnchorRatio { .. } => {
            "the YAML uses too many aliases or anchors (an alias bomb?); a config needs few or none"
                .to_string()
        }
        other => format!("the YAML exceeds a parsing limit ({other:?})"),
    }
}

/// serde-saphyr renders an error with a source snippet over several lines,
/// headed `error: line L column C: problem`; we keep the problem and put the
/// place in front ourselves.
fn first_line_of(rendered: &str) -> String {
    let line = rendered.lines().next().unwrap_or("invalid YAML").trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let line = match line
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((place, problem)) if place.contains(" column ") => problem,
        _ => line,
    };
    // Some messages end with the place instead.
    match line.find(" at line ") {
        Some(i) => line[..i].to_string(),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};

    #[test]
    fn syntax_error_names_line_and_column() {
        let e = parse("listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: [\n").unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert!(e.0[0].line >= 4, "{e}");
        assert!(e.0[0].column > 0, "{e}");
        assert!(e.to_string().starts_with("test.yaml:"), "{e}");
    }

    #[test]
    fn unknown_fields_and_duplicate_keys_are_rejected() {
        let p = problems(
            "listen: 127.0.0.1:7000\nbogus: 1\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n",
        );
        assert!(p[0].contains("bogus"), "{p:?}");
        assert!(
            p[0].starts_with("test.yaml:2:1: unknown field `bogus`"),
            "{p:?}"
        );
        assert!(p[0].starts_with("test.yaml:2:"), "{p:?}");
        let p = problems(
            "listen: 127.0.0.1:7000\nlisten: 127.0.0.1:7001\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n",
        );
        assert!(p[0].contains("test.yaml:2:"), "{p:?}");
        let p =
            problems("listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    adr: 127.0.0.1:8001\n");
        assert!(p[0].contains("adr"), "{p:?}");
    }
}
