//! The L7 data path (`mode: http`): one key per request, so one keep-alive
//! client connection can carry many sessions to many backends.
//!
//! `accept ─▶ intake (PROXY header) ─▶ (TLS handshake) ─▶ each request: key from header / JSON
//! body / conversation / address ─▶ the routing decision's plan
//! ([`crate::routing::decision`]) ─▶ pooled upstream ─▶ commit ─▶ stream
//! the response`.
//!
//! Plain HTTP/1.1 requests go through magpie's own pass-through ([`h1`]):
//! heads parsed in place and forwarded as they came, bodies passed on in
//! their framing, one task per client connection. What it does not take
//! (HTTP/2 with prior knowledge, or chosen by ALPN on a listener that
//! terminates TLS; HTTP/1.0; framing to normalise or refuse) it hands over,
//! with the bytes it read, to hyper, which serves that connection from then
//! on. Backends are spoken to over HTTP/1.1 keep-alive connections. Nothing
//! is buffered whole: request and response bodies stream in both
//! directions, except the part of a request body read to find its key
//! (bounded by `key.max_bytes`).
//!
//! | module | owns |
//! |---|---|
//! | [`failure`] | why a request reached no backend, and magpie's own short answers (status, text, `Retry-After`) |
//! | [`h1`] | the HTTP/1.1 pass-through: heads, framing, keys from bodies, forwarding and relaying without hyper |
//! | [`request_key`] | a request's key: header, JSON body field, conversation, or address |
//! | [`normalize`] | requests refused before any backend: `CONNECT`, two `Host`s, unknown transfer codings |
//! | [`journey`] | one request's journey, written once for both wire formats: choose, connect, send, account, respond, finish; why requests fail |
//! | [`fields`] | header-field rules both wire formats apply: hop-by-hop fields, the backend's name, which answers are read for usage |
//! | [`hyper_wire`] | hyper's wire format: requests prepared for HTTP/1.1 backends, sent by hyper's client; answers as hyper responses |
//! | [`pool`] | keep-alive connections to backends (hyper's, and the pass-through's), lent to one request at a time |
//! | [`upstream`] | a connection to a backend below HTTP: TCP, then TLS for a `tls: true` backend |
//! | [`request_body`] | a request body: the bytes read for the key, then the rest |
//! | [`body_fields`] | a JSON body's top-level fields, dropped, set or read, the rest passed on as written |
//! | [`disaggregation`] | a disaggregated request's prefill half, sent to the prefill pool by vLLM's or SGLang's protocol, and the decode half's body |
//! | [`engine_priority`] | a request's class written into its body for engines that schedule by priority (`queue.priority.engine`) |
//! | [`response_body`] | a response body: counted, timed, its connection given back at the end |
//! | [`request_log`] | a request's access-log line: begun on arrival, completed as it is routed and answered, written at its end |
//! | [`reply`] | what the client gets: a backend's response body, or magpie's own short answer |
//! | [`reuse`] | which idle upstream connection a request may take (`http.reuse`), and what keeps one out of the pool |
//! | [`resets`] | HTTP/2 streams reset by the client after dispatch, and the budget past which a connection gets GOAWAY |
//! | [`socket`] | the client's socket under everything: the bytes the intake read, then the socket |
//! | [`tls`] | TLS termination: the handshake under the first byte's deadline, the certificate chosen by SNI from the snapshot |
//! | [`client_deadlines`] | first-byte, head and keep-alive deadlines on a client connection (`408`) |
//! | [`backend_deadlines`] | a backend's deadlines: the response head (`504`), pauses in its body |

