//! A key from a field of a JSON request body (`key.body_field`), such as
//! `prompt_cache_key`, `user`, or `/metadata/session_id`.
//!
//! Pure: the HTTP path buffers the body (up to `key.max_bytes`) and asks
//! [`json_field_key`]. The body is streamed through serde_json once, with a
//! seed that follows only the path: every other value is skipped without
//! being built, so a 1 MiB chat body costs one pass and no allocation beyond
//! the escaped strings it meets on the path. The whole body must be valid
//! JSON; anything else falls back.
//!
//! A string value is the key exactly as a header with that text would be
//! (trimmed, then `h64`), so a client may send the same session ID in either
//! place. A number is keyed by its JSON text as written (`42`, `4.5e3`).

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{FallbackReason, text_key};

/// Where the key is in a JSON body: one top-level field name, or a JSON
/// pointer (RFC 6901) such as `/metadata/session_id` or `/messages/0/content`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    /// As written in the config, for messages.
    pub text: String,
    /// The reference tokens, unescaped (`~1` is `/`, `~0` is `~`).
    steps: Vec<String>,
}

/// Why a body field setting is not a usable path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    #[error("is empty")]
    Empty,
    #[error(
        "is a JSON pointer with an empty step or a bad escape (write e.g. /metadata/session_id)"
    )]
    BadPointer,
}

impl FieldPath {
    /// A field name, or a JSON pointer when `text` starts with `/`.
    pub fn parse(text: &str) -> Result<FieldPath, FieldPathError> {
        let steps = match text.strip_prefix('/') {
            None if text.is_empty() => return Err(FieldPathError::Empty),
            None => vec![text.to_string()],
            Some(pointer) => pointer
                .split('/')
                .map(unescape)
                .collect::<Option<Vec<String>>>()
                .filter(|steps| steps.iter().all(|s| !s.is_empty()))
                .ok_or(FieldPathError::BadPointer)?,
        };
        Ok(FieldPath {
            text: text.to_string(),
            steps,
        })
    }
}

/// RFC 6901 unescaping of one reference token; `None` for a stray `~`.
fn unescape(token: &str) -> Option<String> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        match c {
            '~' => match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// The key in `body` at `path`, or why there is none.
pub fn json_field_key(body: &[u8], path: &FieldPath) -> Result<u64, FallbackReason> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Follow::root(&path.steps, None)
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found));
    match found {
        Ok(found) => found.key(),
        Err(_) => Err(FallbackReason::NotJson),
    }
}

/// What the first bytes of a body say about the key at `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    /// The path's first occurrence is complete in these bytes, with this
    /// answer; the rest of the body cannot change it.
    Known(Result<u64, FallbackReason>),
    /// The bytes end before the path's value does.
    NeedMore,
    /// The bytes are not the start of a JSON document.
    NotJson,
}

/// The key at `path` in `bytes`, the first part of a body still arriving:
/// known as soon as the path's first occurrence is complete (a later
/// duplicate is ignored anyway), so a large or slow body can be routed
/// before its end. The bytes after that value are not checked.
pub fn json_field_prefix(bytes: &[u8], path: &FieldPath) -> Prefix {
    // A number at the very end may go on in the next bytes: leave it out.
    let number = |b: &u8| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-');
    let cut = bytes.len() - bytes.iter().rev().take_while(|b| number(b)).count();
    let bytes = &bytes[..cut];
    let first = Cell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Follow::root(&path.steps, Some(&first)).deserialize(&mut de);
    match (first.get(), parsed) {
        (Some(found), _) | (None, Ok(found)) => Prefix::Known(found.key()),
        (None, Err(e)) if e.is_eof() => Prefix::NeedMore,
        (None, Err(_)) => Prefix::NotJson,
    }
}

/// What following a path through one value found.
#[derive(Debug, Clone, Copy)]
enum Found {
    Key(u64),
    Missing,
    WrongType,
}

impl Found {
    fn key(self) -> Result<u64, FallbackReason> {
        match self {
            Found::Key(k) => Ok(k),
            Found::Missing => Err(FallbackReason::MissingField),
            Found::WrongType => Err(FallbackReason::FieldType),
        }
    }
}

/// Follows `steps` into the value being deserialized; the rest is skipped.
struct Follow<'p> {
    steps: &'p [String],
    /// At the top level only: where the first step's value is noted as soon
    /// as it is complete (it decides the answer).
    first: Option<&'p Cell<Option<Found>>>,
}

