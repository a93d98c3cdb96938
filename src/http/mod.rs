//! The L7 data path (`mode: http`): one key per request, so one keep-alive
//! client connection can carry many sessions to many backends.
//!
//! `accept ─▶ (PROXY header) ─▶ each request: key from header / JSON body /
//! address ─▶ route ─▶ pooled upstream ─▶ stream the response`.
//!
//! hyper does the HTTP: the client side speaks HTTP/1.1, or HTTP/2 with prior
//! knowledge (cleartext); backends are spoken to over HTTP/1.1 keep-alive
//! connections. Nothing is buffered whole: request and response bodies stream
//! frame by frame in both directions, except the part of a request body read
//! to find its key (bounded by `key.max_bytes`).
//!
//! | module | owns |
//! |---|---|
//! | [`request_key`] | a request's key: header, JSON body field, or address |
//! | [`forward`] | one request: route, pooled connection, send once, stream back |
//! | [`pool`] | keep-alive connections to backends |
//! | [`body`] | request and response bodies: replayed, counted, timed |
//! | [`clock`] | head and keep-alive deadlines on a client connection (`408`) |

pub mod body;
pub mod clock;
pub mod forward;
pub mod pinning;
pub mod pool;
pub mod request_key;

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tracing::{debug, warn};

use self::body::Reply;
use self::clock::{Clock, Timed};
use self::forward::{Forward, local};
use self::pool::Pool;
use crate::listener::Accepted;
use crate::net::{Client, reset_on_close};
use crate::proxy_protocol::{self, Origin};
use crate::route::Route;
use crate::snapshot::Shared;
use crate::stats::ClientFailure;

/// The smallest head buffer hyper accepts.
const MIN_HEAD_BUFFER: usize = 8192;

/// What every HTTP connection shares.
#[derive(Clone, Default)]
pub struct HttpPath {
    pub pool: Arc<Pool>,
}

impl HttpPath {
    /// Serves one client connection: its requests, one after another (or
    /// side by side over HTTP/2), until it closes or shutdown.
    pub async fn serve_connection(self, accepted: Accepted) {
        let Accepted {
            mut stream,
            peer,
            local: _,
            shared,
            shutdown,
            stop,
            slot: _slot,
        } = accepted;
        let config = Arc::clone(&shared.snapshot.load().config);
        // A trusted peer speaks PROXY first: its source is the client.
        let mut first = Vec::new();
        let mut filled = 0;
        let client = if config.proxy_protocol.is_trusted(peer.0.ip()) {
            first.resize(proxy_protocol::MAX_HEADER_BYTES, 0);
            let header = proxy_protocol::read_header(
                &mut stream,
                &mut first,
                &mut filled,
                config.proxy_protocol.header_timeout,
            )
            .await;
            match header {
                Ok(Origin::Proxied { source, .. }) => Client(source),
                Ok(Origin::Local) => Client(peer.0),
                Err(e) => {
                    warn!(%peer, error = %e, "refusing connection: bad PROXY header from a trusted peer");
                    shared
                        .stats
                        .count_client_failure(ClientFailure::ProxyProtocol);
                    return;
                }
            }
        } else {
            Client(peer.0)
        };
        let (head_timeout, head_limit) = config.key.read().map_or(
            (
                crate::config::DEFAULT_HTTP_READ_TIMEOUT,
                crate::config::DEFAULT_HTTP_MAX_BYTES as usize,
            ),
            |r| (r.read_timeout, r.max_bytes),
        );
        let clock = Clock::new();
        let stream = Arc::new(stream);
        let io = Timed::new(
            Arc::clone(&stream),
            Arc::clone(&clock),
            head_timeout,
            config.idle_timeout,
        )
        .with_pending(&first[..filled]);
        drop(config);

        let service = {
            let clock = Arc::clone(&clock);
            let shared = Arc::clone(&shared);
            service_fn(move |request: Request<Incoming>| {
                let path = self.clone();
                let clock = Arc::clone(&clock);
                let shared = Arc::clone(&shared);
                async move {
                    clock.serving();
                    let response = path.request(request, &shared, client).await;
                    Ok::<_, Infallible>(response.map(|reply| reply.ending(clock)))
                }
            })
        };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            // A head that overflows this buffer is answered with 431.
            .max_buf_size(head_limit.max(MIN_HEAD_BUFFER));
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let ended = tokio::select! {
            ended = connection.as_mut() => ended,
            _ = shutdown.cancelled() => {
                // Finish the request in flight, then close keep-alive.
                connection.as_mut().graceful_shutdown();
                tokio::select! {
                    ended = connection.as_mut() => ended,
                    _ = stop.cancelled() => {
                        // The grace is over: the client sees a reset, not
                        // a response that merely stops.
                        reset_on_close(&stream);
                        Ok(())
                    }
                }
            }
        };
        let timed_out = clock.timed_out.load(std::sync::atomic::Ordering::Relaxed);
        if timed_out {
            shared
                .stats
                .count_client_failure(ClientFailure::HeadTimeout);
        }
        if let Err(e) = ended {
            debug!(%client, error = %e, "client connection ended with an error");
            clock::linger(&stream).await;
        } else if timed_out {
            clock::linger(&stream).await;
        }
    }

    /// One request: its key, its route, and the backend's answer.
    async fn request(
        &self,
        request: Request<Incoming>,
        shared: &Shared,
        client: Client,
    ) -> Response<Reply> {
        let snapshot = shared.snapshot.load_full();
        let config = Arc::clone(&snapshot.config);
        let (found, request) = match request_key::request_key(request, &config.key, client).await {
            Ok(found) => found,
            Err(e) => {
                debug!(%client, error = %e, "request body failed while reading its key");
                shared.stats.count_client_failure(ClientFailure::BadRequest);
                return local(
                    StatusCode::BAD_REQUEST,
                    "magpie: the request body could not be read\n",
                );
            }
        };
        if let Some(why) = found.fallback {
            shared.stats.count_fallback(why);
        }
        let sessions = shared.sessions();
        let (route, pin_served) = match &sessions {
            Some(sessions) => {
                let pinned = pinning::route(sessions, &snapshot, found.key).await;
                (pinned.route, pinned.pin_served)
            }
            None => (Route::plan(&snapshot, found.key), false),
        };
        drop(snapshot);
        let forward = Forward {
            route: &route,
            config: &config,
            pool: &self.pool,
            stats: &shared.stats,
        };
        match forward::forward(request, forward).await {
            Ok(served) => {
                if let Some(sessions) = &sessions {
                    if pin_served {
                        sessions.pins.bind(found.key, &served.backend.name);
                    } else {
                        sessions.pins.touch(found.key);
                    }
                }
                served.response
            }
            Err(failure) => {
                shared.stats.count_client_failure(failure.client_failure());
                failure.reply()
            }
        }
    }
}