pub(crate) mod backend_deadlines;
pub(crate) mod body_fields;
pub(crate) mod client_deadlines;
pub(crate) mod disaggregation;
pub(crate) mod engine_priority;
pub(crate) mod failure;
pub(crate) mod fields;
pub(crate) mod h1;
pub(crate) mod hyper_wire;
pub(crate) mod journey;
pub(crate) mod normalize;
pub(crate) mod pool;
pub(crate) mod reply;
pub(crate) mod request_body;
pub(crate) mod request_key;
pub(crate) mod request_log;
pub(crate) mod resets;
pub(crate) mod response_body;
pub(crate) mod reuse;
pub(crate) mod socket;
pub(crate) mod tls;
pub(crate) mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use self::client_deadlines::{Clock, Deadlines, Timed};
use self::h1::io::{ClientIo, Replay};
use self::h1::{Ended, Next};
use self::hyper_wire::{HyperWire, local};
use self::journey::{BODY_UNREADABLE, Failure, Forwarded, Journey};
use self::pool::Pool;
use self::pool::RawConn;
use self::reply::Reply;
use self::request_body::RequestBody;
use self::request_key::KeyPlan;
use self::request_log::{Arrival, RequestLog};
use self::resets::{Dispatched, Resets};
use self::reuse::ClientConn;
use self::socket::ClientSocket;
use crate::config::{Config, DEFAULT_HTTP_READ_TIMEOUT, KeyConfig};
use crate::intake::listener::Accepted;
use crate::intake::proxy_protocol::{self, Addresses};
use crate::net::{Client, reset_on_close};
use crate::routing::decision;
use crate::routing::instance::Instance;
use crate::routing::llm::disaggregation::{Decision, PrefillPlan};
use crate::routing::queue::Standing;
use crate::telemetry::stats::{ClientFailure, Stats};

/// The smallest head buffer hyper accepts.
const MIN_HEAD_BUFFER: usize = 8192;

/// One request's answer in the making, boxed (see [`HttpPath::service`]).
type RequestFuture = Pin<Box<dyn Future<Output = Result<Response<Reply>, Infallible>> + Send>>;

/// What every HTTP connection shares.
#[derive(Clone, Default)]
pub(crate) struct HttpPath {
    /// hyper's upstream connections.
    pub(crate) pool: Arc<Pool>,
    /// The HTTP/1.1 pass-through's upstream connections.
    pub(crate) raw_pool: Arc<Pool<RawConn>>,
    /// One per `listen` address: its TLS acceptor, `None` for cleartext
    /// (and for every listener when empty).
    pub(crate) tls: Arc<[Option<TlsAcceptor>]>,
}

/// One client connection, past its intake, as hyper will serve it.
struct Connection {
    instance: Arc<Instance>,
    shutdown: CancellationToken,
    stop: CancellationToken,
    arrival: Arrival,
    clock: Arc<Clock>,
    deadlines: Deadlines,
    /// The socket, for closing after hyper is done with the stream.
    socket: Arc<TcpStream>,
    /// Tells its requests from other clients' for the upstream pool.
    conn: Arc<ClientConn>,
}

/// What hyper's service for one client connection holds.
struct Served {
    instance: Arc<Instance>,
    clock: Arc<Clock>,
    resets: Arc<Resets>,
    arrival: Arrival,
    conn: Arc<ClientConn>,
    /// The client's socket, for its leaving while a request waits.
    socket: Arc<TcpStream>,
}

/// Which HTTP versions a connection may speak.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Versions {
    /// Cleartext: HTTP/1.1, or HTTP/2 with prior knowledge.
    Either,
    /// TLS without ALPN `h2`.
    Http1,
    /// TLS with ALPN `h2`.
    Http2,
}

impl HttpPath {
    /// Serves one client connection: its TLS handshake if its listener
    /// terminates TLS, then its requests, one after another (or side by
    /// side over HTTP/2), until it closes or shutdown.
    pub(crate) async fn serve_connection(self, accepted: Accepted) {
        let Accepted {
            stream,
            peer,
            local,
            listener,
            instance,
            shutdown,
            stop,
            slot: _slot,
        } = accepted;
        let config = Arc::clone(&instance.snapshot.load().config);
        let addresses = Addresses { peer, local };
        let Some(intake) =
            proxy_protocol::intake(stream, addresses, &config.proxy_protocol, &instance.stats)
                .await
        else {
            return;
        };
        let deadlines = Deadlines {
            head: head_timeout(&config.key),
            first_byte: config.http.first_byte_timeout,
            keepalive: config.http.keepalive_timeout,
        };
        drop(config);
        // From here the first byte's deadline runs, the handshake's included.
        let clock = Clock::new();
        let raw = ClientSocket::new(intake.stream);
        let connection = Connection {
            socket: raw.socket(),
            instance,
            shutdown,
            stop,
            arrival: Arrival {
                client: intake.client,
                local: intake.local,
            },
            clock,
            deadlines,
            conn: ClientConn::new(),
        };
        let acceptor = self.tls.get(listener).and_then(Option::as_ref).cloned();
        let Some(acceptor) = acceptor else {
            return self.pass_through(raw, Versions::Either, connection).await;
        };
        // Boxed, as is hyper's path below: a task's size is that of its
        // largest state, which a cleartext connection in the pass-through
        // would otherwise pay for.
        Box::pin(self.serve_tls(raw, acceptor, connection)).await
    }

