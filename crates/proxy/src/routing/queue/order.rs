//! The order in which waiting requests leave the queue, with no I/O and no
//! lock of its own: classes by strict priority, a class's requests that
//! waited `aging` counting one class higher (so a low class is never
//! starved), tenants within a class in turn (round robin: the tenant just
//! served goes to the back), and each tenant's requests first in, first
//! out. Or, with tenants across classes, tenants in turn first (by id, after
//! the one served last) and each tenant's own requests by class, so one
//! tenant's high class cannot hold up another's low one. Only requests that may take the freed slot are looked at
//! (`eligible`), so a request waiting for one backend never holds up
//! another backend's.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{QueueConfig, TenantBy};
use crate::routing::keys::TenantKey;

/// The waiting requests of every class, in order.
#[derive(Debug)]
pub(crate) struct Waiting<W> {
    classes: Vec<Class<W>>,
    next_id: u64,
    len: usize,
    /// Tenants take turns across classes; the one served last.
    across: bool,
    last_tenant: u64,
}

#[derive(Debug)]
struct Class<W> {
    /// Tenants with requests waiting, the next to be served first.
    tenants: VecDeque<Tenant<W>>,
    len: usize,
}

#[derive(Debug)]
struct Tenant<W> {
    id: u64,
    entries: VecDeque<Entry<W>>,
}

/// One waiting request.
#[derive(Debug)]
pub(crate) struct Entry<W> {
    pub(crate) id: u64,
    pub(crate) since: Instant,
    pub(crate) waiter: W,
}

/// A request taken off the queue.
#[derive(Debug)]
pub(crate) struct Picked<W> {
    /// Its class (what the tests check of the order).
    #[cfg(test)]
    pub(crate) class: usize,
    pub(crate) waiter: W,
}

/// Where a waiting request is: its class, its tenant's turn in it, its
/// place in that tenant's line.
#[derive(Debug)]
pub(crate) struct Place {
    class: usize,
    tenant: usize,
    entry: usize,
}

impl<W> Waiting<W> {
    pub(crate) fn new(classes: usize) -> Self {
        Waiting {
            classes: (0..classes.max(1))
                .map(|_| Class {
                    tenants: VecDeque::new(),
                    len: 0,
                })
                .collect(),
            next_id: 0,
            len: 0,
            across: false,
            last_tenant: 0,
        }
    }

