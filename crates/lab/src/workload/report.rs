//! The workload's summary, from every request's record: how much of the
//! prompts the engines' caches held, the prefill work against the ideal
//! (one infinite cache shared by all engines), times to first token, the
//! conversations served by more than one engine, the busiest engine's share,
//! after a scale-up the live conversations that moved, and per tenant and
//! class ([`Slice`]): goodput against `--slo-ms`, refusals with a status
//! (429, 503) apart from other failures, and TTFT.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::trace::TraceFacts;
use super::{KeyMode, WorkloadArgs};

/// What a run produced.
pub struct Outcome {
    pub records: Vec<Record>,
    pub scale_up: Option<ScaleUp>,
    /// Conversations the deadline cut.
    pub cut: usize,
    pub elapsed: Duration,
    /// The replayed trace's window, if any.
    pub trace: Option<TraceFacts>,
}

/// One request.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub conversation: usize,
    pub turn: usize,
    /// Which `--url` it went to.
    pub url: usize,
    /// When it was sent, seconds into the run.
    pub sent_s: f64,
    pub ttft_ms: f64,
    pub total_ms: f64,
    /// The `x-engine` of its answer.
    pub engine: Option<String>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The tokens the ideal cache would have prefilled.
    pub ideal_uncached: u64,
    pub error: Option<String>,
    /// Its conversation's tenant and class (`--tenants`, `--classes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// The scale-up command and what it did to live conversations.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleUp {
    /// When the command started and finished, seconds into the run.
    pub at: f64,
    pub finished_at: f64,
    pub status: String,
    /// Conversations with answered turns both before and after `finished_at`.
    pub live_conversations: usize,
    /// Of those, the ones whose first turn after it went to another engine
    /// than their last turn before it.
    pub moved: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub key: KeyMode,
    pub urls: usize,
    pub conversations: usize,
    pub turns: usize,
    pub seed: u64,
    pub elapsed_s: f64,
    pub requests: usize,
    pub errors: usize,
    pub errors_by_kind: BTreeMap<String, usize>,
    /// Conversations still running at `--max-seconds`.
    pub cut_conversations: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Σ cached ÷ Σ prompt over answered requests.
    pub hit_ratio: f64,
    pub uncached_tokens: u64,
    pub ideal_uncached_tokens: u64,
    /// Σ uncached ÷ Σ ideal uncached: 1 is as good as one shared cache.
    pub prefill_vs_ideal: f64,
    /// The ideal cache's hit ratio: 1 − Σ ideal uncached ÷ Σ prompt.
    pub ideal_hit_ratio: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub total_p50_ms: f64,
    pub total_p99_ms: f64,
    /// Conversations with two or more answered turns, and those among them
    /// served by more than one engine.
    pub multi_turn_conversations: usize,
    pub split_conversations: usize,
    /// Answered requests per engine.
    pub engines: BTreeMap<String, usize>,
    /// The busiest engine's requests over the mean of the engines that answered.
    pub share_max_over_mean: f64,
    /// Prompt tokens each engine computed (its prompts less what its cache
    /// held), and the busiest's over the mean: the load in work, where a
    /// count of requests weighs a short prompt as much as a long one.
    pub engines_prefill: BTreeMap<String, u64>,
    pub prefill_share_max_over_mean: f64,
    pub scale_up: Option<ScaleUp>,
    /// The replayed trace's window (`--trace`): its own figures, the ideal
    /// hit ratio among them, to check `ideal_hit_ratio` against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceFacts>,
    /// Every request, and by tenant and by class (when the run has them).
    pub slo_ms: f64,
    pub all: Slice,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_tenant: BTreeMap<String, Slice>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_class: BTreeMap<String, Slice>,
    /// By `tenant/class`, when the run has both.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_tenant_class: BTreeMap<String, Slice>,
}

/// Some of a run's requests (a tenant's, a class's, or all).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Slice {
    pub requests: usize,
    pub answered: usize,
    /// Refused with a status: 429 or 503.
    pub refused: usize,
    /// Every other failure: resets, time-outs, other statuses.
    pub failed: usize,
    /// The share of requests answered with a first token within `--slo-ms`
    /// (a refused or failed request is not good).
    pub goodput: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
}

