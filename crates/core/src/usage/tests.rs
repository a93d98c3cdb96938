//! Every shape as a whole body and as a stream, fed whole, split at every
//! byte and in random-sized frames; the memory bound; bad input.

use super::*;

const JSON: Option<&str> = Some("application/json");
const SSE: Option<&str> = Some("text/event-stream");

fn usage(prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens,
        cached_tokens,
        completion_tokens,
    })
}

/// `body` fed in frames of the given sizes (the last frame takes the rest).
fn scan_in(
    scanner: UsageScanner,
    body: &[u8],
    sizes: impl Iterator<Item = usize>,
) -> Option<Usage> {
    let mut scanner = scanner;
    let mut rest = body;
    for size in sizes {
        if rest.is_empty() {
            break;
        }
        let (frame, after) = rest.split_at(size.min(rest.len()));
        scanner.feed(frame);
        rest = after;
    }
    scanner.feed(rest);
    scanner.finish()
}

/// Frame sizes from 1 to 97 that no short block repeats (xorshift).
fn random_sizes(seed: u64) -> impl Iterator<Item = usize> {
    let mut x = seed | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 97) as usize + 1
    })
}

/// The usage of `body`, after checking that every way of framing it gives
/// the same: two frames split at each byte, 1-byte frames, random frames.
fn scan_limit(content_type: Option<&str>, limit: usize, body: &str) -> Option<Usage> {
    let format = BodyFormat::from_content_type(content_type).expect("a scanned type");
    let fresh = || UsageScanner::new(format, limit);
    let body = body.as_bytes();
    let whole = scan_in(fresh(), body, std::iter::empty());
    for at in 0..=body.len() {
        let split = scan_in(fresh(), body, std::iter::once(at));
        assert_eq!(split, whole, "split at {at}");
    }
    assert_eq!(scan_in(fresh(), body, std::iter::repeat(1)), whole, "bytes");
    for seed in 1..20 {
        assert_eq!(scan_in(fresh(), body, random_sizes(seed)), whole, "{seed}");
    }
    whole
}

fn scan(content_type: Option<&str>, body: &str) -> Option<Usage> {
    scan_limit(content_type, MAX_BUFFER, body)
}

/// An event stream of `data:` lines, one event each.
fn events(data: &[&str]) -> String {
    data.iter().map(|d| format!("data: {d}\n\n")).collect()
}

#[test]
fn content_types() {
    let format = BodyFormat::from_content_type;
    assert_eq!(format(JSON), Some(BodyFormat::Json));
    assert_eq!(
        format(Some("Application/JSON; charset=utf-8")),
        Some(BodyFormat::Json)
    );
    assert_eq!(
        format(Some(" text/event-stream ;charset=UTF-8")),
        Some(BodyFormat::EventStream)
    );
    for other in [
        "text/plain",
        "application/x-ndjson",
        "",
        "application/jsonl",
    ] {
        assert_eq!(format(Some(other)), None, "{other}");
    }
    assert_eq!(format(None), None);
    assert!(UsageScanner::for_content_type(Some("text/html")).is_none());
    assert!(UsageScanner::for_content_type(SSE).is_some());
}

#[test]
fn openai_chat_body() {
    let body = r#"{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {"role": "assistant", "content": "Hello! How can I assist you today? \"usage\": {\"prompt_tokens\": 1}", "refusal": null, "annotations": []},
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 2019,
    "completion_tokens": 10,
    "total_tokens": 2029,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
  },
  "service_tier": "default"
}
"#;
    assert_eq!(scan(JSON, body), usage(2019, 1920, 10));
}

#[test]
fn openai_chat_body_without_cache_details() {
    let absent = r#"{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7}}"#;
    assert_eq!(scan(JSON, absent), usage(12, 0, 7));
    let null =
        r#"{"usage":{"prompt_tokens":12,"completion_tokens":7,"prompt_tokens_details":null}}"#;
    assert_eq!(scan(JSON, null), usage(12, 0, 7));
    let null_cached = r#"{"usage":{"prompt_tokens":12,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":null}}}"#;
    assert_eq!(scan(JSON, null_cached), usage(12, 0, 7));
}