    /// Whether tenants take turns across classes (else within each).
    pub(crate) fn set_across_classes(&mut self, across: bool) {
        self.across = across;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Requests waiting in `class`.
    pub(crate) fn depth(&self, class: usize) -> usize {
        self.classes.get(class).map_or(0, |c| c.len)
    }

    /// Requests of `tenant` waiting, in every class.
    pub(crate) fn of_tenant(&self, tenant: u64) -> usize {
        (self.classes.iter())
            .flat_map(|c| c.tenants.iter())
            .filter(|t| t.id == tenant)
            .map(|t| t.entries.len())
            .sum()
    }

    /// Queues `waiter` at the back of its tenant's line in `class` (the
    /// lowest class if there are fewer); its id, to remove it by.
    pub(crate) fn push(&mut self, class: usize, tenant: u64, since: Instant, waiter: W) -> u64 {
        let class = class.min(self.classes.len() - 1);
        let id = self.next_id;
        self.next_id += 1;
        let c = &mut self.classes[class];
        let entry = Entry { id, since, waiter };
        match c.tenants.iter_mut().find(|t| t.id == tenant) {
            Some(t) => t.entries.push_back(entry),
            None => c.tenants.push_back(Tenant {
                id: tenant,
                entries: VecDeque::from([entry]),
            }),
        }
        c.len += 1;
        self.len += 1;
        id
    }

    /// Takes the request `id` off the queue, if it is still there.
    pub(crate) fn remove(&mut self, id: u64) -> Option<W> {
        for c in &mut self.classes {
            for (ti, t) in c.tenants.iter_mut().enumerate() {
                if let Some(i) = t.entries.iter().position(|e| e.id == id) {
                    let entry = t.entries.remove(i)?;
                    if t.entries.is_empty() {
                        c.tenants.remove(ti);
                    }
                    c.len -= 1;
                    self.len -= 1;
                    return Some(entry.waiter);
                }
            }
        }
        None
    }

    /// Takes off the queue the request that goes next among those
    /// `eligible` ([`Waiting::next`]); the queue takes it in two steps.
    #[cfg(test)]
    pub(crate) fn pick(
        &mut self,
        now: Instant,
        aging: Duration,
        eligible: impl FnMut(&W) -> bool,
    ) -> Option<Picked<W>> {
        let place = self.next(now, aging, eligible)?;
        self.take(place)
    }

    /// Where the request that goes next among those `eligible` waits,
    /// leaving it there: the class with the lowest rank once aged (its rank
    /// less one for every `aging` its oldest such request waited; on a tie
    /// the higher class), in it the next tenant in turn that has one, of
    /// that tenant's the first in.
    pub(crate) fn next(
        &self,
        now: Instant,
        aging: Duration,
        mut eligible: impl FnMut(&W) -> bool,
    ) -> Option<Place> {
        let (class, tenant, entry) = if self.across {
            self.next_tenants_first(now, aging, &mut eligible)?
        } else {
            self.next_by_class(now, aging, &mut eligible)?
        };
        Some(Place {
            class,
            tenant,
            entry,
        })
    }

    /// Takes the request at `place` ([`Waiting::next`], the queue unchanged
    /// since) off the queue.
    pub(crate) fn take(&mut self, place: Place) -> Option<Picked<W>> {
        let Place {
            class: ci,
            tenant: ti,
            entry: ei,
        } = place;
        let c = self.classes.get_mut(ci)?;
        // A place that is not there takes nothing (and loses nothing).
        c.tenants.get(ti)?.entries.get(ei)?;
        let mut tenant = c.tenants.remove(ti)?;
        self.last_tenant = tenant.id;
        let entry = tenant.entries.remove(ei)?;
        if !tenant.entries.is_empty() {
            // Served: to the back of the line of tenants.
            c.tenants.push_back(tenant);
        }
        c.len -= 1;
        self.len -= 1;
        Some(Picked {
            #[cfg(test)]
            class: ci,
            waiter: entry.waiter,
        })
    }

    /// The next request by class: the class with the lowest rank once
    /// aged, in it the next tenant in turn; (class, tenant, entry).
    fn next_by_class(
        &self,
        now: Instant,
        aging: Duration,
        eligible: &mut impl FnMut(&W) -> bool,
    ) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize, usize)> = None; // (rank, class, tenant, entry)
        for (ci, c) in self.classes.iter().enumerate() {
            let Some((ti, ei, since)) = first_eligible(c, eligible) else {
                continue;
            };
            let rank = ci.saturating_sub(aged_steps(now.saturating_duration_since(since), aging));
            if best.is_none_or(|(r, ..)| rank < r) {
                best = Some((rank, ci, ti, ei));
            }
        }
        best.map(|(_, ci, ti, ei)| (ci, ti, ei))
    }

    /// The next request by tenant: the first tenant (by id) after the one
    /// served last that has an eligible request, and its request of the
    /// lowest rank once aged (on a tie the higher class, first in).
    fn next_tenants_first(
        &self,
        now: Instant,
        aging: Duration,
        eligible: &mut impl FnMut(&W) -> bool,
    ) -> Option<(usize, usize, usize)> {
        // Per tenant: (rank, class, tenant index, entry index).
        let mut best: Vec<(u64, (usize, usize, usize, usize))> = Vec::new();
        for (ci, c) in self.classes.iter().enumerate() {
            for (ti, t) in c.tenants.iter().enumerate() {
                let Some((ei, e)) =
                    (t.entries.iter().enumerate()).find(|(_, e)| eligible(&e.waiter))
                else {
                    continue;
                };
                let rank =
                    ci.saturating_sub(aged_steps(now.saturating_duration_since(e.since), aging));
                match best.iter_mut().find(|(id, _)| *id == t.id) {
                    Some((_, b)) if rank < b.0 => *b = (rank, ci, ti, ei),
                    Some(_) => {}
                    None => best.push((t.id, (rank, ci, ti, ei))),
                }
            }
        }
        // In turn: ids after the last served first, then from the lowest.
        let turn = |id: u64| (id <= self.last_tenant, id);
        let (_, (_, ci, ti, ei)) = best.into_iter().min_by_key(|(id, _)| turn(*id))?;
        Some((ci, ti, ei))
    }

    /// The waiting request `id`, if it is still there.
    pub(crate) fn get(&self, id: u64) -> Option<&W> {
        (self.classes.iter())
            .flat_map(|c| c.tenants.iter())
            .flat_map(|t| t.entries.iter())
            .find(|e| e.id == id)
            .map(|e| &e.waiter)
    }

    /// The first answer `f` gives for a waiting request, in no set order.
    pub(crate) fn find<T>(&self, mut f: impl FnMut(&W) -> Option<T>) -> Option<T> {
        (self.classes.iter())
            .flat_map(|c| c.tenants.iter())
            .flat_map(|t| t.entries.iter())
            .find_map(|e| f(&e.waiter))
    }

    /// Every waiting request, to bind again after a reload.
    pub(crate) fn waiters_mut(&mut self) -> impl Iterator<Item = &mut W> {
        (self.classes.iter_mut())
            .flat_map(|c| c.tenants.iter_mut())
            .flat_map(|t| t.entries.iter_mut())
            .map(|e| &mut e.waiter)
    }
}

/// In `c`, the first tenant in turn with an eligible request, that
/// request's place and when it came.
fn first_eligible<W>(
    c: &Class<W>,
    eligible: &mut impl FnMut(&W) -> bool,
) -> Option<(usize, usize, Instant)> {
    c.tenants.iter().enumerate().find_map(|(ti, t)| {
        (t.entries.iter().enumerate())
            .find(|(_, e)| eligible(&e.waiter))
            .map(|(ei, e)| (ti, ei, e.since))
    })
}

