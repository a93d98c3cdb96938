//! The flow table: which flow a datagram belongs to, by the client's
//! address, or (`key.from: quic`) by a connection ID the flow has carried,
//! so a QUIC client whose address changed finds its flow, its upstream
//! socket and its backend again, and its answers follow it to the new
//! address.
//!
//! One mutex guards both maps; a lookup holds it for two hash probes.
//! The table holds at most `max_connections` flows (checked by the data
//! path before it opens one) and each flow at most
//! [`MAX_IDS_PER_FLOW`] connection IDs, so its size is bounded by config.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use super::flow::Flow;

/// The most connection IDs remembered per flow: a QUIC connection uses
/// the client's first ID, then those its server issues (a few at a time).
pub const MAX_IDS_PER_FLOW: usize = 8;

#[derive(Debug, Default)]
pub struct Flows {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    by_client: HashMap<SocketAddr, Arc<Flow>>,
    by_id: HashMap<Box<[u8]>, Arc<Flow>>,
}

impl Flows {
    /// Flows open.
    pub fn len(&self) -> usize {
        self.lock().by_client.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The flow of a datagram from `client` carrying connection ID `id`
    /// (QUIC): by the ID first, then by the address. A flow found by its
    /// ID from a new address moves there; a new ID on a known flow is
    /// remembered (up to [`MAX_IDS_PER_FLOW`]).
    pub fn lookup(&self, client: SocketAddr, id: Option<&[u8]>) -> Option<Arc<Flow>> {
        let mut table = self.lock();
        let by_id = id.and_then(|id| table.by_id.get(id)).cloned();
        let flow = by_id.or_else(|| table.by_client.get(&client).cloned())?;
        let was = flow.client();
        if was != client {
            if table
                .by_client
                .get(&was)
                .is_some_and(|f| Arc::ptr_eq(f, &flow))
            {
                table.by_client.remove(&was);
            }
            table.by_client.insert(client, Arc::clone(&flow));
            flow.moved_to(client);
        }
        if let Some(id) = id {
            table.remember(&flow, id);
        }
        Some(flow)
    }

    /// A new flow, with the ID its first datagram carried.
    pub fn insert(&self, flow: Arc<Flow>, id: Option<&[u8]>) {
        let mut table = self.lock();
        if let Some(id) = id {
            table.remember(&flow, id);
        }
        table.by_client.insert(flow.client(), flow);
    }

    /// `flow` leaves the table (its entries, not a newer flow's).
    pub fn remove(&self, flow: &Arc<Flow>) {
        let mut table = self.lock();
        let client = flow.client();
        if table
            .by_client
            .get(&client)
            .is_some_and(|f| Arc::ptr_eq(f, flow))
        {
            table.by_client.remove(&client);
        }
        for id in flow.take_ids() {
            if table.by_id.get(&id).is_some_and(|f| Arc::ptr_eq(f, flow)) {
                table.by_id.remove(&id);
            }
        }
    }

    /// Every flow open now.
    pub fn all(&self) -> Vec<Arc<Flow>> {
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