impl Slice {
    pub fn of<'a>(records: impl IntoIterator<Item = &'a Record>, slo_ms: f64) -> Slice {
        let mut s = Slice::default();
        let mut ttft = Vec::new();
        let mut good = 0;
        for r in records {
            s.requests += 1;
            match r.error.as_deref() {
                None => {
                    s.answered += 1;
                    ttft.push(r.ttft_ms);
                    good += usize::from(r.ttft_ms <= slo_ms);
                }
                Some("status 429" | "status 503") => s.refused += 1,
                Some(_) => s.failed += 1,
            }
        }
        s.goodput = ratio(good as u64, s.requests as u64);
        s.ttft_p50_ms = percentile(&mut ttft, 0.50);
        s.ttft_p99_ms = percentile(&mut ttft, 0.99);
        s
    }
}

/// The records of each value `part` gives (none when it gives none).
fn slices(
    records: &[Record],
    slo_ms: f64,
    part: fn(&Record) -> Option<String>,
) -> BTreeMap<String, Slice> {
    let mut parts: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    for r in records {
        if let Some(name) = part(r) {
            parts.entry(name).or_default().push(r);
        }
    }
    (parts.into_iter())
        .map(|(name, rs)| (name, Slice::of(rs, slo_ms)))
        .collect()
}

