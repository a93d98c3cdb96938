//! The group key (`key.group`, mode http): what the table is looked up by,
//! when it is not the session key.
//!
//! Prefix caches are shared by prefix, not by conversation: every
//! conversation of one agent repeats its system prompt and tool definitions.
//! Looking the table up by that head sends the conversations of one head to
//! the same replica (and a hot head along its own candidates), while the
//! session key still names the conversation and its pin.
//!
//! * `system`: `h64` of the rendered head of a chat body ([`render_head`]):
//!   the model, the instructions (a top-level `system` or `instructions`,
//!   system and developer messages before the first user message) and the
//!   `tools` definitions, in the three body shapes
//!   [`super::conversation`] reads.
//! * `prefix_bytes: N`: `h64` of the first `N` bytes of that rendered head
//!   (all of it when shorter), so heads that share a long preamble share a
//!   group even when their ends differ.
//! * `header: NAME`: a request header's value, hashed like a header key
//!   (a tenant such as `x-tenant-id`).
//! * `conversation`: the conversation key of the body
//!   ([`ChatHead::conversation_key`]: the model, the instructions and the
//!   first user message), so conversations that open alike (one document,
//!   one few-shot preamble) share a replica whatever their session keys.
//!
//! The rendered head is the model, then each instruction's text, then the
//! `tools` array in canonical JSON ([`canonical_json`]: compact, object keys
//! sorted by their bytes, strings and numbers written as serde_json writes
//! them), each part followed by a NUL byte. Canonical, so two clients that
//! send the same tools with other spacing or key order share a group. A
//! text that itself holds a NUL could render like a different split of
//! parts; that only puts two heads in one group, it never loses a request.
//!
//! A body without instructions and without tools has no group, nor does a
//! request without the header: such a request is routed by its session key,
//! and the reason ([`GroupMiss`]) counted.

use serde_json::Value;

use super::FallbackReason;
use super::conversation::{ChatHead, read_head};
use crate::hash::h64;
use crate::labels;

/// Where a request's group key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// The model, instructions and tools of a chat body.
    System,
    /// The first `N` bytes of that rendered head.
    PrefixBytes(usize),
    /// A header's value; the name lower-case.
    Header(String),
    /// The conversation key: the model, instructions and first user message.
    Conversation,
}

impl GroupBy {
    /// Whether the group is read from the request body.
    pub fn reads_body(&self) -> bool {
        !matches!(self, GroupBy::Header(_))
    }

    /// As `magpie check` prints it, and as the fingerprint hashes it.
    pub fn describe(&self) -> String {
        match self {
            GroupBy::System => "system".to_string(),
            GroupBy::PrefixBytes(n) => format!("prefix_bytes {n}"),
            GroupBy::Header(name) => format!("header {name}"),
            GroupBy::Conversation => "conversation".to_string(),
        }
    }

    /// The group key of a chat head (`system`, `prefix_bytes`,
    /// `conversation`); `None` for `header` groups, which no body carries.
    pub fn of_head(&self, head: &ChatHead) -> Option<Result<u64, GroupMiss>> {
        self.head_of(head).map(|found| found.map(|h| h.key))
    }

    /// The group of a chat head and the size of what its conversations
    /// share ([`GroupHead`]); `None` for `header` groups.
    pub fn head_of(&self, head: &ChatHead) -> Option<Result<GroupHead, GroupMiss>> {
        let rendered = match self {
            GroupBy::Header(_) => return None,
            GroupBy::Conversation => {
                let key = head.conversation_key();
                return Some(
                    key.map_err(|_| GroupMiss::NoUserMessage)
                        .map(|key| GroupHead {
                            key,
                            bytes: head.opening_bytes(),
                        }),
                );
            }
            _ => render_head(head),
        };
        let Some(rendered) = rendered else {
            return Some(Err(GroupMiss::NoHead));
        };
        let shared = match self {
            GroupBy::PrefixBytes(n) => &rendered[..rendered.len().min(*n)],
            _ => &rendered[..],
        };
        Some(Ok(GroupHead {
            key: h64(shared),
            bytes: shared.len() as u64,
        }))
    }
}

/// A request's group and the bytes of its body's head the group's other
/// conversations repeat (the rendered head, or its first `N` bytes, or for
/// `conversation` the opening's text): about what a replica that served the
/// group lately holds of this request in its prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupHead {
    pub key: u64,
    pub bytes: u64,
}