#[test]
fn openai_completions_body() {
    let body = r#"{"id":"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
    assert_eq!(scan(JSON, body), usage(5, 0, 7));
}

#[test]
fn openai_chat_stream_with_include_usage() {
    let body = events(&[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}],"usage":null}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1033,"completion_tokens":2,"total_tokens":1035,"prompt_tokens_details":{"cached_tokens":1024}}}"#,
        "[DONE]",
    ]);
    assert_eq!(scan(SSE, &body), usage(1033, 1024, 2));
}

#[test]
fn a_stream_without_usage_has_none() {
    let body = events(&[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
        "[DONE]",
    ]);
    assert_eq!(scan(SSE, &body), None);
    assert_eq!(scan(SSE, ""), None);
    assert_eq!(scan(JSON, ""), None);
    assert_eq!(scan(JSON, r#"{"error":{"message":"bad"}}"#), None);
}

#[test]
fn vllm_continuous_usage_the_last_wins() {
    let chunk = |content: &str, p: u64, c: u64| {
        format!(
            r#"{{"id":"cmpl-9","object":"chat.completion.chunk","created":2,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":null}}],"usage":{{"prompt_tokens":{p},"total_tokens":{},"completion_tokens":{c}}}}}"#,
            p + c
        )
    };
    let (a, b, c) = (
        chunk("The", 40, 1),
        chunk(" sky", 40, 2),
        chunk(" is", 40, 3),
    );
    let last = r#"{"id":"cmpl-9","object":"chat.completion.chunk","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":40,"total_tokens":44,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":32}}}"#;
    let body = events(&[&a, &b, &c, last, "[DONE]"]);
    assert_eq!(scan(SSE, &body), usage(40, 32, 4));
    let body = events(&[&a, &b, &c, "[DONE]"]);
    assert_eq!(scan(SSE, &body), usage(40, 0, 3));
}

#[test]
fn responses_body() {
    let body = r#"{"id":"resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41","object":"response","created_at":1741476777,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4o-2024-08-06","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"The image depicts a scenic landscape.","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":256},"output_tokens":52,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":380},"user":null,"metadata":{}}"#;
    assert_eq!(scan(JSON, body), usage(328, 256, 52));
}

#[test]
fn responses_stream() {
    let body = concat!(
        "event: response.created\n",
        r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#,
        "\n\n",
        "event: response.in_progress\n",
        r#"data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","status":"in_progress","usage":null}}"#,
        "\n\n",
        "event: response.output_text.delta\n",
        r#"data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}"#,
        "\n\n",
        "event: response.completed\n",
        r#"data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}"#,
        "\n\n",
    );
    assert_eq!(scan(SSE, body), usage(37, 0, 11));
}

#[test]
fn anthropic_body() {
    let body = r#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000,"output_tokens":12,"service_tier":"standard"}}"#;
    assert_eq!(scan(JSON, body), usage(3210, 3000, 12));
    let no_cache = r#"{"type":"message","usage":{"input_tokens":25,"output_tokens":9}}"#;
    assert_eq!(scan(JSON, no_cache), usage(25, 0, 9));
}

#[test]
fn anthropic_stream_combines_start_and_delta() {
    let body = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":1800,"output_tokens":1}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: ping\n",
        r#"data: {"type": "ping"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );
    assert_eq!(scan(SSE, body), usage(1825, 1800, 15));
}

#[test]
fn anthropic_delta_with_cumulative_input_replaces_the_start() {
    let body = events(&[
        r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"cache_read_input_tokens":100,"output_tokens":1}}}"#,
        r#"{"type":"message_delta","usage":{"input_tokens":40,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":30}}"#,
    ]);
    assert_eq!(scan(SSE, &body), usage(140, 100, 30));
    // Nulls on the input side report nothing: the start's counts stay.
    let body = events(&[
        r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}"#,
        r#"{"type":"message_delta","usage":{"input_tokens":null,"cache_read_input_tokens":null,"output_tokens":30}}"#,
    ]);
    assert_eq!(scan(SSE, &body), usage(25, 0, 30));
}

