//! Disaggregated prefill and decode (`disaggregation`): where a request's
//! two halves go, and when it is not split at all.
//!
//! The decode half is the request as the table routes it: pinned by its
//! conversation, so the conversation's later turns find their earlier KV
//! (its answers' included) on their decode backend. The prefill half goes
//! to the prefill pool by the same conversation key, so a conversation's
//! prompts meet their own earlier prefixes there too. And a request whose
//! decode backend lacks fewer than `disaggregation.skip_below_tokens` of its
//! prompt's tokens is not split: that backend prefills them itself, and no
//! KV moves (a conversation's next turn, or a short prompt whose long
//! shared head the backend holds).
//!
//! What the decode backend holds is told as the queue tells a request's
//! work ([`super::work`]): from the key memory's note of the conversation's
//! previous request there (its prompt, and its answer), and the heads the
//! backend served lately.

use std::sync::Arc;

use crate::config::{Config, TenantBy};
use crate::routing::backend::Backend;
use crate::routing::backend::{ActiveGuard, WorkGuard};
use crate::routing::instance::Instance;
use crate::routing::key_memory::KeyMemory;
use crate::routing::keys::Keys;
use crate::routing::keys::TenantKey;
use crate::routing::llm::work::{Heads, Work, work};
use crate::routing::queue::{Ask, SlotLimits, Standing};
use crate::routing::route::Route;
use crate::routing::snapshot::Snapshot;

/// How a disaggregated request was served, as metrics and the access log
/// count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Split: its prefill half went to the prefill pool.
    Split,
    /// Its decode backend held all but fewer than
    /// `disaggregation.skip_below_tokens` of its prompt: sent there whole.
    DecodeHolds,
    /// Its body was not one JSON object read whole (too large for
    /// `key.max_bytes`, chunked past it, or not JSON): sent whole.
    Unsplittable,
    /// No prefill backend answered (down, full, failed or late): its
    /// decode backend prefilled it.
    PrefillFailed,
}

