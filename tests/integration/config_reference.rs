//! `docs/configuration.md` against the config the parser takes, so the
//! reference cannot drift:
//!
//! * every field the parser accepts has a row, and every row names a field
//!   it accepts (the fields are found by asking the parser itself: an
//!   unknown field's error lists the known ones, section by section);
//! * every row gives a default and a bound (`—` when there is none);
//! * a default written as one value is the default: a config that writes it
//!   is the config that leaves it out;
//! * a numeric field's documented range `A to B` is what `check` enforces:
//!   `A` and `B` are accepted, the values just outside are refused; a
//!   duration's documented most (`≤ X`) likewise, and `> 0` refuses `0s`.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value, json};

use magpie_proxy::config::Config;

use crate::support::BackendCa;

const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");

/// A field no config has: the parser's error for it lists the known ones.
const PROBE: &str = "zz_probe";

/// One row of the reference's table.
#[derive(Debug)]
struct Row {
    /// Field paths, `backends[].weight` style.
    paths: Vec<String>,
    default: String,
    bounds: String,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(REFERENCE).expect("read docs/configuration.md");
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        assert!(cells.len() >= 4, "a row of four cells: {line}");
        let spans = code_spans(cells[0]);
        let first = spans[0]
            .split(':')
            .next()
            .expect("a path")
            .trim()
            .to_string();
        let parent = first.rsplit_once('.').map_or("", |(p, _)| p).to_string();
        let mut paths = vec![first];
        for sibling in spans[1..].iter().filter(|s| s.starts_with('.')) {
            paths.push(format!("{parent}{sibling}"));
        }
        rows.push(Row {
            paths,
            default: cells[1].trim().to_string(),
            bounds: cells[2].trim().to_string(),
        });
    }
    assert!(rows.len() > 50, "the reference's table was found");
    rows
}

/// The `code` spans of a cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The smallest config every probe starts from: two backends, so that one
/// may weigh nothing.
fn base() -> Value {
    json!({
        "listen": "127.0.0.1:7000",
        "backends": [
            {"name": "a", "addr": "127.0.0.1:8001"},
            {"name": "b", "addr": "127.0.0.1:8002"}
        ]
    })
}

/// A CA file for backends reached over TLS, written once.
fn ca_file() -> String {
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("config-reference-ca.pem");
        std::fs::write(&path, BackendCa::new("reference").pem()).expect("write the CA");
        path.display().to_string()
    })
    .clone()
}

/// Settings a field may need beside it, tried in order.
fn contexts() -> Vec<Value> {
    vec![
        json!({}),
        json!({"mode": "http"}),
        json!({"mode": "http", "key": {"from": "header", "header": "x-s", "group": "system"},
               "sessions": {}, "connect": {"attempts": 8}}),
        json!({"mode": "http", "health": {"load": {"preset": "vllm"}}}),
        json!({"mode": "http", "key": {"from": "header", "header": "x-s"},
               "sessions": {"store": "redis"}}),
        json!({"access_log": {"path": "stderr"}}),
        json!({"placement": {"bounded_load": 1.25}}),
        json!({"placement": {"algorithm": "ring"}}),
        json!({"mode": "http", "key": {"from": "body", "body_field": "k"}}),
        json!({"health": {"http_path": "/health"}}),
        json!({"health": {"interval": "1h", "load": {"preset": "vllm", "interval": "5m"}}, "mode": "http"}),
        json!({"mode": "http", "health": {"load": {"waiting": "queue_waiting"}}}),
        json!({"mode": "http", "upstream_tls": {"ca": ca_file()},
               "backends": [{"name": "a", "addr": "127.0.0.1:8001", "tls": true},
                            {"name": "b", "addr": "127.0.0.1:8002", "tls": true}]}),
        json!({"backends": [{"name": "a", "addr": "127.0.0.1:8001"}, {"dns": "localhost:8000"}]}),
        json!({"queue": {}}),
        json!({"mode": "http", "key": {"from": "header", "header": "x-s"}, "queue": {"priority": {"header": "x-p", "classes": ["default", "batch"], "engine": {"default": 0, "batch": 1}}}}),
        json!({"mode": "http", "queue": {"tenant": {"header": "x-t"}}}),
        json!({"mode": "http", "key": {"from": "header", "header": "x-s", "group": "system"},
               "sessions": {}, "queue": {}}),
        json!({"mode": "http", "disaggregation": {"protocol": "vllm"}}),
        json!({"mode": "http", "disaggregation": {"protocol": "sglang"},
               "backends": [{"name": "a", "addr": "127.0.0.1:8001", "bootstrap_port": 8998},
                            {"name": "b", "addr": "127.0.0.1:8002", "bootstrap_port": 8999}]}),
        json!({"mode": "udp", "key": {"from": "quic"}}),
        json!({"mode": "udp", "health": {"port": 8053}}),
        json!({"mode": "udp", "health": {"datagram": {"send": "00"}}}),
    ]
}

