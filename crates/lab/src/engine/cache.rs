//! The simulated engine's prefix cache: KV blocks named by their chained
//! hashes ([`super::prompt::block_hashes`]), a fixed number of them, as in
//! vLLM's automatic prefix caching.
//!
//! A running request holds (references) its blocks; a block nobody holds
//! stays cached and is evictable, least recently released first. A request
//! releases its blocks last to first, so under pressure a chain loses its
//! tail before its head and the shared heads (system prompts) live longest.
//! A prompt's cached prefix is its leading blocks that are cached, whole
//! blocks from the start: a chain with a hole is cached only up to the hole.

use std::collections::HashMap;

use lru::LruCache;

/// A prefix cache of at most `capacity` blocks.
pub struct PrefixCache {
    capacity: usize,
    /// Every cached block and how many running requests hold it.
    refs: HashMap<u64, u32>,
    /// The blocks nobody holds, least recently released at the LRU end.
    free: LruCache<u64, ()>,
    evictions: u64,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            refs: HashMap::new(),
            free: LruCache::unbounded(),
            evictions: 0,
        }
    }

    /// How many of `hashes`' leading blocks are cached.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.refs.contains_key(h))
            .count()
    }

    /// Holds `hashes`' blocks from the first, caching those that are not
    /// cached yet (evicting unheld blocks for room). Stops at the first block
    /// it cannot hold because every cached block is held; returns how many it
    /// holds, which are `hashes[..n]`: give exactly those to [`Self::release`].
    pub fn acquire(&mut self, hashes: &[u64]) -> usize {
        for (i, &hash) in hashes.iter().enumerate() {
            if let Some(count) = self.refs.get_mut(&hash) {
                if *count == 0 {
                    self.free.pop(&hash);
                }
                *count += 1;
                continue;
            }
            if self.refs.len() >= self.capacity {
                let Some((victim, ())) = self.free.pop_lru() else {
                    return i;
                };
                self.refs.remove(&victim);
                self.evictions += 1;
            }
            self.refs.insert(hash, 1);
        }
        hashes.len()
    }

    /// Lets go of blocks [`Self::acquire`] held, last to first; the blocks
    /// stay cached until evicted.
    pub fn release(&mut self, hashes: &[u64]) {
        for hash in hashes.iter().rev() {
            if let Some(count) = self.refs.get_mut(hash) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.free.put(*hash, ());
                }
            }
        }
    }

    /// Cached blocks.
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Blocks held by running requests (vLLM's KV cache usage counts these).
    pub fn held(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::prompt::block_hashes;

    #[test]
    fn a_prompt_matches_its_cached_leading_blocks() {
        let mut cache = PrefixCache::new(100);
        let first = block_hashes(&"a".repeat(64 * 3), 16);
        assert_eq!(cache.matched(&first), 0);
        assert_eq!(cache.acquire(&first), 3);
        cache.release(&first);
        let longer = block_hashes(&format!("{}{}", "a".repeat(64 * 3), "b".repeat(64 * 2)), 16);
        assert_eq!(cache.matched(&longer), 3);
        // Another prefix shares nothing, even with equal later blocks: the chain.
        let other = block_hashes(&format!("{}{}", "c".repeat(64), "a".repeat(64 * 2)), 16);
        assert_eq!(cache.matched(&other), 0);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn a_hole_ends_the_match() {
        let mut cache = PrefixCache::new(100);
        let hashes = [1, 2, 3, 4];
        cache.acquire(&[1, 2, 4]);
        assert_eq!(cache.matched(&hashes), 2);
    }

    #[test]
    fn eviction_takes_the_least_recently_released_unheld_block_tail_first() {
        let mut cache = PrefixCache::new(4);
        cache.acquire(&[1, 2]);
        cache.acquire(&[10, 11]);
        cache.release(&[1, 2]);
        cache.release(&[10, 11]);
        // Full; a new chain of two evicts chain 1's tail, then its head
        // (released before chain 10's blocks).
        assert_eq!(cache.acquire(&[20]), 1);
        assert_eq!(cache.matched(&[1, 2]), 1);
        assert_eq!(cache.acquire(&[21]), 1);
        assert_eq!(cache.matched(&[1]), 0);
        assert_eq!(cache.matched(&[10, 11]), 2);
        assert_eq!(cache.evictions(), 2);
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn held_blocks_are_never_evicted_and_capacity_holds() {
        let mut cache = PrefixCache::new(3);
        assert_eq!(cache.acquire(&[1, 2]), 2);
        assert_eq!(cache.acquire(&[5, 6, 7]), 1, "one free slot, then all held");
        assert_eq!(cache.held(), 3);
        cache.release(&[5]);
        assert_eq!(cache.acquire(&[8]), 1, "evicts 5, the only unheld block");
        assert_eq!(cache.matched(&[5]), 0);
        assert_eq!(cache.matched(&[1, 2]), 2);
        assert_eq!(cache.len(), 3);
        // Holding a cached block twice needs two releases.
        cache.acquire(&[1]);
        cache.release(&[1]);
        assert_eq!(cache.held(), 3);
        cache.release(&[1, 2]);
        assert_eq!(cache.held(), 1);
        assert_eq!(cache.capacity(), 3);
    }
}
