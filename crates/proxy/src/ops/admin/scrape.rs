//! `GET /metrics`: one rendering at a time, shared by every scrape waiting
//! for it, gzipped for the scrapers that ask.
//!
//! A scrape that arrives while no rendering runs starts one; a scrape that
//! arrives while one runs waits for it and is answered with the same bytes.
//! A finished rendering is never served again: the next scrape starts a new
//! one, so a scrape never sees counters older than the rendering that was
//! running when it arrived. However many scrapers there are, at most one
//! rendering (and its gzip) is ever running, on a blocking thread of the
//! admin runtime, never on the data path's threads.
//!
//! gzip is made once per rendering, in the same blocking task, when a scrape
//! waiting for it asked for gzip (`Accept-Encoding`) before its text was
//! done; a gzip scrape that joins in the instant between the two gets plain
//! text, which HTTP allows. Every answer carries `Vary: Accept-Encoding`.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use hyper::header::{
    ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderValue, VARY,
};
use hyper::{Response, StatusCode};
use tokio::sync::watch;

use super::body::Body;
use crate::ops::metrics::Renderer;

/// The Prometheus text format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// gzip's fastest level: on magpie's exposition it takes a fifth of the
/// time of the default level for a body about 1.3 times as large.
const LEVEL: Compression = Compression::fast();

/// One rendering of the exposition.
#[derive(Debug)]
pub(crate) struct Rendering {
    pub(crate) plain: Bytes,
    /// When a scrape waiting for it asked for gzip.
    pub(crate) gzip: Option<Bytes>,
}

/// The rendering in progress, if any.
#[derive(Default)]
struct InFlight {
    /// `Some` once it is done; closed without a value if it panicked.
    done: Option<watch::Receiver<Option<Arc<Rendering>>>>,
    /// Whether a scrape waiting for it wants gzip.
    gzip: Arc<AtomicBool>,
}

/// Renders `/metrics` for every scrape, one rendering at a time.
pub(crate) struct Scrapes {
    renderer: Arc<Renderer>,
    in_flight: Arc<Mutex<InFlight>>,
}

impl Scrapes {
    pub(crate) fn new(renderer: Renderer) -> Scrapes {
        Scrapes {
            renderer: Arc::new(renderer),
            in_flight: Arc::default(),
        }
    }

    /// The answer to `GET /metrics` with request headers `headers`.
    pub(crate) async fn answer(&self, headers: &HeaderMap) -> Response<Body> {
        let gzip = accepts_gzip(headers);
        let Some(rendering) = self.rendering(gzip).await else {
            let mut r = Response::new(Body::new("the metrics rendering failed (see the log)\n"));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        };
        let (body, gzipped) = match (&rendering.gzip, gzip) {
            (Some(z), true) => (z.clone(), true),
            _ => (rendering.plain.clone(), false),
        };
        let mut r = Response::new(Body::new(body));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
        h.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        if gzipped {
            h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    }

    /// The rendering in progress, or a new one; `None` if it panicked.
    pub(crate) async fn rendering(&self, gzip: bool) -> Option<Arc<Rendering>> {
        let mut done = {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if gzip {
                in_flight.gzip.store(true, Ordering::Relaxed);
            }
            match &in_flight.done {
                Some(done) => done.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    in_flight.done = Some(rx.clone());
                    self.start(tx, Arc::clone(&in_flight.gzip));
                    rx
                }
            }
        };
        let rendering = done.wait_for(Option::is_some).await.ok()?;
        rendering.clone()
    }

    /// Renders on a blocking thread and publishes the result.
    fn start(&self, tx: watch::Sender<Option<Arc<Rendering>>>, gzip: Arc<AtomicBool>) {
        let renderer = Arc::clone(&self.renderer);
        let publish = Publish {
            in_flight: Arc::clone(&self.in_flight),
            tx,
        };
        tokio::task::spawn_blocking(move || {
            let plain = Bytes::from(renderer.render());
            let gzip = gzip
                .load(Ordering::Relaxed)
                .then(|| compress(&plain))
                .flatten();
            publish.send(Rendering { plain, gzip });
        });
    }
}

/// Ends the rendering in progress: when dropped without [`Publish::send`]
/// (a panic), its waiters are told by the channel closing, and the next
/// scrape starts afresh.
struct Publish {
    in_flight: Arc<Mutex<InFlight>>,
    tx: watch::Sender<Option<Arc<Rendering>>>,
}

impl Publish {
    fn send(self, rendering: Rendering) {
        // Under the lock: a scrape either joined this rendering and is
        // sent it, or comes after and starts the next.
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *in_flight = InFlight::default();
        self.tx.send_replace(Some(Arc::new(rendering)));
    }
}

impl Drop for Publish {
    fn drop(&mut self) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if in_flight
            .done
            .as_ref()
            .is_some_and(|done| done.same_channel(&self.tx.subscribe()))
        {
            *in_flight = InFlight::default();
        }
    }
}

/// `text` gzipped; `None` (logged) if the encoder fails.
fn compress(text: &[u8]) -> Option<Bytes> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(text.len() / 8), LEVEL);
    match encoder.write_all(text).and_then(|()| encoder.finish()) {
        Ok(gzipped) => Some(Bytes::from(gzipped)),
        Err(e) => {
            tracing::error!(error = %e, "cannot gzip the metrics; answering plain text");
            None
        }
    }
}

/// Whether `Accept-Encoding` takes gzip: `gzip` (or `x-gzip`) with a
/// q-value above 0, or `*` above 0 without gzip named.
pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut named = None;
    let mut any = None;
    let codings = headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for coding in codings {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or("").trim();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            named = Some(q > 0.0);
        } else if name == "*" {
            any = Some(q > 0.0);
        }
    }
    named.or(any).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn accept_encoding_is_read_with_its_q_values() {
        for yes in [
            &["gzip"][..],
            &["gzip, deflate, br"],
            &["deflate", "GZip;q=0.5"],
            &["x-gzip"],
            &["*"],
            &["br;q=1.0, *;q=0.1"],
            &["identity, gzip; q=0.001"],
        ] {
            assert!(accepts_gzip(&headers(yes)), "{yes:?}");
        }
        for no in [
            &[][..],
            &["identity"],
            &["deflate, br"],
            &["gzip;q=0"],
            &["gzip;q=0.0, *"],
            &["*;q=0"],
            &["gzipper"],
        ] {
            assert!(!accepts_gzip(&headers(no)), "{no:?}");
        }
    }

    #[test]
    fn compressed_text_decodes_to_itself() {
        let text = "magpie_backend_up{backend=\"a\",addr=\"127.0.0.1:8001\"} 1\n".repeat(1000);
        let gzipped = compress(text.as_bytes()).unwrap();
        assert!(gzipped.len() < text.len() / 10, "{}", gzipped.len());
        let mut decoded = String::new();
        flate2::read::GzDecoder::new(&gzipped[..])
            .read_to_string(&mut decoded)
            .unwrap();
        assert_eq!(decoded, text);
    }
}
