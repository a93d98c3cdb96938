//! A key for a whole conversation, from the request body alone
//! (`key.from: conversation`, mode http).
//!
//! Every turn of a chat repeats the conversation's head and appends at its
//! tail, so the head names the conversation: the `model`, the instructions
//! (system and developer messages, a top-level `system` or `instructions`)
//! and the first user message. That covers the three body shapes in use:
//!
//! * OpenAI chat completions: `model`, `messages[]` with `role` and `content`;
//! * OpenAI responses: `model`, `instructions`, `input` (a string, or items
//!   with `role` and `content`);
//! * Anthropic messages: `model`, `system` (a string or text blocks),
//!   `messages[]`.
//!
//! Content is normalised to its text: a string as is, an array of parts as
//! the concatenation of their `text` fields (whitespace kept). Two
//! conversations that start byte-identically share a key; bounded loads
//! spread a hot one. A body without a user message has no conversation key.
//!
//! Pure: the messages after the first user message are skipped without
//! being built. [`read_head`] parses a body once into a [`ChatHead`], which
//! gives both this key and the group keys of [`super::group`] (the same
//! instructions, and the `tools` definitions).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::Value;

use super::FallbackReason;
use crate::hash::h64;

/// The top-level fields that can hold a conversation's head.
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    instructions: Option<Value>,
    #[serde(default)]
    messages: Option<Head>,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Value>,
}

/// The instructions and the first user message of a message list; the
/// messages after it are skipped, only whether there are any is kept.
#[derive(Default)]
struct Head {
    instructions: Vec<String>,
    first_user: Option<String>,
    later_turn: bool,
}

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Head, D::Error> {
        struct HeadVisitor;
        impl<'de> Visitor<'de> for HeadVisitor {
            type Value = Head;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Head, A::Error> {
                let mut head = Head::default();
                while head.first_user.is_none() {
                    let Some(message) = seq.next_element::<Message>()? else {
                        return Ok(head);
                    };
                    let text = message.content.as_ref().map(text_of).unwrap_or_default();
                    match message.role.as_deref() {
                        Some("system" | "developer") => head.instructions.push(text),
                        Some("user") => head.first_user = Some(text),
                        _ => {}
                    }
                }
                head.later_turn = seq.next_element::<IgnoredAny>()?.is_some();
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(head)
            }
        }
        d.deserialize_seq(HeadVisitor)
    }
}

/// A Responses-style `input`: a string (the user's message) or items.
enum Input {
    Text(String),
    Items(Head),
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Input, D::Error> {
        struct InputVisitor;
        impl<'de> Visitor<'de> for InputVisitor {
            type Value = Input;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of input items")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Input, E> {
                Ok(Input::Text(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Input, A::Error> {
                Head::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Input::Items)
            }
        }
        d.deserialize_any(InputVisitor)
    }
}

/// The text of a content value: a string, or the `text` of each part.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The head of a chat body: what every turn of a conversation repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatHead {
    /// `model` when it is a string, else empty.
    pub model: String,
    /// The instructions in order: a top-level `system`, a top-level
    /// `instructions`, then the system and developer messages before the
    /// first user message.
    pub instructions: Vec<String>,
    /// The text of the first user message, if there is one.
    pub first_user: Option<String>,
    /// The top-level `tools` definitions, as parsed.
    pub tools: Option<Value>,
    /// Messages follow the first user message (an answer, a tool's result,
    /// the next question): the body is a later turn of its conversation,
    /// which an earlier turn may have bound somewhere.
    pub later_turn: bool,
}

/// Parses a JSON chat body's head once; the messages after the first user
/// message are skipped.
pub fn read_head(body: &[u8]) -> Result<ChatHead, FallbackReason> {
    let body: Body = serde_json::from_slice(body).map_err(|_| FallbackReason::NotJson)?;
    let mut head = body.messages.unwrap_or_default();
    let mut instructions: Vec<String> = Vec::new();
    instructions.extend(body.system.as_ref().map(text_of));
    instructions.extend(body.instructions.as_ref().map(text_of));
    match body.input {
        Some(Input::Text(text)) if head.first_user.is_none() => head.first_user = Some(text),
        Some(Input::Items(items)) if head.first_user.is_none() => {
            instructions.extend(items.instructions);
            head.first_user = items.first_user;
            head.later_turn = items.later_turn;
        }
        _ => {}
    }
    instructions.extend(head.instructions);
    let model = match body.model {
        Some(Value::String(m)) => m,
        _ => String::new(),
    };
    Ok(ChatHead {
        model,
        instructions,
        first_user: head.first_user,
        tools: body.tools.filter(|t| !t.is_null()),
        later_turn: head.later_turn,
    })
}