    /// Serves a connection on a listener that terminates TLS: the handshake,
    /// then HTTP/2 with hyper when the client chose `h2`, else the
    /// pass-through.
    async fn serve_tls(self, raw: ClientSocket, acceptor: TlsAcceptor, connection: Connection) {
        let deadline = Instant::now() + connection.deadlines.first_byte;
        let stats = &connection.instance.stats;
        let handshake = tls::handshake(&acceptor, raw, deadline, stats, connection.arrival.client);
        let tls = tokio::select! {
            tls = handshake => tls,
            // The shutdown grace is over: no handshake holds the drain up.
            _ = connection.stop.cancelled() => None,
        };
        let Some(tls) = tls else {
            return;
        };
        if tls::chose_h2(&tls) {
            let tls = Replay::new(tls, Vec::new());
            return self.serve_http(tls, Versions::Http2, connection).await;
        }
        self.pass_through(tls, Versions::Http1, connection).await
    }

    /// Serves the requests on `stream` with the HTTP/1.1 pass-through
    /// ([`h1`]), then with hyper from the first request it hands over.
    async fn pass_through<S>(self, stream: S, versions: Versions, mut c: Connection)
    where
        S: ClientIo + 'static,
    {
        self.raw_pool.start_sweeper(&c.instance);
        let client = h1::Client {
            instance: &c.instance,
            pool: &self.raw_pool,
            arrival: c.arrival,
            deadlines: c.deadlines,
            accepted: c.clock.started(),
            shutdown: &c.shutdown,
            stop: &c.stop,
            conn: &c.conn,
            socket: &c.socket,
        };
        match h1::serve(stream, &client).await {
            Ended::Handover(stream, read) => {
                // hyper's deadlines start afresh, with the bytes read.
                c.clock = Clock::new();
                let hyper = self.serve_http(Replay::new(stream, read), versions, c);
                Box::pin(hyper).await
            }
            Ended::Closed(Next::Reset) => reset_on_close(&c.socket),
            Ended::Closed(Next::Linger) => client_deadlines::linger(&c.socket).await,
            Ended::Closed(_) => {}
        }
    }

