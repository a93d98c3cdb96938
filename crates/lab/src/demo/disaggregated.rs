//! `magpie demo --mode disaggregated`: two simulated prefill engines and
//! two decode engines ([`crate::engine`], `--role prefill` and `decode`)
//! behind magpie running `config/disaggregated.yaml` as it ships
//! ([`shipped_yaml`]: only its addresses changed, its access log left out).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::engine::transfer::Role;
use crate::engine::{self, EngineConfig, EngineError};

/// `config/disaggregated.yaml` as shipped.
const SHIPPED: &str = include_str!("../../../../config/disaggregated.yaml");

/// Starts two prefill engines (`prefill-1`, `prefill-2`) and two decode
/// engines (`decode-1`, `decode-2`) on loopback; they stop with `stop`.
pub async fn start_engines(
    stop: &CancellationToken,
) -> Result<Vec<(String, SocketAddr, Role)>, EngineError> {
    let mut engines = Vec::new();
    for (name, role) in [
        ("prefill-1", Role::Prefill),
        ("prefill-2", Role::Prefill),
        ("decode-1", Role::Decode),
        ("decode-2", Role::Decode),
    ] {
        let config = EngineConfig {
            role,
            ..super::llm::engine_config(name)
        };
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let engine = engine::start(config, loopback, stop.clone()).await?;
        engines.push((name.to_string(), engine.addr(), role));
    }
    Ok(engines)
}

/// [`SHIPPED`] with the demo's addresses and `engines` (each with its
/// role), its access log left out (a line per request on stderr).
pub fn shipped_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    engines: &[(String, SocketAddr, Role)],
) -> String {
    let mut yaml = String::new();
    let mut skipping = false;
    for line in SHIPPED.lines() {
        if line.starts_with(|c: char| c.is_ascii_alphabetic()) {
            skipping = line.starts_with("access_log:");
        }
        match line {
            _ if line.starts_with("backends:") => break,
            _ if line.starts_with("listen:") => yaml.push_str(&format!("listen: \"{listen}\"\n")),
            _ if line.starts_with("admin:") => yaml.push_str(&format!("admin: \"{admin}\"\n")),
            _ if skipping => {}
            _ => {
                yaml.push_str(line);
                yaml.push('\n');
            }
        }
    }
    yaml.push_str("backends:\n");
    for (name, addr, role) in engines {
        let role = match role {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        };
        yaml.push_str(&format!(
            "  - name: {name}\n    addr: \"{addr}\"\n    role: {role}\n"
        ));
    }
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_keeps_its_settings_and_takes_the_demos_engines() {
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let engines = [
            ("p".to_string(), at(9001), Role::Prefill),
            ("d".to_string(), at(9002), Role::Decode),
        ];
        let yaml = shipped_yaml(at(7000), at(9090), &engines);
        assert!(yaml.contains("listen: \"127.0.0.1:7000\""));
        assert!(yaml.contains("disaggregation:\n  "));
        assert!(yaml.contains("  protocol: vllm"));
        assert!(!yaml.contains("access_log:"));
        assert!(yaml.ends_with(
            "backends:\n  - name: p\n    addr: \"127.0.0.1:9001\"\n    role: prefill\n  - name: d\n    addr: \"127.0.0.1:9002\"\n    role: decode\n"
        ));
    }
}