/// One step of a field path: a field, or a list's first item.
fn steps(path: &str) -> Vec<Option<&str>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        match part.strip_suffix("[]") {
            Some(field) => {
                out.push(Some(field));
                out.push(None);
            }
            None => out.push(Some(part)),
        }
    }
    out
}

/// `config` with `value` at `path`, every section on the way made (an
/// empty object, or a list of one) when missing; merged into what is there.
fn set(config: &mut Value, path: &[Option<&str>], value: Value) {
    let Some((step, rest)) = path.split_first() else {
        merge(config, value);
        return;
    };
    let slot = match step {
        Some(field) => {
            if !config.is_object() {
                *config = Value::Object(Map::new());
            }
            let object = config.as_object_mut().expect("an object");
            let empty = if rest.first() == Some(&None) {
                json!([])
            } else {
                json!({})
            };
            object.entry(field.to_string()).or_insert(empty)
        }
        None => {
            if !config.is_array() {
                *config = json!([]);
            }
            let list = config.as_array_mut().expect("a list");
            if list.is_empty() {
                list.push(json!({}));
            }
            &mut list[0]
        }
    };
    set(slot, rest, value);
}

/// Objects merge field by field; anything else replaces.
fn merge(into: &mut Value, value: Value) {
    match (into, value) {
        (Value::Object(into), Value::Object(value)) => {
            for (k, v) in value {
                merge(into.entry(k).or_insert(Value::Null), v);
            }
        }
        (into, value) => *into = value,
    }
}

fn parse(config: &Value) -> Result<Config, String> {
    let text = serde_json::to_string(config).expect("JSON");
    Config::parse_offline(Path::new("ref.yaml"), &text).map_err(|e| e.to_string())
}

/// A config as it routes: what the text's bytes and places add is left
/// out, and a backend's TLS client (equal only to itself: each parse makes
/// one) is compared by what it checks.
fn normalised(mut config: Config) -> (Config, Vec<Option<String>>) {
    config.content_hash = 0;
    config.places = Default::default();
    let tls = (config.backends.iter_mut())
        .map(|b| b.tls.take().map(|t| format!("{:?} {}", t.name, t.verify)))
        .collect();
    (config, tls)
}

/// The fields the parser lists for the section at `path` (`""`: the top),
/// if it is a section.
fn fields_of(path: &str) -> Option<Vec<String>> {
    let mut config = base();
    let at = if path.is_empty() { vec![] } else { steps(path) };
    set(&mut config, &at, json!({ PROBE: 1 }));
    let error = parse(&config).err()?;
    let marker = format!("unknown field `{PROBE}`, expected ");
    let list = &error[error.find(&marker)? + marker.len()..];
    let list = list.lines().next().unwrap_or("");
    let list = list.strip_prefix("one of ").unwrap_or(list);
    Some(
        list.split([',', ' '])
            .map(|f| f.trim_matches('`'))
            .filter(|f| !f.is_empty() && *f != "or")
            .map(str::to_string)
            .collect(),
    )
}

/// Every field path the parser accepts: sections (`health`), lists of
/// sections (`backends[]`) and their fields, found by probing.
fn accepted() -> (BTreeSet<String>, BTreeSet<String>) {
    let mut leaves = BTreeSet::new();
    let mut sections = BTreeSet::new();
    let mut todo = vec![String::new()];
    while let Some(section) = todo.pop() {
        let fields = fields_of(&section).unwrap_or_else(|| panic!("{section:?} is a section"));
        for field in fields {
            let path = if section.is_empty() {
                field
            } else {
                format!("{section}.{field}")
            };
            if fields_of(&path).is_some() {
                sections.insert(path.clone());
                todo.push(path);
            } else if fields_of(&format!("{path}[]")).is_some() {
                sections.insert(path.clone());
                todo.push(format!("{path}[]"));
            } else {
                leaves.insert(path);
            }
        }
    }
    (leaves, sections)
}

#[test]
fn every_field_has_a_row_and_every_row_a_field() {
    let (leaves, sections) = accepted();
    assert!(leaves.contains("backends[].weight") && leaves.contains("health.load.max_age"));
    let documented: BTreeSet<String> = rows().into_iter().flat_map(|r| r.paths).collect();
    let undocumented: Vec<_> = leaves.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "fields without a row in docs/configuration.md: {undocumented:?}"
    );
    let unknown: Vec<_> = documented
        .iter()
        .filter(|p| !leaves.contains(*p) && !sections.contains(p.trim_end_matches("[]")))
        .collect();
    assert!(
        unknown.is_empty(),
        "rows in docs/configuration.md that name no field: {unknown:?}"
    );
}

#[test]
fn every_row_gives_a_default_and_a_bound() {
    for row in rows() {
        assert!(!row.default.is_empty(), "{:?} has no default", row.paths);
        assert!(!row.bounds.is_empty(), "{:?} has no bound", row.paths);
    }
}

