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
            let prefilled = prefilled(requests, block_tokens, blocks);
            OneCache {
                share,
                blocks,
                prefill_over_ideal: prefilled as f64 / ideal.max(1) as f64,
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
        let measured = one_cache(&all, 512, 4, 2048);
        assert_eq!(measured[3].blocks, 3);
        assert!(
            (measured[3].prefill_over_ideal - 1.0).abs() < 1e-9,
            "{measured:?}"
        );
    }
}
