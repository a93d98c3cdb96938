//! Durations in the config file, written the human way.

use std::time::Duration;

use serde::Deserialize;

/// A duration written the human way: `250ms`, `30s`, `1h`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text)
            .map(HumanDuration)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {text:?} ({e}); write e.g. 250ms, 30s or 1h"
                ))
            })
    }
}