/// Writes `records` to `path`, one JSON object per line.
pub fn write_records(path: &std::path::Path, records: &[Record]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in records {
        serde_json::to_writer(&mut out, r).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

impl Summary {
    pub fn of(args: &WorkloadArgs, outcome: &Outcome) -> Self {
        let records = &outcome.records;
        let ok: Vec<&Record> = records.iter().filter(|r| r.error.is_none()).collect();
        let mut errors_by_kind = BTreeMap::new();
        for r in records {
            if let Some(e) = &r.error {
                *errors_by_kind.entry(e.clone()).or_insert(0) += 1;
            }
        }
        let prompt_tokens: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
        let cached_tokens: u64 = ok.iter().map(|r| r.cached_tokens).sum();
        let uncached_tokens = prompt_tokens.saturating_sub(cached_tokens);
        let ideal_uncached_tokens: u64 = ok.iter().map(|r| r.ideal_uncached).sum();
        let mut ttft: Vec<f64> = ok.iter().map(|r| r.ttft_ms).collect();
        let mut total: Vec<f64> = ok.iter().map(|r| r.total_ms).collect();
        let (multi_turn_conversations, split_conversations) = splits(&ok);
        let engines = per_engine(&ok, |_| 1);
        let engines_prefill = per_engine(&ok, |r| r.prompt_tokens.saturating_sub(r.cached_tokens));
        let scale_up = outcome.scale_up.clone().map(|s| moved(s, &ok));
        Self {
            key: args.key,
            urls: args.url.len(),
            conversations: (outcome.trace.as_ref()).map_or(args.conversations, |t| t.conversations),
            turns: (outcome.trace.as_ref()).map_or(args.turns, |t| t.max_turns),
            seed: args.seed,
            elapsed_s: outcome.elapsed.as_secs_f64(),
            requests: records.len(),
            errors: records.len() - ok.len(),
            errors_by_kind,
            cut_conversations: outcome.cut,
            prompt_tokens,
            cached_tokens,
            hit_ratio: ratio(cached_tokens, prompt_tokens),
            uncached_tokens,
            ideal_uncached_tokens,
            prefill_vs_ideal: ratio(uncached_tokens, ideal_uncached_tokens),
            ideal_hit_ratio: 1.0 - ratio(ideal_uncached_tokens, prompt_tokens).min(1.0),
            ttft_p50_ms: percentile(&mut ttft, 0.50),
            ttft_p99_ms: percentile(&mut ttft, 0.99),
            total_p50_ms: percentile(&mut total, 0.50),
            total_p99_ms: percentile(&mut total, 0.99),
            multi_turn_conversations,
            split_conversations,
            share_max_over_mean: share(engines.values().map(|&n| n as f64)),
            engines,
            prefill_share_max_over_mean: share(engines_prefill.values().map(|&n| n as f64)),
            engines_prefill,
            scale_up,
            trace: outcome.trace.clone(),
            slo_ms: args.slo_ms,
            all: Slice::of(records, args.slo_ms),
            by_tenant: slices(records, args.slo_ms, |r| r.tenant.clone()),
            by_class: slices(records, args.slo_ms, |r| r.class.clone()),
            by_tenant_class: slices(records, args.slo_ms, |r| {
                Some(format!("{}/{}", r.tenant.as_ref()?, r.class.as_ref()?))
            }),
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Nearest rank; 0 for no values.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// (conversations with two or more answered turns, those served by more than one engine).
fn splits(ok: &[&Record]) -> (usize, usize) {
    let mut by_conversation: HashMap<usize, (usize, BTreeSet<&str>)> = HashMap::new();
    for r in ok {
        let entry = by_conversation.entry(r.conversation).or_default();
        entry.0 += 1;
        entry.1.insert(r.engine.as_deref().unwrap_or("?"));
    }
    let multi = by_conversation.values().filter(|(n, _)| *n >= 2);
    let split = multi.clone().filter(|(_, e)| e.len() > 1).count();
    (multi.count(), split)
}

/// What `of` each answered request sums to, per engine.
fn per_engine<T: Default + std::ops::AddAssign>(
    ok: &[&Record],
    of: impl Fn(&Record) -> T,
) -> BTreeMap<String, T> {
    let mut engines = BTreeMap::new();
    for r in ok {
        let name = r.engine.clone().unwrap_or_else(|| "?".into());
        *engines.entry(name).or_default() += of(r);
    }
    engines
}

/// The largest of the engines' `loads` over their mean (0 when they sum
/// to 0).
fn share(loads: impl Iterator<Item = f64>) -> f64 {
    let (total, max, n) = loads.fold((0.0, 0.0, 0.0), |(t, m, n), v: f64| {
        (t + v, v.max(m), n + 1.0)
    });
    if total == 0.0 { 0.0 } else { max * n / total }
}

/// Fills in the live conversations at the scale-up and how many moved.
fn moved(mut s: ScaleUp, ok: &[&Record]) -> ScaleUp {
    // Per conversation: the last (time, engine) before the moment, the first after.
    type Seen<'a> = Option<(f64, &'a str)>;
    let mut around: HashMap<usize, (Seen, Seen)> = HashMap::new();
    for r in ok {
        let engine = r.engine.as_deref().unwrap_or("?");
        let entry = around.entry(r.conversation).or_default();
        if r.sent_s < s.finished_at {
            if entry.0.is_none_or(|(t, _)| r.sent_s > t) {
                entry.0 = Some((r.sent_s, engine));
            }
        } else if entry.1.is_none_or(|(t, _)| r.sent_s < t) {
            entry.1 = Some((r.sent_s, engine));
        }
    }
    let live: Vec<(&str, &str)> = around
        .values()
        .filter_map(|(before, after)| Some((before.as_ref()?.1, after.as_ref()?.1)))
        .collect();
    s.live_conversations = live.len();
    s.moved = live.iter().filter(|(b, a)| b != a).count();
    s
}

impl Summary {
    /// One line for all requests, then one per class, tenant and tenant/class.
    fn fmt_slices(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = (self.by_class.iter()).map(|(n, s)| (format!("class {n}"), s));
        let named = named.chain((self.by_tenant.iter()).map(|(n, s)| (format!("tenant {n}"), s)));
        let named = named.chain((self.by_tenant_class.iter()).map(|(n, s)| (n.clone(), s)));
        for (name, s) in std::iter::once(("all".to_string(), &self.all)).chain(named) {
            writeln!(
                f,
                "{name:<21} goodput {:.3} (TTFT ≤ {:.0} ms), TTFT p50 / p99 {:.0} / {:.0} ms, {} requests, {} refused, {} failed",
                s.goodput,
                self.slo_ms,
                s.ttft_p50_ms,
                s.ttft_p99_ms,
                s.requests,
                s.refused,
                s.failed
            )?;
        }
        Ok(())
    }

    /// Each engine's requests and prefill, and the busiest's over the mean.
    fn fmt_engines(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn line<T: fmt::Display>(
            f: &mut fmt::Formatter<'_>,
            label: &str,
            share: f64,
            per: &BTreeMap<String, T>,
        ) -> fmt::Result {
            let per: Vec<String> = per.iter().map(|(e, n)| format!("{e} {n}")).collect();
            writeln!(f, "{label:<22}{share:.2} ({})", per.join(", "))
        }
        line(
            f,
            "share max / mean",
            self.share_max_over_mean,
            &self.engines,
        )?;
        line(
            f,
            "prefill max / mean",
            self.prefill_share_max_over_mean,
            &self.engines_prefill,
        )
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = serde_json::to_value(self.key)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        writeln!(
            f,
            "workload: {} conversations x {} turns, key {key}, seed {}, {} URL(s), {:.1} s",
            self.conversations, self.turns, self.seed, self.urls, self.elapsed_s
        )?;
        writeln!(
            f,
            "requests              {} ({} errors, {} conversations cut)",
            self.requests, self.errors, self.cut_conversations
        )?;
        for (kind, n) in &self.errors_by_kind {
            writeln!(f, "  error {kind}: {n}")?;
        }
        writeln!(
            f,
            "hit ratio             {:.3} ({} of {} prompt tokens cached)",
            self.hit_ratio, self.cached_tokens, self.prompt_tokens
        )?;
        writeln!(
            f,
            "prefill ÷ ideal       {:.2} ({} uncached, ideal {}; ideal hit ratio {:.3})",
            self.prefill_vs_ideal,
            self.uncached_tokens,
            self.ideal_uncached_tokens,
            self.ideal_hit_ratio
        )?;
        if let Some(t) = &self.trace {
            writeln!(
                f,
                "trace                 {} from {:.0} s for {:.0} s at {}x, tokens ÷ {}: {} requests, ideal hit ratio {:.3} by its blocks",
                t.path.display(),
                t.from_s,
                t.seconds,
                t.speedup,
                t.token_scale,
                t.requests,
                t.ideal_hit_ratio
            )?;
        }
        writeln!(
            f,
            "TTFT p50 / p99        {:.0} ms / {:.0} ms",
            self.ttft_p50_ms, self.ttft_p99_ms
        )?;
        writeln!(
            f,
            "total p50 / p99       {:.0} ms / {:.0} ms",
            self.total_p50_ms, self.total_p99_ms
        )?;
        writeln!(
            f,
            "split conversations   {} of {}",
            self.split_conversations, self.multi_turn_conversations
        )?;
        self.fmt_engines(f)?;
        self.fmt_slices(f)?;
        if let Some(s) = &self.scale_up {
            writeln!(
                f,
                "scale-up at {:.1} s    done at {:.1} s ({}); moved {} of {} live conversations",
                s.at, s.finished_at, s.status, s.moved, s.live_conversations
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(conversation: usize, sent_s: f64, engine: &str) -> Record {
        Record {
            conversation,
            turn: 0,
            url: 0,
            sent_s,
            ttft_ms: sent_s,
            total_ms: 0.0,
            engine: Some(engine.into()),
            prompt_tokens: 100,
            cached_tokens: 50,
            ideal_uncached: 25,
            error: None,
            tenant: None,
            class: None,
        }
    }

    #[test]
    fn splits_shares_and_moves() {
        let records = [
            record(0, 1.0, "a"),
            record(0, 2.0, "a"),
            record(0, 6.0, "b"),
            record(1, 1.5, "b"),
            record(1, 7.0, "b"),
            record(2, 8.0, "c"),
        ];
        let ok: Vec<&Record> = records.iter().collect();
        assert_eq!(splits(&ok), (2, 1));
        let engines = per_engine(&ok, |_| 1usize);
        assert_eq!(engines["b"], 3);
        assert!((share(engines.values().map(|&n| n as f64)) - 1.5).abs() < 1e-9);
        let s = ScaleUp {
            at: 4.0,
            finished_at: 5.0,
            status: "ok".into(),
            live_conversations: 0,
            moved: 0,
        };
        let s = moved(s, &ok);
        assert_eq!((s.live_conversations, s.moved), (2, 1));
    }

    #[test]
    fn slices_tell_refusals_from_failures_and_count_goodput() {
        let mut records: Vec<Record> = (0..4).map(|i| record(i, 100.0 * i as f64, "a")).collect();
        records[1].error = Some("status 429".into());
        records[2].error = Some("connection reset".into());
        records[3].ttft_ms = 50.0;
        for (i, r) in records.iter_mut().enumerate() {
            r.tenant = Some(["quiet", "noisy"][i % 2].into());
        }
        let all = Slice::of(&records, 60.0);
        assert_eq!(
            (all.requests, all.answered, all.refused, all.failed),
            (4, 2, 1, 1)
        );
        // Two answered (TTFT 0 and 50 ms) meet 60 ms: two of four.
        assert!((all.goodput - 0.5).abs() < 1e-9);
        assert_eq!(all.ttft_p99_ms, 50.0);
        let by = slices(&records, 60.0, |r| r.tenant.clone());
        assert_eq!(by["noisy"].refused, 1);
        assert_eq!(by["quiet"].failed, 1);
        assert!(slices(&records, 60.0, |r| r.class.clone()).is_empty());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
        assert_eq!(percentile(&mut [7.0], 0.99), 7.0);
    }
}