impl ChatHead {
    /// The conversation key: the model, the instructions and the first user
    /// message; none without a user message.
    pub fn conversation_key(&self) -> Result<u64, FallbackReason> {
        let first_user = self
            .first_user
            .as_deref()
            .ok_or(FallbackReason::NoConversation)?;
        // Length-prefixed parts: no two different heads encode alike.
        let mut encoded = Vec::new();
        for part in std::iter::once(self.model.as_str())
            .chain(self.instructions.iter().map(String::as_str))
            .chain(std::iter::once(first_user))
        {
            encoded.extend_from_slice(&(part.len() as u64).to_le_bytes());
            encoded.extend_from_slice(part.as_bytes());
        }
        Ok(h64(&encoded))
    }

    /// The bytes of the text a conversation opens with: the model, the
    /// instructions, the tools (as JSON) and the first user message.
    pub fn opening_bytes(&self) -> u64 {
        let texts = std::iter::once(&self.model)
            .chain(&self.instructions)
            .chain(&self.first_user);
        let text: usize = texts.map(String::len).sum();
        let mut tools = Counted(0);
        if let Some(t) = &self.tools {
            // Writing to a counter cannot fail.
            let _ = serde_json::to_writer(&mut tools, t);
        }
        (text + tools.0) as u64
    }
}

/// A writer that only counts the bytes written to it.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The conversation key of a JSON chat body, or why there is none.
pub fn conversation_key(body: &[u8]) -> Result<u64, FallbackReason> {
    read_head(body)?.conversation_key()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(turns: &[(&str, &str)]) -> String {
        let messages: Vec<String> = turns
            .iter()
            .map(|(role, text)| format!(r#"{{"role":"{role}","content":"{text}"}}"#))
            .collect();
        format!(
            r#"{{"model":"m1","messages":[{}],"stream":true}}"#,
            messages.join(",")
        )
    }

    #[test]
    fn a_growing_conversation_keeps_its_key() {
        let mut turns = vec![("system", "be brief"), ("user", "hello")];
        let first = conversation_key(chat(&turns).as_bytes()).unwrap();
        for i in 0..5 {
            turns.push(("assistant", "sure"));
            turns.push(("user", if i % 2 == 0 { "more" } else { "and more" }));
            assert_eq!(
                conversation_key(chat(&turns).as_bytes()),
                Ok(first),
                "turn {i}"
            );
        }
    }

    #[test]
    fn a_body_with_messages_after_the_first_user_message_is_a_later_turn() {
        let later = |body: &str| read_head(body.as_bytes()).map(|h| h.later_turn);
        let mut turns = vec![("system", "s"), ("user", "one")];
        assert_eq!(later(&chat(&turns)), Ok(false));
        turns.push(("assistant", "sure"));
        assert_eq!(later(&chat(&turns)), Ok(true));
        let items = r#"{"model":"m1","input":[{"role":"user","content":"one"},{"role":"assistant","content":"x"}]}"#;
        assert_eq!(later(items), Ok(true));
        assert_eq!(later(r#"{"model":"m1","input":"one"}"#), Ok(false));
        assert_eq!(later(&chat(&[("system", "s")])), Ok(false));
    }

    #[test]
    fn the_head_decides_and_parts_are_text() {
        let a = conversation_key(chat(&[("system", "s"), ("user", "one")]).as_bytes()).unwrap();
        let b = conversation_key(chat(&[("system", "s"), ("user", "two")]).as_bytes()).unwrap();
        let c = conversation_key(chat(&[("system", "t"), ("user", "one")]).as_bytes()).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
        let parts = r#"{"model":"m1","messages":[{"role":"system","content":[{"type":"text","text":"s"}]},{"role":"user","content":[{"type":"text","text":"o"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"ne"}]}]}"#;
        assert_eq!(conversation_key(parts.as_bytes()), Ok(a));
        let other_model = chat(&[("system", "s"), ("user", "one")]).replace("m1", "m2");
        assert_ne!(conversation_key(other_model.as_bytes()), Ok(a));
    }

    #[test]
    fn responses_and_anthropic_shapes() {
        let responses = r#"{"model":"m1","instructions":"s","input":"one"}"#;
        let items = r#"{"model":"m1","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"one"}]},{"role":"assistant","content":"x"}]}"#;
        let chat = conversation_key(chat(&[("system", "s"), ("user", "one")]).as_bytes());
        assert_eq!(conversation_key(responses.as_bytes()), chat);
        assert_eq!(conversation_key(items.as_bytes()), chat);
        let anthropic = r#"{"model":"m1","system":[{"type":"text","text":"s"}],"max_tokens":10,"messages":[{"role":"user","content":"one"}]}"#;
        assert_eq!(conversation_key(anthropic.as_bytes()), chat);
    }

    #[test]
    fn no_user_message_no_key() {
        assert_eq!(
            conversation_key(chat(&[("system", "s")]).as_bytes()),
            Err(FallbackReason::NoConversation)
        );
        assert_eq!(
            conversation_key(b"{\"model\":\"m\"}"),
            Err(FallbackReason::NoConversation)
        );
        assert_eq!(conversation_key(b"not json"), Err(FallbackReason::NotJson));
        assert_eq!(
            conversation_key(b"{\"messages\":5}"),
            Err(FallbackReason::NotJson)
        );
    }
}
