//! The operator files in `deploy/`: the systemd unit verifies and gives magpie
//! what it needs, the Kubernetes ConfigMap holds a config `magpie check`
//! accepts and the Deployment drains it in time, the NetworkPolicy keeps all
//! but Prometheus off the admin port, the Prometheus alerts pass
//! their unit tests, and the Grafana dashboard's queries parse and use only
//! metrics magpie exports.
//!
//! promtool comes from the Debian package `prometheus`, systemd-analyze from
//! `systemd`; a test that cannot find its tool fails naming the package.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use magpie_proxy::config::{Config, DEFAULT_MAX_CONNECTIONS, DEFAULT_SHUTDOWN_GRACE, Mode};

use crate::support::*;

/// Labels every scraped series has (added by Prometheus), and histogram buckets'.
const ALWAYS_THERE_LABELS: &[&str] = &["instance", "job", "le"];

/// magpie needs 2 x max_connections + its splice pipes + this many file descriptors.
const FD_MARGIN: u64 = 64;

const ALERTS: &[&str] = &[
    "MagpieBackendDown",
    "MagpieAllBackendsDown",
    "MagpieReloadFailing",
    "MagpieSpillRateHigh",
    "MagpieFleetDisagreement",
    "MagpieFdsNearLimit",
    "MagpieCacheHitRatioFalling",
    "MagpiePanics",
    "MagpieCertificateExpiringSoon",
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn read(relative: &str) -> String {
    let path = deploy_dir().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str::<Value>(&read(relative))
        .unwrap_or_else(|e| panic!("deploy/{relative} is not valid YAML: {e}"))
}

/// `tool` as found on PATH.
fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

fn promtool() -> PathBuf {
    on_path("promtool").unwrap_or_else(|| {
        panic!(
            "promtool is not on PATH: install the Debian package prometheus \
             (script/test does)"
        )
    })
}

fn describe(command: &Command, out: &Output) -> String {
    format!(
        "{command:?} exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `command`, failing the test with its output unless it succeeds.
fn succeeds(mut command: Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(out.status.success(), "{}", describe(&command, &out));
    out
}

fn get<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    let mut at = value;
    for (i, key) in path.iter().enumerate() {
        at = match at {
            Value::Object(map) => map.get(*key),
            Value::Array(list) => key.parse::<usize>().ok().and_then(|n| list.get(n)),
            _ => None,
        }
        .unwrap_or_else(|| panic!("no {} in {value:#}", path[..=i].join(".")));
    }
    at
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    get(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("{} is not a string", path.join(".")))
}

fn u64_at(value: &Value, path: &[&str]) -> u64 {
    get(value, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{} is not a whole number", path.join(".")))
}

// ------------------------------------------------------------------ systemd

/// The unit's `Key=value` lines, every value of each key in file order.
fn unit_keys(unit: &str) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a Key=value line in the unit: {line:?}"));
        keys.entry(key.trim().to_string())
            .or_default()
            .push(value.trim().to_string());
    }
    keys
}

#[test]
fn systemd_unit_verifies_and_gives_magpie_what_it_needs() {
    let unit = read("systemd/magpie.service");
    let keys = unit_keys(&unit);
    let one = |key: &str| -> &str {
        match keys.get(key).map(Vec::as_slice) {
            Some([value]) => value,
            other => panic!("the unit should set {key} once, found {other:?}"),
        }
    };

    assert_eq!(
        one("ExecStart"),
        "/usr/local/bin/magpie run --config /etc/magpie/magpie.yaml"
    );
    let reload = one("ExecReload");
    assert!(
        reload.contains("-HUP") && reload.contains("$MAINPID"),
        "ExecReload must send SIGHUP to magpie: {reload}"
    );
    assert_eq!(one("KillSignal"), "SIGTERM");
    // A binary upgrade tells systemd the new main PID.
    assert_eq!(one("NotifyAccess"), "all");
    let stop = humantime::parse_duration(one("TimeoutStopSec"))
        .unwrap_or_else(|e| panic!("TimeoutStopSec: {e}"));
    assert!(
        stop > DEFAULT_SHUTDOWN_GRACE,
        "TimeoutStopSec {stop:?} must exceed the default shutdown_grace {DEFAULT_SHUTDOWN_GRACE:?}, or SIGKILL cuts the drain"
    );
    let nofile: u64 = one("LimitNOFILE")
        .parse()
        .unwrap_or_else(|e| panic!("LimitNOFILE: {e}"));
    let pipes = magpie_proxy::testing::SPLICE_PIPE_FDS;
    let needed = 2 * DEFAULT_MAX_CONNECTIONS + pipes + FD_MARGIN;
    assert!(
        nofile >= needed,
        "LimitNOFILE {nofile} is below 2 x max_connections + {pipes} + {FD_MARGIN} = {needed}"
    );
    for key in ["AmbientCapabilities", "CapabilityBoundingSet"] {
        assert!(
            one(key)
                .split_whitespace()
                .any(|c| c == "CAP_NET_BIND_SERVICE"),
            "{key} must hold CAP_NET_BIND_SERVICE"
        );
    }
    assert!(
        keys.get("DynamicUser").is_some_and(|v| v == &["yes"]) || keys.contains_key("User"),
        "the unit must not run magpie as root: DynamicUser=yes or User="
    );
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("ConfigurationDirectory"), "magpie");
    assert_eq!(one("Restart"), "on-failure");
    // Exit status 2 (connections cut at shutdown) stays a failure, and never
    // restarts magpie: it only follows a stop signal.
    assert!(
        !keys
            .get("SuccessExitStatus")
            .is_some_and(|v| v.iter().any(|s| s.split_whitespace().any(|c| c == "2"))),
        "the unit comments why exit status 2 is not a success"
    );
    assert_eq!(one("RestartPreventExitStatus"), "2");

    let analyze = on_path("systemd-analyze").unwrap_or_else(|| {
        panic!(
            "systemd-analyze is not on PATH: install the Debian package systemd \
             (script/test does)"
        )
    });
    // verify wants ExecStart's binary to exist: point it at the one Cargo built.
    let copy = TempFile::new(
        "magpie.service",
        &unit.replace("/usr/local/bin/magpie", magpie_bin()),
    );
    // The socket unit beside it: systemd pairs magpie.socket with magpie.service.
    let socket = read("systemd/magpie.socket");
    let socket_path = copy.path.with_file_name("magpie.socket");
    std::fs::write(&socket_path, &socket).expect("write the socket unit");
    let mut command = Command::new(analyze);
    command.arg("verify").arg(&socket_path).arg(&copy.path);
    let out = succeeds(command);
    // Unknown keys and bad values are only warnings to verify: fail on those too.
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let about_the_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("magpie.service") || l.contains("magpie.socket"))
        .collect();
    assert!(
        about_the_unit.is_empty(),
        "systemd-analyze verify complains about the unit:\n{}",
        about_the_unit.join("\n")
    );
    // The socket is the example config's listener, so the two files work together.
    let socket_keys = unit_keys(&socket);
    let config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/magpie.yaml"))
            .expect("read config/magpie.yaml");
    let listen = (config.lines())
        .find_map(|l| l.strip_prefix("listen:"))
        .map(str::trim)
        .expect("config/magpie.yaml has a listen line");
    assert_eq!(
        socket_keys.get("ListenStream").map(Vec::as_slice),
        Some(&[listen.to_string()][..]),
        "magpie.socket listens where config/magpie.yaml does"
    );
}

