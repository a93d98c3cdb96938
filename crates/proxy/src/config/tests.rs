//! Parsing and validating whole configs: defaults, every rejected mistake
//! with its place, and what each mode allows.

use super::test_util::{parse, problems};
use super::*;
use magpie_core::key::Fallback;
use magpie_core::key::group::GroupBy;

const MINIMAL: &str = "listen: 127.0.0.1:7000\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\n";

#[test]
fn minimal_config_gets_defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.listen, vec!["127.0.0.1:7000".parse().unwrap()]);
    assert_eq!(c.admin, Some(DEFAULT_ADMIN.parse().unwrap()));
    assert_eq!(c.placement.algorithm, Algorithm::Maglev);
    assert_eq!(c.placement.table_size, 65537);
    assert_eq!(c.key, KeyConfig::SourceIp);
    assert_eq!(
        c.connect,
        ConnectConfig {
            timeout: Duration::from_secs(1),
            attempts: 3
        }
    );
    assert_eq!(c.idle_timeout, Duration::from_secs(3600));
    assert_eq!(c.max_connections, 10_000);
    assert_eq!(c.backends[0].weight, 1);
    assert!(c.health.is_none());
    assert_eq!(c.copy, CopyMode::Buffered);
}

#[test]
fn each_copy_mode_parses() {
    for (text, want) in [
        ("auto", CopyMode::Auto),
        ("buffered", CopyMode::Buffered),
        ("splice", CopyMode::Splice),
    ] {
        let c = parse(&format!("copy: {text}\n{MINIMAL}")).unwrap();
        assert_eq!(c.copy, want);
        assert_eq!(c.copy.to_string(), text);
        let c = parse(&format!("mode: tcp\ncopy: {text}\n{MINIMAL}")).unwrap();
        assert_eq!(c.copy, want);
    }
}

#[test]
fn full_config_parses() {
    let c = parse(
        "listen: [127.0.0.1:7000, '[::1]:7000']\nadmin: off\nplacement:\n  algorithm: ring\n  points_per_weight: 100\n  bounded_load: 1.25\nkey:\n  from: header\n  header: X-Session-Id\n  read_timeout: 250ms\n  max_bytes: 4096\n  fallback: source_addr\nconnect:\n  timeout: 500ms\n  attempts: 2\nidle_timeout: 30s\nmax_connections: 5\nshutdown_grace: 0s\nproxy_protocol:\n  accept_from: [10.0.0.0/8, 127.0.0.1]\n  send: v2\nhealth:\n  interval: 2s\n  timeout: 1s\n  when_all_down: refuse\nbackends:\n  - {name: b, addr: 'localhost:8002', weight: 2, zone: z1}\n  - {name: a, addr: 127.0.0.1:8001, weight: 0}\n",
    )
    .unwrap();
    assert_eq!(c.listen.len(), 2);
    assert_eq!(c.admin, None);
    assert_eq!(c.placement.algorithm, Algorithm::Ring);
    assert_eq!(c.placement.bounded_load, Some(1.25));
    assert_eq!(
        c.key,
        KeyConfig::Header {
            name: "x-session-id".into(),
            body_field: None,
            read: KeyRead {
                read_timeout: Duration::from_millis(250),
                max_bytes: 4096,
                fallback: Fallback::SourceAddr
            }
        }
    );
    assert_eq!(c.shutdown_grace, Duration::ZERO);
    assert!(c.proxy_protocol.is_trusted("127.0.0.1".parse().unwrap()));
    assert!(
        c.proxy_protocol
            .is_trusted("::ffff:10.1.2.3".parse().unwrap())
    );
    assert!(!c.proxy_protocol.is_trusted("127.0.0.2".parse().unwrap()));
    assert!(c.proxy_protocol.send_v2);
    assert_eq!(c.health.as_ref().unwrap().when_all_down, AllDown::Refuse);
    assert!(c.backends[0].addr.ip().is_loopback());
    assert_eq!(c.backends[0].zone.as_deref(), Some("z1"));
}