/// How many classes a request that waited `waited` has risen.
fn aged_steps(waited: Duration, aging: Duration) -> usize {
    if aging.is_zero() {
        return 0;
    }
    usize::try_from(waited.as_nanos() / aging.as_nanos()).unwrap_or(usize::MAX)
}

/// A request's place in the queue's order: its class (an index into
/// `queue.priority.classes`) and its tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Standing {
    pub(crate) class: usize,
    pub(crate) tenant: TenantKey,
}

impl Standing {
    /// A request's standing from its header fields (`header` gives a
    /// field's value by lower-case name); a tenant told by its group
    /// (`queue.tenant: group`) is told by the decision, which knows the
    /// group ([`crate::routing::decision`]).
    pub(crate) fn of<'h>(
        queue: Option<&QueueConfig>,
        header: impl Fn(&str) -> Option<&'h [u8]>,
    ) -> Standing {
        let Some(q) = queue else {
            return Standing::default();
        };
        let class = q
            .priority
            .class_of(q.priority.header.as_deref().and_then(&header));
        let tenant = match &q.tenant {
            Some(TenantBy::Header(name)) => header(name).map_or(TenantKey::NONE, |v| {
                TenantKey::new(magpie_core::hash::h64(v))
            }),
            Some(TenantBy::Group) | None => TenantKey::NONE,
        };
        Standing { class, tenant }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGING: Duration = Duration::from_secs(10);

    fn drain(w: &mut Waiting<&'static str>, now: Instant) -> Vec<&'static str> {
        std::iter::from_fn(|| w.pick(now, AGING, |_| true).map(|p| p.waiter)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn classes_by_priority_then_first_in() {
        let now = Instant::now();
        let mut w = Waiting::new(3);
        w.push(2, 0, now, "batch-1");
        w.push(1, 0, now, "default-1");
        w.push(0, 0, now, "interactive-1");
        w.push(2, 0, now, "batch-2");
        w.push(0, 0, now, "interactive-2");
        assert_eq!(w.depth(0), 2);
        assert_eq!(
            drain(&mut w, now),
            [
                "interactive-1",
                "interactive-2",
                "default-1",
                "batch-1",
                "batch-2"
            ]
        );
        assert_eq!(w.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_take_turns_within_a_class() {
        let now = Instant::now();
        let mut w = Waiting::new(1);
        for name in ["noisy-1", "noisy-2", "noisy-3", "noisy-4"] {
            w.push(0, 1, now, name);
        }
        w.push(0, 2, now, "quiet-1");
        w.push(0, 2, now, "quiet-2");
        assert_eq!(w.of_tenant(1), 4);
        assert_eq!(
            drain(&mut w, now),
            [
                "noisy-1", "quiet-1", "noisy-2", "quiet-2", "noisy-3", "noisy-4"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn across_classes_tenants_take_turns_first_then_their_own_classes() {
        let now = Instant::now();
        let mut w = Waiting::new(2);
        w.set_across_classes(true);
        for name in ["noisy-i1", "noisy-i2", "noisy-i3"] {
            w.push(0, 1, now, name);
        }
        w.push(1, 1, now, "noisy-b1");
        w.push(1, 2, now, "quiet-b1");
        w.push(0, 2, now, "quiet-i1");
        // The quiet tenant's batch request waits for its turn, not for
        // every interactive request; each tenant's own go by class.
        assert_eq!(
            drain(&mut w, now),
            [
                "noisy-i1", "quiet-i1", "noisy-i2", "quiet-b1", "noisy-i3", "noisy-b1"
            ]
        );
        // Within classes (the default), it goes after every interactive one.
        let mut w = Waiting::new(2);
        w.push(0, 1, now, "noisy-i1");
        w.push(1, 2, now, "quiet-b1");
        w.push(0, 1, now, "noisy-i2");
        assert_eq!(drain(&mut w, now), ["noisy-i1", "noisy-i2", "quiet-b1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waited_long_rises_a_class_per_aging_step() {
        let start = Instant::now();
        let mut w = Waiting::new(3);
        w.push(2, 0, start, "old-batch");
        let now = start + AGING * 2;
        w.push(0, 0, now, "new-interactive");
        // Risen two classes, it ties with interactive: the higher class goes first.
        assert_eq!(drain(&mut w, now), ["new-interactive", "old-batch"]);
        let mut w = Waiting::new(3);
        w.push(2, 0, start, "old-batch");
        w.push(1, 0, now, "new-default");
        assert_eq!(drain(&mut w, now), ["old-batch", "new-default"]);
    }

    #[tokio::test(start_paused = true)]
    async fn only_eligible_requests_are_taken_and_removal_by_id() {
        let now = Instant::now();
        let mut w = Waiting::new(2);
        w.push(0, 0, now, "for-a");
        let gone = w.push(1, 0, now, "gone");
        w.push(1, 0, now, "for-b");
        assert_eq!(w.remove(gone), Some("gone"));
        assert_eq!(w.remove(gone), None);
        let picked = w.pick(now, AGING, |x| *x == "for-b").unwrap();
        assert_eq!((picked.class, picked.waiter), (1, "for-b"));
        assert!(w.pick(now, AGING, |x| *x == "for-c").is_none());
        assert_eq!(w.len(), 1);
    }
}
