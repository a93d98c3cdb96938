//! Slow start: a backend that joins (added, or back from down) takes over
//! the keys it owns gradually, over a ramp of a fixed duration.
//!
//! At a moment `progress` of the ramp (0 at its start, 1 at its end), a key
//! the backend owns has moved to it when its own fraction, a hash of the key
//! and the backend's name taken as a number in [0, 1), is below
//! `progress`; the other keys stay with the candidate that would have taken
//! them without it. The fraction depends on nothing but the key and the
//! name, so every instance with the same config moves the same keys at the
//! same progress, and a key that has moved stays moved as the ramp goes on.
//! Pure: the clock is the caller's.

use std::time::Duration;

use crate::hash::h64_parts;

/// How far a ramp of `length` is after `elapsed`: in [0, 1); `None` once it
/// is over (or for a ramp of no length).
pub fn progress(elapsed: Duration, length: Duration) -> Option<f64> {
    if length.is_zero() || elapsed >= length {
        return None;
    }
    Some(elapsed.as_secs_f64() / length.as_secs_f64())
}

/// The key's fraction for `backend`: where in the ramp it moves.
pub fn fraction(key: u64, backend: &str) -> f64 {
    let h = h64_parts(&[b"slow_start", &key.to_be_bytes(), backend.as_bytes()]);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether `key`, owned by `backend`, has moved to it at `progress`.
pub fn moved(key: u64, backend: &str, progress: f64) -> bool {
    fraction(key, backend) < progress
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_moves_a_growing_share_and_never_takes_one_back() {
        let secs = Duration::from_secs;
        assert_eq!(progress(secs(0), secs(60)), Some(0.0));
        assert_eq!(progress(secs(15), secs(60)), Some(0.25));
        assert_eq!(progress(secs(60), secs(60)), None);
        assert_eq!(progress(secs(1), Duration::ZERO), None);
        let keys = 0..20_000u64;
        let share = |p: f64| keys.clone().filter(|&k| moved(k, "r4", p)).count() as f64 / 20_000.0;
        assert_eq!(share(0.0), 0.0);
        for p in [0.1, 0.25, 0.5, 0.9] {
            assert!((share(p) - p).abs() < 0.02, "{p}: {}", share(p));
        }
        // Monotonic: a key moved at 0.3 is still moved at 0.6.
        assert!(
            keys.clone()
                .all(|k| !moved(k, "r4", 0.3) || moved(k, "r4", 0.6))
        );
        // Another backend's ramp moves other keys.
        let both = keys
            .filter(|&k| moved(k, "r4", 0.5) && moved(k, "r5", 0.5))
            .count();
        assert!((4_500..5_500).contains(&both), "{both}");
    }
}