#[test]
fn sglang_meta_info() {
    let body = r#"{"text":" Paris.","meta_info":{"id":"a1","finish_reason":{"type":"stop"},"prompt_tokens":8,"completion_tokens":3,"cached_tokens":6,"e2e_latency":0.1}}"#;
    assert_eq!(scan(JSON, body), usage(8, 6, 3));
    let stream = events(&[
        r#"{"text":" Par","meta_info":{"prompt_tokens":8,"completion_tokens":1,"cached_tokens":6}}"#,
        r#"{"text":" Paris.","meta_info":{"prompt_tokens":8,"completion_tokens":3,"cached_tokens":6}}"#,
        "[DONE]",
    ]);
    assert_eq!(scan(SSE, &stream), usage(8, 6, 3));
    // usage, when there is one, wins over meta_info.
    let both = r#"{"usage":{"prompt_tokens":9,"completion_tokens":4},"meta_info":{"prompt_tokens":8,"completion_tokens":3}}"#;
    assert_eq!(scan(JSON, both), usage(9, 0, 4));
}

/// llama-server's own answers (tests/fixtures/llamacpp).
const LLAMACPP_CHAT: &str = include_str!("../../../../tests/fixtures/llamacpp/chat.json");
const LLAMACPP_STREAM: &str = include_str!("../../../../tests/fixtures/llamacpp/chat-stream.txt");
const LLAMACPP_COMPLETION: &str =
    include_str!("../../../../tests/fixtures/llamacpp/completion.json");

#[test]
fn llamacpp_usage_and_timings() {
    // A whole answer has both; usage wins (they agree).
    assert_eq!(scan(JSON, LLAMACPP_CHAT), usage(281, 0, 4));
    // A stream has no usage: the last chunk's timings (cache_n of the
    // prompt's tokens came from the cache, prompt_n were computed).
    assert_eq!(scan(SSE, LLAMACPP_STREAM), usage(281, 280, 4));
    // The native /completion API: timings only.
    assert_eq!(scan(JSON, LLAMACPP_COMPLETION), usage(248, 0, 4));
    // usage, when there is one, wins over timings.
    let both = r#"{"usage":{"prompt_tokens":9,"completion_tokens":4},"timings":{"cache_n":5,"prompt_n":3,"predicted_n":2}}"#;
    assert_eq!(scan(JSON, both), usage(9, 0, 4));
}

#[test]
fn crlf_cr_and_multi_line_events() {
    let crlf = "event: message\r\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\r\n\r\n";
    assert_eq!(scan(SSE, crlf), usage(3, 0, 4));
    let cr = "data: {\"usage\":{\"prompt_tokens\":3,\r\rdata: \"completion_tokens\":4}}\r\r";
    // Two events here, neither of them whole JSON.
    assert_eq!(scan(SSE, cr), None);
    let multi = ": keep-alive\ndata: {\"usage\":\ndata:{\"prompt_tokens\":5,\r\nid: 7\ndata:  \"completion_tokens\":6}}\n\n";
    assert_eq!(scan(SSE, multi), usage(5, 0, 6));
    let bare = "data\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n";
    assert_eq!(scan(SSE, bare), usage(1, 0, 2));
    // Not data lines: `data ` without a colon, `datum:`.
    let not_data =
        "data {\"usage\":{\"prompt_tokens\":1}}\ndatum: {\"usage\":{\"prompt_tokens\":1}}\n\n";
    assert_eq!(scan(SSE, not_data), None);
}

#[test]
fn an_event_left_open_at_the_end_is_read() {
    let open = "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
    assert_eq!(scan(SSE, open), usage(3, 0, 4));
    assert_eq!(scan(SSE, &format!("{open}\n")), usage(3, 0, 4));
}

