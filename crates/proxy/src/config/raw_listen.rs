//! `listen` as YAML says it: one address, or a list whose entries are
//! addresses or `{addr, tls}` objects (a listener that terminates TLS).
//!
//! Part of the parse step ([`raw`](super::raw)); what the paths name and
//! whether TLS fits the mode is [`validate`](super::validate)'s.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `listen: 127.0.0.1:7000` and `listen: [a, b]` both work. Read by hand
/// rather than as an untagged enum: that would lose each item's place and
/// answer anything else with "did not match any variant".
#[derive(Debug)]
pub(super) enum Listen {
    /// One address; its place is the `listen` value's.
    One(String),
    Many(Vec<Spanned<ListenItem>>),
}

/// One entry of a `listen` list: `ip:port` (cleartext), or
/// `{addr: ip:port, tls: {...}}`.
#[derive(Debug)]
pub(super) enum ListenItem {
    Addr(String),
    Object(Box<RawListener>),
}

/// `{addr, tls}`: a listener written as an object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub(super) addr: Spanned<String>,
    #[serde(default)]
    pub(super) tls: Option<Spanned<RawTls>>,
}

/// `tls`: one certificate (`cert` and `key`), or several chosen by the
/// client's server name (`certificates`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    #[serde(default)]
    pub(super) cert: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) key: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) certificates: Option<Spanned<Vec<Spanned<RawCertificate>>>>,
}

/// One `{cert, key}` pair of files: a PEM chain (leaf first) and its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCertificate {
    pub(super) cert: Spanned<String>,
    pub(super) key: Spanned<String>,
}

fn number<E: serde::de::Error>(v: impl std::fmt::Display) -> E {
    E::custom(format!(
        "listen {v} is a number; write an ip:port address such as 0.0.0.0:{v}"
    ))
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ListenVisitor;
        impl<'de> serde::de::Visitor<'de> for ListenVisitor {
            type Value = Listen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an ip:port address such as 127.0.0.1:7000, or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Listen, E> {
                Ok(Listen::One(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Listen, E> {
                Err(number(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Listen, E> {
                Err(number(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Listen, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Listen::Many(items))
            }
        }
        d.deserialize_any(ListenVisitor)
    }
}

impl<'de> Deserialize<'de> for ListenItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> serde::de::Visitor<'de> for ItemVisitor {
            type Value = ListenItem;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an ip:port address, or {addr: ip:port, tls: {cert: FILE, key: FILE}}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ListenItem, E> {
                Ok(ListenItem::Addr(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ListenItem, E> {
                Err(number(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ListenItem, E> {
                Err(number(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ListenItem, A::Error> {
                let de = serde::de::value::MapAccessDeserializer::new(map);
                RawListener::deserialize(de).map(|l| ListenItem::Object(Box::new(l)))
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}
