//! A backend's prefill rate, learned from its own answers (`queue`): the
//! prompt tokens it computed for the requests magpie sent it, over the time
//! it was busy with them.
//!
//! Each request's work ([`crate::routing::llm::work`]) is held from its
//! admission to its answer's first byte. When that byte comes, the backend
//! was busy with the request since it was sent, or since the previous first
//! byte there if that came later: what the backend spent on this one alone,
//! even when it prefills several at once (a batch's first answer counts the
//! batch's time, the others none, so the sum is the batch's time). Tokens
//! and seconds are summed with a decay of [`DECAY`] per answer, about the
//! last hundred answers, and the rate is their ratio once
//! [`MIN_ANSWERS`] answers were counted.
//!
//! The queue weighs work by it ([`crate::routing::queue`]): 4,000 tokens
//! ahead at an engine twice as fast come as soon as 2,000 at the other. It
//! is this magpie's view: work that other clients send an engine slows it
//! here too, which is what a request sent there would meet; but not the
//! fleet's (`sessions.store: redis`): the queue counts the other magpies'
//! work ahead already, so what they held there when a request was sent
//! counts as computed in its wait (beyond what they held when the answer
//! before it was sent, if that answer came during its wait), else each
//! magpie of two would learn an engine about half as fast as it is, and
//! the one the other sent less to faster.
//!
//! The same sums give the mean work of a request answered there lately
//! ([`PrefillRate::mean_tokens`]): what each conversation in flight there
//! will, on average, send again, ahead of a new one's next turn.

use std::sync::Mutex;

use tokio::time::Instant;

/// The weight each earlier answer keeps at each new one.
pub(crate) const DECAY: f64 = 0.99;
/// Answers counted before a rate is given.
pub(crate) const MIN_ANSWERS: u32 = 8;

/// One backend's learned prefill rate.
#[derive(Debug, Default)]
pub(crate) struct PrefillRate {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The previous first byte.
    last: Option<Instant>,
    tokens: f64,
    /// The fleet's work counted as computed in the same time.
    fleet_tokens: f64,
    /// The fleet's work ahead of the request answered at `last`.
    last_fleet_ahead: u64,
    seconds: f64,
    answers: u32,
}

impl PrefillRate {
    /// A request of `tokens` of work, sent at `sent` behind `fleet_ahead`
    /// tokens of the other magpies' work, had its first byte at `now`.
    pub(crate) fn answered(&self, tokens: u64, fleet_ahead: u64, sent: Instant, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // An earlier answer during its wait counted the time (and the
        // fleet's work ahead of both) before it.
        let (from, fleet) = match state.last {
            Some(last) if last > sent => (last, fleet_ahead.saturating_sub(state.last_fleet_ahead)),
            _ => (sent, fleet_ahead),
        };
        let busy = now.saturating_duration_since(from).as_secs_f64();
        state.last = Some(now.max(state.last.unwrap_or(now)));
        state.last_fleet_ahead = fleet_ahead;
        state.tokens = state.tokens * DECAY + tokens as f64;
        state.fleet_tokens = state.fleet_tokens * DECAY + fleet as f64;
        state.seconds = state.seconds * DECAY + busy;
        state.answers = state.answers.saturating_add(1);
    }

    /// Tokens per second, once [`MIN_ANSWERS`] answers were counted (and
    /// some time and work was).
    pub(crate) fn per_second(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let learned = state.answers >= MIN_ANSWERS && state.seconds > 0.0 && state.tokens > 0.0;
        learned.then(|| (state.tokens + state.fleet_tokens) / state.seconds)
    }

    /// The mean work of a request answered here lately, in tokens, once
    /// [`MIN_ANSWERS`] answers were counted.
    pub(crate) fn mean_tokens(&self) -> Option<f64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // `tokens` sums the answers with these weights: 1, DECAY, DECAY², …
        let answers = i32::try_from(state.answers).unwrap_or(i32::MAX);
        let weight = (1.0 - DECAY.powi(answers)) / (1.0 - DECAY);
        (state.answers >= MIN_ANSWERS).then(|| state.tokens / weight)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_rate_is_work_over_busy_time_and_a_batch_counts_once() {
        let rate = PrefillRate::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // One at a time: 1,000 tokens each 100 ms, with idle time between.
        for i in 0..4 {
            rate.answered(1000, 0, ms(i * 300), ms(i * 300 + 100));
        }
        assert_eq!(rate.per_second(), None, "too few answers");
        // A batch of four sent together, answered together after 400 ms:
        // the first counts the 400 ms, the others none.
        for _ in 0..4 {
            rate.answered(1000, 0, ms(2000), ms(2400));
        }
        let per_second = rate.per_second().expect("learned");
        assert!((per_second - 10_000.0).abs() < 300.0, "{per_second}");
        let mean = rate.mean_tokens().expect("learned");
        assert!((mean - 1000.0).abs() < 1.0, "{mean}");
    }

    #[test]
    fn the_fleets_work_ahead_counts_as_computed_in_the_wait() {
        let rate = PrefillRate::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Each of 1,000 tokens, sent behind 1,000 of another magpie's, at
        // an engine of 10,000 a second: answered 200 ms later.
        for i in 0..8 {
            rate.answered(1000, 1000, ms(i * 300), ms(i * 300 + 200));
        }
        let per_second = rate.per_second().expect("learned");
        assert!((per_second - 10_000.0).abs() < 1.0, "{per_second}");
        // Two sent together behind 2,000: the first answered after 300 ms
        // counts it, the second, 100 ms later, only its own.
        rate.answered(1000, 2000, ms(3000), ms(3300));
        rate.answered(1000, 2000, ms(3000), ms(3400));
        let per_second = rate.per_second().expect("learned");
        assert!((per_second - 10_000.0).abs() < 1.0, "{per_second}");
        let mean = rate.mean_tokens().expect("learned");
        assert!((mean - 1000.0).abs() < 1.0, "own work only: {mean}");
    }
}
