//! The key of one HTTP request: a header, a JSON body field, the
//! conversation's head, or the client's address, in the order the config
//! gives.
//!
//! With `key.from: header`, the header's value is the key; when the header is
//! absent and `key.body_field` is set, the body is tried next. With `from:
//! body`, the body field is the key. With `from: conversation`, a configured
//! header, then a configured body field, then the conversation's head
//! ([`magpie_core::key::conversation`]). Reading a body for its key buffers it
//! (at most `key.max_bytes`, within `key.read_timeout`); the bytes read are
//! then sent on first, followed by the rest of the stream, so the backend
//! receives the body unchanged. Only a JSON body (by `content-type`) is read.
//! When no key is found, the fallback key is used and the reason counted.
//!
//! With `key.group`, the group key is found beside it: a header's value,
//! or (`system`, `prefix_bytes`) the body's chat head, which is then read
//! even when a header carried the session key. One parse of the body gives
//! both the conversation key and the group. A request without a group is
//! routed by its session key; the reason ([`GroupMiss`]) is counted.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap};
use tokio::time::Instant;

use super::request_body::RequestBody;
use crate::config::{Config, KeyConfig, KeyRead, KeySources};
use crate::net::Client;
use crate::routing::decision;
use crate::routing::keys::{GroupKey, Keys, OpeningKey, SessionKey, SharedHead};
use crate::routing::llm::work::Heads;
use crate::routing::queue::Standing;
use crate::telemetry::key_budget::{Held, KeyBudget};
use crate::telemetry::stats::Stats;
use magpie_core::key::conversation::{ChatHead, read_head};
use magpie_core::key::group::{GroupBy, GroupMiss};
use magpie_core::key::json::{FieldPath, Prefix, json_field_key, json_field_prefix};
use magpie_core::key::{self, FallbackReason};

/// The key a request goes by, and why it is the fallback when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestKey {
    /// The session key (the table's key too, without a group).
    pub(crate) key: SessionKey,
    pub(crate) fallback: Option<FallbackReason>,
    /// With `key.group`: the group key, or why the request has none (then
    /// the table is looked up by the session key). `None` without groups.
    pub(crate) group: Option<Result<GroupKey, GroupMiss>>,
    /// How its conversation opens (the conversation key of its chat body:
    /// the model, instructions and first user message), when the body was
    /// parsed for a key: where conversations that open alike meet under a
    /// `queue`. None when the session key is the conversation key.
    pub(crate) opening: Option<OpeningKey>,
    /// Its chat body is a later turn of its conversation (messages follow
    /// the first user message), when the body was parsed for a key.
    pub(crate) later_turn: bool,
    /// What of its body other requests share: its group's head, its
    /// system head ([`Heads`]).
    pub(crate) heads: Heads,
}

impl RequestKey {
    /// What the routing decision is asked with: these keys, the request's
    /// `standing` and its body's length, counting why a fallback key was
    /// used or a group is missing.
    pub(crate) fn request(
        &self,
        standing: Standing,
        prompt_bytes: u64,
        stats: &Stats,
    ) -> decision::Request {
        if let Some(why) = self.fallback {
            stats.count_fallback(why);
        }
        let group = match self.group {
            Some(Ok(group)) => Some(group),
            Some(Err(why)) => {
                stats.count_group_miss(why);
                None
            }
            None => None,
        };
        decision::Request {
            keys: Keys {
                session: self.key,
                group,
                opening: self.opening,
                later_turn: self.later_turn,
                head: SharedHead::of(
                    group,
                    self.heads.group_bytes,
                    self.heads.system.map(|(h, _)| h),
                ),
            },
            fallback: self.fallback.is_some(),
            standing,
            prompt_bytes,
            follows: None,
            awaits_first_byte: true,
            heads: self.heads,
        }
    }
}

/// The client stopped sending its body while it was read for the key.
#[derive(Debug, thiserror::Error)]
#[error("the request body could not be read: {0}")]
pub(crate) struct BodyError(#[from] hyper::Error);

/// Where a request's keys are looked for.
#[derive(Clone, Copy)]
pub(crate) struct KeyPlan<'a> {
    pub(crate) key: &'a KeyConfig,
    /// `key.group`, if set.
    pub(crate) group: Option<&'a GroupBy>,
    pub(crate) client: Client,
    /// The bytes all requests hold while reading bodies for keys, and their
    /// most (`limits.key_buffer_bytes`).
    pub(crate) budget: &'a Arc<KeyBudget>,
    pub(crate) budget_max: u64,
    /// A body parsed for a key gives its system head too: under a `queue`,
    /// which weighs what engines' caches hold of it.
    pub(crate) system_head: bool,
    /// The body is read whole even when no key is in it: it goes on with
    /// the engine's priority written in (`queue.priority.engine`), or is
    /// split into a prefill and a decode half (`disaggregation`).
    pub(crate) whole_body: bool,
}

