//! An [`Entry`] as one line: a JSON object, or space-separated text.
//!
//! JSON writes the configured fields in order and leaves out those an entry
//! does not have (a connection has no `method`); every string is escaped
//! as RFC 8259 asks, so whatever a client put in a path or a header comes
//! out as a valid string. Lines are bytes, written into the writer's batch
//! with no allocation per field ([`super::put`]). Text writes `-` for a missing value and quotes (JSON-style) any
//! value that is empty, is `-`, or holds a space, a quote, a backslash or a
//! control character, so each line splits on spaces into the same columns.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use super::{Entry, Status, put};
use crate::config::{LogField, LogFormat};

/// One field's value, borrowed from its entry: written straight into the
/// line, with no allocation of its own.
#[derive(Clone, Copy)]
enum Value<'a> {
    Time(SystemTime),
    Addr(SocketAddr),
    Hex(u64),
    /// A word magpie chose (a routing reason, how a connection ended).
    Word(&'static str),
    Number(u64),
    Millis(Duration),
    /// Text from the network (or a name from the config): escaped.
    Text(&'a str),
}

impl Value<'_> {
    /// Whether JSON writes it bare.
    fn is_number(self) -> bool {
        matches!(self, Value::Number(_) | Value::Millis(_))
    }

    /// The value as it is, unquoted.
    fn put(self, out: &mut Vec<u8>) {
        match self {
            Value::Time(t) => put::rfc3339_millis(out, t),
            Value::Addr(a) => put::addr(out, a),
            Value::Hex(h) => put::hex16(out, h),
            Value::Word(w) => out.extend_from_slice(w.as_bytes()),
            Value::Number(n) => put::decimal(out, n),
            Value::Millis(d) => put::millis(out, d),
            Value::Text(t) => out.extend_from_slice(t.as_bytes()),
        }
    }
}

#[cfg(test)]
/// `entry` as one line in `format`, with `fields` in order, and a newline.
pub(crate) fn format(entry: &Entry, format: LogFormat, fields: &[LogField]) -> String {
    let mut out = Vec::with_capacity(384);
    write(entry, format, fields, &mut out);
    // Every value is a `str` or ASCII made here.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`format`], appended to `out`.
pub(crate) fn write(entry: &Entry, format: LogFormat, fields: &[LogField], out: &mut Vec<u8>) {
    match format {
        LogFormat::Json => json(entry, fields, out),
        LogFormat::Text => text(entry, fields, out),
    }
    out.push(b'\n');
}

fn json(entry: &Entry, fields: &[LogField], out: &mut Vec<u8>) {
    out.push(b'{');
    let mut first = true;
    for &field in fields {
        let Some(value) = value(entry, field) else {
            continue;
        };
        if !first {
            out.push(b',');
        }
        first = false;
        out.push(b'"');
        out.extend_from_slice(field.as_str().as_bytes());
        out.extend_from_slice(b"\":");
        match value {
            v if v.is_number() => v.put(out),
            Value::Text(s) => push_quoted(out, s),
            // Addresses, times, hex and words need no escaping.
            v => {
                out.push(b'"');
                v.put(out);
                out.push(b'"');
            }
        }
    }
    out.push(b'}');
}

fn text(entry: &Entry, fields: &[LogField], out: &mut Vec<u8>) {
    for (i, &field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        match value(entry, field) {
            None => out.push(b'-'),
            Some(Value::Text(s)) if needs_quotes(s) => push_quoted(out, s),
            Some(v) => v.put(out),
        }
    }
}

/// `s` as a JSON string: quoted, every quote, backslash and control
/// character escaped (RFC 8259 §7), written straight into `out`.
fn push_quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    // Only ASCII is escaped, and no byte of a multi-byte UTF-8 character
    // is ASCII: bytes are enough.
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            b if b < 0x20 => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        if escaped.is_empty() {
            write!(out, "\\u{b:04x}").unwrap_or(());
        } else {
            out.extend_from_slice(escaped);
        }
        plain = i + 1;
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

fn needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s == "-"
        || s.chars()
            .any(|c| c == '"' || c == '\\' || c.is_control() || c.is_whitespace())
}

/// The value of `field` in `entry`, if it has one.
fn value(entry: &Entry, field: LogField) -> Option<Value<'_>> {
    let http = entry.http.as_ref();
    Some(match field {
        LogField::Time => Value::Time(entry.time),
        LogField::Client => Value::Addr(entry.client),
        LogField::Listener => Value::Addr(entry.listener),
        LogField::Backend => Value::Text(&entry.backend.as_ref()?.0),
        LogField::BackendAddr => Value::Addr(entry.backend.as_ref()?.1),
        LogField::KeyHash => Value::Hex(entry.key_hash),
        LogField::Key => Value::Text(entry.key.as_deref()?),
        LogField::Routed => Value::Word(entry.routed?),
        LogField::Status => match entry.status {
            Status::Code(code) => Value::Number(u64::from(code)),
            Status::Ended(how) => Value::Word(how),
        },
        LogField::BytesIn => Value::Number(entry.bytes_in),
        LogField::BytesOut => Value::Number(entry.bytes_out),
        LogField::FirstByteMs => Value::Millis(entry.first_byte?),
        LogField::QueueMs => Value::Millis(entry.queued?),
        LogField::Queue => Value::Word(entry.queue?),
        LogField::Split => Value::Word(entry.split.as_ref()?.0),
        LogField::PrefillBackend => Value::Text(entry.split.as_ref()?.1.as_deref()?),
        LogField::DurationMs => Value::Millis(entry.duration),
        LogField::Method => Value::Text(&http?.method),
        LogField::Path => Value::Text(&http?.path),
        LogField::Protocol => Value::Word(http?.protocol),
        LogField::PromptTokens => Value::Number(entry.tokens?.prompt),
        LogField::CachedTokens => Value::Number(entry.tokens?.cached),
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::telemetry::access_log::{HttpRequest, Tokens};

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
            queued: Some(Duration::from_millis(20)),
            queue: Some("waited"),
            split: Some(("split", Some("gpu-p".to_string()))),
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
    fn quoted_text_reads_back_as_itself() {
        let mut all_controls: String = (0u8..0x20).map(char::from).collect();
        all_controls.push('\u{7f}');
        for s in [
            "",
            "plain",
            "a \"quoted\" \\ back\\slash",
            "line\nbreak\r\ttab",
            &all_controls,
            "ünïcødé → 🐦 and \u{2028}",
            "\"",
        ] {
            let mut out = Vec::new();
            push_quoted(&mut out, s);
            let out = String::from_utf8(out).unwrap();
            let back: String = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
            assert_eq!(back, s, "{out}");
        }
    }

    #[test]
    fn millis_keep_three_decimals() {
        let mut out = Vec::new();
        Value::Millis(Duration::from_micros(1_234_567)).put(&mut out);
        out.push(b' ');
        Value::Millis(Duration::from_micros(5)).put(&mut out);
        assert_eq!(out, b"1234.567 0.005");
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
        assert_eq!(v["split"], "split");
        assert_eq!(v["prefill_backend"], "gpu-p");
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
