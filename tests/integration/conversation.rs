//! `key.from: conversation`: a chat's own head is its key, through real
//! sockets and keep-alive connections.

use std::collections::HashMap;

use crate::support::*;

const SETTINGS: &str = "mode: http\nkey:\n  from: conversation\n  header: x-session-id\n";

fn chat(system: &str, turns: &[&str]) -> String {
    let mut messages = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
    for (i, text) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(format!(r#"{{"role":"{role}","content":"{text}"}}"#));
    }
    format!(r#"{{"model":"llama","messages":[{}]}}"#, messages.join(","))
}

/// A six-turn conversation whose `messages` grow each turn stays on one
/// backend, whichever keep-alive connection carries each turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_conversation_stays_on_one_backend() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(SETTINGS, &backends.pairs()).await;
    let mut clients = [
        KeepAlive::connect(magpie.addr).await,
        KeepAlive::connect(magpie.addr).await,
    ];
    let mut turns = vec!["plan a trip to Lisbon"];
    let first = clients[0]
        .post_json(&chat("you are a guide", &turns), None)
        .await;
    for turn in 1..6 {
        turns.push("here is a plan");
        turns.push(if turn % 2 == 0 {
            "shorter please"
        } else {
            "add museums"
        });
        let got = clients[turn % 2]
            .post_json(&chat("you are a guide", &turns), None)
            .await;
        assert_eq!(got, first, "turn {turn} moved");
    }
    let no_conversation = format!(
        "reason=\"{}\"",
        magpie_core::key::FallbackReason::NoConversation.as_str()
    );
    assert_eq!(
        magpie.metric("magpie_key_fallbacks_total", &[&no_conversation]),
        0
    );
}

/// 50 conversations that share one system prompt but start with different
/// user messages spread over every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_with_one_system_prompt_spread() {
    let backends = HyperBackends::start(&["a", "b", "c"]).await;
    let magpie = Magpie::with(SETTINGS, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let mut per_backend: HashMap<String, usize> = HashMap::new();
    for s in 0..50 {
        let opening = format!("question number {s}");
        let got = client
            .post_json(&chat("you are terse", &[&opening]), None)
            .await;
        *per_backend.entry(got).or_default() += 1;
    }
    assert_eq!(per_backend.len(), 3, "{per_backend:?}");
    for (name, n) in &per_backend {
        assert!(*n >= 5, "backend {name} took {n} of 50: {per_backend:?}");
    }
}

/// A configured header, when present, decides before the conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_takes_precedence() {
    let backends = HyperBackends::start(&["a", "b", "c", "d"]).await;
    let magpie = Magpie::with(SETTINGS, &backends.pairs()).await;
    let mut client = KeepAlive::connect(magpie.addr).await;
    let body = chat("sys", &["same opening"]);
    for session in ["s1", "s2", "s3", "s4", "s5", "s6"] {
        let got = client.post_json(&body, Some(session)).await;
        assert_eq!(
            got,
            magpie.primary(magpie_core::key::text_key(session.as_bytes()))
        );
    }
    // Without the header, the conversation decides.
    let by_head = magpie_core::key::conversation::conversation_key(body.as_bytes()).expect("a key");
    assert_eq!(client.post_json(&body, None).await, magpie.primary(by_head));
}
