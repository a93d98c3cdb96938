//! The human-readable report `magpie simulate` prints without `--json`.

use super::experiment::Hot;
use super::report::{ChangeKind, ReplicaReport, Report};

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

/// The human-readable report: the headline and the moves table, then a
/// section for each option that asked for one.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    push_moves(&mut out, report);
    if report.change == ChangeKind::Remove {
        push_removed_keys(&mut out, report);
    }
    if report.rows.iter().any(|r| !r.weights.is_empty()) {
        push_weights(&mut out, report);
    }
    if let Some(hot) = report.hot {
        push_hot(&mut out, report, hot);
    }
    if let Some(rep) = &report.replicas {
        push_replicas(&mut out, report, rep);
    }
    out
}

/// The headline (keys, nodes, the change) and per scheme the share moved,
/// whether only the minimum moved, and max/mean keys before and after.
fn push_moves(out: &mut String, report: &Report) {
    let last_key = report.keys - 1;
    let what = match report.change {
        ChangeKind::Add => format!("node {} joins", report.node),
        ChangeKind::Remove => format!("node {} leaves", report.node),
    };
    out.push_str(&format!(
        "{} keys (user:0 … user:{last_key}) on {} nodes, then {what}\n\n",
        report.keys, report.nodes_before
    ));
    let minimal = if report.change == ChangeKind::Add {
        "only to new"
    } else {
        "only its keys"
    };
    out.push_str(&format!(
        "{:<13} {:>8}  {:<13} {:>15} {:>14}\n",
        "scheme", "moved", minimal, "max/mean before", "max/mean after"
    ));
    for row in &report.rows {
        out.push_str(&format!(
            "{:<13} {:>8}  {:<13} {:>15.3} {:>14.3}\n",
            row.scheme,
            pct(row.moved),
            if row.only_to_new { "yes" } else { "no" },
            row.peak_before,
            row.peak_after
        ));
    }
}

/// `--remove`: per scheme, how many of the removed node's keys each
/// remaining node received.
fn push_removed_keys(out: &mut String, report: &Report) {
    out.push_str(&format!(
        "\nwhere node {}'s keys went (keys per receiving node)\n",
        report.node
    ));
    if let Some(first) = report.rows.first().and_then(|r| r.went_to.as_ref()) {
        out.push_str(&format!("{:<13}", "scheme"));
        for r in first {
            out.push_str(&format!(" {:>6}", r.node));
        }
        out.push('\n');
    }
    for row in &report.rows {
        out.push_str(&format!("{:<13}", row.scheme));
        for r in row.went_to.iter().flatten() {
            out.push_str(&format!(" {:>6}", r.keys));
        }
        out.push('\n');
    }
}

/// `--weight`: per scheme, each weighted node's keys before and after, and
/// those keys in units of the pool's keys per unit of weight.
fn push_weights(out: &mut String, report: &Report) {
    out.push_str("\nweighted nodes: keys, and keys over the pool's keys per unit of weight (a weight-W node should show about W)\n");
    for row in &report.rows {
        let mut line = format!("{:<13}", row.scheme);
        for w in &row.weights {
            line.push_str(&format!(
                "  node {} (w={}): before {}, after {}",
                w.node,
                w.weight,
                weight_side(w.keys_before, w.units_before),
                weight_side(w.keys_after, w.units_after)
            ));
        }
        if row.uses_weights == Some(false) {
            line.push_str("  (ignores weights)");
        }
        out.push_str(&line);
        out.push('\n');
    }
}

/// A weighted node's keys and units on one side of the change, or `absent`.
fn weight_side(keys: Option<u64>, units: Option<f64>) -> String {
    match (keys, units) {
        (Some(k), Some(u)) => format!("{k} keys = {u:.2}x"),
        _ => "absent".to_string(),
    }
}

/// `--hot` (and `--salt`): per scheme, the peak request load over the mean
/// before and after, plain and with hot keys salted.
fn push_hot(out: &mut String, report: &Report, hot: Hot) {
    out.push_str(&format!(
        "\nhot keys: every {}th key (fraction {}) carries {}x load; peak request load over the mean\n",
        hot.every, hot.fraction, hot.factor
    ));
    let salted = report.salt.map(|k| format!("salted into {k}"));
    out.push_str(&format!(
        "{:<13} {:>12} {:>12}",
        "scheme", "before", "after"
    ));
    if let Some(s) = &salted {
        out.push_str(&format!("   {s}: {:>8} {:>8}", "before", "after"));
    }
    out.push('\n');
    for row in &report.rows {
        out.push_str(&format!(
            "{:<13} {:>12.3} {:>12.3}",
            row.scheme,
            row.load_peak_before.unwrap_or(0.0),
            row.load_peak_after.unwrap_or(0.0)
        ));
        if let (Some(s), Some(b), Some(a)) = (
            &salted,
            row.salted_load_peak_before,
            row.salted_load_peak_after,
        ) {
            out.push_str(&format!("   {:>w$} {b:>8.3} {a:>8.3}", "", w = s.len() + 1));
        }
        out.push('\n');
    }
}

/// `--replicas` and `--zones`: how many replica sets the zone rule changed,
/// and max/mean replicas per node without and with it.
fn push_replicas(out: &mut String, report: &Report, rep: &ReplicaReport) {
    out.push_str(&format!(
        "\nreplicas: {} per key on ring-100 over the {} nodes before, zone = node mod {}\n\
         zone rule changed the replica set of {} keys ({}); max/mean replicas per node {:.3} plain, {:.3} zoned\n",
        rep.replicas,
        report.nodes_before,
        rep.zones,
        rep.changed_keys,
        pct(rep.changed),
        rep.peak_plain,
        rep.peak_zoned
    ));
}
