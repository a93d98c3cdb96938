//! Validation of the `queue` section and of the backends' own
//! `max_inflight`: counts and durations in their bounds, classes named
//! once, a default class that is one of them, one way to tell tenants
//! apart.
//!
//! Part of [`Validator`]. Classes and tenants are read from headers, so
//! they need `mode: http`; limits and the queue itself work in both modes.

use std::collections::BTreeMap;

use serde_saphyr::Spanned;

use super::Validator;
use crate::config::raw::{RawPriority, RawQueue, RawTenant};
use crate::config::{
    DEFAULT_AFFINITY_WAIT, DEFAULT_AGING, DEFAULT_MAX_INFLIGHT, DEFAULT_QUEUE_BODY_BYTES,
    DEFAULT_QUEUE_SIZE, DEFAULT_QUEUE_TIMEOUT, MAX_AGING, MAX_CLASSES, MAX_ENGINE_PRIORITY,
    MAX_MAX_INFLIGHT, MAX_MAX_PREFILL_TOKENS, MAX_QUEUE_BODY_BYTES, MAX_QUEUE_SIZE,
    MAX_QUEUE_TIMEOUT, MAX_TENANT_QUEUED, Mode, Priority, QueueConfig, TenantBy,
};

impl Validator<'_> {
    /// A backend's own `max_inflight` (1 to [`MAX_MAX_INFLIGHT`]); where it
    /// was first written is kept, as it needs a `queue` section.
    pub(super) fn backend_max_inflight(&mut self, raw: Option<Spanned<u64>>) -> Option<u64> {
        let raw = raw?;
        self.inflight_written.get_or_insert(raw.referenced);
        let n = self.count(Some(raw), "max_inflight", 0, 1..=MAX_MAX_INFLIGHT);
        (n > 0).then_some(n)
    }

    /// The `queue` section; `None` (no limits, no queue) when absent.
    pub(super) fn queue(
        &mut self,
        raw: Option<Spanned<RawQueue>>,
        mode: Mode,
        grouped: bool,
        reads_requests: bool,
    ) -> Option<QueueConfig> {
        let Some(raw) = raw else {
            if let Some(at) = self.inflight_written.take() {
                self.err(
                    &at,
                    "max_inflight needs a queue section (write queue: {} for its defaults)",
                );
            }
            return None;
        };
        let raw = raw.value;
        let max_inflight = self.count(
            raw.max_inflight,
            "queue.max_inflight",
            DEFAULT_MAX_INFLIGHT,
            1..=MAX_MAX_INFLIGHT,
        );
        let max_prefill_tokens = self.max_prefill_tokens(raw.max_prefill_tokens, mode);
        let size = self.count(
            raw.size,
            "queue.size",
            DEFAULT_QUEUE_SIZE,
            0..=MAX_QUEUE_SIZE,
        );
        let max_body_bytes = self.count(
            raw.max_body_bytes,
            "queue.max_body_bytes",
            DEFAULT_QUEUE_BODY_BYTES,
            0..=MAX_QUEUE_BODY_BYTES,
        );
        let timeout = self.positive(
            raw.timeout,
            "queue.timeout",
            DEFAULT_QUEUE_TIMEOUT,
            MAX_QUEUE_TIMEOUT,
        );
        // Zero is allowed: spill at once when the home is full.
        let affinity_wait = raw
            .affinity_wait
            .and_then(|d| self.at_most(&d, "queue.affinity_wait", MAX_QUEUE_TIMEOUT))
            .unwrap_or(DEFAULT_AFFINITY_WAIT);
        let priority = match raw.priority {
            Some(p) => self.priority(p, mode, reads_requests),
            None => Priority::default(),
        };
        let (tenant, tenant_max_queued, tenant_across_classes) = match raw.tenant {
            Some(t) => self.tenant(t, mode, grouped),
            None => (None, None, false),
        };
        Some(QueueConfig {
            max_inflight,
            max_prefill_tokens,
            // At most MAX_QUEUE_SIZE, so this fits any usize.
            size: size as usize,
            max_body_bytes,
            timeout,
            affinity_wait,
            priority,
            tenant,
            tenant_max_queued,
            tenant_across_classes,
        })
    }

    /// `queue.max_prefill_tokens`: 1 to [`MAX_MAX_PREFILL_TOKENS`], mode
    /// http only (work is told from request bodies).
    fn max_prefill_tokens(&mut self, raw: Option<Spanned<u64>>, mode: Mode) -> Option<u64> {
        let raw = raw?;
        if mode != Mode::Http {
            self.err(
                &raw.referenced,
                "queue.max_prefill_tokens needs mode: http (work is told from request bodies)",
            );
        }
        let n = self.count(
            Some(raw),
            "queue.max_prefill_tokens",
            0,
            1..=MAX_MAX_PREFILL_TOKENS,
        );
        (n > 0).then_some(n)
    }

    /// `queue.priority`: a header, classes from the highest (each once), a
    /// default among them, an aging step, the engine's values.
    fn priority(
        &mut self,
        raw: Spanned<RawPriority>,
        mode: Mode,
        reads_requests: bool,
    ) -> Priority {
        if mode != Mode::Http {
            self.err(
                &raw.referenced,
                "queue.priority needs mode: http (classes are read from a header)",
            );
        }
        let raw = raw.value;
        let header = raw.header.value.trim().to_ascii_lowercase();
        if header.is_empty() || !header.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            self.err(
                &raw.header.referenced,
                format!(
                    "queue.priority.header {:?} is not a header name",
                    raw.header.value
                ),
            );
        }
        let mut classes: Vec<String> = Vec::new();
        for class in &raw.classes.value {
            let name = class.value.trim().to_ascii_lowercase();
            if name.is_empty() {
                self.err(&class.referenced, "a class name is empty");
            } else if classes.contains(&name) {
                self.err(&class.referenced, format!("class {name:?} is named twice"));
            } else {
                classes.push(name);
            }
        }
        if classes.is_empty() {
            self.err(&raw.classes.referenced, "queue.priority.classes is empty (name them from the highest, e.g. [interactive, default, batch])");
            classes.push("default".to_string());
        } else if classes.len() > MAX_CLASSES {
            self.err(
                &raw.classes.referenced,
                format!(
                    "queue.priority.classes names {} classes (at most {MAX_CLASSES})",
                    classes.len()
                ),
            );
        }
        let default = match &raw.default {
            Some(d) => {
                let name = d.value.trim().to_ascii_lowercase();
                classes.iter().position(|c| *c == name).unwrap_or_else(|| {
                    self.err(&d.referenced, format!("queue.priority.default {name:?} is not one of the classes"));
                    0
                })
            }
            None => classes.iter().position(|c| c == "default").unwrap_or_else(|| {
                self.err(&raw.classes.referenced, "no class is named default: write queue.priority.default, the class of requests that name none");
                0
            }),
        };
        let aging = self.positive(raw.aging, "queue.priority.aging", DEFAULT_AGING, MAX_AGING);
        if let (Some(e), false) = (&raw.engine, reads_requests) {
            self.err(&e.referenced, "queue.priority.engine needs key.from: header, body or conversation (the body is written to as it is read, within key.max_bytes)");
        }
        let engine = raw.engine.map(|e| self.engine_priority(e, &classes));
        Priority {
            header: Some(header),
            classes,
            default,
            aging,
            engine,
        }
    }

    /// `queue.priority.engine`: a value for every class, each within
    /// ±[`MAX_ENGINE_PRIORITY`], none for a class not named.
    fn engine_priority(
        &mut self,
        raw: Spanned<BTreeMap<String, Spanned<i64>>>,
        classes: &[String],
    ) -> Vec<i64> {
        let mut values = vec![None; classes.len()];
        for (name, value) in &raw.value {
            let name = name.trim().to_ascii_lowercase();
            let Some(i) = classes.iter().position(|c| *c == name) else {
                self.err(
                    &value.referenced,
                    format!(
                        "queue.priority.engine names {name:?}, which is not one of the classes"
                    ),
                );
                continue;
            };
            if !(-MAX_ENGINE_PRIORITY..=MAX_ENGINE_PRIORITY).contains(&value.value) {
                self.err(
                    &value.referenced,
                    format!("queue.priority.engine.{name} {} is out of range (-{MAX_ENGINE_PRIORITY} to {MAX_ENGINE_PRIORITY})", value.value),
                );
            }
            values[i] = Some(value.value);
        }
        let missing: Vec<&str> = (classes.iter().zip(&values))
            .filter(|(_, v)| v.is_none())
            .map(|(c, _)| c.as_str())
            .collect();
        if !missing.is_empty() {
            self.err(
                &raw.referenced,
                format!(
                    "queue.priority.engine gives no value for {} (give every class one)",
                    missing.join(", ")
                ),
            );
        }
        values.into_iter().map(|v| v.unwrap_or(0)).collect()
    }

    /// `queue.tenant`: a header or the group, and an optional ceiling.
    fn tenant(
        &mut self,
        raw: Spanned<RawTenant>,
        mode: Mode,
        grouped: bool,
    ) -> (Option<TenantBy>, Option<usize>, bool) {
        let at = raw.referenced;
        if mode != Mode::Http {
            self.err(
                &at,
                "queue.tenant needs mode: http (tenants are read from a request)",
            );
        }
        let raw = raw.value;
        let group = raw.group.as_ref().is_some_and(|g| g.value);
        let by = match (raw.header, group) {
            (Some(h), false) => {
                let name = h.value.trim().to_ascii_lowercase();
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                    self.err(
                        &h.referenced,
                        format!("queue.tenant.header {:?} is not a header name", h.value),
                    );
                }
                Some(TenantBy::Header(name))
            }
            (None, true) => {
                if !grouped {
                    self.err(&at, "queue.tenant.group needs key.group");
                }
                Some(TenantBy::Group)
            }
            (Some(_), true) => {
                self.err(&at, "queue.tenant takes header or group: true, not both");
                None
            }
            (None, false) => {
                self.err(&at, "queue.tenant needs header: NAME or group: true");
                None
            }
        };
        let ceiling = raw
            .max_queued
            .map(|m| self.count(Some(m), "queue.tenant.max_queued", 1, 1..=MAX_TENANT_QUEUED))
            // At most MAX_TENANT_QUEUED, so this fits any usize.
            .map(|m| m as usize);
        (by, ceiling, raw.across_classes.unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_util::{parse, problems};

    const ENGINE: &str = "mode: http\nkey:\n  from: header\n  header: x-s\nqueue:\n  priority:\n    header: x-p\n    classes: [interactive, batch]\n    default: batch\n    engine: {interactive: -10, batch: 30}\nbackends:\n  - name: a\n    addr: 127.0.0.1:8001\nlisten: 127.0.0.1:7000\n";

    #[test]
    fn engine_priority_gives_each_class_a_value() {
        let c = parse(ENGINE).unwrap();
        let priority = &c.queue.unwrap().priority;
        assert_eq!(priority.engine, Some(vec![-10, 30]));
        assert_eq!(priority.engine_value(1), Some(30));
    }

    #[test]
    fn engine_priority_wants_every_class_in_range_and_a_body_read() {
        let other = ENGINE.replace("batch: 30}", "bulk: 1}");
        let p = problems(&other).join("\n");
        assert!(p.contains("test.yaml:10:"), "{p}");
        assert!(
            p.contains("\"bulk\", which is not one of the classes"),
            "{p}"
        );
        assert!(p.contains("gives no value for batch"), "{p}");
        let p = problems(&ENGINE.replace("batch: 30}", "batch: 1000001}")).join("\n");
        assert!(
            p.contains("queue.priority.engine.batch 1000001 is out of range"),
            "{p}"
        );
        let by_address = ENGINE.replace("key:\n  from: header\n  header: x-s\n", "");
        let p = problems(&by_address).join("\n");
        assert!(p.contains("queue.priority.engine needs key.from"), "{p}");
    }
}
