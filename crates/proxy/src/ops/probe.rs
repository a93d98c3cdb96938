//! `magpie probe URL`: one HTTP/1.1 `GET` over plain TCP, for container
//! health checks where there is no shell and no curl. A 2xx answer is a
//! success; anything else (a bad URL, no connection, no answer in time, any
//! other status) is a failure.
//!
//! Only `http://host:port/path` is understood: no TLS, no user info, no
//! fragment, and the port is always written out.

use std::net::Ipv6Addr;
use std::process::ExitCode;
use std::time::Duration;

use http_body_util::Empty;
use hyper::StatusCode;
use hyper::header::{CONNECTION, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("bad URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no HTTP answer from {authority}: {source}")]
    Http {
        authority: String,
        #[source]
        source: hyper::Error,
    },
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("answered {0}")]
    Status(StatusCode),
}

/// A parsed `http://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// A name or an IP address; an IPv6 address without its brackets.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The path and query, starting with `/`.
    pub(crate) path: String,
}

impl Target {
    /// `host:port` as written in a `Host` header (IPv6 in brackets).
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Parses `http://host:port/path` (the path may be left out: `/`).
pub(crate) fn parse_url(url: &str) -> Result<Target, ProbeError> {
    let bad = |reason: &str| ProbeError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let lower = url.to_ascii_lowercase();
    let rest = if lower.starts_with("http://") {
        &url["http://".len()..]
    } else if lower.starts_with("https://") {
        return Err(bad(
            "https is not supported (no TLS); use http://host:port/path",
        ));
    } else if url.contains("://") {
        return Err(bad("only http:// is supported; use http://host:port/path"));
    } else {
        return Err(bad("expected http://host:port/path"));
    };
    if let Some(c) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(&format!("contains {c:?}")));
    }
    if url.contains('#') {
        return Err(bad("a fragment (#...) is not allowed"));
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], &rest[i..]),
        Some(_) => return Err(bad("the path must start with /")),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(bad("no host; use http://host:port/path"));
    }
    if authority.contains('@') {
        return Err(bad("user info (user@host) is not supported"));
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(bad("an IPv6 address is missing its closing ]"));
        };
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(bad(&format!("{host:?} is not an IPv6 address")));
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err(bad("the port is missing; use http://[ipv6]:port/path"));
        };
        (host, port)
    } else {
        let Some((host, port)) = authority.rsplit_once(':') else {
            return Err(bad("the port is missing; use http://host:port/path"));
        };
        if host.contains(':') {
            return Err(bad(
                "an IPv6 address must be in brackets: http://[::1]:port/path",
            ));
        }
        if host.is_empty() {
            return Err(bad("no host; use http://host:port/path"));
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Err(bad(&format!("{host:?} is not a host name or IP address")));
        }
        (host, port)
    };
    let port = match port.parse::<u16>() {
        Ok(0) => return Err(bad("port 0 cannot be connected to")),
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(bad(&format!("{port:?} is not a port (1 to 65535)"))),
    };
    Ok(Target {
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// `GET url` within `timeout` (connect, send, and the response head). The
/// status when it is 2xx; every other outcome is an error.
pub(crate) async fn probe(url: &str, timeout: Duration) -> Result<u16, ProbeError> {
    let target = parse_url(url)?;
    let status = tokio::time::timeout(timeout, get(url, &target))
        .await
        .map_err(|_| ProbeError::Timeout(timeout))??;
    if status.is_success() {
        Ok(status.as_u16())
    } else {
        Err(ProbeError::Status(status))
    }
}

async fn get(url: &str, target: &Target) -> Result<StatusCode, ProbeError> {
    let authority = target.authority();
    let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|source| ProbeError::Connect {
            authority: authority.clone(),
            source,
        })?;
    let http = |source| ProbeError::Http {
        authority: authority.clone(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(target.path.as_str())
        .header(HOST, authority.as_str())
        .header(USER_AGENT, "magpie-probe")
        .header(CONNECTION, "close")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| ProbeError::Url {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let response = sender.send_request(request).await;
    driver.abort();
    Ok(response.map_err(http)?.status())
}

/// The `probe` command: exit 0 on a 2xx answer; otherwise one line on stderr
/// and exit 1.
pub fn run(url: &str, timeout: Duration) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(probe(url, timeout)).map_err(|e| e.to_string()));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("magpie probe: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> Target {
        parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn reason(url: &str) -> String {
        match parse_url(url) {
            Err(ProbeError::Url { reason, .. }) => reason,
            other => panic!("{url}: expected a URL error, got {other:?}"),
        }
    }

    #[test]
    fn host_port_and_path() {
        assert_eq!(
            ok("http://127.0.0.1:9090/readyz"),
            Target {
                host: "127.0.0.1".into(),
                port: 9090,
                path: "/readyz".into()
            }
        );
        let t = ok("http://magpie.internal:80/route?key=alice");
        assert_eq!(t.host, "magpie.internal");
        assert_eq!(t.port, 80);
        assert_eq!(t.path, "/route?key=alice");
        assert_eq!(t.authority(), "magpie.internal:80");
        assert_eq!(ok("HTTP://localhost:1/").host, "localhost");
    }

    #[test]
    fn a_missing_path_is_the_root() {
        assert_eq!(ok("http://127.0.0.1:9090").path, "/");
    }

    #[test]
    fn ipv6_in_brackets() {
        let t = ok("http://[::1]:9090/healthz");
        assert_eq!(t.host, "::1");
        assert_eq!(t.port, 9090);
        assert_eq!(t.authority(), "[::1]:9090");
        assert!(reason("http://::1:9090/").contains("brackets"));
        assert!(reason("http://[::1/").contains("closing ]"));
        assert!(reason("http://[::1]/").contains("port is missing"));
        assert!(reason("http://[nope]:1/").contains("not an IPv6 address"));
    }

    #[test]
    fn other_schemes_are_refused() {
        assert!(reason("https://127.0.0.1:9090/readyz").contains("no TLS"));
        assert!(reason("ftp://127.0.0.1:21/").contains("only http://"));
        assert!(reason("127.0.0.1:9090/readyz").contains("expected http://"));
        assert!(reason("").contains("expected http://"));
    }

    #[test]
    fn the_port_is_required_and_checked() {
        assert!(reason("http://127.0.0.1/readyz").contains("port is missing"));
        assert!(reason("http://127.0.0.1:/readyz").contains("not a port"));
        assert!(reason("http://127.0.0.1:65536/").contains("not a port"));
        assert!(reason("http://127.0.0.1:+80/").contains("not a port"));
        assert!(reason("http://127.0.0.1:http/").contains("not a port"));
        assert!(reason("http://127.0.0.1:0/").contains("port 0"));
    }

    #[test]
    fn odd_authorities_and_paths_are_refused() {
        assert!(reason("http:///readyz").contains("no host"));
        assert!(reason("http://:9090/readyz").contains("no host"));
        assert!(reason("http://user@127.0.0.1:9090/").contains("user info"));
        assert!(reason("http://127.0.0.1:9090?x=1").contains("must start with /"));
        assert!(reason("http://127.0.0.1:9090/a#b").contains("fragment"));
        assert!(reason("http://127.0.0.1:9090/a b").contains("' '"));
        assert!(reason("http://127.0.0.1:9090/a\r\nX: y").contains("'\\r'"));
        assert!(reason("http://ex%41mple:1/").contains("not a host name"));
    }

    #[test]
    fn errors_say_what_was_wrong() {
        let e = parse_url("http://127.0.0.1/readyz").expect_err("no port");
        assert_eq!(
            e.to_string(),
            "bad URL \"http://127.0.0.1/readyz\": the port is missing; use http://host:port/path"
        );
        assert_eq!(
            ProbeError::Timeout(Duration::from_secs(2)).to_string(),
            "no answer within 2s"
        );
        assert_eq!(
            ProbeError::Status(StatusCode::NOT_FOUND).to_string(),
            "answered 404 Not Found"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let url = format!("http://127.0.0.1:{port}/");
        match probe(&url, Duration::from_secs(2)).await {
            Err(ProbeError::Connect { .. }) => {}
            other => panic!("expected a connect error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_silent_server_is_a_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/", listener.local_addr().expect("addr"));
        // Accepted by the kernel's backlog, never answered.
        match probe(&url, Duration::from_millis(200)).await {
            Err(ProbeError::Timeout(_)) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        drop(listener);
    }
}