impl<'a> KeyPlan<'a> {
    /// The plan of `config` for a request from `client`.
    pub(crate) fn of(config: &'a Config, client: Client, budget: &'a Arc<KeyBudget>) -> Self {
        KeyPlan {
            key: &config.key,
            group: config.group.as_ref(),
            client,
            budget,
            budget_max: config.limits.key_buffer_bytes,
            system_head: config.queue.is_some(),
            whole_body: (config.queue.as_ref()).is_some_and(|q| q.priority.engine.is_some())
                || config.disaggregation.is_some(),
        }
    }
}

/// Finds `request`'s key (and group); returns them with the request, its
/// body ready to be sent on unchanged.
pub(crate) async fn request_key(
    request: Request<Incoming>,
    plan: KeyPlan<'_>,
) -> Result<(RequestKey, Request<RequestBody>), BodyError> {
    let (parts, body) = request.into_parts();
    let header = |name: &str| header_value(&parts.headers, name);
    let content_type = parts.headers.get(CONTENT_TYPE).map(|v| v.as_bytes());
    let wants = match head_keys(&plan, header, content_type) {
        HeadKeys::Known(keyed) => {
            return Ok((
                keyed,
                Request::from_parts(parts, RequestBody::streaming(body)),
            ));
        }
        HeadKeys::ReadBody(wants) => wants,
    };
    let (outcome, body) = read_body(body, BodyRead::new(&wants, &plan)).await?;
    Ok((wants.keys(&outcome), Request::from_parts(parts, body)))
}

/// What a request's head says of its keys.
pub(crate) enum HeadKeys<'a> {
    /// All of them: the body need not be read.
    Known(RequestKey),
    /// The body must be read for them.
    ReadBody(BodyWants<'a>),
}

/// What a request's body is read for, and what its head already gave.
pub(crate) struct BodyWants<'a> {
    /// How long and how far the body may be read.
    pub(crate) read: &'a KeyRead,
    /// The body field, when nothing after it is wanted: the read may stop
    /// as soon as its value is in ([`look_early`]).
    pub(crate) early: Option<&'a FieldPath>,
    sources: KeySources<'a>,
    group: Option<&'a GroupBy>,
    /// The session key from a header.
    session: Option<u64>,
    header_group: Option<Result<u64, GroupMiss>>,
    session_reads_body: bool,
    group_reads_body: bool,
    system_head: bool,
    fallback_key: u64,
}

/// The keys of a request by its head: its headers by (lower-case) name, the
/// first if repeated, blank ones absent ([`header_value`]), and its
/// `content-type`; or what its body must be read for.
pub(crate) fn head_keys<'a, 'h>(
    plan: &KeyPlan<'a>,
    header: impl Fn(&str) -> Option<&'h [u8]>,
    content_type: Option<&[u8]>,
) -> HeadKeys<'a> {
    let Some(read) = plan.key.read() else {
        return HeadKeys::Known(RequestKey {
            key: SessionKey::new(plan.key.address_key(plan.client.0)),
            fallback: None,
            group: None,
            opening: None,
            later_turn: false,
            heads: Heads::default(),
        });
    };
    let sources = plan.key.sources();
    let session = sources.header.and_then(&header).map(key::text_key);
    let header_group = match plan.group {
        Some(GroupBy::Header(name)) => Some(
            header(name)
                .map(key::text_key)
                .ok_or(GroupMiss::MissingHeader),
        ),
        _ => None,
    };
    let session_reads_body =
        session.is_none() && (sources.body_field.is_some() || sources.conversation);
    let group_reads_body = plan.group.is_some_and(GroupBy::reads_body);
    let wants = BodyWants {
        read,
        // Only a body field, and nothing after it, is wanted.
        early: sources.body_field.filter(|_| {
            session_reads_body && !sources.conversation && !group_reads_body && !plan.whole_body
        }),
        sources,
        group: plan.group,
        session,
        header_group,
        session_reads_body,
        group_reads_body,
        system_head: plan.system_head,
        fallback_key: key::fallback_key(read.fallback, plan.client.0),
    };
    if !content_type.is_some_and(is_json)
        || !(session_reads_body || group_reads_body || plan.whole_body)
    {
        let why = if session_reads_body {
            FallbackReason::NotJson
        } else {
            FallbackReason::MissingHeader
        };
        let group = group_reads_body.then_some(Err(GroupMiss::NotJson));
        let found = BodyKeys::unparsed(session.ok_or(why), group);
        return HeadKeys::Known(wants.found(found));
    }
    HeadKeys::ReadBody(wants)
}

