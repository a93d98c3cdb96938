//! Where the counts are in a JSON document, and what each shape's fields
//! mean (the table in the module doc).

use std::fmt;
use std::sync::LazyLock;

use memchr::memmem::{Finder, FinderRev};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The counts read so far; a side is `None` until a document reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Partial {
    /// Prompt tokens and, of them, cached tokens.
    pub prompt: Option<(u64, u64)>,
    pub completion: Option<u64>,
}

impl Partial {
    /// Each side `later` reports replaces this one's.
    pub fn update(&mut self, later: Partial) {
        if later.prompt.is_some() {
            self.prompt = later.prompt;
        }
        if later.completion.is_some() {
            self.completion = later.completion;
        }
    }

    fn is_empty(&self) -> bool {
        self.prompt.is_none() && self.completion.is_none()
    }
}

/// The bytes every count's name ends with: an event without them, nor
/// llama.cpp's [`TIMINGS_COUNT`], reports nothing, and is not parsed. (Not
/// `usage`: OpenAI streams asked for usage send `"usage":null` in every
/// chunk but the last.)
pub(super) static COUNT_NAME: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"_tokens"));
/// The count llama.cpp's `timings` always carry.
pub(super) static TIMINGS_COUNT: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"cache_n\""));

/// Whether a document may report counts: it names one.
pub(super) fn may_count(bytes: &[u8]) -> bool {
    COUNT_NAME.find(bytes).is_some() || TIMINGS_COUNT.find(bytes).is_some()
}

/// The counts in a whole JSON document (a body or an event's data): its
/// top-level `usage`, else `response.usage`, else `message.usage`, else
/// `meta_info`, else `timings`. `Ok(None)` for valid JSON that reports none, `Err` for text
/// that is not one JSON value.
pub(super) fn in_document(bytes: &[u8]) -> Result<Option<Partial>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let top = de.deserialize_any(TopVisitor)?;
    de.end()?;
    Ok(top.and_then(|top| {
        [
            top.usage.as_ref(),
            nested_usage(top.response.as_ref()),
            nested_usage(top.message.as_ref()),
        ]
        .into_iter()
        .flatten()
        .find_map(in_usage)
        .or_else(|| top.meta_info.as_ref().and_then(in_meta_info))
        .or_else(|| top.timings.as_ref().and_then(in_timings))
    }))
}

/// `value.usage`, when `value` is an object that has one.
fn nested_usage(value: Option<&Value>) -> Option<&Value> {
    value?.get("usage")
}

/// How many `"usage": {` objects [`in_tail`] tries to parse before it gives
/// up, so that a tail packed with broken ones costs a few parses, not one
/// per occurrence.
const TAIL_TRIES: usize = 4;

/// The counts in the last `"usage"` key of `tail` whose value is an object
/// that parses and reports counts: for the end of a body whose start was
/// dropped, or a body that is not valid JSON.
pub(super) fn in_tail(tail: &[u8]) -> Option<Partial> {
    static KEY: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(b"\"usage\""));
    let mut tries = 0;
    for at in KEY.rfind_iter(tail) {
        if escaped(&tail[..at]) {
            continue;
        }
        let after = tail[at + 7..].trim_ascii_start();
        let Some(value) = after.strip_prefix(b":").map(<[u8]>::trim_ascii_start) else {
            continue;
        };
        if value.first() != Some(&b'{') {
            continue;
        }
        let mut de = serde_json::Deserializer::from_slice(value);
        if let Ok(object) = Value::deserialize(&mut de)
            && let Some(found) = in_usage(&object)
        {
            return Some(found);
        }
        tries += 1;
        if tries == TAIL_TRIES {
            break;
        }
    }
    None
}

