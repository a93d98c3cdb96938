//! Validation of what `mode: udp` adds and excludes: the `udp` section,
//! `key.from: quic`, the health check's `port` and `datagram`, and the
//! settings that have no meaning for datagrams (PROXY headers).
//!
//! Part of [`Validator`]. Mode udp keeps the same placement, health,
//! reload, metrics and access log as mode tcp; a flow is keyed by its
//! client's address or its QUIC connection ID, and a health check must
//! reach something that answers: a TCP connect to a UDP port says nothing,
//! so mode udp needs `health.port` (a TCP or HTTP check there) or
//! `health.datagram` (a probe datagram and its expected answer).

use std::net::SocketAddr;

use serde_saphyr::{Location, Spanned};

use super::Validator;
use super::key::byte_read_settings;
use crate::config::raw::{RawHealth, RawKey, RawProxyProtocol, RawUdp};
use crate::config::{
    DEFAULT_QUIC_CID_LENGTH, DatagramProbe, KeyConfig, MAX_HEALTH_DATAGRAM, MAX_QUIC_CID_LENGTH,
    MAX_UDP_RESPONSES, Mode, UdpConfig,
};
use magpie_core::key::Fallback;
use magpie_core::key::quic::from_hex;

impl Validator<'_> {
    /// The `udp` section: only in mode udp.
    pub(super) fn udp(&mut self, raw: Option<Spanned<RawUdp>>, mode: Mode) -> UdpConfig {
        let Some(raw) = raw else {
            return UdpConfig::default();
        };
        if mode != Mode::Udp {
            self.err(&raw.referenced, "the udp section needs mode: udp");
        }
        let responses = raw.value.responses.map(|r| {
            if !(1..=MAX_UDP_RESPONSES).contains(&r.value) {
                self.err(
                    &r.referenced,
                    format!(
                        "udp.responses {} is out of range (1 to {MAX_UDP_RESPONSES}; leave it out to end flows by idle_timeout only)",
                        r.value
                    ),
                );
            }
            r.value.clamp(1, MAX_UDP_RESPONSES)
        });
        UdpConfig { responses }
    }

    /// `key.from: quic`: mode udp only; `quic_cid_length` and `fallback`
    /// apply, the read settings of keys in bytes do not.
    pub(super) fn quic_key(&mut self, raw: &RawKey, mode: Mode, from_at: Location) -> KeyConfig {
        if mode != Mode::Udp {
            self.err(&from_at, "key.from: quic needs mode: udp");
        }
        for (field, at) in byte_read_settings(raw).into_iter().flatten() {
            self.err(
                &at,
                format!("key.{field} does not apply with key.from: quic (the key is the first datagram's connection ID)"),
            );
        }
        let cid_length = raw.quic_cid_length.as_ref().map_or(DEFAULT_QUIC_CID_LENGTH, |n| {
            if !(1..=MAX_QUIC_CID_LENGTH).contains(&n.value) {
                self.err(
                    &n.referenced,
                    format!(
                        "key.quic_cid_length {} is out of range (1 to {MAX_QUIC_CID_LENGTH}: the length of the connection IDs your QUIC servers issue)",
                        n.value
                    ),
                );
            }
            n.value.clamp(1, MAX_QUIC_CID_LENGTH)
        });
        KeyConfig::Quic {
            // At most MAX_QUIC_CID_LENGTH.
            cid_length: cid_length as usize,
            fallback: raw
                .fallback
                .as_ref()
                .map_or(Fallback::SourceIp, |f| f.value),
        }
    }

    /// `key.quic_cid_length` under another `key.from` is a silent mistake.
    pub(super) fn no_quic_settings(&mut self, raw: &RawKey) {
        if let Some(n) = &raw.quic_cid_length {
            self.err(
                &n.referenced,
                "key.quic_cid_length only applies with key.from: quic",
            );
        }
    }

    /// `health.port` (any mode) and `health.datagram` (mode udp); mode udp
    /// needs one of them.
    pub(super) fn probe_target(
        &mut self,
        raw: &mut RawHealth,
        mode: Mode,
        at: Location,
    ) -> (Option<u16>, Option<DatagramProbe>) {
        let port = raw.port.as_ref().map(|p| {
            if p.value == 0 {
                self.err(&p.referenced, "health.port must be 1 to 65535");
            }
            p.value
        });
        let datagram = raw.datagram.take().map(|d| {
            if mode != Mode::Udp {
                self.err(&d.referenced, "health.datagram needs mode: udp");
            }
            if let Some(p) = &raw.port {
                self.err(&p.referenced, "health.port and health.datagram are two kinds of check: write one (the datagram goes to the backend's own port)");
            }
            let send = self.hex(&d.value.send, "health.datagram.send");
            let expect = (d.value.expect.as_ref()).map_or(Vec::new(), |e| {
                self.hex(e, "health.datagram.expect")
            });
            DatagramProbe { send, expect }
        });
        if mode == Mode::Udp && port.is_none() && datagram.is_none() {
            self.err(&at, "health in mode udp needs health.port (a TCP or HTTP check on that port) or health.datagram (a probe datagram and the start of its answer, in hex): a TCP connect to a UDP port says nothing");
        }
        if mode == Mode::Udp
            && let Some(load) = &raw.load
        {
            self.err(&load.referenced, "health.load needs mode: http");
        }
        (port, datagram)
    }

    /// Bytes written in hex, 1 to [`MAX_HEALTH_DATAGRAM`] of them.
    fn hex(&mut self, text: &Spanned<String>, what: &str) -> Vec<u8> {
        match from_hex(&text.value) {
            Some(bytes) if bytes.len() <= MAX_HEALTH_DATAGRAM => bytes,
            Some(bytes) => {
                self.err(
                    &text.referenced,
                    format!(
                        "{what} is {} bytes (at most {MAX_HEALTH_DATAGRAM})",
                        bytes.len()
                    ),
                );
                Vec::new()
            }
            None => {
                self.err(
                    &text.referenced,
                    format!(
                        "{what} {:?} is not hex (two digits per byte, e.g. \"00 01 ff\")",
                        text.value
                    ),
                );
                Vec::new()
            }
        }
    }

    /// Mode udp answers a client from the socket it sent to, whose address
    /// must then be the one the client sent to: a wildcard (`0.0.0.0`,
    /// `[::]`) would let the kernel pick another on a host with several.
    pub(super) fn datagram_listen(&mut self, addr: SocketAddr, mode: Mode, at: &Location) {
        if mode == Mode::Udp && addr.ip().is_unspecified() {
            self.err(
                at,
                format!("mode udp needs each listen address written out, not {addr}: answers leave from the address the client sent to (list each of the host's addresses)"),
            );
        }
    }

    /// PROXY headers belong to streams: in mode udp each setting of
    /// `proxy_protocol` is an error at its place.
    pub(super) fn proxy_protocol_needs_streams(
        &mut self,
        raw: Option<&RawProxyProtocol>,
        mode: Mode,
    ) {
        let Some(raw) = raw.filter(|_| mode == Mode::Udp) else {
            return;
        };
        let places = (raw.accept_from.first().map(|a| a.referenced))
            .into_iter()
            .chain(raw.send.as_ref().map(|s| s.referenced))
            .chain(raw.header_timeout.as_ref().map(|t| t.referenced));
        for at in places {
            self.err(&at, "proxy_protocol needs mode: tcp or http (magpie sends and reads no PROXY header on datagrams)");
        }
    }
}
