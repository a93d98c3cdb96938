//! The limits on what placement builds, in one place: config validation checks
//! a file against these same constants, so a config that passes `magpie check`
//! always builds, and the numbers in messages, the docs and code agree.
//!
//! Each bounds the time and memory of one table build. A build happens at
//! start and on every reload, and a limit hit there should be an error with a
//! line and column, not seconds of CPU and hundreds of MiB.

/// The largest Maglev table. Slots and node indices are `u32`, and a table of
/// this size already takes 64 MiB; larger tables buy nothing measurable.
pub const MAX_TABLE_SIZE: u64 = 1 << 24;

/// Ring points across the whole pool (`points_per_weight` · total weight) for
/// the proxy's ring. A ring this size takes about 160 MiB and a second or two
/// to build; beyond it, more points buy no measurable evenness.
pub const MAX_RING_POINTS: u64 = 10_000_000;

/// The largest weight one backend may have in a config. Placement itself takes
/// any `u32` weight (a Maglev quota is a share of the table whatever the
/// weights, and a ring is bounded by its points); weights are ratios, and
/// 10,000 is already finer than any share an operator can observe.
pub const MAX_WEIGHT: u32 = 10_000;

/// Ring points for the lab's rings ([`Ring::for_lab`](super::ring::Ring::for_lab)).
/// `magpie simulate` measures rings of up to 1001 nodes of weight up to 100 at
/// 1000 points per weight, 100,100,000 points (about 1.6 GB), which the proxy's
/// [`MAX_RING_POINTS`] would refuse. This leaves room for that and stops a
/// mistake in the lab's own limits well short of exhausting memory.
pub const MAX_LAB_RING_POINTS: u64 = 200_000_000;
