//! Mode udp's families ([`super::families`] lists every family): flows
//! open, created and ended, datagrams dropped, and per backend the
//! datagrams each way (bytes are in the backends' byte counters).

use prometheus::proto::MetricType;

use super::series::{Family, Read};
use crate::telemetry::datagrams::{DatagramDrop, FlowEnd};

use MetricType::{COUNTER, GAUGE};

/// Mode udp's per-backend families.
pub(crate) const BACKEND: &[Family] = &[
    Family {
        name: "magpie_backend_datagrams_sent_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Mode udp: datagrams sent to the backend (from clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.datagrams_sent() as f64)),
    },
    Family {
        name: "magpie_backend_datagrams_received_total",
        kind: COUNTER,
        labels: &["backend", "addr"],
        help: "Mode udp: datagrams received from the backend (and sent on to clients).",
        read: Read::Backend(|b, s| s.value(&[], b.live().traffic.datagrams_received() as f64)),
    },
];

/// Mode udp's global families.
pub(crate) const GLOBAL: &[Family] = &[
    Family {
        name: "magpie_udp_flows_open",
        kind: GAUGE,
        labels: &[],
        help: "Mode udp: flows open now (at most max_connections).",
        read: Read::Global(|g, s| s.value(&[], g.stats.datagrams.open() as f64)),
    },
    Family {
        name: "magpie_udp_flows_created_total",
        kind: COUNTER,
        labels: &[],
        help: "Mode udp: flows opened (a client address, or a QUIC connection, that sent its first datagram).",
        read: Read::Global(|g, s| s.value(&[], g.stats.datagrams.created() as f64)),
    },
    Family {
        name: "magpie_udp_flows_ended_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "Mode udp: flows ended, by reason: idle_timeout, responses (udp.responses answers came back), backend_down (health marked its backend down), shutdown.",
        read: Read::Global(|g, s| {
            for why in FlowEnd::ALL {
                s.value(&[why.as_str()], g.stats.datagrams.ended(why) as f64);
            }
        }),
    },
    Family {
        name: "magpie_udp_datagrams_dropped_total",
        kind: COUNTER,
        labels: &["reason"],
        help: "Mode udp: datagrams not delivered, by reason: table_full (a new flow past max_connections), no_backend, backend_busy (the socket to the backend had no room), backend_refused (ICMP unreachable), oversized (EMSGSIZE), reply_failed (the answer could not be sent to the client).",
        read: Read::Global(|g, s| {
            for why in DatagramDrop::ALL {
                s.value(&[why.as_str()], g.stats.datagrams.dropped(why) as f64);
            }
        }),
    },
];