impl<'p> Follow<'p> {
    fn root(steps: &'p [String], first: Option<&'p Cell<Option<Found>>>) -> Follow<'p> {
        Follow { steps, first }
    }

    fn inner(steps: &'p [String]) -> Follow<'p> {
        Follow { steps, first: None }
    }

    fn note(&self, found: Found) -> Found {
        if let Some(first) = self.first {
            first.set(Some(found));
        }
        found
    }
}

impl<'de> DeserializeSeed<'de> for Follow<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        if self.steps.is_empty() {
            d.deserialize_any(Leaf)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Follow<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let (step, rest) = self.steps.split_first().expect("checked non-empty");
        let mut found = Found::Missing;
        let mut seen = false;
        while let Some(name) = map.next_key_seed(Matches(step))? {
            if name && !seen {
                seen = true;
                found = self.note(map.next_value_seed(Follow::inner(rest))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let (step, rest) = self.steps.split_first().expect("checked non-empty");
        // RFC 6901: an index is "0" or digits without a leading zero.
        let index = (step == "0" || !step.starts_with('0'))
            .then(|| step.parse::<usize>().ok())
            .flatten();
        let mut found = Found::Missing;
        let mut i = 0usize;
        loop {
            if Some(i) == index {
                match seq.next_element_seed(Follow::inner(rest))? {
                    Some(f) => found = self.note(f),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    // A scalar where the path wanted to go deeper.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Found, E> {
        Ok(Found::Missing)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Found, E> {
        Ok(Found::Missing)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Found, E> {
        Ok(Found::Missing)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Found, E> {
        Ok(Found::Missing)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Found, E> {
        Ok(Found::Missing)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Found, E> {
        Ok(Found::Missing)
    }
}

/// Whether an object key equals the wanted step (escaped keys included).
struct Matches<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for Matches<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Matches<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// The value at the end of the path: a string or a number is the key.
struct Leaf;

impl<'de> Visitor<'de> for Leaf {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Found, E> {
        let v = v.trim();
        Ok(if v.is_empty() {
            Found::WrongType
        } else {
            Found::Key(text_key(v.as_bytes()))
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Found, E> {
        Ok(Found::Key(text_key(v.to_string().as_bytes())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Found, E> {
        Ok(Found::Key(text_key(v.to_string().as_bytes())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Found, E> {
        Ok(Found::Key(text_key(v.to_string().as_bytes())))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Found, E> {
        Ok(Found::WrongType)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Found, E> {
        Ok(Found::WrongType)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Found, A::Error> {
        IgnoredAny.visit_map(map).map(|_| Found::WrongType)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Found, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| Found::WrongType)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::h64;

    fn key(body: &str, path: &str) -> Result<u64, FallbackReason> {
        json_field_key(body.as_bytes(), &FieldPath::parse(path).unwrap())
    }

    #[test]
    fn top_level_string_is_keyed_like_a_header() {
        let body = r#"{"model":"m","prompt_cache_key":" conv-1 ","messages":[]}"#;
        assert_eq!(key(body, "prompt_cache_key"), Ok(h64(b"conv-1")));
        assert_eq!(key(body, "user"), Err(FallbackReason::MissingField));
    }

    #[test]
    fn pointers_follow_objects_and_arrays() {
        let body = r#"{"metadata":{"session_id":"s-9","a/b":{"~x":7}},"messages":[{"content":"hi"},{"content":"second"}]}"#;
        assert_eq!(key(body, "/metadata/session_id"), Ok(h64(b"s-9")));
        assert_eq!(key(body, "/metadata/a~1b/~0x"), Ok(h64(b"7")));
        assert_eq!(key(body, "/messages/1/content"), Ok(h64(b"second")));
        assert_eq!(
            key(body, "/messages/2/content"),
            Err(FallbackReason::MissingField)
        );
        assert_eq!(
            key(body, "/messages/01/content"),
            Err(FallbackReason::MissingField)
        );
        assert_eq!(
            key(body, "/metadata/session_id/deeper"),
            Err(FallbackReason::MissingField)
        );
    }

    #[test]
    fn numbers_are_keys_other_types_are_not() {
        assert_eq!(key(r#"{"user": 42}"#, "user"), Ok(h64(b"42")));
        assert_eq!(key(r#"{"user": -3}"#, "user"), Ok(h64(b"-3")));
        for v in ["true", "null", "{}", "[1]", "\"  \""] {
            assert_eq!(
                key(&format!(r#"{{"user": {v}}}"#), "user"),
                Err(FallbackReason::FieldType),
                "{v}"
            );
        }
    }

    #[test]
    fn invalid_json_anywhere_falls_back() {
        assert_eq!(
            key(r#"{"user": "a", "x": }"#, "user"),
            Err(FallbackReason::NotJson)
        );
        assert_eq!(
            key(r#"{"user": "a"} trailing"#, "user"),
            Err(FallbackReason::NotJson)
        );
        assert_eq!(key("", "user"), Err(FallbackReason::NotJson));
        assert_eq!(key("[1,2]", "user"), Err(FallbackReason::MissingField));
    }

    #[test]
    fn escaped_keys_and_duplicates() {
        assert_eq!(key(r#"{"us\u0065r": "a"}"#, "user"), Ok(h64(b"a")));
        // The first occurrence wins; later ones are read but ignored.
        assert_eq!(key(r#"{"user": "a", "user": "b"}"#, "user"), Ok(h64(b"a")));
    }

    #[test]
    fn a_large_body_with_the_field_at_the_end() {
        let filler = "x".repeat(1 << 20);
        let body = format!(r#"{{"messages":[{{"content":"{filler}"}}],"user":"late"}}"#);
        assert_eq!(key(&body, "user"), Ok(h64(b"late")));
    }

    fn prefix(bytes: &str, path: &str) -> Prefix {
        json_field_prefix(bytes.as_bytes(), &FieldPath::parse(path).unwrap())
    }

    #[test]
    fn a_prefix_knows_the_key_once_its_first_occurrence_is_complete() {
        let body = r#"{"prompt_cache_key":"conv-1","messages":[{"content":"long"#;
        assert_eq!(
            prefix(body, "prompt_cache_key"),
            Prefix::Known(Ok(h64(b"conv-1")))
        );
        // Cut inside the value, or before it: not yet.
        assert_eq!(
            prefix(r#"{"prompt_cache_key":"conv"#, "prompt_cache_key"),
            Prefix::NeedMore
        );
        assert_eq!(
            prefix(r#"{"model":"m","#, "prompt_cache_key"),
            Prefix::NeedMore
        );
        assert_eq!(prefix("", "prompt_cache_key"), Prefix::NeedMore);
        // A number is complete only once something follows it.
        assert_eq!(prefix(r#"{"user": 42"#, "user"), Prefix::NeedMore);
        assert_eq!(
            prefix(r#"{"user": 42,"#, "user"),
            Prefix::Known(Ok(h64(b"42")))
        );
        // Nested: known when the first "metadata" object closes.
        let nested = r#"{"metadata":{"session_id":"s-9"},"messages":["#;
        assert_eq!(
            prefix(nested, "/metadata/session_id"),
            Prefix::Known(Ok(h64(b"s-9")))
        );
        assert_eq!(
            prefix(r#"{"metadata":{"other":1},"x":"#, "/metadata/session_id"),
            Prefix::Known(Err(FallbackReason::MissingField))
        );
        assert_eq!(
            prefix(r#"{"user": true, "#, "user"),
            Prefix::Known(Err(FallbackReason::FieldType))
        );
        assert_eq!(prefix(r#"{"user" x"#, "user"), Prefix::NotJson);
        // A whole body gives what json_field_key gives.
        let whole = r#"{"model":"m","user":"u"}"#;
        assert_eq!(prefix(whole, "user"), Prefix::Known(key(whole, "user")));
        assert_eq!(prefix(whole, "nope"), Prefix::Known(key(whole, "nope")));
    }

    #[test]
    fn bad_paths_are_rejected() {
        assert_eq!(FieldPath::parse(""), Err(FieldPathError::Empty));
        assert_eq!(FieldPath::parse("/"), Err(FieldPathError::BadPointer));
        assert_eq!(FieldPath::parse("/a//b"), Err(FieldPathError::BadPointer));
        assert_eq!(FieldPath::parse("/a~2"), Err(FieldPathError::BadPointer));
        assert!(FieldPath::parse("prompt_cache_key").is_ok());
    }
}