impl Decision {
    pub(crate) const ALL: [Decision; 4] = [
        Decision::Split,
        Decision::DecodeHolds,
        Decision::Unsplittable,
        Decision::PrefillFailed,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Split => "split",
            Decision::DecodeHolds => "decode_holds",
            Decision::Unsplittable => "unsplittable",
            Decision::PrefillFailed => "prefill_failed",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// How many prefill backends a request's prefill half is offered to: its
/// own, then one retry on the next.
pub(crate) const PREFILL_TRIES: usize = 2;

/// What a request brings, as its prefill half's route is told from it:
/// its keys, its body's bytes and the heads it shares with others.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub(crate) keys: Keys,
    pub(crate) bytes: u64,
    pub(crate) heads: Heads,
    /// Its class and tenant (`queue`).
    pub(crate) standing: Standing,
}

/// Where a request's prefill half goes: its targets, the cheapest first,
/// each with the prompt tokens it would compute there.
#[derive(Debug)]
pub(crate) struct PrefillPlan {
    /// The prefill pool's route (its caps, for the slots taken).
    pub(crate) route: Route,
    /// The candidates, each with its work there.
    pub(crate) targets: Vec<(Arc<Backend>, u64)>,
    /// Its work (at its own prefill backend, less its previous prompt),
    /// what it is, and its key, as the queue weighs and binds it.
    work: Work,
    asked: Asked,
    key: u64,
}

/// A prefill backend's room taken for a prefill half: the backend, its
/// slot, and the half's work held there.
pub(crate) type PrefillRoom = (Arc<Backend>, ActiveGuard, WorkGuard);

impl PrefillPlan {
    /// A room for the prefill half at one of its targets not in `tried`:
    /// without `queue`, the first under its caps; with it, what the queue
    /// gives (the first with room, in the plan's order, or the first to
    /// have room, waiting up to `queue.timeout` in the half's class and
    /// tenant). `None`: none.
    pub(crate) async fn room(
        &self,
        instance: &Instance,
        config: &Config,
        tried: &[Arc<Backend>],
    ) -> Option<PrefillRoom> {
        let left =
            || (self.targets.iter()).filter(|(b, _)| !tried.iter().any(|t| Arc::ptr_eq(t, b)));
        let Some(queue) = &config.queue else {
            return left().find_map(|(b, tokens)| {
                let (slot, work) = self.route.reserve_work(b, *tokens)?;
                Some((Arc::clone(b), slot, work))
            });
        };
        let targets: Vec<Arc<Backend>> = left().map(|(b, _)| Arc::clone(b)).collect();
        if targets.is_empty() {
            return None;
        }
        let ask = Ask {
            targets: &targets,
            sticky: false,
            pinned: false,
            places: false,
            class: self.asked.standing.class,
            tenant: match queue.tenant {
                Some(TenantBy::Group) => TenantKey::of_group(self.asked.keys.group),
                _ => self.asked.standing.tenant,
            },
            bytes: self.asked.bytes,
            work: self.work.clone(),
            key: self.key,
            queue,
            limits: SlotLimits::of(queue, config.load_limits()),
            prefill: true,
            again: false,
        };
        let admitted = instance
            .queue
            .admit(ask, std::future::pending())
            .await
            .ok()?;
        Some((admitted.backend, admitted.slot, admitted.work))
    }
}

/// Where the request `asked`, whose decode half goes first to `decode`,
/// has its prefill half, or `Err` with why it is not split.
///
/// The candidates are the prefill pool's backends that are up, in its
/// table's order for the conversation (its own prefill backend first,
/// where its earlier prompts were computed); each costs the prefill work
/// magpie holds there plus the request's own (at its own backend less its
/// previous prompt), and the cheapest goes first (ties in the table's
/// order). The route keeps the pool's bounded-load caps for the slots.
pub(crate) fn prefill_route(
    snapshot: &Snapshot,
    memory: &KeyMemory,
    asked: Asked,
    decode: Option<&Arc<Backend>>,
) -> Result<PrefillPlan, Decision> {
    let (Some(config), Some(prefill)) = (&snapshot.config.disaggregation, &snapshot.prefill) else {
        return Err(Decision::Unsplittable);
    };
    let work = work(memory, asked.keys.session.memory(), asked.bytes);
    let lacking = decode.map(|d| lacking(memory, asked, &work, d));
    if lacking.is_some_and(|tokens| tokens < config.skip_below_tokens) {
        return Err(Decision::DecodeHolds);
    }
    let key = asked.keys.session.hash();
    let route = Route::preview(prefill, key);
    let own = work.warm_at.as_ref().map_or(work.tokens, |(_, t)| *t);
    let mut up = prefill
        .candidates(key)
        .filter(|b| b.live.health.is_up())
        .peekable();
    let at_home = Work {
        warm_at: up.peek().map(|home| (Arc::clone(home), own)),
        ..Work::cold(work.tokens)
    };
    let mut costed: Vec<(u64, usize, Arc<Backend>, u64)> = (up.enumerate())
        .map(|(i, b)| {
            let tokens = if i == 0 { own } else { work.tokens };
            let cost = b.live.load.held_tokens().saturating_add(tokens);
            (cost, i, Arc::clone(b), tokens)
        })
        .collect();
    costed.sort_by_key(|(cost, i, _, _)| (*cost, *i));
    let targets = costed.into_iter().map(|(_, _, b, t)| (b, t)).collect();
    Ok(PrefillPlan {
        route,
        targets,
        work: at_home,
        asked,
        key,
    })
}

/// The prompt tokens `backend` lacks of the request `asked`, its work
/// told from the key memory here (what [`prefill_route`] does once).
#[cfg(test)]
pub(crate) fn lacking_at(memory: &KeyMemory, asked: Asked, backend: &Backend) -> u64 {
    let work = work(memory, asked.keys.session.memory(), asked.bytes);
    lacking(memory, asked, &work, backend)
}

/// The prompt tokens `backend` lacks of the request `asked` whose `work`
/// ([`super::work`]) is told: its prompt less the prefix its
/// conversation's previous request left there, or less a shared head the
/// backend likely holds, and less that previous request's answer when it
/// was there (the backend computed its KV as it wrote it).
fn lacking(memory: &KeyMemory, asked: Asked, work: &Work, backend: &Backend) -> u64 {
    let key = asked.keys.session.memory();
    let work = work.clone().of_group(asked.keys.group, asked.heads);
    let warm_here = work
        .warm_at
        .as_ref()
        .is_some_and(|(b, _)| b.name == backend.name);
    let answered = match warm_here {
        true => memory.note(key).map_or(0, |(_, note)| note.answered),
        false => 0,
    };
    work.at(backend).saturating_sub(answered)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::routing::key_memory::Decision as Routed;
    use crate::routing::keys::SessionKey;
    use crate::routing::llm::note::Sent;
    use crate::routing::llm::usage::{self, Tokens};
    use crate::routing::route::How;

    /// Two prefill backends and one decode backend, vLLM's protocol.
    fn pools(skip: u64) -> Snapshot {
        let text = format!(
            "mode: http\nlisten: 127.0.0.1:7000\nkey: {{from: header, header: x-s}}\ndisaggregation: {{protocol: vllm, skip_below_tokens: {skip}}}\nbackends:\n  - {{name: p1, addr: 127.0.0.1:8001, role: prefill}}\n  - {{name: p2, addr: 127.0.0.1:8002, role: prefill}}\n  - {{name: d, addr: 127.0.0.1:8003, role: decode}}\n"
        );
        let config = Config::parse(std::path::Path::new("t.yaml"), &text).expect("it parses");
        Snapshot::build(Arc::new(config), 1, &Default::default()).expect("it builds")
    }

    fn asked(key: u64, bytes: u64) -> Asked {
        Asked {
            keys: Keys::single(SessionKey::new(key)),
            bytes,
            heads: Heads::default(),
            standing: Standing::default(),
        }
    }

    /// `key`'s request of `bytes` was served at `backend` with `prompt`
    /// tokens and an answer of `answered`.
    fn served(
        memory: &KeyMemory,
        key: u64,
        backend: &Arc<Backend>,
        bytes: u64,
        prompt: u64,
        answered: u64,
    ) {
        let sent = Sent {
            group: None,
            prompt_bytes: bytes,
        };
        let how = Routed {
            how: How::Primary,
            pin_lost: false,
            sent,
        };
        memory.routed(SessionKey::new(key), backend, how);
        let tokens = Tokens { prompt, cached: 0 };
        usage::served(memory, SessionKey::new(key), &backend.name, tokens, None);
        memory.note_mut(SessionKey::new(key), |n| n.answered = answered);
    }

    #[test]
    fn the_decode_backend_prefills_what_it_lacks_little_of() {
        let s = pools(256);
        let d = s.backend("d").expect("the decode backend");
        let memory = KeyMemory::new(100, Duration::from_secs(60));
        // A short prompt, nowhere yet: 800 bytes, 200 tokens.
        assert_eq!(lacking_at(&memory, asked(1, 800), d), 200);
        assert!(matches!(
            prefill_route(&s, &memory, asked(1, 800), Some(d)),
            Err(Decision::DecodeHolds)
        ));
        // A long one is split.
        assert!(prefill_route(&s, &memory, asked(2, 8_000), Some(d)).is_ok());
        // Its next turn: 8,000 bytes were 2,000 tokens, and the answer's
        // 150 tokens are held too; 1,200 bytes more are 300 tokens, 150 new.
        served(&memory, 2, d, 8_000, 2_000, 150);
        assert_eq!(lacking_at(&memory, asked(2, 9_200), d), 150);
        assert!(matches!(
            prefill_route(&s, &memory, asked(2, 9_200), Some(d)),
            Err(Decision::DecodeHolds)
        ));
        // Elsewhere, the whole prompt is lacking.
        let p1 = s
            .prefill
            .as_ref()
            .and_then(|p| p.backend("p1"))
            .expect("p1");
        assert_eq!(lacking_at(&memory, asked(2, 9_200), p1), 2_300);
        // With the skip off everything is split.
        let off = pools(0);
        let d = off.backend("d").expect("the decode backend");
        assert!(prefill_route(&off, &memory, asked(1, 800), Some(d)).is_ok());
    }

    #[test]
    fn a_prefill_half_goes_where_it_finishes_first() {
        let s = pools(0);
        let d = s.backend("d").expect("the decode backend");
        let memory = KeyMemory::new(100, Duration::from_secs(60));
        let plan = prefill_route(&s, &memory, asked(7, 4_000), Some(d)).expect("split");
        let names = |plan: &PrefillPlan| -> Vec<String> {
            plan.targets.iter().map(|(b, _)| b.name.clone()).collect()
        };
        let home = names(&plan)[0].clone();
        assert_eq!(plan.targets[0].1, 1_000);
        assert_eq!(names(&plan).len(), 2);
        // Work held at its own prefill backend sends it to the other one.
        let held = (plan.targets[0].0.live).try_reserve_work(u64::MAX, 5_000, None, None);
        let moved = prefill_route(&s, &memory, asked(7, 4_000), Some(d)).expect("split");
        assert_ne!(names(&moved)[0], home);
        drop(held);
        let back = prefill_route(&s, &memory, asked(7, 4_000), Some(d)).expect("split");
        assert_eq!(names(&back)[0], home);
        // A backend that is down is no candidate.
        let p = s
            .prefill
            .as_ref()
            .and_then(|p| p.backend(&home))
            .expect("home");
        p.live.health.set_up(false);
        let without = prefill_route(&s, &memory, asked(7, 4_000), Some(d)).expect("split");
        assert_eq!(names(&without).len(), 1);
        assert_ne!(names(&without)[0], home);
    }
}
