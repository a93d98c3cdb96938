//! What one prefix cache of a given size would prefill on a window of a
//! trace: a reference for routers whose engines' caches are small.
//!
//! The ideal ([`super::trace::TraceFacts::ideal_hit_ratio`]) is an unbounded
//! cache shared by all engines. With bounded caches no router reaches it, and
//! how far it stays depends on the caches, not on routing: one cache that
//! holds all the engines' blocks together, evicting as the simulated engine
//! does (least recently used, a chain's tail before its head), is what a
//! router that never splits a conversation or a head could at best hope
//! for. Each share is of the window's distinct blocks: three engines that
//! each hold a quarter hold 3/4 together, at an eighth 3/8.
//!
//! Below that, a bound no router and no eviction can beat ([`optimal`]):
//! the same cache, knowing the future, evicting the block used again
//! furthest ahead (or not keeping one never used again sooner than what it
//! holds), and counting a block as a hit wherever it sits in the prompt.
//! Engines that hold their blocks apart hold no more than one cache of all
//! of them, so on blocks they can only hit less.

use std::collections::{BTreeSet, HashMap};

use lru::LruCache;
use serde::Serialize;

/// One request as a cache sees it: its input tokens, and its chained ids
/// of blocks of `block_tokens` tokens each.
#[derive(Debug, Clone, Copy)]
pub struct Blocks<'a> {
    pub input_tokens: usize,
    pub ids: &'a [u64],
}

/// The shares of the window's distinct blocks one cache is measured at.
pub const SHARES: [f64; 4] = [0.125, 0.25, 0.375, 0.75];

/// One cache of `blocks` trace blocks (`share` of the window's distinct
/// blocks), and what it prefills over the ideal.
#[derive(Debug, Clone, Serialize)]
pub struct OneCache {
    pub share: f64,
    pub blocks: usize,
    pub prefill_over_ideal: f64,
    /// What the same cache prefills at best ([`optimal`]): no routing and
    /// no eviction over engines that hold this many blocks together
    /// prefills less.
    pub optimal_over_ideal: f64,
}

/// For each of [`SHARES`]: one cache of that size over `requests`, in
/// arrival order, of blocks of `block_tokens` tokens; `ideal` is the
/// tokens an unbounded cache prefills.
pub fn one_cache(
    requests: &[Blocks<'_>],
    block_tokens: usize,
    distinct: usize,
    ideal: usize,
) -> Vec<OneCache> {
    SHARES
        .iter()
        .map(|&share| {
            let blocks = ((distinct as f64 * share) as usize).max(1);
            let over_ideal = |tokens: usize| tokens as f64 / ideal.max(1) as f64;
            OneCache {
                share,
                blocks,
                prefill_over_ideal: over_ideal(prefilled(requests, block_tokens, blocks)),
                optimal_over_ideal: over_ideal(optimal(requests, block_tokens, blocks)),
            }
        })
        .collect()
}

/// The tokens one LRU cache of `capacity` blocks prefills over `requests`:
/// a request's cached prefix is its leading blocks that are cached; then
/// all its blocks are used, the head last, so the head is evicted last.
fn prefilled(requests: &[Blocks<'_>], block_tokens: usize, capacity: usize) -> usize {
    let mut cache: LruCache<u64, ()> = LruCache::unbounded();
    let mut missed = 0;
    for r in requests {
        let matched = r.ids.iter().take_while(|id| cache.contains(*id)).count();
        missed += r.input_tokens - (matched * block_tokens).min(r.input_tokens);
        for id in r.ids.iter().rev() {
            cache.put(*id, ());
        }
        while cache.len() > capacity {
            cache.pop_lru();
        }
    }
    missed
}

/// The fewest tokens a cache of `capacity` blocks can prefill over
/// `requests`, knowing every later request: each block a request uses in
/// turn, a hit if cached (anywhere in the prompt, not only in its cached
/// prefix), else kept in place of the cached block used again furthest
/// ahead when that one is used later than it (Belady's rule, which no
/// other eviction beats). A block's tokens are 512 but the last, partial
/// one's.
fn optimal(requests: &[Blocks<'_>], block_tokens: usize, capacity: usize) -> usize {
    // Every use of a block, in order, with its tokens and its next use.
    let uses: Vec<(u64, usize)> = (requests.iter())
        .flat_map(|r| {
            (r.ids.iter().enumerate()).map(move |(i, &id)| {
                let tokens = r.input_tokens.saturating_sub(i * block_tokens);
                (id, tokens.min(block_tokens))
            })
        })
        .collect();
    let mut next = vec![usize::MAX; uses.len()];
    let mut later: HashMap<u64, usize> = HashMap::new();
    for (at, (id, _)) in uses.iter().enumerate().rev() {
        next[at] = later.insert(*id, at).unwrap_or(usize::MAX);
    }
    let total: usize = requests.iter().map(|r| r.input_tokens).sum();
    // Cached blocks by their next use, and each one's next use.
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut cached: HashMap<u64, usize> = HashMap::new();
    let mut hit = 0;
    for (at, &(id, tokens)) in uses.iter().enumerate() {
        let next_use = next[at];
        if let Some(was) = cached.get_mut(&id) {
            hit += tokens;
            by_next.remove(&(*was, id));
            *was = next_use;
            by_next.insert((next_use, id));
            continue;
        }
        if next_use == usize::MAX {
            continue;
        }
        if cached.len() >= capacity {
            match by_next.last().copied() {
                Some((furthest, out)) if furthest > next_use => {
                    by_next.remove(&(furthest, out));
                    cached.remove(&out);
                }
                _ => continue,
            }
        }
        cached.insert(id, next_use);
        by_next.insert((next_use, id));
    }
    total - hit.min(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(input_tokens: usize, ids: &[u64]) -> Blocks<'_> {
        Blocks { input_tokens, ids }
    }

    #[test]
    fn a_cache_of_everything_is_the_ideal_and_a_small_one_prefills_more() {
        let (a, b, c) = (
            request(1024, &[0, 1]),
            request(1024, &[0, 2]),
            request(1536, &[0, 1, 3]),
        );
        let all = [a, b, c];
        // Ideal: 1024, then 512 (block 0 shared), then 512 (0 and 1 cached).
        assert_eq!(prefilled(&all, 512, 100), 2048);
        // Two blocks: after b, 0 and 2 are cached; c finds 0 but not 1.
        assert_eq!(prefilled(&all, 512, 2), 1024 + 512 + 1024);
        // Knowing the future: b's block 2 is never used again, so it is
        // not kept, and c finds 0 and 1; with one block, 0 is kept.
        assert_eq!(optimal(&all, 512, 100), 2048);
        assert_eq!(optimal(&all, 512, 2), 1024 + 512 + 512);
        assert_eq!(optimal(&all, 512, 1), 1024 + 512 + 1024);
        let measured = one_cache(&all, 512, 4, 2048);
        assert_eq!(measured[3].blocks, 3);
        assert!(
            (measured[3].prefill_over_ideal - 1.0).abs() < 1e-9,
            "{measured:?}"
        );
    }
}
