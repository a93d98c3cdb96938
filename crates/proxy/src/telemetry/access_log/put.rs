//! A line's numbers, addresses and times written straight into it, without
//! `core::fmt`: at tens of thousands of lines a second, its per-value
//! dispatch and padding logic cost more than the rest of the line.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// `n` in decimal.
pub(super) fn decimal(out: &mut Vec<u8>, n: u64) {
    padded(out, n, 1);
}

/// `n` in decimal with at least `width` digits (leading zeros).
fn padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut at = digits.len();
    let mut rest = n;
    while rest > 0 || digits.len() - at < width {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    out.extend_from_slice(&digits[at..]);
}

/// `n` as 16 lower-case hex digits.
pub(super) fn hex16(out: &mut Vec<u8>, n: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    for (i, d) in digits.iter_mut().enumerate() {
        *d = DIGITS[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&digits);
}

/// `d` in milliseconds with three decimals: `1234.567`.
pub(super) fn millis(out: &mut Vec<u8>, d: Duration) {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    decimal(out, micros / 1000);
    out.push(b'.');
    padded(out, micros % 1000, 3);
}

/// `a` as `1.2.3.4:80`, or `[::1]:80`.
pub(super) fn addr(out: &mut Vec<u8>, a: SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                decimal(out, u64::from(octet));
            }
            out.push(b':');
            decimal(out, u64::from(v4.port()));
        }
        // Rare enough for the general formatter (RFC 5952's compression).
        SocketAddr::V6(_) => write!(out, "{a}").unwrap_or(()),
    }
}

/// `t` in RFC 3339 with milliseconds, in UTC: `2026-01-01T00:00:00.123Z`
/// (a time before 1970 is written as 1970's first instant, and years past
/// 9999 keep their last four digits).
pub(super) fn rfc3339_millis(out: &mut Vec<u8>, t: SystemTime) {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let of_day = secs % 86_400;
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let parts = [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, of_day / 3600),
        (14, 2, of_day / 60 % 60),
        (17, 2, of_day % 60),
        (20, 3, u64::from(since.subsec_millis())),
    ];
    for (at, width, mut n) in parts {
        for d in text[at..at + width].iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    out.extend_from_slice(&text);
}

/// Year, month and day of the `days`-th day after 1970-01-01, in the
/// proleptic Gregorian calendar (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_match_the_general_formatter() {
        for n in [0, 7, 10, 99, 100, 65_535, 1_767_225_600_123, u64::MAX] {
            assert_eq!(with(|o| decimal(o, n)), n.to_string());
            assert_eq!(with(|o| hex16(o, n)), format!("{n:016x}"));
        }
        assert_eq!(with(|o| millis(o, Duration::from_micros(5))), "0.005");
        assert_eq!(
            with(|o| millis(o, Duration::from_micros(1_234_567))),
            "1234.567"
        );
        assert_eq!(with(|o| millis(o, Duration::ZERO)), "0.000");
    }

    #[test]
    fn addresses_match_the_general_formatter() {
        for a in [
            "0.0.0.0:0",
            "127.0.0.1:50000",
            "255.255.255.255:65535",
            "[::1]:8080",
            "[2001:db8::1]:443",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(with(|o| addr(o, a)), a.to_string());
        }
    }

    #[test]
    fn times_match_humantime_across_leap_years_and_centuries() {
        let mut secs = 0u64;
        // Every 9,999,991 s (about 116 days) from 1970 to past 2100, and
        // the days around 2000-02-29 and 2100-03-01.
        let mut instants: Vec<u64> = Vec::new();
        while secs < 4_200_000_000 {
            instants.push(secs);
            secs += 9_999_991;
        }
        instants.extend([
            951_782_399,
            951_782_400,
            951_868_800,
            4_107_542_399,
            4_107_542_400,
        ]);
        for s in instants {
            for millis in [0, 1, 999] {
                let t = SystemTime::UNIX_EPOCH + Duration::from_millis(s * 1000 + millis);
                let want = humantime::format_rfc3339_millis(t).to_string();
                assert_eq!(with(|o| rfc3339_millis(o, t)), want);
            }
        }
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(
            with(|o| rfc3339_millis(o, before)),
            "1970-01-01T00:00:00.000Z"
        );
    }
}