#[test]
fn a_usage_event_over_the_limit_is_skipped() {
    let limit = 512;
    let small = r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}"#;
    let big = format!(
        r#"{{"choices":[{{"delta":{{"content":"{}"}}}}],"usage":{{"prompt_tokens":10,"completion_tokens":99}}}}"#,
        "x".repeat(2 * limit)
    );
    let body = events(&[small, &big]);
    assert_eq!(scan_limit(SSE, limit, &body), usage(10, 0, 2));
    let body = events(&[&big, small]);
    assert_eq!(scan_limit(SSE, limit, &body), usage(10, 0, 2));
    assert_eq!(scan(SSE, &body), usage(10, 0, 2));
    assert_eq!(scan(SSE, &events(&[small, &big])), usage(10, 0, 99));
    // Held bytes stay under the limit while the big event streams by.
    let mut scanner = UsageScanner::new(BodyFormat::EventStream, limit);
    for byte in events(&[&big, &big]).as_bytes() {
        scanner.feed(std::slice::from_ref(byte));
        assert!(scanner.held() <= limit, "{}", scanner.held());
    }
    assert_eq!(scanner.finish(), None);
}

#[test]
fn ten_megabytes_of_events_stay_under_the_cap() {
    let event = events(&[
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}"#,
    ]);
    let frame = event.repeat(64 * 1024 / event.len());
    let mut scanner = UsageScanner::for_content_type(SSE).expect("a scanner");
    let mut fed = 0;
    let mut sizes = random_sizes(7);
    while fed < 10 << 20 {
        // Frames that cut events anywhere.
        let cut = sizes.next().unwrap_or(1) * 300 % frame.len();
        scanner.feed(&frame.as_bytes()[cut..]);
        scanner.feed(&frame.as_bytes()[..cut]);
        fed += frame.len();
        assert!(scanner.held() <= MAX_BUFFER, "{}", scanner.held());
    }
    // A single event of 10 MB, too.
    let mut scanner = UsageScanner::for_content_type(SSE).expect("a scanner");
    scanner.feed(b"data: {\"usage\": \"");
    for _ in 0..160 {
        scanner.feed(&[b'u'; 64 * 1024]);
        assert!(scanner.held() <= MAX_BUFFER, "{}", scanner.held());
    }
    scanner.feed(b"\"}\n\n");
    assert_eq!(scanner.finish(), None);
}

#[test]
fn a_long_json_body_keeps_its_tail() {
    let limit = 300;
    let content = "All work and no play. ".repeat(40);
    let body = format!(
        r#"{{"id":"chatcmpl-2","choices":[{{"message":{{"role":"assistant","content":"{content}"}}}}],"usage":{{"prompt_tokens":100,"completion_tokens":200,"prompt_tokens_details":{{"cached_tokens":64}}}}}}"#
    );
    assert!(body.len() > 3 * limit);
    assert_eq!(scan_limit(JSON, limit, &body), usage(100, 64, 200));
    let mut scanner = UsageScanner::new(BodyFormat::Json, limit);
    for frame in body.as_bytes().chunks(7) {
        scanner.feed(frame);
        assert!(scanner.held() <= limit, "{}", scanner.held());
    }
    assert_eq!(scanner.finish(), usage(100, 64, 200));
    // A usage object whose start was dropped is not read.
    assert_eq!(scan_limit(JSON, 40, &body), None);
}

#[test]
fn the_tail_search_takes_the_last_usage_object() {
    let limit = 200;
    let pad = "p".repeat(300);
    // `usage` in a string, escaped quotes, null, a number: all skipped.
    let body = format!(
        r#"{{"pad":"{pad}","usage":{{"prompt_tokens":1,"completion_tokens":2}},"note":"x\"usage\": {{\"prompt_tokens\": 9}}","x\"usage":{{"prompt_tokens":8}},"usage" : null,"also":{{"usage":7}}}}"#
    );
    assert_eq!(scan_limit(JSON, limit, &body), usage(1, 0, 2));
    // Invalid JSON that fits is searched too.
    let broken = r#"{"choices":[}, "usage": {"prompt_tokens": 4, "completion_tokens": 5}}"#;
    assert_eq!(scan(JSON, broken), usage(4, 0, 5));
    // Valid JSON with no top-level usage reports none, whatever is nested.
    let nested = r#"{"data":[{"usage":{"prompt_tokens":4,"completion_tokens":5}}]}"#;
    assert_eq!(scan(JSON, nested), None);
}

