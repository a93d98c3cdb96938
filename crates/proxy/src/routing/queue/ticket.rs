//! A request's place in the queue while it waits: a slot handed to it, a
//! spill once its home wait is over, a refusal at its deadline or when its
//! client goes; dropping it leaves the queue.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Admit, Ask, Grant, Queue, Refusal, Room};
use crate::routing::backend::Backend;

/// A request's place in the queue; dropping it (the client went away, the
/// request was cancelled) leaves the queue.
pub(super) struct Ticket<'a> {
    pub(super) queue: &'a Queue,
    pub(super) id: u64,
    pub(super) home_until: Instant,
    pub(super) deadline: Instant,
}

impl Ticket<'_> {
    /// Waits for a slot: handed out, or taken at a spill once the home
    /// wait is over; refused at the deadline or when the client goes.
    pub(super) async fn wait(
        self,
        mut rx: oneshot::Receiver<Grant>,
        ask: &Ask<'_>,
        gone: impl Future<Output = ()>,
    ) -> Result<(Arc<Backend>, Room, Admit), Refusal> {
        let home = ask.targets.first().map(|b| Arc::clone(&b.live));
        let how = |b: &Arc<Backend>| match &home {
            Some(home) if Arc::ptr_eq(home, &b.live) => Admit::Waited,
            _ if ask.places && !ask.sticky => Admit::Placed,
            _ => Admit::Spilled,
        };
        tokio::pin!(gone);
        let mut home_wait = Instant::now() < self.home_until;
        let mut closing = self.queue.closing.subscribe();
        loop {
            let deadline = match *closing.borrow_and_update() {
                Some(at) => at.min(self.deadline),
                None => self.deadline,
            };
            tokio::select! {
                granted = &mut rx => {
                    return match granted {
                        Ok((b, slot)) => Ok((Arc::clone(&b), slot, how(&b))),
                        // The sender went without a grant: only at exit.
                        Err(_) => Err(Refusal::TimedOut),
                    };
                }
                () = tokio::time::sleep_until(self.home_until), if home_wait => {
                    home_wait = false;
                    if let Some((b, slot)) = self.queue.spill(self.id) {
                        return Ok((Arc::clone(&b), slot, how(&b)));
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return self.settle(&mut rx, how, Refusal::TimedOut);
                }
                Ok(()) = closing.changed() => {}
                () = &mut gone => {
                    return self.settle(&mut rx, how, Refusal::ClientGone);
                }
            }
        }
    }

    /// Leaves the queue for `why`, unless a slot came first.
    fn settle(
        &self,
        rx: &mut oneshot::Receiver<Grant>,
        how: impl Fn(&Arc<Backend>) -> Admit,
        why: Refusal,
    ) -> Result<(Arc<Backend>, Room, Admit), Refusal> {
        if self.queue.leave(self.id) {
            return Err(why);
        }
        match rx.try_recv() {
            Ok((b, slot)) if why != Refusal::ClientGone => Ok((Arc::clone(&b), slot, how(&b))),
            _ => Err(why),
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.queue.leave(self.id);
    }
}