// --------------------------------------------------------------- kubernetes

/// The seconds of the container's preStop sleep, exec `sleep N` or `sleep: {seconds: N}`.
fn pre_stop_sleep(container: &Value) -> u64 {
    let pre_stop = get(container, &["lifecycle", "preStop"]);
    if let Some(seconds) = pre_stop.pointer("/sleep/seconds") {
        return seconds.as_u64().expect("preStop.sleep.seconds is a number");
    }
    let command: Vec<&str> = get(pre_stop, &["exec", "command"])
        .as_array()
        .expect("preStop.exec.command is a list")
        .iter()
        .map(|c| c.as_str().expect("a command word"))
        .collect();
    match command.as_slice() {
        [sleep, seconds] if sleep.ends_with("sleep") => seconds
            .parse()
            .unwrap_or_else(|e| panic!("preStop sleep {seconds:?}: {e}")),
        other => panic!("preStop should be a sleep, found {other:?}"),
    }
}

#[test]
fn kubernetes_config_checks_and_the_deployment_drains_in_time() {
    let configmap = yaml("kubernetes/configmap.yaml");
    assert_eq!(str_at(&configmap, &["kind"]), "ConfigMap");
    let config_text = str_at(&configmap, &["data", "magpie.yaml"]);
    let file = TempFile::new("magpie.yaml", config_text);
    let mut check = Command::new(magpie_bin());
    check
        .args(["check", "--config"])
        .arg(&file.path)
        .env("RUST_LOG", "warn");
    let out = succeeds(check);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fingerprint"),
        "check prints the table summary: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("warning: idle_timeout"),
        "mode http's idle connections are closed by http.keepalive_timeout"
    );
    let config = Config::parse_offline(&file.path, config_text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.mode, Mode::Http);
    assert_eq!(
        config.listen,
        vec!["0.0.0.0:7000".parse().expect("an address")]
    );
    assert_eq!(
        config.admin,
        Some("0.0.0.0:9090".parse().expect("an address"))
    );
    assert!(config.health.is_some(), "health checks are on");
    assert!(
        config.reload.watch,
        "the ConfigMap's symlink swaps reload it"
    );

    let deployment = yaml("kubernetes/deployment.yaml");
    assert_eq!(str_at(&deployment, &["kind"]), "Deployment");
    let pod = get(&deployment, &["spec", "template"]);
    let container = get(pod, &["spec", "containers", "0"]);
    let grace = u64_at(pod, &["spec", "terminationGracePeriodSeconds"]);
    let sleep = pre_stop_sleep(container);
    assert!(
        (1..=15).contains(&sleep),
        "preStop sleeps a few seconds, not {sleep}"
    );
    // The kubelet's grace period runs from the preStop hook on.
    assert!(
        Duration::from_secs(grace) > config.shutdown_grace + Duration::from_secs(sleep),
        "terminationGracePeriodSeconds {grace} must exceed the preStop sleep ({sleep}s) \
         plus shutdown_grace ({:?})",
        config.shutdown_grace
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(str_at(container, &[probe, "httpGet", "path"]), path);
        assert_eq!(u64_at(container, &[probe, "httpGet", "port"]), 9090);
    }
    assert_eq!(
        get(container, &["args"]),
        &serde_json::json!(["run", "--config", "/etc/magpie/magpie.yaml"])
    );
    let mounts = get(container, &["volumeMounts"])
        .as_array()
        .expect("volumeMounts is a list");
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"] == "/etc/magpie")
        .expect("the config is mounted at /etc/magpie");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap updates: mount the directory"
    );
    let volume_name = str_at(mount, &["name"]);
    let volume = get(pod, &["spec", "volumes"])
        .as_array()
        .expect("volumes is a list")
        .iter()
        .find(|v| v["name"] == volume_name)
        .unwrap_or_else(|| panic!("no volume {volume_name}"));
    assert_eq!(
        get(volume, &["configMap", "name"]),
        get(&configmap, &["metadata", "name"])
    );
    let run_as_non_root = container
        .pointer("/securityContext/runAsNonRoot")
        .or_else(|| pod.pointer("/spec/securityContext/runAsNonRoot"));
    assert_eq!(run_as_non_root, Some(&Value::Bool(true)));
    assert_eq!(
        get(container, &["securityContext", "readOnlyRootFilesystem"]),
        &Value::Bool(true)
    );
    for side in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            get(container, &["resources", side, resource]);
        }
    }
    let annotations = get(pod, &["metadata", "annotations"]);
    assert_eq!(str_at(annotations, &["prometheus.io/scrape"]), "true");
    assert_eq!(str_at(annotations, &["prometheus.io/port"]), "9090");
    assert_eq!(str_at(annotations, &["prometheus.io/path"]), "/metrics");

    let service = yaml("kubernetes/service.yaml");
    assert_eq!(str_at(&service, &["kind"]), "Service");
    let ports: BTreeSet<u64> = get(&service, &["spec", "ports"])
        .as_array()
        .expect("ports is a list")
        .iter()
        .map(|p| p["port"].as_u64().expect("a port number"))
        .collect();
    assert_eq!(ports, BTreeSet::from([7000, 9090]));
    let selector = get(&service, &["spec", "selector"])
        .as_object()
        .expect("a selector");
    let pod_labels = get(pod, &["metadata", "labels"]);
    for (label, value) in selector {
        assert_eq!(
            &pod_labels[label], value,
            "the Service selects {label}={value}, the pods do not carry it"
        );
    }

    let headless_text = read("kubernetes/headless-service.yaml");
    let headless = yaml("kubernetes/headless-service.yaml");
    assert_eq!(str_at(&headless, &["kind"]), "Service");
    assert_eq!(str_at(&headless, &["spec", "clusterIP"]), "None");
    let entry = "{dns: \"vllm.default.svc.cluster.local:8000\"}";
    assert!(
        headless_text.contains(entry),
        "the headless Service should show the backend entry {entry} that reads it"
    );
    assert_eq!(str_at(&headless, &["metadata", "name"]), "vllm");
    assert_eq!(str_at(&headless, &["metadata", "namespace"]), "default");
    assert_eq!(u64_at(&headless, &["spec", "ports", "0", "port"]), 8000);
}