#[test]
fn every_listed_mistake_is_rejected() {
    let cases: &[(&str, &str)] = &[
        (
            "listen: 127.0.0.1:7000\nbackends: []\n",
            "backends is empty",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 0}\n",
            "weight 0",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: no-such-host.invalid:80}\n",
            "does not resolve",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1}\n",
            "no port",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {table_size: 65536}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "not prime",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {table_size: 2}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n  - {name: b, addr: 127.0.0.1:8002}\n  - {name: c, addr: 127.0.0.1:8003}\n",
            "smaller than the number of backends",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {bounded_load: 0.9}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "bounded_load",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s, group_choices: 2}\nsessions: {ttl: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "key.group_choices applies only with key.group",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s, group: system, group_choices: 0}\nsessions: {ttl: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "key.group_choices 0 is out of range (1 to 8)",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s, group: system, group_choices: 9}\nsessions: {ttl: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "key.group_choices 9 is out of range (1 to 8)",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s, group: system, group_choices: 3}\nconnect: {attempts: 2}\nsessions: {ttl: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "key.group_choices 3 is more than connect.attempts (2)",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {spill_min_excess: 4}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "spill_min_excess applies only with bounded_load",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {bounded_load: 1.25, spill_min_excess: 100001}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "must be at most 100000",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {slow_start: 2h}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "placement.slow_start 2h is too long (at most 1h)",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {from: header}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "key.header",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {from: header, header: 'bad header'}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "not a valid HTTP header name",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {header: x-session-id}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "only applies with key.from: header",
        ),
        (
            "listen: 127.0.0.1:7000\nconnect: {timeout: 0s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "connect.timeout must be greater than zero",
        ),
        (
            "listen: 127.0.0.1:7000\nconnect: {attempts: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "attempts must be at least 1",
        ),
        (
            "listen: 127.0.0.1:7000\nidle_timeout: 0s\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "idle_timeout must be greater than zero",
        ),
        (
            "listen: 127.0.0.1:7000\nidle_timeout: 5 parsecs\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "invalid duration",
        ),
        (
            "listen: 127.0.0.1:7000\nmax_connections: 0\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "max_connections",
        ),
        (
            "listen: nowhere\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "not an ip:port",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:7000}\n",
            "loop",
        ),
        (
            "listen: 127.0.0.1:7000\nadmin: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "also a listen address",
        ),
        (
            "listen: 127.0.0.1:7000\nproxy_protocol: {accept_from: [10.0.0.0/33]}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "CIDR",
        ),
        (
            "listen: 127.0.0.1:7000\nproxy_protocol: {send: v3}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "v3",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {algorithm: maglev, points_per_weight: 10}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "ring only",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {interval: 1s, timeout: 2s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "longer than health.interval",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {rise: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "rise must be at least 1",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: 'a b', addr: 127.0.0.1:8001}\n",
            "whitespace",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 100000}\n",
            "too large",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {algorithm: ring, points_per_weight: 1000}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 10000}\n  - {name: b, addr: 127.0.0.1:8002, weight: 10000}\n",
            "test.yaml:2:49: the ring would have 20000000 points (at most 10000000)",
        ),
        (
            "listen: 127.0.0.1:7000\nplacement: {algorithm: ring}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001, weight: 10000}\n  - {name: b, addr: 127.0.0.1:8002, weight: 10000}\n  - {name: c, addr: 127.0.0.1:8003, weight: 10000}\n  - {name: d, addr: 127.0.0.1:8004, weight: 10000}\n  - {name: e, addr: 127.0.0.1:8005, weight: 10000}\n  - {name: f, addr: 127.0.0.1:8006, weight: 10000}\n  - {name: g, addr: 127.0.0.1:8007, weight: 10000}\n",
            "test.yaml:2:24: the ring would have 11200000 points with the default points_per_weight 160 (at most 10000000)",
        ),
        (
            "listen: 127.0.0.1:7000\nmax_connections: 3000000000000000000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:18: max_connections 3000000000000000000 is too large (at most 1000000)",
        ),
        (
            "listen: 127.0.0.1:7000\nidle_timeout: 18446744073709551615s\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:15: idle_timeout 584542046090years 7months 15days 17h 5m 3s is too long (at most 7days)",
        ),
        (
            "listen: 127.0.0.1:7000\nidle_timeout: 8d\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:15: idle_timeout 8days is too long (at most 7days)",
        ),
        (
            "listen: 127.0.0.1:7000\nshutdown_grace: 2h\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:17: shutdown_grace 2h is too long (at most 1h)",
        ),
        (
            "listen: 127.0.0.1:7000\ndrain_timeout: 8d\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:16: drain_timeout 8days is too long (at most 7days)",
        ),
        (
            "listen: 127.0.0.1:7000\nconnect: {timeout: 6m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:20: connect.timeout 6m is too long (at most 5m)",
        ),
        (
            "listen: 127.0.0.1:7000\nconnect: {attempts: 65}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:21: connect.attempts 65 is too large (at most 64)",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {from: header, header: x-id, read_timeout: 6m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:49: key.read_timeout 6m is too long (at most 5m)",
        ),
        (
            "listen: 127.0.0.1:7000\nproxy_protocol: {header_timeout: 6m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:34: proxy_protocol.header_timeout 6m is too long (at most 5m)",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {interval: 18446744073709551615s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:20: health.interval 584542046090years 7months 15days 17h 5m 3s is too long (at most 1h)",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {interval: 1h, timeout: 6m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:33: health.timeout 6m is too long (at most 5m)",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {rise: 101}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:16: health.rise 101 is too large (at most 100)",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {fall: 101}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:16: health.fall 101 is too large (at most 100)",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {passive_failures: 1001}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:28: health.passive_failures 1001 is too large (at most 1000)",
        ),
        (
            "listen: 127.0.0.1:7000\nreload: {poll_interval: 18446744073709551615s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:25: reload.poll_interval 584542046090years 7months 15days 17h 5m 3s is too long (at most 1day)",
        ),
        // Listen addresses: each error in its place, in words.
        (
            "listen: 7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "listen 7000 is a number; write an ip:port address such as 0.0.0.0:7000",
        ),
        (
            "listen: [127.0.0.1:7000, nope]\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:1:26: listen address \"nope\" is not an ip:port address",
        ),
        (
            "listen: localhost:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:1:9: listen address \"localhost:7000\" is not an ip:port address",
        ),
        // Self-loops through wildcard addresses.
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: \"0.0.0.0:7000\"}\n",
            "test.yaml:3:21: backend \"a\" at 0.0.0.0:7000 reaches magpie's own listener 127.0.0.1:7000: that would loop",
        ),
        (
            "listen: 0.0.0.0:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:7000}\n",
            "test.yaml:3:21: backend \"a\" at 127.0.0.1:7000 reaches magpie's own listener 0.0.0.0:7000: that would loop",
        ),
        (
            "listen: \"[::]:7000\"\nbackends:\n  - {name: a, addr: \"[::1]:7000\"}\n",
            "test.yaml:3:21: backend \"a\" at [::1]:7000 reaches magpie's own listener [::]:7000: that would loop",
        ),
        (
            "listen: 127.0.0.1:7000\nadmin: 0.0.0.0:9090\nbackends:\n  - {name: a, addr: 127.0.0.1:9090}\n",
            "reaches magpie's own listener 0.0.0.0:9090",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {from: conversation}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:13: key.from: conversation needs mode: http",
        ),
        // DNS discovery.
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a, dns: \"pool:80\"}\n",
            "test.yaml:3:5: a dns or srv backend entry has no name: its backends are named by what the name resolves to",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {dns: pool}\n",
            "test.yaml:3:11: dns \"pool\" is not host:port (write e.g. vllm.default.svc.cluster.local:8000)",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {srv: pool.test}\n",
            "is not a service name",
        ),
        (
            "listen: 127.0.0.1:7000\nbackends:\n  - {name: a}\n",
            "test.yaml:3:5: a backend needs name and addr (or dns: host:port, or srv: _service._proto.name)",
        ),
        (
            "listen: 127.0.0.1:7000\ndiscovery: {interval: 10s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:12: discovery needs a backend entry with dns or srv",
        ),
        (
            "listen: 127.0.0.1:7000\ndiscovery: {interval: 10ms}\nbackends:\n  - {dns: \"pool:80\"}\n",
            "discovery.interval 10ms is too short (at least 100ms)",
        ),
        (
            "listen: 127.0.0.1:7000\ndiscovery: {resolver: dns.local}\nbackends:\n  - {dns: \"pool:80\"}\n",
            "discovery.resolver \"dns.local\" is not an ip:port address",
        ),
        // The shared session store.
        (
            "mode: http\nlisten: 127.0.0.1:7000\nsessions: {redis: {addr: 127.0.0.1:6379}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:19: sessions.redis needs sessions.store: redis",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nsessions: {store: redis, redis: {addr: redis}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:40: sessions.redis.addr \"redis\" is not host:port (write e.g. 127.0.0.1:6379)",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nsessions: {store: redis, redis: {timeout: 6s}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "sessions.redis.timeout 6s is too long (at most 5s)",
        ),
        (
            "mode: http\nlisten: 127.0.0.1:7000\nsessions: {store: memcached}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "unknown variant `memcached`",
        ),
        // What each mode allows.
        (
            "listen: 127.0.0.1:7000
key: {from: body, body_field: user}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:13: key.from: body needs mode: http",
        ),
        (
            "listen: 127.0.0.1:7000
key: {from: header, header: x-id, body_field: user}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:47: key.body_field needs mode: http",
        ),
        (
            "listen: 127.0.0.1:7000
sessions: {ttl: 30m}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:11: sessions needs mode: http",
        ),
        (
            "listen: 127.0.0.1:7000
http: {expose_backend: true}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:7: the http section needs mode: http",
        ),
        (
            "listen: 127.0.0.1:7000
health: {passive_status: true}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:26: health.passive_status needs mode: http",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
proxy_protocol: {send: v2}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:24: proxy_protocol.send needs mode: tcp",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
key: {from: body}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:13: key.from is body but key.body_field",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
key: {from: body, body_field: /a//b}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:31: key.body_field \"/a//b\" is a JSON pointer with an empty step",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
key: {from: header, header: x-id, max_bytes: 67108865}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:46: key.max_bytes 67108865 is out of range (16 to 67108864 in mode http)",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
limits: {max_head_bytes: 4096}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:26: limits.max_head_bytes must be at least 8192",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
limits: {key_buffer_bytes: 17179869185}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:28: limits.key_buffer_bytes 17179869185 is too large (at most 17179869184)",
        ),
        (
            "listen: 127.0.0.1:7000
limits: {max_head_bytes: 65536}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:9: the limits section needs mode: http",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
limits: {h2_resets_per_second: 0}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:32: limits.h2_resets_per_second must be at least 1",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
health: {http_path: health}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:21: health.http_path \"health\" is not a request path",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
health: {http_path: /health, expect_status: 299-200}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:45: health.expect_status 299-200 is not a range of HTTP statuses",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
health: {expect_status: 200}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:25: health.expect_status applies to HTTP checks only",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
sessions: {max: 0}
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "sessions.max",
        ),
        (
            "mode: http
listen: 127.0.0.1:7000
copy: splice
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:3:7: copy applies to mode tcp only",
        ),
        (
            "listen: 127.0.0.1:7000
copy: zerocopy
backends:
  - {name: a, addr: 127.0.0.1:8001}
",
            "test.yaml:2:7: unknown variant `zerocopy`, expected one of auto, buffered, splice",
        ),
        (
            "mode: udp\nlisten: 0.0.0.0:53\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:9: mode udp needs each listen address written out, not 0.0.0.0:53",
        ),
        (
            "mode: sctp\nlisten: 127.0.0.1:7000\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:1:7: unknown variant `sctp`, expected one of tcp, http, udp",
        ),
        (
            "listen: 127.0.0.1:7000\nkey: {from: quic}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:13: key.from: quic needs mode: udp",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nkey: {from: header, header: x-s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:13: key.from: header needs mode: tcp or http",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nkey: {from: sni}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:13: key.from: sni needs mode: tcp",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nkey: {from: quic, quic_cid_length: 21}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:36: key.quic_cid_length 21 is out of range (1 to 20",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nkey: {from: quic, read_timeout: 1s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:33: key.read_timeout does not apply with key.from: quic",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nkey: {from: source_ip, quic_cid_length: 8}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:41: key.quic_cid_length only applies with key.from: quic",
        ),
        (
            "listen: 127.0.0.1:7000\nudp: {responses: 1}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:2:6: the udp section needs mode: udp",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nudp: {responses: 0}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:18: udp.responses 0 is out of range",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nhealth: {interval: 2s}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "test.yaml:3:9: health in mode udp needs health.port",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nhealth: {datagram: {send: \"0g\"}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "health.datagram.send \"0g\" is not hex",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nhealth: {port: 53, datagram: {send: \"00\"}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "health.port and health.datagram are two kinds of check",
        ),
        (
            "listen: 127.0.0.1:7000\nhealth: {datagram: {send: \"00\"}}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "health.datagram needs mode: udp",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nproxy_protocol: {send: v2}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "proxy_protocol needs mode: tcp or http",
        ),
        (
            "mode: udp\nlisten: 127.0.0.1:7000\nsessions: {ttl: 1m}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
            "sessions needs mode: http",
        ),
    ];
    for (text, needle) in cases {
        let p = problems(text).join("\n");
        assert!(
            p.contains(needle),
            "for {text:?} expected {needle:?} in:\n{p}"
        );
        assert!(p.starts_with("test.yaml:"), "{p}");
    }
}

#[test]
fn an_http_config_parses() {
    let c = parse(
        "mode: http\nlisten: 127.0.0.1:7000\nkey:\n  from: header\n  header: X-Session-Id\n  body_field: prompt_cache_key\nhttp: {expose_backend: true}\nsessions: {ttl: 10m, max: 500}\nhealth: {http_path: /health, expect_status: 200-399, passive_status: true}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n",
    )
    .unwrap();
    assert_eq!(c.mode, Mode::Http);
    match &c.key {
        KeyConfig::Header {
            name,
            body_field: Some(field),
            read,
        } => {
            assert_eq!(name, "x-session-id");
            assert_eq!(field.text, "prompt_cache_key");
            assert_eq!(read.read_timeout, DEFAULT_HTTP_READ_TIMEOUT);
            assert_eq!(read.max_bytes as u64, DEFAULT_HTTP_MAX_BYTES);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.http.expose_backend);
    assert_eq!(
        c.sessions,
        Some(SessionsConfig {
            ttl: Duration::from_secs(600),
            max: 500,
            redis: None,
        })
    );
    let h = c.health.unwrap();
    assert_eq!(h.http_path.as_deref(), Some("/health"));
    assert_eq!(h.expect_status, 200..=399);
    assert!(h.passive_status);
}

#[test]
fn key_group_forms_and_their_needs() {
    let with = |group: &str, rest: &str| {
        format!(
            "mode: http\nlisten: 127.0.0.1:7000\nkey:\n  from: conversation\n  group: {group}\n{rest}backends:\n  - {{name: a, addr: 127.0.0.1:8001}}\n"
        )
    };
    let sessions = "sessions: {ttl: 10m}\n";
    for (group, want) in [
        ("system", GroupBy::System),
        ("{prefix_bytes: 4096}", GroupBy::PrefixBytes(4096)),
        (
            "{header: X-Tenant-Id}",
            GroupBy::Header("x-tenant-id".into()),
        ),
    ] {
        assert_eq!(parse(&with(group, sessions)).unwrap().group, Some(want));
    }
    let by_header = with("conversation", sessions)
        .replace("from: conversation", "from: header\n  header: x-session-id");
    assert_eq!(
        parse(&by_header).unwrap().group,
        Some(GroupBy::Conversation)
    );
    assert_eq!(
        parse(&with("system", sessions).replace("  group: system\n", ""))
            .unwrap()
            .group,
        None
    );
    for (text, needle) in [
        (with("system", ""), "test.yaml:5:10: key.group needs sessions: the session pin is what keeps a conversation on the replica its group placed it on"),
        (with("{prefix_bytes: 8}", sessions), "prefix_bytes 8 is out of range (16 to 1048576)"),
        (with("{prefix_bytes: 2097152}", sessions), "out of range"),
        (with("{header: \"a b\"}", sessions), "not a valid HTTP header name"),
        (with("tenant", sessions), "write key.group: system, conversation, {prefix_bytes: N} or {header: NAME}"),
        (with("conversation", sessions), "test.yaml:5:10: key.group: conversation with key.from: conversation groups nothing"),
        (with("{model: x}", sessions), "key.group has no field \"model\""),
        (with("{header: a, prefix_bytes: 64}", sessions), "key.group takes one form"),
        (with("system", sessions).replace("from: conversation", "from: source_ip"), "key.group needs key.from: header, body or conversation"),
        (
            "listen: 127.0.0.1:7000\nkey: {from: header, header: x-a, group: system}\nbackends:\n  - {name: a, addr: 127.0.0.1:8001}\n".to_string(),
            "key.group needs mode: http",
        ),
    ] {
        let p = problems(&text).join("\n");
        assert!(p.contains(needle), "for {text:?} expected {needle:?} in:\n{p}");
        assert!(p.starts_with("test.yaml:"), "{p}");
    }
}
