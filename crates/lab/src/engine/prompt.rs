//! What the simulated engine sees of a request: the prompt text a chat
//! template renders from the messages, its token count, the chained hashes of
//! its whole blocks, and the deterministic text of an answer.
//!
//! The tokenizer is one token per [`BYTES_PER_TOKEN`] bytes of the rendered
//! prompt, cut from the start. So a text that extends another has the other's
//! whole tokens, and whole blocks, as its own first ones: a conversation's
//! next turn (the last prompt, the answer, a new user message) starts with the
//! last turn's blocks, as with a real tokenizer and chat template. The
//! workload renders and hashes with the same functions, so its "ideal cache"
//! counts exactly what an engine would.

use magpie_core::hash::h64_parts;

/// One token per this many bytes of rendered prompt (the last token may be shorter).
pub const BYTES_PER_TOKEN: usize = 4;

/// The chat template's markers, ChatML style.
const START: &str = "<|im_start|>";
const END: &str = "<|im_end|>\n";

/// Tokens in `text`.
pub fn token_count(text: &str) -> usize {
    text.len().div_ceil(BYTES_PER_TOKEN)
}

/// The chained hashes of `text`'s whole blocks of `block_tokens` tokens: block
/// i's hash covers block i−1's hash and block i's bytes, so equal hashes mean
/// equal prefixes (vLLM's automatic prefix caching hashes blocks the same way).
pub fn block_hashes(text: &str, block_tokens: usize) -> Vec<u64> {
    let block_bytes = block_tokens.max(1) * BYTES_PER_TOKEN;
    let mut previous = 0u64;
    text.as_bytes()
        .chunks_exact(block_bytes)
        .map(|block| {
            previous = h64_parts(&[&previous.to_be_bytes(), block]);
            previous
        })
        .collect()
}

/// Renders a chat (each message's role and text) as one prompt: the tools'
/// JSON first when there are any, every message in turn, then the
/// generation prompt for the assistant's answer. The rendering of a chat is
/// the exact prefix of the rendering of any chat that extends it (once the
/// answer is appended as an assistant message).
pub fn render_chat<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    tools: Option<&str>,
) -> String {
    let mut out = String::new();
    if let Some(tools) = tools {
        push_turn(&mut out, "tools", tools);
    }
    for (role, content) in messages {
        push_turn(&mut out, role, content);
    }
    out.push_str(START);
    out.push_str("assistant\n");
    out
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str(START);
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str(END);
}

/// What follows an answer in the next turn's prompt, before the next message:
/// the answer's closing marker. (`render_chat` of the longer chat writes it.)
pub const ANSWER_END: &str = END;

/// Three-letter words and a space: every answer token is one of them, so an
/// answer of n tokens is exactly 4n bytes.
const WORDS: [&str; 32] = [
    "the ", "and ", "for ", "you ", "are ", "not ", "but ", "can ", "all ", "one ", "new ", "now ",
    "way ", "may ", "use ", "how ", "our ", "out ", "any ", "day ", "get ", "has ", "him ", "his ",
    "its ", "let ", "put ", "say ", "see ", "set ", "two ", "who ",
];

/// The deterministic answer to a prompt: `tokens` words drawn from a
/// generator seeded with `seed` (the engine seeds it with the prompt's hash,
/// so the same prompt always gets the same answer).
pub fn answer_text(seed: u64, tokens: usize) -> String {
    let mut state = seed;
    let mut out = String::with_capacity(tokens * BYTES_PER_TOKEN);
    for _ in 0..tokens {
        let r = splitmix64(&mut state);
        out.push_str(WORDS[(r >> 59) as usize]);
    }
    out
}

/// One step of SplitMix64: cheap, and well mixed enough to pick words and
/// draw the workload's random numbers.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_chat_starts_with_the_shorter_ones_blocks() {
        let first = render_chat([("system", "be brief"), ("user", "hello there")], None);
        let answer = answer_text(7, 40);
        let second = render_chat(
            [
                ("system", "be brief"),
                ("user", "hello there"),
                ("assistant", answer.as_str()),
                ("user", "and then?"),
            ],
            None,
        );
        assert!(second.starts_with(&format!("{first}{answer}{ANSWER_END}")));
        let short = block_hashes(&first, 4);
        let long = block_hashes(&second, 4);
        assert!(!short.is_empty());
        assert_eq!(short, long[..short.len()]);
    }

    #[test]
    fn a_changed_byte_changes_that_block_and_every_later_one() {
        let a = "x".repeat(64 * 4);
        let mut b = a.clone();
        b.replace_range(70..71, "y");
        let (ha, hb) = (block_hashes(&a, 16), block_hashes(&b, 16));
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[0], hb[0]);
        assert!(ha[1..].iter().zip(&hb[1..]).all(|(x, y)| x != y));
        // Equal blocks at different depths hash differently: the chain.
        assert_ne!(ha[0], ha[1]);
    }

    #[test]
    fn tokens_and_answers_have_fixed_sizes() {
        assert_eq!(token_count(""), 0);
        assert_eq!(token_count("abcde"), 2);
        let answer = answer_text(1, 25);
        assert_eq!(answer.len(), 100);
        assert_eq!(token_count(&answer), 25);
        assert_eq!(answer, answer_text(1, 25));
        assert_ne!(answer, answer_text(2, 25));
        assert!(render_chat([], Some("[]")).starts_with("<|im_start|>tools\n[]"));
    }
}