    /// Serves the requests on `stream` until it closes or shutdown.
    async fn serve_http<S>(self, stream: S, versions: Versions, c: Connection)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.pool.start_sweeper(&c.instance);
        let io = Timed::new(stream, Arc::clone(&c.clock), c.deadlines);
        let config = Arc::clone(&c.instance.snapshot.load().config);
        let resets = Resets::new(config.limits.h2_resets_per_second);
        let builder = builder(config.limits.max_head_bytes, versions);
        drop(config);
        let service = self.service(Served {
            instance: Arc::clone(&c.instance),
            clock: Arc::clone(&c.clock),
            resets: Arc::clone(&resets),
            arrival: c.arrival,
            conn: Arc::clone(&c.conn),
            socket: Arc::clone(&c.socket),
        });
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let ended = tokio::select! {
            ended = connection.as_mut() => Some(ended),
            _ = c.shutdown.cancelled() => None,
            // Too many streams reset after dispatch: GOAWAY.
            _ = resets.exceeded() => None,
        };
        let ended = match ended {
            Some(ended) => ended,
            None => {
                // A request may be on its way (a connection accepted just
                // before the drain, a keep-alive client's next): it gets a
                // moment to arrive rather than a close that races it.
                let early = tokio::select! {
                    ended = connection.as_mut() => Some(ended),
                    () = tokio::time::sleep(client_deadlines::FIRST_REQUEST_GRACE) => None,
                    _ = c.stop.cancelled() => None,
                };
                match early {
                    Some(ended) => ended,
                    None => {
                        // Finish the requests in flight, then close (HTTP/1:
                        // keep-alive ends; HTTP/2: GOAWAY).
                        connection.as_mut().graceful_shutdown();
                        tokio::select! {
                            ended = connection.as_mut() => ended,
                            _ = c.stop.cancelled() => {
                                // The grace is over: the client sees a reset,
                                // not a response that merely stops.
                                reset_on_close(&c.socket);
                                Ok(())
                            }
                        }
                    }
                }
            }
        };
        let failed = ended.err();
        // A head hyper could not parse was answered by hyper itself (400, or
        // 431 past the head limit): a request refused all the same.
        let refused = failed
            .as_deref()
            .and_then(|e| e.downcast_ref::<hyper::Error>());
        if refused.is_some_and(|e| e.is_parse() || e.is_parse_too_large()) {
            (c.instance.stats).count_client_failure(ClientFailure::BadRequest);
        }
        let failed = failed.map(|e| e.to_string());
        close(
            &c.socket,
            &c.clock,
            failed,
            &c.instance.stats,
            c.arrival.client,
        )
        .await;
    }

    /// The per-request service of one client connection.
    fn service(
        self,
        served: Served,
    ) -> impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<Reply>,
        Error = Infallible,
        Future = RequestFuture,
    > + Clone
    + use<> {
        let Served {
            instance,
            clock,
            resets,
            arrival,
            conn,
            socket,
        } = served;
        service_fn(move |request: Request<Incoming>| {
            let path = self.clone();
            let clock = Arc::clone(&clock);
            let instance = Arc::clone(&instance);
            let conn = Arc::clone(&conn);
            let socket = Arc::clone(&socket);
            let dispatched = Dispatched::new(&resets, &clock, &instance);
            // Boxed: hyper keeps a slot the size of this future for every
            // connection, idle or not, so an unboxed one (kilobytes: the
            // key, the route, the upstream exchange) would be paid by every
            // idle keep-alive client.
            Box::pin(async move {
                let busy = clock.serving();
                let mut log = RequestLog::start(&request, arrival, &instance);
                let response = path
                    .request(
                        request,
                        &instance,
                        (arrival.client, &conn, &socket),
                        &mut log,
                    )
                    .await;
                if let Some(log) = log {
                    // Not handed to a response body: magpie answered itself.
                    let bytes = response.body().size_hint().exact().unwrap_or(0);
                    log.answered_locally(response.status().as_u16(), bytes);
                }
                dispatched.done();
                Ok::<_, Infallible>(response.map(|reply| reply.ending(busy)))
            }) as RequestFuture
        })
    }

    /// One request: its key, its route (and pin), and the backend's answer.
    async fn request(
        &self,
        request: Request<Incoming>,
        instance: &Arc<Instance>,
        (client, conn, socket): (Client, &ClientConn, &TcpStream),
        log: &mut Option<RequestLog>,
    ) -> Response<Reply> {
        if let Some(refused) = normalize::refuse(&request, &instance.stats, client) {
            return refused;
        }
        let snapshot = instance.snapshot.load_full();
        let config = Arc::clone(&snapshot.config);
        let claim = conn.claim(config.http.reuse);
        let headers = request.headers();
        let standing = Standing::of(config.queue.as_ref(), |name| {
            headers.get(name).map(|v| v.as_bytes())
        });
        let plan = KeyPlan::of(&config, client, &instance.stats.key_budget);
        let (found, request) = match request_key::request_key(request, plan).await {
            Ok(found) => found,
            Err(e) => {
                debug!(%client, error = %e, "request body failed while reading its key");
                instance
                    .stats
                    .count_client_failure(ClientFailure::BadRequest);
                return local(StatusCode::BAD_REQUEST, BODY_UNREADABLE);
            }
        };
        let mut request = with_engine_priority(&config, standing, request);
        let held = request.body().held();
        let prompt_bytes = hyper::body::Body::size_hint(request.body())
            .exact()
            .unwrap_or(held);
        let asked = found.request(standing, prompt_bytes, &instance.stats);
        if let Some(log) = log.as_mut() {
            log.keyed(asked.keys.session);
        }
        let plan = decision::plan(instance, &snapshot, asked).await;
        let split = (config.disaggregation).map(|_| plan.prefill_route(instance, &snapshot));
        drop(snapshot);
        if let Some(route) = split {
            request = halves(instance, &config, route, request, log).await;
        }
        let length = hyper::body::Body::size_hint(request.body()).exact();
        let mut journey = Journey {
            plan,
            claim,
            with_body: length != Some(0),
            held,
            config: &config,
            instance,
            log,
        };
        let mut wire = HyperWire::new(request, &self.pool, socket);
        match journey.forward(&mut wire).await {
            Forwarded::Answered(answered) => {
                hyper_wire::respond(answered.head, answered.in_flight, &config)
            }
            Forwarded::Failed(failure) => hyper_wire::answer(failure.answer()),
            // hyper's client never reports this: a client that goes away
            // drops the request's future instead.
            Forwarded::ClientGone => hyper_wire::answer(Failure::LocalResources.answer()),
        }
    }
}

