//! The flow table: the flow of each client address at each listening
//! address (one client may send to several), and (`key.from: quic`)
//! the flow that carried each connection ID, so that a QUIC client whose
//! address changed is sent to the backend its connection is on.
//!
//! A flow is what one client address sends: a client that moves gets a
//! new flow, with a socket of its own, on its connection's backend. The
//! server then sees the connection arrive from a new address and validates
//! the new path itself (QUIC's defense against a forged migration), where
//! moving the old flow's answers to whoever showed a connection ID would
//! hand them to anyone who saw one on the wire.
//!
//! One mutex guards both maps; a lookup holds it for two hash probes. The
//! table holds at most `max_connections` flows (checked by the data path
//! before it opens one) and each flow at most [`MAX_IDS_PER_FLOW`]
//! connection IDs, so its size is bounded by config.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use super::flow::Flow;
use crate::routing::backend::Backend;

/// The most connection IDs remembered per flow: a QUIC connection uses
/// the client's first ID, then those its server issues (a few at a time).
pub(crate) const MAX_IDS_PER_FLOW: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct Flows {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// By (listening address, client address).
    by_client: HashMap<(SocketAddr, SocketAddr), Arc<Flow>>,
    by_id: HashMap<Box<[u8]>, Arc<Flow>>,
}

/// What the table knows of a datagram.
#[derive(Debug)]
pub(crate) enum Found {
    /// The flow of its client address.
    Flow(Arc<Flow>),
    /// No flow of its address, but its connection ID is another flow's
    /// (the client moved): a new flow should go to this backend.
    Moved(Arc<Backend>),
    Nothing,
}

impl Flows {
    /// Flows open.
    pub(crate) fn len(&self) -> usize {
        self.lock().by_client.len()
    }

    /// What is known of a datagram from `client` to `local` carrying
    /// connection ID `id` (QUIC). A new ID on a known flow is remembered
    /// (up to [`MAX_IDS_PER_FLOW`], and while no other flow has it).
    pub(crate) fn lookup(&self, local: SocketAddr, client: SocketAddr, id: Option<&[u8]>) -> Found {
        let mut table = self.lock();
        if let Some(flow) = table.by_client.get(&(local, client)).cloned() {
            if let Some(id) = id {
                table.remember(&flow, id);
            }
            return Found::Flow(flow);
        }
        match id.and_then(|id| table.by_id.get(id)) {
            Some(flow) => Found::Moved(Arc::clone(&flow.backend)),
            None => Found::Nothing,
        }
    }

    /// A new flow, with the ID its first datagram carried.
    pub(crate) fn insert(&self, flow: Arc<Flow>, id: Option<&[u8]>) {
        let mut table = self.lock();
        if let Some(id) = id {
            table.remember(&flow, id);
        }
        table.by_client.insert((flow.local, flow.client), flow);
    }

    /// `flow` leaves the table (its entries, not a newer flow's).
    pub(crate) fn remove(&self, flow: &Arc<Flow>) {
        let mut table = self.lock();
        let at = (flow.local, flow.client);
        if (table.by_client.get(&at)).is_some_and(|f| Arc::ptr_eq(f, flow)) {
            table.by_client.remove(&at);
        }
        for id in flow.take_ids() {
            if table.by_id.get(&id).is_some_and(|f| Arc::ptr_eq(f, flow)) {
                table.by_id.remove(&id);
            }
        }
    }

    /// Every flow open now.
    pub(crate) fn all(&self) -> Vec<Arc<Flow>> {
        self.lock().by_client.values().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Table {
    fn remember(&mut self, flow: &Arc<Flow>, id: &[u8]) {
        if self.by_id.contains_key(id) || !flow.add_id(id, MAX_IDS_PER_FLOW) {
            return;
        }
        self.by_id.insert(id.into(), Arc::clone(flow));
    }
}
