//! A small authoritative DNS server on 127.0.0.1 (UDP) whose records a test
//! changes while magpie resolves them; it can also stop answering.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Zone {
    addresses: HashMap<String, Vec<IpAddr>>,
    /// name → (priority, weight, port, target)
    services: HashMap<String, Vec<(u16, u16, u16, String)>>,
    silent: bool,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    stop: CancellationToken,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    pub async fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind the DNS server");
        let addr = socket.local_addr().expect("an address");
        let zone = Arc::new(Mutex::new(Zone::default()));
        let stop = CancellationToken::new();
        let (z, s) = (Arc::clone(&zone), stop.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = tokio::select! {
                    _ = s.cancelled() => return,
                    got = socket.recv_from(&mut buf) => match got {
                        Ok(got) => got,
                        Err(_) => continue,
                    },
                };
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(reply) = answer(&z, &query) else {
                    continue;
                };
                if let Ok(bytes) = reply.to_vec() {
                    let _ = socket.send_to(&bytes, peer).await;
                }
            }
        });
        DnsServer { addr, zone, stop }
    }

    /// `name` answers A/AAAA with `ips` (none: NXDOMAIN).
    pub fn set_addresses(&self, name: &str, ips: &[IpAddr]) {
        let mut zone = self.zone.lock().expect("zone");
        if ips.is_empty() {
            zone.addresses.remove(&key(name));
        } else {
            zone.addresses.insert(key(name), ips.to_vec());
        }
    }

    /// `name` answers SRV with (priority, weight, port, target) records.
    pub fn set_services(&self, name: &str, records: &[(u16, u16, u16, &str)]) {
        let records = records
            .iter()
            .map(|&(p, w, port, t)| (p, w, port, t.to_string()))
            .collect();
        self.zone
            .lock()
            .expect("zone")
            .services
            .insert(key(name), records);
    }

    /// Stops answering (every question times out) or starts again.
    pub fn set_silent(&self, silent: bool) {
        self.zone.lock().expect("zone").silent = silent;
    }
}

fn answer(zone: &Mutex<Zone>, query: &Message) -> Option<Message> {
    let zone = zone.lock().expect("zone");
    if zone.silent {
        return None;
    }
    let q = query.queries.first()?;
    let name = key(&q.name().to_utf8());
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.authoritative = true;
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.queries = query.queries.clone();
    let owner = q.name().clone();
    let known = zone.addresses.contains_key(&name) || zone.services.contains_key(&name);
    if !known {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return Some(reply);
    }
    match q.query_type() {
        RecordType::A | RecordType::AAAA => {
            for ip in zone.addresses.get(&name).into_iter().flatten() {
                let data = match (ip, q.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                    _ => continue,
                };
                reply
                    .answers
                    .push(Record::from_rdata(owner.clone(), 1, data));
            }
        }
        RecordType::SRV => {
            for (priority, weight, port, target) in zone.services.get(&name).into_iter().flatten() {
                let target = Name::from_ascii(format!("{target}.")).expect("a target name");
                let data = RData::SRV(SRV::new(*priority, *weight, *port, target));
                reply
                    .answers
                    .push(Record::from_rdata(owner.clone(), 1, data));
            }
        }
        _ => {}
    }
    Some(reply)
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
