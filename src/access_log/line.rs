//! An [`Entry`] as one line: a JSON object, or space-separated text.
//!
//! JSON writes the configured fields in order and leaves out those an entry
//! does not have (a connection has no `method`); every string goes through
//! `serde_json`, so whatever a client put in a path or a header comes out
//! escaped. Text writes `-` for a missing value and quotes (JSON-style) any
//! value that is empty, is `-`, or holds a space, a quote, a backslash or a
//! control character, so each line splits on spaces into the same columns.

use std::time::Duration;

use super::{Entry, Status};
use crate::config::{LogField, LogFormat};

/// One field's value.
enum Value<'a> {
    /// Words and numbers that never need quoting or escaping.
    Plain(String),
    /// A number that JSON writes bare.
    Number(String),
    /// Text from the network (or a name from the config): escaped.
    Text(&'a str),
}

/// `entry` as one line in `format`, with `fields` in order, and a newline.
pub fn format(entry: &Entry, format: LogFormat, fields: &[LogField]) -> String {
    let mut out = String::with_capacity(320);
    match format {
        LogFormat::Json => json(entry, fields, &mut out),
        LogFormat::Text => text(entry, fields, &mut out),
    }
    out.push('\n');
    out
}

fn json(entry: &Entry, fields: &[LogField], out: &mut String) {
    out.push('{');
    let mut first = true;
    for &field in fields {
        let Some(value) = value(entry, field) else {
            continue;
        };
        if !first {
            out.push(',');
        }
        first = false;
        out.push('"');
        out.push_str(field.as_str());
        out.push_str("\":");
        match value {
            Value::Number(n) => out.push_str(&n),
            Value::Plain(s) => push_quoted(out, &s),
            Value::Text(s) => push_quoted(out, s),
        }
    }
    out.push('}');
}

fn text(entry: &Entry, fields: &[LogField], out: &mut String) {
    for (i, &field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match value(entry, field) {
            None => out.push('-'),
            Some(Value::Number(s) | Value::Plain(s)) => out.push_str(&s),
            Some(Value::Text(s)) if needs_quotes(s) => push_quoted(out, s),
            Some(Value::Text(s)) => out.push_str(s),
        }
    }
}

/// `s` as a JSON string: quoted, every quote, backslash and control
/// character escaped.
fn push_quoted(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serializing a `str` cannot fail; an empty string keeps the line whole.
        Err(_) => out.push_str("\"\""),
    }
}

fn needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s == "-"
        || s.chars()
            .any(|c| c == ' ' || c == '"' || c == '\\' || c.is_control() || c.is_whitespace())
}

fn millis(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// The value of `field` in `entry`, if it has one.
fn value(entry: &Entry, field: LogField) -> Option<Value<'_>> {
    let plain = |s: String| Some(Value::Plain(s));
    let number = |n: u64| Some(Value::Number(n.to_string()));
    let http = entry.http.as_ref();
    match field {
        LogField::Time => plain(humantime::format_rfc3339_millis(entry.time).to_string()),
        LogField::Client => plain(entry.client.to_string()),
        LogField::Listener => plain(entry.listener.to_string()),
        LogField::Backend => entry.backend.as_ref().map(|(n, _)| Value::Text(n)),
        LogField::BackendAddr => entry
            .backend
            .as_ref()
            .and_then(|(_, a)| plain(a.to_string())),
        LogField::KeyHash => plain(format!("{:016x}", entry.key_hash)),
        LogField::Key => entry.key.as_deref().map(Value::Text),
        LogField::Routed => entry.routed.and_then(|r| plain(r.to_string())),
        LogField::Status => match entry.status {
            Status::Code(code) => number(u64::from(code)),
            Status::Ended(how) => plain(how.to_string()),
        },
        LogField::BytesIn => number(entry.bytes_in),
        LogField::BytesOut => number(entry.bytes_out),
        LogField::FirstByteMs => entry.first_byte.map(|d| Value::Number(millis(d))),
        LogField::DurationMs => Some(Value::Number(millis(entry.duration))),
        LogField::Method => http.map(|h| Value::Text(&h.method)),
        LogField::Path => http.map(|h| Value::Text(&h.path)),
        LogField::Protocol => http.and_then(|h| plain(h.protocol.to_string())),
        LogField::PromptTokens => entry.tokens.and_then(|t| number(t.prompt)),
        LogField::CachedTokens => entry.tokens.and_then(|t| number(t.cached)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::access_log::{HttpRequest, Tokens};

    fn entry() -> Entry {
        Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_767_225_600_123),
            client: "127.0.0.1:50000".parse().unwrap(),
            listener: "[::1]:8080".parse().unwrap(),
            backend: Some(("gpu-a".into(), "10.0.0.1:8000".parse().unwrap())),
            key_hash: 0x2b6e5f8c3559ee21,
            key: Some("user \"0\"\n".into()),
            routed: Some("primary"),
            status: Status::Code(200),
            bytes_in: 120,
            bytes_out: 3400,
            first_byte: Some(Duration::from_micros(1500)),
            duration: Duration::from_millis(20),
            http: Some(HttpRequest {
                method: "POST".into(),
                path: "/v1/chat completions".into(),
                protocol: "HTTP/1.1",
            }),
            tokens: Some(Tokens {
                prompt: 900,
                cached: 800,
            }),
        }
    }

    #[test]
    fn json_lines_parse_and_escape_what_the_network_sent() {
        let line = format(&entry(), LogFormat::Json, &LogField::ALL);
        assert!(line.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "2026-01-01T00:00:00.123Z");
        assert_eq!(v["listener"], "[::1]:8080");
        assert_eq!(v["key_hash"], "2b6e5f8c3559ee21");
        assert_eq!(v["key"], "user \"0\"\n");
        assert_eq!(v["status"], 200);
        assert_eq!(v["first_byte_ms"], 1.5);
        assert_eq!(v["cached_tokens"], 800);
        assert_eq!(v.as_object().unwrap().len(), LogField::COUNT);
    }

    #[test]
    fn json_leaves_out_what_a_connection_lacks_and_keeps_the_order() {
        let mut e = entry();
        e.http = None;
        e.tokens = None;
        e.key = None;
        e.status = Status::Ended("aborted_by_client");
        let fields = [LogField::Status, LogField::Method, LogField::Backend];
        let line = format(&e, LogFormat::Json, &fields);
        assert_eq!(
            line,
            "{\"status\":\"aborted_by_client\",\"backend\":\"gpu-a\"}\n"
        );
    }

    #[test]
    fn text_quotes_where_needed_and_marks_missing_values() {
        let mut e = entry();
        e.tokens = None;
        let fields = [
            LogField::Time,
            LogField::Method,
            LogField::Path,
            LogField::Status,
            LogField::Key,
            LogField::CachedTokens,
            LogField::DurationMs,
        ];
        let line = format(&e, LogFormat::Text, &fields);
        assert_eq!(
            line,
            "2026-01-01T00:00:00.123Z POST \"/v1/chat completions\" 200 \"user \\\"0\\\"\\n\" - 20.000\n"
        );
        e.http.as_mut().unwrap().path = "-".into();
        let line = format(&e, LogFormat::Text, &[LogField::Path]);
        assert_eq!(line, "\"-\"\n");
    }
}
