//! The families read once per backend: each declared once, its `backend`
//! and `addr` labels filled in for every backend of the table
//! ([`super::families`] lists every family).

use prometheus::proto::MetricType;

use super::series::{Family, Read};
use crate::routing::backend::groups::Rank;
use crate::routing::backend::{CodeClass, Discard, Side, Spill, TimeoutKind};
use crate::routing::health::{CheckOutcome, ConnectFailure, ScrapeResult};

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// The families read once per backend.
pub(crate) const BACKEND: &[Family] = &[
    Family {
        name: "magpie_backend_role",
        kind: GAUGE,
        labels: &["backend", "addr", "role"],
        help: "Always 1; role says which halves of a disaggregated request the backend takes (prefill, decode, both: every backend without disaggregation).",
        read: Read::Backend(|b, s| s.value(&[b.backend.role.as_str()], 1.0)),
    },
    Family {
        name: "magpie_backend_inflight_limit",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "With queue: the most requests (mode tcp: connections) the backend takes at once, its own max_inflight or queue.max_inflight; 0 without a queue. Compare with magpie_backend_active_requests (mode tcp: magpie_backend_active_connections).",
        read: Read::Backend(|b, s| s.value(&[], b.inflight_limit.unwrap_or(0) as f64)),
    },
    Family {
        name: "magpie_backend_active_connections",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Open connections (and connects in progress) to the backend; in mode http, its pooled and busy upstream connections.",
        read: Read::Backend(|b, s| {
            let load = &b.live().load;
            let open = if b.requests {
                load.upstream_connections()
            } else {
                load.active()
            };
            s.value(&[], open as f64);
        }),
    },
    Family {
        name: "magpie_backend_connections_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Connections established to the backend.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.connections() as f64)),
    },
    Family {
        name: "magpie_backend_connect_failures_total",
        kind: COUNTER,
        labels: &["backend", "addr", "reason"],
        help: "Failed connects to the backend on the data path, by reason (refused, timeout, error).",
        read: Read::Backend(|b, s| {
            s.by(|why: ConnectFailure| b.live().health.connect_failures(why))
        }),
    },
    Family {
        name: "magpie_backend_resets_total",
        kind: COUNTER,
        labels: &["backend", "addr", "by"],
        help: "Connections through the backend aborted (reset) by one side, by which (client, backend); magpie passes the reset on to the other side.",
        read: Read::Backend(|b, s| s.by(|by: Side| b.live().traffic.resets(by))),
    },
    Family {
        name: "magpie_backend_prompt_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Prompt tokens of the backend's answers, as its engine reported them in usage (mode http).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.prompt_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_cached_prompt_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Prompt tokens the backend's engine served from its prefix cache (usage cached_tokens, or cache_read_input_tokens).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.cached_prompt_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_completion_tokens_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Completion (output) tokens of the backend's answers, as its engine reported them in usage.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.completion_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_received_bytes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Bytes received from the backend (and sent on to clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.bytes_received() as f64)),
    },
    Family {
        name: "magpie_backend_sent_bytes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Bytes sent to the backend (received from clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.bytes_sent() as f64)),
    },
    Family {
        name: "magpie_backend_spills_total",
        kind: COUNTER,
        labels: &["backend", "addr", "reason"],
        help: "Connections (mode http: requests) whose key this backend was a candidate for but which went elsewhere, by reason: down (health), at_cap (bounded load) or engine_full (health.load).",
        read: Read::Backend(|b, s| s.by(|why: Spill| b.live().traffic.spills(why))),
    },
    Family {
        name: "magpie_group_placements_total",
        kind: COUNTER,
        labels: &["backend", "addr", "rank"],
        help: "key.group: conversations first placed on the backend by their group, by the backend's rank among the group's candidates (1, 2, 3, 4+); a hot group's new conversations reach rank 2, then 3.",
        read: Read::Backend(|b, s| s.by(|rank: Rank| b.live().groups.placements(rank))),
    },
    Family {
        name: "magpie_backend_groups_seen",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "key.group: distinct groups whose requests the backend served in the last 2.5 to 5 minutes (two rotating sets of at most 10000 group hashes): how many heads its cache must hold.",
        read: Read::Backend(|b, s| s.value(&[], b.live().groups.seen() as f64)),
    },
    Family {
        name: "magpie_backend_idle_closes_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Connections (mode tcp) closed because neither side sent anything for idle_timeout.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.idle_closes() as f64)),
    },
    Family {
        name: "magpie_backend_connect_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "Time to open a data-path connection to the backend (mode http: fresh connections only).",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.connect_time)),
    },
    Family {
        name: "magpie_backend_connection_duration_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "Lifetime of proxied connections (mode tcp), from connected to closed.",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.connection_duration)),
    },
    Family {
        name: "magpie_backend_requests_total",
        kind: COUNTER,
        labels: &["backend", "addr", "code_class"],
        help: "mode http: requests the backend answered, by status class (1xx to 5xx), or `error` when it failed after the request was sent.",
        read: Read::Backend(|b, s| s.by(|class: CodeClass| b.live().traffic.requests(class))),
    },
    Family {
        name: "magpie_backend_requests_in_flight",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http: requests sent to the backend whose response has not ended (what bounded load counts in mode http).",
        read: Read::Backend(|b, s| {
            let in_flight = if b.requests {
                b.live().load.active()
            } else {
                0
            };
            s.value(&[], in_flight as f64);
        }),
    },
    Family {
        name: "magpie_backend_requests_awaiting_first_byte",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http: requests sent to the backend whose response has brought no byte of body yet (an engine's queued and prefilling requests); key.group_choices places a new group by it.",
        read: Read::Backend(|b, s| s.value(&[], b.live().load.awaiting() as f64)),
    },
    Family {
        name: "magpie_backend_prefill_tokens",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http with queue: the prompt tokens the requests awaiting their first byte are estimated to still have to prefill (each body's size less what its key's previous request left in this backend's cache); queue.max_prefill_tokens limits it, and so does, with health.load, what the engine's KV cache keeps of what its running requests do not hold.",
        read: Read::Backend(|b, s| s.value(&[], b.live().load.prefill_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_fleet_prefill_tokens",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http with queue and sessions.store redis: the prefill work the other magpies sharing the store hold at the backend, as last read (every 100 ms); the queue counts it with this magpie's own.",
        read: Read::Backend(|b, s| s.value(&[], b.live().load.fleet_tokens() as f64)),
    },
    Family {
        name: "magpie_backend_prefill_rate_tokens_per_second",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "mode http with queue: the backend's prefill rate as learned from its answers (the work of its requests over the time it was busy with them until each one's first byte, with sessions.store redis the other magpies' work ahead of them too, about the last hundred answers); 0 until eight answers came. A new conversation's work ahead there is weighed by it.",
        read: Read::Backend(|b, s| {
            let rate = b.live().prefill_rate.per_second().unwrap_or(0.0);
            s.value(&[], rate)
        }),
    },
    Family {
        name: "magpie_backend_client_aborts_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "mode http: responses the client went away from before their end.",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.client_aborts() as f64)),
    },
    Family {
        name: "magpie_backend_timeouts_total",
        kind: COUNTER,
        labels: &["backend", "addr", "kind"],
        help: "mode http: requests whose backend missed a deadline, by kind: response (no response head within http.response_timeout of the request's last byte; the client got 504) or stream_idle (no body byte for http.stream_idle_timeout; the client's stream was cut with a reset).",
        read: Read::Backend(|b, s| s.by(|kind: TimeoutKind| b.live().traffic.timeouts(kind))),
    },
    Family {
        name: "magpie_backend_pool_discards_total",
        kind: COUNTER,
        labels: &["backend", "addr", "reason"],
        help: "mode http: connections to the backend closed instead of kept for another request, by reason: unsolicited_bytes (bytes past an answer's end, or sent while the connection idled), early_answer (an answer that ended before its request's body was sent), closed (the backend closed it while idle, or said it would).",
        read: Read::Backend(|b, s| s.by(|why: Discard| b.live().traffic.discards(why))),
    },
    Family {
        name: "magpie_backend_time_to_first_byte_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "mode http: from sending a request to the backend to its response head.",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.time_to_first_byte)),
    },
    Family {
        name: "magpie_backend_request_duration_seconds",
        kind: HISTOGRAM,
        labels: &["backend", "addr"],
        help: "mode http: from sending a request to the last byte of its response (or the client leaving).",
        read: Read::Backend(|b, s| s.histogram(&[], &b.live().traffic.request_duration)),
    },
    Family {
        name: "magpie_backend_health_checks_total",
        kind: COUNTER,
        labels: &["backend", "addr", "result"],
        help: "Active health checks, by result (ok, failed, timeout, bad_status, bad_answer).",
        read: Read::Backend(|b, s| s.by(|outcome: CheckOutcome| b.live().health.checks(outcome))),
    },
    Family {
        name: "magpie_backend_transitions_total",
        kind: COUNTER,
        labels: &["backend", "addr", "to"],
        help: "Times the backend was marked up or down (by checks or passive health).",
        read: Read::Backend(|b, s| {
            let (up, down) = b.live().health.transitions();
            s.value(&["up"], up as f64);
            s.value(&["down"], down as f64);
        }),
    },
    Family {
        name: "magpie_backend_up",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "1 if the backend is up (health), 0 if down.",
        read: Read::Backend(|b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(u8::from(b.live().health.is_up())));
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_waiting",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Requests waiting in the backend's inference engine, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(waiting) = b.engine().and_then(|e| e.waiting) {
                s.value(&[], waiting);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_running",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "Requests running in the backend's inference engine, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(running) = b.engine().and_then(|e| e.running) {
                s.value(&[], running);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_kv_usage",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The used fraction (0 to 1) of the backend's KV cache, as last scraped (health.load); absent without a value at most max_age old.",
        read: Read::Backend(|b, s| {
            if let Some(kv_usage) = b.engine().and_then(|e| e.kv_usage) {
                s.value(&[], kv_usage);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_kv_capacity_tokens",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The size in tokens of the backend's KV cache, as its engine last said it (health.load: vLLM's cache_config_info, SGLang's max_total_num_tokens); kept while scrapes fail.",
        read: Read::Backend(|b, s| {
            if let Some(tokens) = b.live().engine.kv_capacity() {
                s.value(&[], tokens);
            }
        }),
    },
    Family {
        name: "magpie_backend_engine_slots",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The requests the backend's engine runs at once, learned from the engine (health.load preset llamacpp: total_slots of GET /props, or requests_processing at a scrape that found requests deferred); a first request goes where a slot is free while any target has one.",
        read: Read::Backend(|b, s| {
            if let Some(slots) = b.live().engine.slots() {
                s.value(&[], slots as f64);
            }
        }),
    },
    Family {
        name: "magpie_engine_load_scrapes_total",
        kind: COUNTER,
        labels: &["backend", "addr", "result"],
        help: "Scrapes of the backend's engine metrics (health.load), by result (ok, timeout, connect, status, parse, too_large); a failed one keeps the last value until max_age.",
        read: Read::Backend(|b, s| s.by(|result: ScrapeResult| b.live().engine.scrapes(result))),
    },
    Family {
        name: "magpie_backend_weight",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The backend's configured weight.",
        read: Read::Backend(|b, s| {
            if b.share.is_some() {
                s.value(&[], f64::from(b.backend.weight));
            }
        }),
    },
    Family {
        name: "magpie_backend_table_share_ratio",
        kind: GAUGE,
        labels: &["backend", "addr"],
        help: "The backend's share of table slots (Maglev) or hash space (ring), 0 to 1.",
        read: Read::Backend(|b, s| {
            if let Some(share) = b.share {
                s.value(&[], share);
            }
        }),
    },
];