// --------------------------------------------------------------- prometheus

#[test]
fn prometheus_alerts_check_and_pass_their_unit_tests() {
    let dir = deploy_dir().join("prometheus");
    let promtool = promtool();
    let mut check = Command::new(&promtool);
    check.args(["check", "rules"]).arg(dir.join("alerts.yaml"));
    succeeds(check);
    let mut test = Command::new(&promtool);
    test.args(["test", "rules"])
        .arg(dir.join("alerts_test.yaml"));
    succeeds(test);

    // Each alert is there, labelled and described, and tested both ways.
    let rules = yaml("prometheus/alerts.yaml");
    let mut found = Vec::new();
    for group in get(&rules, &["groups"]).as_array().expect("a list") {
        for rule in get(group, &["rules"]).as_array().expect("a list") {
            let name = str_at(rule, &["alert"]);
            for path in [
                ["labels", "severity"],
                ["annotations", "summary"],
                ["annotations", "description"],
            ] {
                assert!(
                    !str_at(rule, &path).is_empty(),
                    "{name} has no {}",
                    path.join(".")
                );
            }
            found.push(name.to_string());
        }
    }
    assert_eq!(found, ALERTS, "the alerts in deploy/prometheus/alerts.yaml");

    let tests = yaml("prometheus/alerts_test.yaml");
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in get(&tests, &["tests"]).as_array().expect("a list") {
        for rule_test in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = str_at(rule_test, &["alertname"]).to_string();
            match rule_test.get("exp_alerts").and_then(Value::as_array) {
                Some(alerts) if !alerts.is_empty() => firing.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    for alert in ALERTS {
        assert!(firing.contains(*alert), "no test sees {alert} fire");
        assert!(quiet.contains(*alert), "no test sees {alert} stay quiet");
    }
}

#[test]
fn prometheus_alerts_use_only_metrics_magpie_exports() {
    let rules = yaml("prometheus/alerts.yaml");
    let exprs: Vec<String> = get(&rules, &["groups"])
        .as_array()
        .expect("a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a list"))
        .map(|r| str_at(r, &["expr"]).to_string())
        .collect();
    assert_eq!(exprs.len(), ALERTS.len());
    assert_exported(&exprs, "deploy/prometheus/alerts.yaml");
}

// ------------------------------------------------------------------ grafana

/// Every `"expr"` string anywhere in `value`: panel targets (rows' nested
/// panels included) and annotation queries.
fn exprs_in(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs_in(v, out),
                }
            }
        }
        Value::Array(list) => list.iter().for_each(|v| exprs_in(v, out)),
        _ => {}
    }
}

