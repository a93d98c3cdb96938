//! A connection's access-log line ([`crate::telemetry::access_log`]): begun at accept,
//! written when the connection ends, with how it ended.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::copy::{Copied, End};
use crate::net::{Client, Local};
use crate::routing::backend::{Backend, Side};
use crate::routing::instance::Instance;
use crate::telemetry::access_log::{Entry, Status};

/// One connection's line while it is open; nothing when the access log is
/// off or did not sample it (boxed: a connection's task stays small).
#[derive(Debug)]
pub(crate) struct ConnectionLog(Option<Box<Open>>);

#[derive(Debug)]
struct Open {
    entry: Entry,
    accepted: Instant,
}

impl ConnectionLog {
    /// The line of a connection from `client` to `local`, if the access log
    /// samples it.
    pub(crate) fn start(
        instance: &Instance,
        client: Client,
        local: Local,
        key: u64,
    ) -> ConnectionLog {
        ConnectionLog(Open::start(instance, client, local, key).map(Box::new))
    }

    /// The backend it went to, and why that one.
    pub(crate) fn connected(&mut self, backend: &Backend, how: &'static str) {
        if let Some(open) = &mut self.0 {
            open.entry.backend = Some((backend.name.clone(), backend.addr));
            open.entry.routed = Some(how);
        }
    }

    /// It ended before any copy (`no_backend`, `local_resources`, ...).
    pub(crate) fn failed(self, instance: &Instance, why: &'static str) {
        if let Some(mut open) = self.0 {
            open.entry.status = Status::Ended(why);
            open.write(instance);
        }
    }

    /// The copy is over.
    pub(crate) fn copied(self, instance: &Instance, copied: &Copied) {
        if let Some(mut open) = self.0 {
            open.entry.status = Status::Ended(ended(&copied.end));
            open.entry.bytes_in = copied.bytes_in;
            open.entry.bytes_out = copied.bytes_out;
            open.entry.first_byte = copied.first_byte.map(|t| t - open.accepted);
            open.write(instance);
        }
    }
}

impl Open {
    fn start(instance: &Instance, client: Client, local: Local, key: u64) -> Option<Open> {
        instance.access_log.sampled()?;
        let entry = Entry {
            time: SystemTime::UNIX_EPOCH,
            client: client.0,
            listener: local.0,
            backend: None,
            key_hash: key,
            // A key read from the first bytes is logged by its hash only.
            key: None,
            routed: None,
            status: Status::Ended("no_backend"),
            bytes_in: 0,
            bytes_out: 0,
            first_byte: None,
            queued: None,
            queue: None,
            split: None,
            duration: Duration::ZERO,
            http: None,
            tokens: None,
        };
        Some(Open {
            entry,
            accepted: Instant::now(),
        })
    }

    fn write(self, instance: &Instance) {
        let mut entry = self.entry;
        entry.time = SystemTime::now();
        entry.duration = self.accepted.elapsed();
        instance.access_log.record(Box::new(entry));
    }
}

/// How a copy's end is written in the `status` field.
fn ended(end: &End) -> &'static str {
    match end {
        End::Done => "closed",
        End::Idle => "idle_timeout",
        End::Stopped => "shutdown",
        End::Drained => "drained",
        End::Refused => "refused",
        End::Aborted(Side::Client, _) => "aborted_by_client",
        End::Aborted(Side::Backend, _) => "aborted_by_backend",
    }
}
