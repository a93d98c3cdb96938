//! The JSON answers of the admin endpoint: `/table` (the published table)
//! and `/route` (where a key goes, and why), and the query string they read.

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::body::Body;
use crate::routing::backend::Backend;
use crate::routing::instance::Instance;
use crate::routing::key_memory::Last;
use crate::routing::keys::{GroupKey, SessionKey};
use crate::routing::route::{self, Route};
use crate::routing::sessions::group_pin;
use crate::routing::snapshot::Snapshot;
use magpie_core::key::group::GroupBy;

/// `/queue`: whether the queue is on, what waits in each class, and each
/// backend's requests in flight against its limit.
pub(crate) fn queue_json(snapshot: &Snapshot, instance: &Instance) -> serde_json::Value {
    let Some(q) = &snapshot.config.queue else {
        return json!({"enabled": false});
    };
    let queue = &instance.queue;
    let depths = queue.depths(q.priority.classes.len());
    let classes: Vec<_> = (q.priority.classes.iter().zip(depths))
        .map(|(name, waiting)| json!({"class": name, "waiting": waiting}))
        .collect();
    let backends: Vec<_> = (snapshot.backends.iter())
        .map(|b| {
            json!({
                "name": b.name,
                "in_flight": b.live.load.active(),
                "limit": b.max_inflight.unwrap_or(q.max_inflight),
            })
        })
        .collect();
    json!({
        "enabled": true,
        "waiting": queue.len(),
        "size": q.size,
        "body_bytes": queue.stats.bytes(),
        "classes": classes,
        "backends": backends,
    })
}

/// `/table`: the table's version, fingerprint and backends; with
/// `disaggregation` the prefill pool's backends too.
pub(crate) fn table_json(snapshot: &Snapshot) -> serde_json::Value {
    let mut answer = pool_json(snapshot);
    answer["version"] = json!(snapshot.version);
    answer["fingerprint"] = json!(snapshot.fingerprint);
    answer["algorithm"] = json!(snapshot.table.algorithm().as_str());
    answer["bounded_load"] = json!(snapshot.config.placement.bounded_load);
    if let Some(split) = &snapshot.config.disaggregation {
        answer["disaggregation"] = json!({
            "protocol": split.protocol.as_str(),
            "skip_below_tokens": split.skip_below_tokens,
            "prefill": snapshot.prefill.as_deref().map(pool_json),
        });
    }
    answer
}

/// One pool's backends, with their shares of its table.
fn pool_json(snapshot: &Snapshot) -> serde_json::Value {
    let backends: Vec<_> = snapshot
        .backends
        .iter()
        .zip(&snapshot.shares)
        .map(|(b, share)| {
            json!({
                "name": b.name,
                "addr": b.addr.to_string(),
                "weight": b.weight,
                "zone": b.zone,
                "role": b.role.as_str(),
                "up": b.live.health.is_up(),
                "active": b.live.load.active(),
                "share": share,
                "engine_kv_capacity_tokens": b.live.engine.kv_capacity(),
                "slow_start_progress": slow_start_progress(snapshot, b),
            })
        })
        .collect();
    json!({ "backends": backends })
}

/// How far `backend` is in its slow-start ramp (0 to 1), if it is in one.
fn slow_start_progress(snapshot: &Snapshot, backend: &Backend) -> Option<f64> {
    let length = snapshot.config.placement.slow_start?;
    route::slow_start_progress(backend, length, tokio::time::Instant::now())
}

