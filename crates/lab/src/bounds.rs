//! The one range check the lab's command-line options share.

/// An option's value outside its documented range.
#[derive(Debug, thiserror::Error)]
#[error("{option} must be between {min} and {max}, not {value}")]
pub struct OutOfRange {
    pub option: &'static str,
    pub min: f64,
    pub max: f64,
    pub value: f64,
}

/// `value` of `option` within `min..=max`; NaN is out of range too (it
/// fails both comparisons).
pub fn range(option: &'static str, value: f64, min: f64, max: f64) -> Result<(), OutOfRange> {
    if value >= min && value <= max {
        Ok(())
    } else {
        Err(OutOfRange {
            option,
            min,
            max,
            value,
        })
    }
}
