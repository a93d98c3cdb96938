//! The LLM policy: what routing knows of inference engines beyond a
//! generic load balancer's keys, pins and loads. Conversations that share a
//! head are grouped and placed by their group's home; a conversation's
//! first request goes where its cache is likeliest; a request's prefill
//! work is told from its body and its key's history; an engine's `usage`
//! tells a cache hit from a miss.
//!
//! Only the decision ([`crate::routing::decision`]) calls in here, at plan,
//! take and commit; the queue weighs [`work::Work`]; the key memory keeps a
//! [`note::Note`] per key without reading it. A reader of the generic load
//! balancer never needs this room.
//!
//! | module | owns |
//! |---|---|
//! | [`groups`] | groups' homes (`key.group_choices`): placing a group, its home first, what serving a group's request counts |
//! | [`openings`] | conversations' first requests: where one was placed, and under a `queue` where the latest that opened alike went |
//! | [`work`] | a request's prefill work, told from its body and what its key's previous request left in a cache |
//! | [`usage`] | an answer's usage: token counters, cache misses and their causes |
//! | [`note`] | what the key memory keeps with each key for this policy |
//! | [`disaggregation`] | prefill and decode on separate pools: where a request's prefill half goes, and when it is not split |

pub(crate) mod disaggregation;
pub(crate) mod groups;
pub(crate) mod note;
pub(crate) mod openings;
pub(crate) mod usage;
pub(crate) mod work;

#[cfg(test)]
mod tests;