labels! {
    /// Why a request had no group key, so the table was looked up by its
    /// session key; each is counted separately.
    pub enum GroupMiss {
        /// `key.group.header`: the request has no such header (or a blank one).
        MissingHeader => "missing_header",
        /// The body has neither instructions nor tools.
        NoHead => "no_head",
        /// `key.group: conversation`: the body has no user message.
        NoUserMessage => "no_user_message",
        /// The body is not JSON (by content type or by content).
        NotJson => "not_json",
        /// The body did not fit in `key.max_bytes`.
        TooLarge => "too_large",
        /// The body did not arrive within `key.read_timeout`.
        Timeout => "timeout",
        /// Reading the body would have held more than `limits.key_buffer_bytes`.
        BufferBudget => "buffer_budget",
    }
}

impl GroupMiss {
    /// The group's reason when reading the body for a key failed.
    pub fn of_body(why: FallbackReason) -> GroupMiss {
        match why {
            FallbackReason::TooLarge => GroupMiss::TooLarge,
            FallbackReason::Timeout => GroupMiss::Timeout,
            FallbackReason::BufferBudget => GroupMiss::BufferBudget,
            _ => GroupMiss::NotJson,
        }
    }
}

/// The head a group is hashed from: the model, each instruction, then the
/// tools in canonical JSON, each followed by a NUL; `None` without
/// instructions and tools.
pub fn render_head(head: &ChatHead) -> Option<Vec<u8>> {
    let has_instructions = head.instructions.iter().any(|i| !i.is_empty());
    if !has_instructions && head.tools.is_none() {
        return None;
    }
    let mut out = Vec::new();
    for part in std::iter::once(&head.model).chain(&head.instructions) {
        out.extend_from_slice(part.as_bytes());
        out.push(0);
    }
    if let Some(tools) = &head.tools {
        canonical_json(tools, &mut out);
        out.push(0);
    }
    Some(out)
}

/// The group key of a JSON body under `by` (`system`, `prefix_bytes` or
/// `conversation`), or why there is none; what `magpie` computes from a
/// buffered body.
pub fn body_group_key(body: &[u8], by: &GroupBy) -> Result<u64, GroupMiss> {
    let head = read_head(body).map_err(GroupMiss::of_body)?;
    by.of_head(&head).unwrap_or(Err(GroupMiss::MissingHeader))
}

/// Writes `value` as compact JSON with object keys sorted by their bytes,
/// whatever order the map keeps them in.
pub fn canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                scalar(&Value::String(k.clone()), out);
                out.push(b':');
                canonical_json(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(v, out);
            }
            out.push(b']');
        }
        other => scalar(other, out),
    }
}

