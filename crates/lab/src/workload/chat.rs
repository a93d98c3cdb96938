//! The workload's conversations, all drawn from one seed: which system
//! prompt each shares, its messages, when it arrives, and how long its user
//! thinks between turns. Texts are the engine's three-letter words
//! ([`crate::engine::prompt::answer_text`]), so a text of n tokens is
//! 4n bytes; every user message starts with its conversation and turn, so no
//! two conversations share more than their system prompt.

use std::time::Duration;

use crate::engine::prompt::{BYTES_PER_TOKEN, answer_text, splitmix64};
use magpie_core::hash::h64;

/// A seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// A seed for one purpose: the run's seed and a label, hashed.
fn seed_for(seed: u64, label: &str) -> u64 {
    h64(format!("{seed}|{label}").as_bytes())
}

/// `tokens` tokens of text starting with `head` (the head counts).
fn text(head: &str, seed: u64, tokens: usize) -> String {
    let head_tokens = head.len().div_ceil(BYTES_PER_TOKEN);
    let mut out = head.to_string();
    // Pad the head to whole tokens so the words keep their 4-byte tokens.
    while !out.len().is_multiple_of(BYTES_PER_TOKEN) {
        out.push(' ');
    }
    out.push_str(&answer_text(seed, tokens.saturating_sub(head_tokens)));
    out
}

/// System prompt `index` of a run, about `tokens` tokens.
pub fn system_prompt(seed: u64, index: usize, tokens: usize) -> String {
    let head = format!("You are assistant {index}. Follow these instructions.");
    text(&head, seed_for(seed, &format!("system {index}")), tokens)
}

/// The tool definitions of system prompt `index`'s agent: one function
/// whose description is about `tokens` tokens; none for 0.
pub fn tools(seed: u64, index: usize, tokens: usize) -> Option<serde_json::Value> {
    if tokens == 0 {
        return None;
    }
    let head = format!("Tools of assistant {index}.");
    let description = text(&head, seed_for(seed, &format!("tools {index}")), tokens);
    Some(serde_json::json!([{
        "type": "function",
        "function": {
            "name": format!("tool_{index}"),
            "description": description,
            "parameters": {"type": "object", "properties": {}},
        },
    }]))
}

/// The user's message in turn `turn` of conversation `conversation`.
pub fn user_message(seed: u64, conversation: usize, turn: usize, tokens: usize) -> String {
    let head = format!("conv-{conversation} turn {turn}:");
    text(
        &head,
        seed_for(seed, &format!("user {conversation} {turn}")),
        tokens,
    )
}

/// A conversation's shape: its system prompt, arrival and think times.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: usize,
    pub system: usize,
    /// Since the run's start.
    pub arrival: Duration,
    /// The pause before each turn after the first.
    pub thinks: Vec<Duration>,
}

/// Every conversation of a run, in arrival order: Poisson arrivals at
/// `rate` per second, a system prompt drawn uniformly from `system_prompts`,
/// exponential think times of mean `think_ms`.
pub fn conversations(
    seed: u64,
    count: usize,
    turns: usize,
    system_prompts: usize,
    rate: f64,
    think_ms: f64,
) -> Vec<Conversation> {
    let mut arrivals = Rng::new(seed_for(seed, "arrivals"));
    let mut at = 0.0;
    (0..count)
        .map(|id| {
            if id > 0 {
                at += arrivals.exponential(1.0 / rate);
            }
            let mut rng = Rng::new(seed_for(seed, &format!("conversation {id}")));
            let system = (rng.next_u64() % system_prompts.max(1) as u64) as usize;
            let thinks = (1..turns)
                .map(|_| Duration::from_secs_f64(rng.exponential(think_ms) / 1000.0))
                .collect();
            Conversation {
                id,
                system,
                arrival: Duration::from_secs_f64(at),
                thinks,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::prompt::token_count;

    #[test]
    fn texts_have_their_sizes_and_depend_on_the_seed_only() {
        let s = system_prompt(1, 0, 1000);
        assert_eq!(token_count(&s), 1000);
        assert_eq!(s, system_prompt(1, 0, 1000));
        assert_ne!(s, system_prompt(2, 0, 1000));
        assert_ne!(s, system_prompt(1, 1, 1000));
        let u = user_message(1, 7, 2, 50);
        assert!(u.starts_with("conv-7 turn 2:"));
        assert_eq!(token_count(&u), 50);
    }

    #[test]
    fn arrivals_are_poisson_at_the_rate() {
        let all = conversations(3, 2000, 4, 5, 10.0, 500.0);
        assert_eq!(all.len(), 2000);
        assert_eq!(all[0].arrival, Duration::ZERO);
        assert!(all.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        // 2,000 arrivals at 10/s take about 200 s.
        let span = all[1999].arrival.as_secs_f64();
        assert!((180.0..220.0).contains(&span), "{span}");
        let thinks: Vec<f64> = all
            .iter()
            .flat_map(|c| c.thinks.iter().map(Duration::as_secs_f64))
            .collect();
        assert_eq!(thinks.len(), 6000);
        let mean = thinks.iter().sum::<f64>() / thinks.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
        assert!(all.iter().all(|c| c.system < 5));
        assert_eq!(
            all.iter().map(|c| c.system).collect::<Vec<_>>(),
            conversations(3, 2000, 4, 5, 10.0, 500.0)
                .iter()
                .map(|c| c.system)
                .collect::<Vec<_>>()
        );
    }
}