/// Every panel, rows' nested panels included.
fn panels_in(panels: &Value, out: &mut Vec<Value>) {
    for panel in panels.as_array().expect("panels is a list") {
        out.push(panel.clone());
        if let Some(nested) = panel.get("panels") {
            panels_in(nested, out);
        }
    }
}

/// `expr` with Grafana's variables replaced by values PromQL accepts:
/// intervals by durations, anything else (`$instance`, `${instance:regex}`)
/// by a plain word, which only parses inside a label matcher's string.
fn concrete(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
            let inner = &braced[..end];
            (inner.split(':').next().unwrap_or(inner), end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(match name {
            "__rate_interval" => "5m",
            "__interval" => "1m",
            "__range" => "1h",
            "" => panic!("a lone $ in {expr}"),
            _ => "x",
        });
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

#[test]
fn grafana_dashboard_queries_parse_and_use_only_metrics_magpie_exports() {
    let text = read("grafana/magpie.json");
    let dashboard: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("deploy/grafana/magpie.json is not JSON: {e}"));
    assert!(u64_at(&dashboard, &["schemaVersion"]) >= 39);

    let variables = get(&dashboard, &["templating", "list"])
        .as_array()
        .expect("a list");
    let variable = |name: &str| -> &Value {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no template variable {name}"))
    };
    let datasource = variable("DS_PROMETHEUS");
    assert_eq!(str_at(datasource, &["type"]), "datasource");
    assert_eq!(str_at(datasource, &["query"]), "prometheus");
    let instance = variable("instance");
    assert_eq!(
        str_at(instance, &["query", "query"]),
        "label_values(magpie_table_version, instance)"
    );

    let mut panels = Vec::new();
    panels_in(get(&dashboard, &["panels"]), &mut panels);
    let mut ids = BTreeSet::new();
    for panel in &panels {
        let id = u64_at(panel, &["id"]);
        assert!(ids.insert(id), "two panels have the id {id}");
        if panel["type"] == "row" {
            continue;
        }
        let title = str_at(panel, &["title"]);
        let targets = get(panel, &["targets"]).as_array().expect("a list");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            assert_eq!(
                str_at(target, &["datasource", "uid"]),
                "${DS_PROMETHEUS}",
                "panel {title:?} should query the chosen data source"
            );
            assert!(
                target["expr"].is_string(),
                "panel {title:?} has a target without expr"
            );
        }
    }

    let mut exprs = Vec::new();
    exprs_in(&dashboard, &mut exprs);
    assert!(exprs.len() > 20, "only {} queries found", exprs.len());
    for expr in &exprs {
        assert!(
            expr.contains("$instance"),
            "every query follows the instance variable: {expr}"
        );
    }

    // promtool parses every query: one recording rule each, written as JSON
    // (which is YAML).
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": concrete(e)}))
        .collect();
    let file = TempFile::new(
        "dashboard_rules.yaml",
        &serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
    );
    let mut check = Command::new(promtool());
    check.args(["check", "rules"]).arg(&file.path);
    let out = check
        .output()
        .unwrap_or_else(|e| panic!("cannot run {check:?}: {e}"));
    if !out.status.success() {
        let listing: Vec<String> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| format!("dashboard:query_{i} = {e}"))
            .collect();
        panic!(
            "a dashboard query does not parse:\n{}\n--- queries ---\n{}",
            describe(&check, &out),
            listing.join("\n")
        );
    }

    let mut with_variable = exprs.clone();
    with_variable.push(str_at(instance, &["query", "query"]).to_string());
    assert_exported(&with_variable, "deploy/grafana/magpie.json");
}

