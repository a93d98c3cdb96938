//! The validated settings of `mode: udp`: how a flow ends, and the
//! datagram a health check sends.

/// The `udp` section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpConfig {
    /// A flow ends once this many datagrams came back from its backend
    /// (`udp.responses`, as nginx's `proxy_responses`: 1 for DNS); `None`:
    /// only its idle timeout ends it.
    pub responses: Option<u64>,
}

/// `health.datagram`: sent to each backend; a check passes when an answer
/// starting with `expect` comes back within `health.timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatagramProbe {
    pub send: Vec<u8>,
    /// Empty: any answer passes.
    pub expect: Vec<u8>,
}