impl BodyWants<'_> {
    /// The keys, once the body was read as far as it was (`outcome`).
    pub(crate) fn keys(&self, outcome: &Read) -> RequestKey {
        let by_body = match outcome {
            Read::Complete(bytes) => {
                let wants = Wants {
                    session: self.session_reads_body,
                    group: self.group.filter(|_| self.group_reads_body),
                    system_head: self.system_head,
                };
                body_keys(&self.sources, wants, bytes)
            }
            Read::Early(found) => BodyKeys::unparsed(*found, None),
            Read::TooLarge => unread(FallbackReason::TooLarge, self.group_reads_body),
            Read::Timeout => unread(FallbackReason::Timeout, self.group_reads_body),
            Read::OverBudget => unread(FallbackReason::BufferBudget, self.group_reads_body),
        };
        let session = match self.session {
            Some(key) => Ok(key),
            None if self.session_reads_body => by_body.session,
            None => Err(FallbackReason::MissingHeader),
        };
        self.found(BodyKeys { session, ..by_body })
    }

    /// The keys found: the session key (or the fallback key, and why), the
    /// group (a header's before the body's) and the opening.
    fn found(&self, found: BodyKeys) -> RequestKey {
        let group = self.header_group.or(found.group);
        let (key, fallback) = match found.session {
            Ok(key) => (key, None),
            Err(why) => (self.fallback_key, Some(why)),
        };
        RequestKey {
            key: SessionKey::new(key),
            fallback,
            group: group.map(|g| g.map(GroupKey::new)),
            opening: found.opening.map(OpeningKey::new),
            later_turn: found.later_turn,
            heads: found.heads,
        }
    }
}

/// The body field's value in the first bytes of a body, if they settle it
/// (the value is in, or the body is not JSON).
pub(crate) fn look_early(field: &FieldPath, bytes: &[u8]) -> Option<Result<u64, FallbackReason>> {
    match json_field_prefix(bytes, field) {
        Prefix::Known(found) => Some(found),
        Prefix::NotJson => Some(Err(FallbackReason::NotJson)),
        Prefix::NeedMore => None,
    }
}

/// What a complete body is read for.
struct Wants<'a> {
    /// The session key (no header carried it).
    session: bool,
    /// The group, when it is read from the body.
    group: Option<&'a GroupBy>,
    /// The system head, when the chat head is parsed for the others.
    system_head: bool,
}

/// What a body gave (or, for the session key, why it gave none).
struct BodyKeys {
    session: Result<u64, FallbackReason>,
    group: Option<Result<u64, GroupMiss>>,
    opening: Option<u64>,
    later_turn: bool,
    /// What of it other requests share.
    heads: Heads,
}

/// The keys a body that was not read in full gives: none, for `why`.
fn unread(why: FallbackReason, group_reads_body: bool) -> BodyKeys {
    let group = group_reads_body.then_some(Err(GroupMiss::of_body(why)));
    BodyKeys::unparsed(Err(why), group)
}

impl BodyKeys {
    /// The keys found without parsing a body: no opening, no turn, no heads.
    fn unparsed(
        session: Result<u64, FallbackReason>,
        group: Option<Result<u64, GroupMiss>>,
    ) -> BodyKeys {
        BodyKeys {
            session,
            group,
            opening: None,
            later_turn: false,
            heads: Heads::default(),
        }
    }
}

/// The session key (the field, else the conversation) and the group key in
/// a complete JSON body, each only if wanted; the chat head is parsed once
/// for both, and then gives the opening too.
fn body_keys(sources: &KeySources<'_>, wants: Wants<'_>, bytes: &[u8]) -> BodyKeys {
    let by_field = match sources.body_field {
        Some(field) if wants.session => json_field_key(bytes, field),
        _ => Err(FallbackReason::MissingField),
    };
    let by_conversation = wants.session && sources.conversation && by_field.is_err();
    let needs_head = by_conversation || wants.group.is_some();
    let head: Option<Result<ChatHead, FallbackReason>> = needs_head.then(|| read_head(bytes));
    let session = match &head {
        Some(head) if by_conversation => head
            .as_ref()
            .map_err(|why| *why)
            .and_then(ChatHead::conversation_key),
        _ => by_field,
    };
    let grouped = wants.group.and_then(|by| match &head {
        Some(Ok(head)) => by.head_of(head),
        Some(Err(why)) => Some(Err(GroupMiss::of_body(*why))),
        None => None,
    });
    let heads = Heads {
        group_bytes: grouped.and_then(Result::ok).map_or(0, |g| g.bytes),
        system: match (&head, wants.group) {
            _ if !wants.system_head => None,
            (_, Some(GroupBy::System)) => None,
            (Some(Ok(head)), _) => GroupBy::System.head_of(head).and_then(Result::ok),
            _ => None,
        }
        .map(|h| (h.key, h.bytes)),
    };
    let group = grouped.map(|g| g.map(|g| g.key));
    // How it opens: none when that is the session key already (its pin
    // is that memory), the group when it is grouped so, else hashed once.
    let opening = match (&head, wants.group) {
        _ if by_conversation => None,
        (_, Some(GroupBy::Conversation)) => group.and_then(Result::ok),
        (Some(Ok(head)), _) => head.conversation_key().ok(),
        _ => None,
    };
    let later_turn = matches!(&head, Some(Ok(head)) if head.later_turn);
    BodyKeys {
        session,
        group,
        opening,
        later_turn,
        heads,
    }
}