#[test]
fn odd_numbers_are_absent_never_a_panic() {
    let cases = [
        (
            r#"{"prompt_tokens":18446744073709551615,"completion_tokens":1}"#,
            usage(u64::MAX, 0, 1),
        ),
        (
            r#"{"prompt_tokens":18446744073709551616,"completion_tokens":1}"#,
            usage(0, 0, 1),
        ),
        (r#"{"prompt_tokens":-5,"completion_tokens":1e3}"#, None),
        (r#"{"prompt_tokens":5.0,"completion_tokens":"7"}"#, None),
        (
            r#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":50}}"#,
            usage(5, 5, 0),
        ),
        (
            r#"{"input_tokens":18446744073709551615,"cache_read_input_tokens":9,"cache_creation_input_tokens":9}"#,
            usage(u64::MAX, 9, 0),
        ),
        (r#"{"prompt_tokens":{"a":1},"completion_tokens":[1]}"#, None),
        (r#"{"total_tokens":12}"#, None),
    ];
    for (object, expected) in cases {
        let body = format!(r#"{{"usage":{object}}}"#);
        assert_eq!(scan(JSON, &body), expected, "{object}");
        assert_eq!(scan(SSE, &events(&[&body])), expected, "{object}");
    }
}

#[test]
fn garbage_is_no_usage() {
    let deep = format!("{}{}", r#"{"usage":"#.repeat(200), "1");
    let bodies = [
        "usage",
        "\"usage\"",
        "\"usage\":",
        "{\"usage\":{",
        "{\"usage\":{\"prompt_tokens\":1",
        "[{\"usage\":1}]",
        "\\\"usage\":{\"prompt_tokens\":1}}",
        &deep,
        "data: data: \r\r\n\n\r\n",
    ];
    for body in bodies {
        assert_eq!(scan(JSON, body), None, "{body}");
        assert_eq!(scan(SSE, body), None, "{body}");
        assert_eq!(scan(SSE, &events(&[body])), None, "{body}");
    }
    // Nested deeper than the parser goes: not JSON, so the tail search
    // finds the innermost object; an event must be JSON.
    let deeper = format!(
        "{}{{\"prompt_tokens\":2}}{}",
        r#"{"usage":"#.repeat(200),
        "}".repeat(200)
    );
    assert_eq!(scan(JSON, &deeper), usage(2, 0, 0));
    assert_eq!(scan(SSE, &events(&[&deeper])), None);
    // Not JSON, so the tail search finds the object; an event must be JSON.
    let bom = "\u{feff}{\"usage\":{\"prompt_tokens\":1}}";
    assert_eq!(scan(JSON, bom), usage(1, 0, 0));
    assert_eq!(scan(SSE, &events(&[bom])), None);
    let mut scanner = UsageScanner::for_content_type(JSON).expect("a scanner");
    scanner.feed(&[0xff, 0xfe, b'"', b'u']);
    scanner.feed(&[0xc3]);
    assert_eq!(scanner.finish(), None);
}

#[test]
fn non_utf8_around_the_usage_is_tolerated_in_the_tail() {
    let mut body = b"\xff\xfe garbage \xc3".to_vec();
    body.extend_from_slice(br#""usage": {"prompt_tokens": 3, "completion_tokens": 1}"#);
    let mut scanner = UsageScanner::for_content_type(JSON).expect("a scanner");
    scanner.feed(&body);
    assert_eq!(scanner.finish(), usage(3, 0, 1));
}