/// `/route?key=K` or `?addr=A` (and `&group=G` with `key.group`).
pub(super) fn route_answer(
    query: &str,
    snapshot: &Snapshot,
    instance: &Instance,
) -> Response<Body> {
    let bad = |e: String| json_response(StatusCode::BAD_REQUEST, json!({ "error": e }));
    // ?key=K as the key mode reads it; ?addr=A as a client at A (in header
    // and body modes: the fallback key).
    let key_config = &snapshot.config.key;
    let (key, key_text) = match (query_param(query, "key"), query_param(query, "addr")) {
        (Some(text), None) => (key_config.key_of_text(&text), text),
        (None, Some(text)) => (key_config.key_of_address(&text), text),
        _ => return bad("give one of ?key=K or ?addr=IP[:PORT]".to_string()),
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => return bad(e.to_string()),
    };
    let last = instance.key_memory.last(SessionKey::new(key));
    let pin = instance.sessions().and_then(|s| s.pins.peek(key));
    let Some(by) = &snapshot.config.group else {
        let mut answer = route_json(snapshot, &key_text, key, key);
        answer["pinned"] = json!(pin.as_deref());
        answer["last"] = last_json(last);
        return json_response(StatusCode::OK, answer);
    };
    let given = query_param(query, "group");
    let group = match &given {
        Some(text) => match group_of_text(by, text) {
            Ok(g) => Some((GroupKey::new(g), "query")),
            Err(e) => return bad(e),
        },
        None => last
            .as_ref()
            .and_then(|l| l.group)
            .map(|g| (g, "last_request")),
    };
    let table_key = group.map_or(key, |(g, _)| g.hash());
    let mut answer = route_json(snapshot, &key_text, key, table_key);
    // The group's home (`key.group_choices` above 1): where its new
    // conversations go first.
    let home = group
        .and_then(|(g, _)| instance.sessions()?.pins.peek(group_pin(g)))
        .filter(|_| snapshot.config.group_choices > 1);
    if let Some(home) = home.as_deref().and_then(|name| snapshot.backend(name)) {
        let route = Route::preview(snapshot, table_key).home_first(snapshot, home);
        answer["chosen"] = json!(route.first().map(|b| b.name.clone()));
    }
    let pin_rank = pin.as_deref().and_then(|name| {
        let position = snapshot.candidates(table_key).position(|b| b.name == name);
        position.filter(|_| group.is_some()).map(|i| i + 1)
    });
    answer["pinned"] = json!(pin.as_deref());
    answer["last"] = last_json(last);
    answer["session"] = json!({
        "key": key_text,
        "hash": format!("{key:#018x}"),
        "pinned": pin.as_deref(),
    });
    answer["group"] = json!({
        "setting": by.describe(),
        "given": given,
        "hash": group.map(|(g, _)| format!("{:#018x}", g.hash())),
        "from": group.map(|(_, from)| from),
        "pin_rank": pin_rank,
        "home": home.as_deref(),
    });
    answer["table_key"] = json!(if group.is_some() { "group" } else { "session" });
    json_response(StatusCode::OK, answer)
}

/// A group written as text: a header group's value, or the hash of a body
/// group (`0x` and hex digits, as `/route` shows it).
fn group_of_text(by: &GroupBy, text: &str) -> Result<u64, String> {
    if let GroupBy::Header(_) = by {
        return Ok(magpie_core::key::text_key(text.as_bytes()));
    }
    text.trim()
        .strip_prefix("0x")
        .filter(|hex| !hex.is_empty() && hex.len() <= 16)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .ok_or_else(|| {
            format!(
                "key.group is {}: give ?group= as the group's hash (0x and up to 16 hex digits, as /route shows it)",
                by.describe()
            )
        })
}

/// The route of session key `key` whose table is looked up by `table_key`
/// (the same key without a group).
pub(crate) fn route_json(
    snapshot: &Snapshot,
    key_text: &str,
    key: u64,
    table_key: u64,
) -> serde_json::Value {
    let chosen = Route::preview(snapshot, table_key)
        .first()
        .map(|b| b.name.clone());
    let candidates: Vec<_> = snapshot
        .candidates(table_key)
        .map(|b| {
            json!({
                "name": b.name,
                "addr": b.addr.to_string(),
                "up": b.live.health.is_up(),
                "active": b.live.load.active(),
                "chosen": chosen.as_deref() == Some(b.name.as_str()),
            })
        })
        .collect();
    json!({
        "key": key_text,
        "hash": format!("{key:#018x}"),
        "version": snapshot.version,
        "chosen": chosen,
        "candidates": candidates,
    })
}

/// Where the key's last request (or connection) went and why, if this
/// magpie remembers it.
fn last_json(last: Option<Last>) -> serde_json::Value {
    match last {
        None => serde_json::Value::Null,
        Some(l) => json!({
            "backend": l.backend,
            "how": l.how.as_str(),
            "seconds_ago": l.age.as_secs_f64(),
            "stays_after_spill": l.spilled,
            "prompt_tokens": l.prompt_tokens,
        }),
    }
}

pub(super) fn json_response(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut body = serde_json::to_vec_pretty(&value).unwrap_or_default();
    body.push(b'\n');
    let mut r = Response::new(Body::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The decoded value of `name` in a query string (`+` is a space, `%XX` a byte).
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(
            query_param("key=a%20b+c&x=1", "key").as_deref(),
            Some("a b c")
        );
        assert_eq!(query_param("x=1&key=%zz", "key").as_deref(), Some("%zz"));
        assert_eq!(query_param("x=1", "key"), None);
        assert_eq!(query_param("key=100%25", "key").as_deref(), Some("100%"));
        assert_eq!(query_param("key=%4", "key").as_deref(), Some("%4"));
    }
}