/// Whether the quote that follows `before` is escaped (an odd run of
/// backslashes ends `before`), so it is inside a string, not a key's start.
fn escaped(before: &[u8]) -> bool {
    before.iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// A count: a non-negative integer that fits a `u64`; anything else is absent.
fn count(object: &Map<String, Value>, field: &str) -> Option<u64> {
    object.get(field).and_then(Value::as_u64)
}

/// `object.field.cached_tokens`.
fn cached_in(object: &Map<String, Value>, field: &str) -> Option<u64> {
    object
        .get(field)
        .and_then(|details| details.get("cached_tokens"))
        .and_then(Value::as_u64)
}

/// The counts in a `usage` object of any shape; `None` if it is not an
/// object or reports neither side.
fn in_usage(usage: &Value) -> Option<Partial> {
    let usage = usage.as_object()?;
    let cache_read = count(usage, "cache_read_input_tokens");
    let prompt = match count(usage, "prompt_tokens") {
        Some(prompt) => {
            let cached = cached_in(usage, "prompt_tokens_details");
            Some((prompt, cached.unwrap_or(0)))
        }
        // Responses: input_tokens includes the cached ones. Anthropic:
        // input_tokens are the uncached ones after the last cache
        // breakpoint, and both cache counts come on top.
        None => count(usage, "input_tokens").map(|input| {
            let created = count(usage, "cache_creation_input_tokens").unwrap_or(0);
            let read = cache_read.unwrap_or(0);
            let cached = cached_in(usage, "input_tokens_details").unwrap_or(read);
            (input.saturating_add(read).saturating_add(created), cached)
        }),
    };
    let completion = count(usage, "completion_tokens").or_else(|| count(usage, "output_tokens"));
    let found = Partial {
        prompt: prompt.map(|(prompt, cached)| (prompt, cached.min(prompt))),
        completion,
    };
    (!found.is_empty()).then_some(found)
}

/// SGLang's `meta_info`: `prompt_tokens`, `cached_tokens`, `completion_tokens`.
fn in_meta_info(meta: &Value) -> Option<Partial> {
    let meta = meta.as_object()?;
    let prompt = count(meta, "prompt_tokens").map(|prompt| {
        (
            prompt,
            count(meta, "cached_tokens").unwrap_or(0).min(prompt),
        )
    });
    let found = Partial {
        prompt,
        completion: count(meta, "completion_tokens"),
    };
    (!found.is_empty()).then_some(found)
}

/// llama.cpp's `timings`: `prompt_n` prompt tokens computed and `cache_n`
/// taken from the cache (the prompt is both), `predicted_n` generated.
fn in_timings(timings: &Value) -> Option<Partial> {
    let timings = timings.as_object()?;
    let prompt = match (count(timings, "prompt_n"), count(timings, "cache_n")) {
        (Some(computed), cached) => {
            let cached = cached.unwrap_or(0);
            Some((computed.saturating_add(cached), cached))
        }
        (None, _) => None,
    };
    let found = Partial {
        prompt,
        completion: count(timings, "predicted_n"),
    };
    (!found.is_empty()).then_some(found)
}

/// The top-level fields that can hold counts; every other field is skipped
/// without being built. A repeated field's last value wins, as serde_json's
/// own maps have it.
#[derive(Default)]
struct Top {
    usage: Option<Value>,
    response: Option<Value>,
    message: Option<Value>,
    meta_info: Option<Value>,
    timings: Option<Value>,
}

/// A top-level field name, matched without being copied.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    Usage,
    Response,
    Message,
    MetaInfo,
    Timings,
    #[serde(other)]
    Other,
}

/// A document's top level: `Some` for an object, `None` for any other value.
struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Option<Top>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Top>, A::Error> {
        let mut top = Top::default();
        while let Some(field) = map.next_key::<Field>()? {
            let slot = match field {
                Field::Usage => &mut top.usage,
                Field::Response => &mut top.response,
                Field::Message => &mut top.message,
                Field::MetaInfo => &mut top.meta_info,
                Field::Timings => &mut top.timings,
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value()?);
        }
        Ok(Some(top))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<Top>, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| None)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<Top>, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<Top>, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<Top>, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<Top>, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<Top>, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Option<Top>, E> {
        Ok(None)
    }
}
