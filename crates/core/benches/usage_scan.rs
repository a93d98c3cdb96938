//! What reading usage costs a streamed response: `UsageScanner::feed` over a
//! 1 MB event stream of chat chunks in 16 KiB frames, then `finish`. Two
//! streams: OpenAI's, where every chunk says `"usage":null` and only the
//! last reports counts (each chunk costs a substring scan), and vLLM's with
//! `continuous_usage_stats`, where every chunk reports them (each chunk is
//! parsed). Prints MB/s per stream (the median of the rounds).
//!
//! `cargo bench --bench usage_scan`; under `cargo test` it runs one round as
//! a smoke test.

use std::hint::black_box;
use std::time::{Duration, Instant};

use magpie_core::usage::{Usage, UsageScanner};

const STREAM_BYTES: usize = 1 << 20;
const FRAME: usize = 16 * 1024;

/// Chat chunks until the stream is 1 MB, then the usage chunk and `[DONE]`.
fn stream(usage_every_chunk: bool) -> Vec<u8> {
    let mut out = String::new();
    let mut n = 0u64;
    while out.len() < STREAM_BYTES {
        n += 1;
        let usage = if usage_every_chunk {
            format!(
                r#"{{"prompt_tokens":812,"total_tokens":{},"completion_tokens":{n}}}"#,
                812 + n
            )
        } else {
            "null".to_string()
        };
        out.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-BtW2fk3vN8x\",\"object\":\"chat.completion.chunk\",\"created\":1752000000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"system_fingerprint\":\"fp_1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token{n}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":{usage}}}\n\n"
        ));
    }
    out.push_str(&format!(
        "data: {{\"id\":\"chatcmpl-BtW2fk3vN8x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":812,\"completion_tokens\":{n},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":768}}}}}}\n\ndata: [DONE]\n\n",
        812 + n
    ));
    out.into_bytes()
}

fn scan(body: &[u8]) -> Option<Usage> {
    let mut scanner = UsageScanner::for_content_type(Some("text/event-stream"))?;
    for frame in body.chunks(FRAME) {
        scanner.feed(black_box(frame));
    }
    scanner.finish()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { 200 } else { 1 };
    println!("{:<22} {:>10} {:>10}", "stream", "median", "MB/s");
    for (name, every) in [("usage in the last", false), ("usage in every chunk", true)] {
        let body = stream(every);
        let found = scan(&body).expect("the stream reports usage");
        assert_eq!(found.cached_tokens, 768);
        let mut times: Vec<Duration> = (0..rounds)
            .map(|_| {
                let started = Instant::now();
                black_box(scan(black_box(&body)));
                started.elapsed()
            })
            .collect();
        times.sort();
        let median = times[times.len() / 2];
        let mb_s = body.len() as f64 / 1e6 / median.as_secs_f64();
        println!("{name:<22} {median:>10.1?} {mb_s:>10.0}");
    }
}