// ------------------------------------------------- what magpie really exports

/// The families on a running magpie's `/metrics` (mode http, sessions on,
/// one backend), each with the label names its samples carry.
fn exported_families() -> BTreeMap<String, BTreeSet<String>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // A listener that terminates TLS, so the certificate families have series.
    let certs = TempFile::new("placeholder", "");
    let dir = certs.path.parent().expect("a temp file has a directory");
    let (cert, key) = TestCa::new().issue(&["a.test"]).write(dir, "site");
    let text = runtime.block_on(async {
        let yaml = format!(
            "mode: http\nlisten:\n  - {{addr: 127.0.0.1:0, tls: {{cert: \"{}\", key: \"{}\"}}}}\n\
             admin: 127.0.0.1:0\nsessions:\n  ttl: 1m\n\
             backends:\n  - {{name: a, addr: \"{}\"}}\n",
            cert.display(),
            key.display(),
            dead_addr()
        );
        let magpie = Magpie::start(&yaml).await;
        let (status, text) = admin_get(magpie.admin.expect("admin is on"), "/metrics").await;
        assert_eq!(status, 200);
        magpie.stop().await;
        text
    });
    let mut families: BTreeMap<String, BTreeSet<String>> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let name = l.split_whitespace().next().expect("a name after # TYPE");
            (name.to_string(), BTreeSet::new())
        })
        .collect();
    assert!(!families.is_empty(), "no # TYPE line in:\n{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition parses");
    for sample in &scrape.samples {
        if let Some(labels) = families.get_mut(&sample.metric) {
            labels.extend(sample.labels.keys().cloned());
        }
    }
    families
}

