//! A JSON request body's top-level fields, edited in place: some dropped,
//! some set, the others passed on as they were written, byte for byte (the
//! white space between them dropped). What the engine's priority
//! ([`super::engine_priority`]) and the halves of a disaggregated request
//! ([`super::disaggregation`]) write into a body.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// `body` without its top-level fields named in `drop` or `set`, then with
/// each of `set` (a name and its value as JSON text) added; `None` when the
/// body is not one JSON object (it then goes on unchanged).
pub(crate) fn edit(body: &[u8], drop: &[&str], set: &[(&str, &str)]) -> Option<Vec<u8>> {
    let Fields(fields) = serde_json::from_slice(body).ok()?;
    let extra: usize = set.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    out.push(b'{');
    let kept = fields
        .iter()
        .filter(|(name, _)| !drop.contains(&name.as_str()) && !set.iter().any(|(n, _)| n == name));
    for (name, raw) in kept {
        serde_json::to_writer(&mut out, name).ok()?;
        out.push(b':');
        out.extend_from_slice(raw.get().as_bytes());
        out.push(b',');
    }
    for (name, value) in set {
        serde_json::to_writer(&mut out, name).ok()?;
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.push(b',');
    }
    if out.len() > 1 {
        out.pop();
    }
    out.push(b'}');
    Some(out)
}

/// The top-level field `name` of the JSON object `body`, as written (the
/// last one, if written twice); `None` when it has none or is not one
/// object.
pub(crate) fn field<'a>(body: &'a [u8], name: &str) -> Option<&'a RawValue> {
    let Fields(fields) = serde_json::from_slice(body).ok()?;
    fields
        .into_iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// Whether the JSON object `body` has the top-level field `name`.
pub(crate) fn has(body: &[u8], name: &str) -> bool {
    field(body, name).is_some()
}

/// A JSON object's fields in order, each value as it was written.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
        let mut fields = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            fields.push((name, map.next_value::<&'de RawValue>()?));
        }
        Ok(Fields(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_dropped_set_and_the_rest_kept_as_written() {
        let body =
            br#"{"model":"m","stream":true,"messages":[{"content":"a \"b\" }"}],"max_tokens":90}"#;
        let out = edit(
            body,
            &["stream"],
            &[("max_tokens", "1"), ("x", "{\"a\":null}")],
        );
        assert_eq!(
            String::from_utf8(out.unwrap()).unwrap(),
            r#"{"model":"m","messages":[{"content":"a \"b\" }"}],"max_tokens":1,"x":{"a":null}}"#
        );
        assert_eq!(edit(b"{}", &["a"], &[]).unwrap(), b"{}");
        assert_eq!(edit(b"{\"a\":1}", &["a"], &[]).unwrap(), b"{}");
        assert_eq!(
            edit(b" {\"a\":1} ", &[], &[("b", "2")]).unwrap(),
            b"{\"a\":1,\"b\":2}"
        );
    }

    #[test]
    fn a_field_is_read_as_written() {
        let body = br#"{"kv_transfer_params":{"remote_port":9, "ids":[1,2]},"id":"x"}"#;
        assert_eq!(
            field(body, "kv_transfer_params").map(RawValue::get),
            Some(r#"{"remote_port":9, "ids":[1,2]}"#)
        );
        assert!(has(body, "id"));
        assert!(!has(body, "usage"));
        assert!(field(b"[1]", "id").is_none());
    }

    #[test]
    fn a_body_that_is_not_one_object_is_left_alone() {
        for body in [
            "[1,2]",
            "\"s\"",
            "{\"a\":1",
            "{\"a\":1} {}",
            "",
            "{\"a\":1,}",
        ] {
            assert_eq!(edit(body.as_bytes(), &[], &[("a", "1")]), None, "{body:?}");
        }
    }
}
