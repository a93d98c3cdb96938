//! Who sends a conversation and at which priority: `--tenants` and
//! `--classes` give named shares (`quiet:1,noisy:10`), each conversation
//! draws one of each from its own seed, and its requests name them in a
//! header (`--tenant-header`, `--class-header`). The draws use a generator
//! of their own, so a run without shares sends exactly what it sent before,
//! and `--only-tenant` keeps one tenant's conversations exactly as they are
//! in the whole mix (the baseline of a tenant without its neighbours).

use super::chat::Rng;
use magpie_core::hash::h64;

/// One named share of a mix: `name:weight`.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub name: String,
    pub weight: f64,
}

/// Parses `name:weight` (a weight above 0 and at most 1,000,000; a
/// name of letters, digits, `-` and `_`).
pub fn parse_share(text: &str) -> Result<Share, String> {
    let (name, weight) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected name:weight"))?;
    let valid = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if name.is_empty() || !name.bytes().all(valid) {
        return Err(format!("{name:?}: a name is letters, digits, - and _"));
    }
    let weight: f64 = weight
        .parse()
        .map_err(|_| format!("{weight:?}: the weight is a number"))?;
    if !(weight > 0.0 && weight <= 1_000_000.0) {
        return Err(format!(
            "{weight}: the weight must be above 0, at most 1000000"
        ));
    }
    Ok(Share {
        name: name.to_string(),
        weight,
    })
}

/// Which of `shares` conversation `id` of run `seed` draws for `what`
/// (`None` without shares).
pub fn draw(shares: &[Share], seed: u64, id: usize, what: &str) -> Option<usize> {
    if shares.is_empty() {
        return None;
    }
    let total: f64 = shares.iter().map(|s| s.weight).sum();
    let mut rng = Rng::new(h64(format!("{seed}|{what} {id}").as_bytes()));
    let mut at = rng.unit() * total;
    for (i, s) in shares.iter().enumerate() {
        if at < s.weight {
            return Some(i);
        }
        at -= s.weight;
    }
    Some(shares.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_and_draws_follow_their_weights() {
        let shares = vec![
            parse_share("quiet:1").unwrap(),
            parse_share("noisy:10").unwrap(),
        ];
        assert!(parse_share("x").is_err());
        assert!(parse_share("x:0").is_err());
        assert!(parse_share("a b:1").is_err());
        assert!(parse_share("x:NaN").is_err());
        let noisy = (0..11_000)
            .filter(|&id| draw(&shares, 7, id, "tenant") == Some(1))
            .count();
        assert!((9_700..10_300).contains(&noisy), "{noisy}");
        assert_eq!(draw(&shares, 7, 3, "tenant"), draw(&shares, 7, 3, "tenant"));
        assert_eq!(draw(&[], 7, 3, "tenant"), None);
    }
}
