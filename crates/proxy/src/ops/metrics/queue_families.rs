//! The queue's families (`queue`): what waits now, by class; how long the
//! admitted requests waited; what was admitted and refused, by class
//! ([`super::families`] lists every family).

use prometheus::proto::MetricType;

use super::series::{Family, Read};
use crate::routing::queue::{Admit, Refusal};

use MetricType::{COUNTER, GAUGE, HISTOGRAM};

/// The queue's families, read once per scrape.
pub(crate) const QUEUE: &[Family] = &[
    Family {
        name: "magpie_queue_waiting",
        kind: GAUGE,
        labels: &["class"],
        help: "Requests (mode tcp: connections) waiting in the queue for a backend's room now, by class (queue.priority.classes; default without classes).",
        read: Read::Global(|g, s| {
            let classes = g.classes();
            let depths = g.queue.depths(classes.len());
            for (class, depth) in classes.iter().zip(depths) {
                s.value(&[class], depth as f64);
            }
        }),
    },
    Family {
        name: "magpie_queue_body_bytes",
        kind: GAUGE,
        labels: &[],
        help: "Body bytes the waiting requests hold (read for their keys; at most queue.max_body_bytes).",
        read: Read::Global(|g, s| s.value(&[], g.queue.stats.bytes() as f64)),
    },
    Family {
        name: "magpie_queue_wait_seconds",
        kind: HISTOGRAM,
        labels: &[],
        help: "How long the requests that waited in the queue waited before a backend took them.",
        read: Read::Global(|g, s| s.histogram(&[], &g.queue.stats.wait)),
    },
    Family {
        name: "magpie_queue_admitted_total",
        kind: COUNTER,
        labels: &["class", "how"],
        help: "Requests (mode tcp: connections) the queue admitted, by class and how: at_once (room at their home), waited (their home took them after a wait), spilled (another target took them: their home had no room within queue.affinity_wait), placed (a conversation's first request, where it cost least rather than at its table owner).",
        read: Read::Global(|g, s| {
            for (c, class) in g.classes().iter().enumerate() {
                for how in Admit::ALL {
                    let n = g.queue.stats.admitted_count(c, how);
                    s.value(&[class, how.as_str()], n as f64);
                }
            }
        }),
    },
    Family {
        name: "magpie_queue_refused_total",
        kind: COUNTER,
        labels: &["class", "reason"],
        help: "Requests (mode tcp: connections) the queue refused, by class and reason: full (queue.size or queue.max_body_bytes reached: 429), tenant_full (queue.tenant.max_queued: 429), timeout (no room within queue.timeout: 503), client_gone (the client left while it waited).",
        read: Read::Global(|g, s| {
            for (c, class) in g.classes().iter().enumerate() {
                for why in Refusal::ALL {
                    let n = g.queue.stats.refused_count(c, why);
                    s.value(&[class, why.as_str()], n as f64);
                }
            }
        }),
    },
];
