//! Where a client connection comes in, for both data paths: the accept
//! loop, the PROXY protocol header from trusted peers, and the bytes read
//! ahead of the data path.
//!
//! | module | owns |
//! |---|---|
//! | [`listener`] | the accept loop: the connection limit, back-off on errors, graceful drain |
//! | [`proxy_protocol`] | PROXY v1/v2 in from trusted peers, v2 out |
//! | [`read_ahead`] | a client stream with the bytes already read from it, replayed unchanged |

pub(crate) mod listener;
pub(crate) mod proxy_protocol;
pub(crate) mod read_ahead;