/// A header's value when present and not blank (the first, if repeated).
pub(crate) fn header_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get(name)
        .map(|v| v.as_bytes())
        .filter(|v| !v.trim_ascii().is_empty())
}

/// `application/json`, or any `…/…+json` type, parameters allowed.
pub(crate) fn is_json(content_type: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(content_type) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence
            .rsplit_once('+')
            .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
}

/// What reading a body for its key got.
pub(crate) enum Read {
    /// The whole body.
    Complete(Bytes),
    /// The body field's first occurrence arrived before the body's end.
    Early(Result<u64, FallbackReason>),
    /// More than `max_bytes`.
    TooLarge,
    /// The deadline passed first.
    Timeout,
    /// Holding more would pass `limits.key_buffer_bytes`.
    OverBudget,
}

/// How one body is read for its key.
struct BodyRead<'a> {
    max_bytes: usize,
    deadline: Instant,
    /// This request's bytes of the key budget.
    share: Held,
    /// The body field, when nothing after it is wanted: the read stops as
    /// soon as its value is in.
    early: Option<&'a FieldPath>,
}

impl<'a> BodyRead<'a> {
    fn new(wants: &BodyWants<'a>, plan: &KeyPlan<'_>) -> BodyRead<'a> {
        BodyRead {
            max_bytes: wants.read.max_bytes,
            deadline: Instant::now() + wants.read.read_timeout,
            share: plan.budget.share(plan.budget_max),
            early: wants.early,
        }
    }
}

/// Reads `body` until it ends, its field is found (`early`), it passes
/// `max_bytes` or the key budget, or the deadline passes; returns what
/// happened and the body to send on (the bytes read, then the rest).
async fn read_body(
    mut body: Incoming,
    mut r: BodyRead<'_>,
) -> Result<(Read, RequestBody), BodyError> {
    let mut buf = BytesMut::new();
    let mut trailers = None;
    // Looked for again each time the bytes read double: a body arriving in
    // many small frames costs at most twice one parse.
    let mut next_look = 0;
    let mut unheld = None;
    let outcome = loop {
        let frame = match tokio::time::timeout_at(r.deadline, body.frame()).await {
            Err(_) => break Read::Timeout,
            Ok(None) => break Read::Complete(Bytes::new()),
            Ok(Some(frame)) => frame?,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Trailers end the body.
                trailers = frame.into_trailers().ok();
                break Read::Complete(Bytes::new());
            }
        };
        // What of the frame may be held: up to max_bytes, within the budget.
        let room = r.max_bytes.saturating_sub(buf.len());
        let fits = data.len() <= room;
        let part = data.slice(..data.len().min(room));
        let granted = r.share.grow(part.len());
        if granted {
            buf.extend_from_slice(&part);
        }
        // What is left of the frame to send on after the bytes held.
        let left = if !granted {
            Some(data)
        } else if !fits {
            Some(data.slice(room..))
        } else {
            None
        };
        let last = left.is_some();
        if let Some(field) = r.early.filter(|_| last || buf.len() >= next_look) {
            next_look = buf.len().saturating_mul(2);
            if let Some(found) = look_early(field, &buf) {
                unheld = left;
                break Read::Early(found);
            }
        }
        if last {
            unheld = left;
            break if granted {
                Read::TooLarge
            } else {
                Read::OverBudget
            };
        }
    };
    let head = buf.freeze();
    Ok(match outcome {
        Read::Complete(_) => (
            Read::Complete(head.clone()),
            RequestBody::replay([head], r.share, None).with_trailers(trailers),
        ),
        unfinished => (
            unfinished,
            RequestBody::replay([head].into_iter().chain(unheld), r.share, Some(body)),
        ),
    })
}

#[cfg(test)]
mod tests;