/// The metric names in `expr`: words starting `magpie_` or `process_`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = BTreeSet::new();
    for (at, _) in expr.char_indices() {
        if at > 0 && word(bytes[at - 1]) {
            continue;
        }
        let rest = &expr[at..];
        if !(rest.starts_with("magpie_") || rest.starts_with("process_")) {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(rest.len());
        names.insert(rest[..end].to_string());
    }
    names
}

/// The label names `expr` uses: in matchers (`{a="x"}`) and in `by`,
/// `without`, `on`, `ignoring`, `group_left` and `group_right` lists.
fn label_names(expr: &str) -> BTreeSet<String> {
    // Blank out string literals first, so nothing inside them counts.
    let mut plain = String::with_capacity(expr.len());
    let mut quote = None;
    let mut escaped = false;
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                    plain.push(c);
                    continue;
                }
                plain.push(' ');
            }
            None => {
                if c == '"' || c == '\'' || c == '`' {
                    quote = Some(c);
                }
                plain.push(c);
            }
        }
    }
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut labels = BTreeSet::new();
    let add_list = |list: &str, labels: &mut BTreeSet<String>| {
        for item in list.split(',') {
            let name: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() && name != "__name__" {
                labels.insert(name);
            }
        }
    };
    // Matchers: `{name op "value", ...}`.
    let mut rest = plain.as_str();
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .unwrap_or_else(|| panic!("unclosed {{ in {expr}"))
            + open;
        add_list(&rest[open + 1..close], &mut labels);
        rest = &rest[close + 1..];
    }
    // Label lists after a keyword.
    for keyword in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        for (at, _) in plain.match_indices(keyword) {
            let after = &plain[at + keyword.len()..];
            let alone = !plain[..at].ends_with(is_ident) && !after.starts_with(is_ident);
            if let Some(list) = after.trim_start().strip_prefix('(')
                && alone
            {
                let end = list
                    .find(')')
                    .unwrap_or_else(|| panic!("unclosed ( in {expr}"));
                add_list(&list[..end], &mut labels);
            }
        }
    }
    labels
}