/// A single `value` written in a cell, as JSON: a number, a bool, a list,
/// or text.
fn literal(cell: &str) -> Option<Value> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    if inner.contains('`') {
        return None;
    }
    Some(serde_json::from_str(inner).unwrap_or_else(|_| Value::String(inner.to_string())))
}

/// The first context in which `config` with `value` at `path` is accepted,
/// and what it comes to.
fn accepted_in(path: &str, value: &Value) -> Option<(Value, Config)> {
    contexts().into_iter().find_map(|context| {
        let mut config = base();
        merge(&mut config, context);
        set(&mut config, &steps(path), value.clone());
        let parsed = parse(&config).ok()?;
        Some((config, parsed))
    })
}

#[test]
fn a_default_written_out_is_the_default() {
    let mut checked = 0;
    for row in rows() {
        let Some(default) = literal(&row.default) else {
            continue;
        };
        for path in &row.paths {
            let (config, with) = accepted_in(path, &default)
                .unwrap_or_else(|| panic!("{path}: its default {default} is refused everywhere"));
            // The same config without the field (its section kept).
            let mut without = config.clone();
            let at = steps(path);
            let (last, parents) = at.split_last().expect("a path");
            set(&mut without, parents, json!({}));
            remove(&mut without, parents, last.expect("a field"));
            let without = parse(&without).unwrap_or_else(|e| panic!("{path}: without it: {e}"));
            assert!(
                normalised(with) == normalised(without),
                "{path}: writing its documented default {default} changes the config"
            );
            checked += 1;
        }
    }
    assert!(checked > 40, "{checked} defaults checked");
}

fn remove(config: &mut Value, parents: &[Option<&str>], field: &str) {
    let mut at = config;
    for step in parents {
        at = match step {
            Some(f) => &mut at[*f],
            None => &mut at[0],
        };
    }
    if let Some(object) = at.as_object_mut() {
        object.remove(field);
    }
}

/// `A to B` in a bounds cell, when it holds exactly one such range (two
/// numbers around " to ", thousands separated by commas).
fn range(cell: &str) -> Option<(f64, f64)> {
    let number = |s: &str| -> Option<f64> {
        let s = s.trim_matches(|c: char| !c.is_ascii_digit() && c != '.' && c != '-');
        s.replace(',', "").parse().ok()
    };
    let words: Vec<&str> = cell.split_whitespace().collect();
    let found: Vec<(f64, f64)> = words
        .windows(3)
        .filter(|w| w[1] == "to")
        .filter(|w| w[0].starts_with(|c: char| c.is_ascii_digit() || c == '`'))
        .filter_map(|w| Some((number(w[0])?, number(w[2])?)))
        .collect();
    (found.len() == 1).then(|| found[0])
}

fn as_value(x: f64, integer: bool) -> Value {
    if integer { json!(x as i64) } else { json!(x) }
}

#[test]
fn numeric_ranges_are_what_check_enforces() {
    let mut checked = 0;
    for row in rows() {
        let Some(Value::Number(default)) = literal(&row.default) else {
            continue;
        };
        let Some((low, high)) = range(&row.bounds) else {
            continue;
        };
        let integer = default.is_u64() || default.is_i64();
        let step = if integer { 1.0 } else { 0.5 };
        for path in &row.paths {
            for (inside, outside) in [(high, high + step), (low, low - step)] {
                let (mut config, _) = accepted_in(path, &as_value(inside, integer))
                    .unwrap_or_else(|| panic!("{path}: {inside} (documented) is refused"));
                set(&mut config, &steps(path), as_value(outside, integer));
                assert!(
                    parse(&config).is_err(),
                    "{path}: {outside} is accepted, outside the documented {low} to {high}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "{checked} ranges checked");
}

#[test]
fn duration_bounds_are_what_check_enforces() {
    let mut checked = 0;
    for row in rows() {
        let Some(Value::String(default)) = literal(&row.default) else {
            continue;
        };
        if humantime::parse_duration(&default).is_err() {
            continue;
        }
        let most = row
            .bounds
            .split_once('≤')
            .and_then(|(_, after)| after.split([',', ';']).next())
            .map(str::trim)
            .filter(|s| humantime::parse_duration(s).is_ok())
            .map(str::to_string);
        for path in &row.paths {
            if let Some(most) = &most {
                let (mut config, _) = accepted_in(path, &json!(most))
                    .unwrap_or_else(|| panic!("{path}: {most} (documented) is refused"));
                set(&mut config, &steps(path), json!(format!("{most} 1s")));
                assert!(
                    parse(&config).is_err(),
                    "{path}: more than the documented most {most} is accepted"
                );
            }
            if row.bounds.contains("> 0") {
                let (mut config, _) = accepted_in(path, &json!(default)).expect("the default");
                set(&mut config, &steps(path), json!("0s"));
                assert!(parse(&config).is_err(), "{path}: 0s is accepted");
            }
            checked += usize::from(most.is_some());
        }
    }
    assert!(checked >= 10, "{checked} durations checked");
}