/// A string, number, boolean or null as serde_json writes it.
fn scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar to a Vec cannot fail.
    if let Ok(text) = serde_json::to_vec(value) {
        out.extend_from_slice(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(body: &str) -> Result<u64, GroupMiss> {
        body_group_key(body.as_bytes(), &GroupBy::System)
    }

    const TOOLS: &str = r#"[{"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]"#;

    #[test]
    fn conversations_of_one_head_share_a_group() {
        let a = format!(
            r#"{{"model":"m","tools":{TOOLS},"messages":[{{"role":"system","content":"agent"}},{{"role":"user","content":"one"}}]}}"#
        );
        let b = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"agent"}},{{"role":"user","content":"two"}},{{"role":"assistant","content":"x"}},{{"role":"user","content":"y"}}],"tools":{TOOLS}}}"#
        );
        assert_eq!(system(&a), system(&b));
        assert!(system(&a).is_ok());
        // Another model, other instructions or other tools: another group.
        assert_ne!(system(&a), system(&a.replace(r#""m""#, r#""m2""#)));
        assert_ne!(system(&a), system(&a.replace("agent", "agent2")));
        assert_ne!(system(&a), system(&a.replace("search", "fetch")));
    }

    #[test]
    fn a_group_head_says_how_many_bytes_its_conversations_share() {
        let body = r#"{"model":"m","tools":[{"a":1}],"messages":[{"role":"system","content":"agent"},{"role":"user","content":"hello"}]}"#;
        let head = read_head(body.as_bytes()).expect("a head");
        let bytes = |by: GroupBy| {
            by.head_of(&head)
                .expect("a body group")
                .expect("a head")
                .bytes
        };
        // "m\0agent\0[{\"a\":1}]\0": the rendered head.
        assert_eq!(bytes(GroupBy::System), 2 + 6 + 10);
        assert_eq!(bytes(GroupBy::PrefixBytes(4)), 4);
        // The model, instructions, tools and first user message: 1 + 5 + 9 + 5.
        assert_eq!(bytes(GroupBy::Conversation), 20);
        assert_eq!(GroupBy::Header("x".into()).head_of(&head), None);
    }

    #[test]
    fn conversations_that_open_alike_share_a_group() {
        let by = |body: &str| body_group_key(body.as_bytes(), &GroupBy::Conversation);
        let opening = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"doc"}]}"#;
        let later = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"doc"},{"role":"assistant","content":"a"},{"role":"user","content":"q"}]}"#;
        assert!(by(opening).is_ok());
        assert_eq!(by(opening), by(later));
        // The group is the conversation key.
        let key = crate::key::conversation::conversation_key(opening.as_bytes());
        assert_eq!(by(opening).ok(), key.ok());
        assert_ne!(by(opening), by(&opening.replace("doc", "other")));
        let no_user = r#"{"model":"m","messages":[{"role":"system","content":"s"}]}"#;
        assert_eq!(by(no_user), Err(GroupMiss::NoUserMessage));
        assert_eq!(by("not json"), Err(GroupMiss::NotJson));
    }

    #[test]
    fn tools_are_canonical() {
        let spaced = r#"[ { "function": { "parameters": { "properties": { "q": { "type": "string" } }, "type": "object" }, "name": "search" }, "type": "function" } ]"#;
        let with = |tools: &str| {
            system(&format!(
                r#"{{"model":"m","tools":{tools},"messages":[{{"role":"user","content":"hi"}}]}}"#
            ))
        };
        assert_eq!(with(TOOLS), with(spaced));
        let mut out = Vec::new();
        canonical_json(&serde_json::from_str(spaced).unwrap(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[{"function":{"name":"search","parameters":{"properties":{"q":{"type":"string"}},"type":"object"}},"type":"function"}]"#
        );
    }

    #[test]
    fn the_three_body_shapes_render_alike() {
        let chat = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"a"}]}"#;
        let responses = r#"{"model":"m","instructions":"s","input":"b"}"#;
        let anthropic = r#"{"model":"m","system":[{"type":"text","text":"s"}],"max_tokens":9,"messages":[{"role":"user","content":"c"}]}"#;
        let developer = r#"{"model":"m","input":[{"role":"developer","content":"s"},{"role":"user","content":"d"}]}"#;
        let expected = h64(b"m\0s\0");
        for body in [chat, responses, anthropic, developer] {
            assert_eq!(system(body), Ok(expected), "{body}");
        }
    }

    #[test]
    fn prefix_bytes_cut_the_rendered_head() {
        let preamble = "p".repeat(100);
        let body = |tail: &str| {
            format!(
                r#"{{"model":"m","system":"{preamble}{tail}","messages":[{{"role":"user","content":"q"}}]}}"#
            )
        };
        let (a, b) = (body("doc one"), body("doc two"));
        let by = |n| GroupBy::PrefixBytes(n);
        // "m\0" and the preamble are 102 bytes.
        let at = |text: &str, n| body_group_key(text.as_bytes(), &by(n));
        assert_eq!(at(&a, 102), at(&b, 102));
        assert_eq!(at(&a, 102), Ok(h64(format!("m\0{preamble}").as_bytes())));
        assert_ne!(at(&a, 110), at(&b, 110));
        // Longer than the head: all of it, as `system` hashes it.
        assert_eq!(at(&a, 1 << 20), system(&a));
    }

    #[test]
    fn no_head_no_group() {
        let plain = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(system(plain), Err(GroupMiss::NoHead));
        let empty = r#"{"model":"m","system":"","tools":null,"messages":[]}"#;
        assert_eq!(system(empty), Err(GroupMiss::NoHead));
        // Tools alone are a head.
        let tools = format!(r#"{{"model":"m","tools":{TOOLS}}}"#);
        assert!(system(&tools).is_ok());
        assert_eq!(system("not json"), Err(GroupMiss::NotJson));
        assert_eq!(system(r#"{"messages":5}"#), Err(GroupMiss::NotJson));
        let header = GroupBy::Header("x-tenant-id".into());
        assert_eq!(
            body_group_key(plain.as_bytes(), &header),
            Err(GroupMiss::MissingHeader)
        );
        assert_eq!(
            GroupMiss::of_body(FallbackReason::TooLarge),
            GroupMiss::TooLarge
        );
    }
}