/// Every metric name in `exprs` is a family magpie exports (histogram series
/// by their family's name), and every label they use is one of theirs.
fn assert_exported(exprs: &[String], file: &str) {
    let families = exported_families();
    let family_of = |name: &str| -> Option<String> {
        if families.contains_key(name) {
            return Some(name.to_string());
        }
        ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|base| families.contains_key(*base))
            .map(str::to_string)
    };
    let mut problems = Vec::new();
    for expr in exprs {
        let mut allowed: BTreeSet<String> =
            ALWAYS_THERE_LABELS.iter().map(|l| l.to_string()).collect();
        let names = metric_names(expr);
        for name in &names {
            match family_of(name) {
                Some(family) => {
                    allowed.extend(families.get(&family).into_iter().flatten().cloned());
                }
                None => problems.push(format!("{name} is not exported, in: {expr}")),
            }
        }
        if names.is_empty() {
            problems.push(format!("no magpie metric in: {expr}"));
        }
        for label in label_names(expr) {
            if !allowed.contains(&label) {
                problems.push(format!("label {label} is not on {names:?}, in: {expr}"));
            }
        }
    }
    assert!(problems.is_empty(), "{file}:\n{}", problems.join("\n"));
}

#[test]
fn deploy_query_helpers_find_names_labels_and_variables() {
    let expr = r#"histogram_quantile(0.99, sum by (backend, le) (rate(magpie_backend_time_to_first_byte_seconds_bucket{instance=~"$instance", code_class!="by (x)"}[$__rate_interval]))) / on (job) group_left (zone) process_open_fds"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from([
            "magpie_backend_time_to_first_byte_seconds_bucket".to_string(),
            "process_open_fds".to_string()
        ])
    );
    assert_eq!(
        label_names(expr),
        ["backend", "code_class", "instance", "job", "le", "zone"]
            .into_iter()
            .map(str::to_string)
            .collect()
    );
    assert_eq!(
        concrete(
            r#"rate(m{instance=~"${instance:regex}", a="$a"}[$__rate_interval]) offset $__interval"#
        ),
        r#"rate(m{instance=~"x", a="x"}[5m]) offset 1m"#
    );
}

#[test]
fn the_network_policy_admits_clients_to_the_proxy_port_and_only_prometheus_to_admin() {
    let config_text =
        str_at(&yaml("kubernetes/configmap.yaml"), &["data", "magpie.yaml"]).to_string();
    let file = TempFile::new("magpie.yaml", &config_text);
    let config = Config::parse_offline(&file.path, &config_text).unwrap_or_else(|e| panic!("{e}"));
    let proxy = u64::from(config.listen[0].port());
    let admin = u64::from(config.admin.expect("admin is on").port());
    let policy = yaml("kubernetes/networkpolicy.yaml");
    assert_eq!(str_at(&policy, &["kind"]), "NetworkPolicy");
    let deployment = yaml("kubernetes/deployment.yaml");
    let pod_labels = get(&deployment, &["spec", "template", "metadata", "labels"]);
    let selector = get(&policy, &["spec", "podSelector", "matchLabels"])
        .as_object()
        .expect("matchLabels");
    for (label, value) in selector {
        assert_eq!(
            &pod_labels[label], value,
            "the policy selects {label}={value}"
        );
    }
    let rules = get(&policy, &["spec", "ingress"])
        .as_array()
        .expect("ingress rules");
    let admitting = |port: u64| {
        rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["port"].as_u64() == Some(port)))
            })
            .collect::<Vec<_>>()
    };
    let proxy_rules = admitting(proxy);
    assert_eq!(proxy_rules.len(), 1);
    assert!(
        proxy_rules[0].get("from").is_none(),
        "clients come from anywhere"
    );
    let admin_rules = admitting(admin);
    assert_eq!(admin_rules.len(), 1);
    let from = admin_rules[0]["from"]
        .as_array()
        .expect("admin is admitted from somewhere");
    assert!(!from.is_empty());
    assert!(
        from.iter()
            .all(|peer| peer.get("namespaceSelector").is_some()),
        "only the monitoring namespace reaches admin: {from:?}"
    );
    // The probes and scrape annotations point at the port the policy guards.
    let annotations = get(
        &deployment,
        &["spec", "template", "metadata", "annotations"],
    );
    assert_eq!(
        str_at(annotations, &["prometheus.io/port"]),
        admin.to_string()
    );
}