/// `request` with the engine's priority written into its body, when the
/// config writes it and the body, read whole, is one JSON object
/// ([`engine_priority`]); its `Content-Length`, if it has one, restated.
fn with_engine_priority(
    config: &Config,
    standing: Standing,
    request: Request<RequestBody>,
) -> Request<RequestBody> {
    let Some(value) = (config.queue.as_ref()).and_then(|q| q.priority.engine_value(standing.class))
    else {
        return request;
    };
    let (mut parts, mut body) = request.into_parts();
    if let Some(len) = body.rewrite(|b| engine_priority::with_priority(b, value))
        && parts.headers.contains_key(hyper::header::CONTENT_LENGTH)
    {
        parts
            .headers
            .insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    Request::from_parts(parts, body)
}

/// `request` as its decode half goes on, once its prefill half went by
/// `route` ([`disaggregation`]): its body rewritten (its `Content-Length`,
/// if it has one, restated) when the prefill half says so.
async fn halves(
    instance: &Instance,
    config: &Arc<Config>,
    route: Result<PrefillPlan, Decision>,
    request: Request<RequestBody>,
    log: &mut Option<RequestLog>,
) -> Request<RequestBody> {
    let (mut parts, mut body) = request.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fields = (parts.headers.iter()).map(|(n, v)| (n.as_str(), v.as_bytes()));
    let leg = disaggregation::Leg::new(target, fields);
    let whole = body.whole();
    let halves = disaggregation::prefill(instance, config, route, &leg, whole.as_deref()).await;
    if let Some(log) = log.as_mut() {
        log.split(halves.decision.as_str(), halves.prefill.as_deref());
    }
    if let Some(new) = halves.body
        && let Some(len) = body.rewrite(|_| Some(new))
        && parts.headers.contains_key(hyper::header::CONTENT_LENGTH)
    {
        parts
            .headers
            .insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    Request::from_parts(parts, body)
}

/// hyper's server for one connection: the versions it may speak, and the
/// head limit.
fn builder(head_limit: usize, versions: Versions) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        // A head that overflows this buffer is answered with 431; it
        // also bounds what hyper queues for a client that reads slowly.
        .max_buf_size(head_limit.max(MIN_HEAD_BUFFER));
    builder
        .http2()
        .max_header_list_size(u32::try_from(head_limit).unwrap_or(u32::MAX))
        // What one stream may queue for a client that reads slowly.
        .max_send_buf_size(head_limit);
    match versions {
        Versions::Either => builder,
        Versions::Http1 => builder.http1_only(),
        Versions::Http2 => builder.http2_only(),
    }
}

/// How long a request head may take from its first byte: the key's read
/// timeout, or mode http's default for address keys.
fn head_timeout(key: &KeyConfig) -> Duration {
    key.read()
        .map_or(DEFAULT_HTTP_READ_TIMEOUT, |r| r.read_timeout)
}

/// The client connection is over: a head that timed out, or a quiet
/// connection's close, is counted; a connection whose response was cut
/// half-way is reset, so the client cannot take it for a complete answer;
/// one that ended in another error (or a `408`) is closed gently, so the
/// answer it got is not destroyed by a reset.
async fn close(
    socket: &TcpStream,
    clock: &Clock,
    failed: Option<String>,
    stats: &Stats,
    client: Client,
) {
    let timed_out = clock.timed_out.load(std::sync::atomic::Ordering::Relaxed);
    if timed_out {
        stats.count_client_failure(ClientFailure::HeadTimeout);
    }
    if let Some(why) = clock.quiet_close() {
        stats.count_quiet_close(why);
    }
    if let Some(error) = &failed {
        debug!(%client, %error, "client connection ended with an error");
    }
    if clock.was_cut() {
        reset_on_close(socket);
    } else if failed.is_some() || timed_out {
        client_deadlines::linger(socket).await;
    }
}
