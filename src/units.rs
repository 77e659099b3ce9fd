//! Units people type: durations ("250us"), bit rates ("300Mbit") and byte sizes ("4MiB"). Used
//! by profiles, experiment files and command-line flags alike, so every place accepts the same
//! spellings and gives the same messages.

use std::time::Duration;

/// The longest duration anyone may type: a year is past any run, and keeps `Instant + d` (and
/// sums of a few such) far from overflowing.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a humantime duration, with a clear message for negative and absurdly long values.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!(
            "negative duration \"{s}\" (durations are never negative)"
        ));
    }
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let d = humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration \"{s}\": {e} (use a unit, like \"10ms\", \"250us\")")
    })?;
    at_most(d, MAX_DURATION).map_err(|e| format!("duration \"{s}\" {e}"))
}

/// `d`, when it is not longer than `max`.
pub(crate) fn at_most(d: Duration, max: Duration) -> Result<Duration, String> {
    if d > max {
        return Err(format!(
            "is longer than the {} allowed here",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// Parses a bit rate into bits per second (decimal prefixes, as tc does).
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t == "0" || t.eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    let (num, unit) = number_and_unit(t);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("invalid rate \"{s}\" (use e.g. \"300Mbit\", \"20Mbit\", \"0\")"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "bit" | "bps" => 1.0,
        "kbit" | "kbps" => 1e3,
        "mbit" | "mbps" => 1e6,
        "gbit" | "gbps" => 1e9,
        _ => {
            return Err(format!(
                "invalid rate unit in \"{s}\" (use bit, kbit, Mbit or Gbit)"
            ))
        }
    };
    Ok((num * mult).round() as u64)
}

pub(crate) fn format_rate(bps: Option<u64>) -> String {
    match bps {
        None => "0".to_string(),
        Some(b) if b % 1_000_000_000 == 0 => format!("{}Gbit", b / 1_000_000_000),
        Some(b) if b % 1_000_000 == 0 => format!("{}Mbit", b / 1_000_000),
        Some(b) if b % 1_000 == 0 => format!("{}kbit", b / 1_000),
        Some(b) => format!("{b}bit"),
    }
}

pub(crate) fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0ms".to_string()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// `"12.5Mbit"` as `("12.5", "Mbit")`: the leading number, and the unit after it.
fn number_and_unit(t: &str) -> (&str, &str) {
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// Parses a byte size: "4MiB", "64KiB", "1GiB", "16MB" (decimal), "1500" or "1500B".
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = number_and_unit(t);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("invalid size \"{s}\" (use e.g. \"4MiB\", \"128B\", \"16KiB\")"))?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" | "K" => 1024.0,
        "MiB" | "M" => 1024.0 * 1024.0,
        "GiB" | "G" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => {
            return Err(format!(
                "invalid size unit in \"{s}\" (use B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    Ok((num * mult).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("300Mbit"), Ok(300_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("1.5Mbps"), Ok(1_500_000));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("10MB").is_err());
        assert_eq!(format_rate(Some(300_000_000)), "300Mbit");
        assert_eq!(format_rate(None), "0");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("-1ms").unwrap_err().contains("negative"));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("2years")
            .unwrap_err()
            .contains("longer than"));
        assert!(parse_duration("500000000000years").is_err());
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("128B"), Ok(128));
        assert_eq!(parse_size("16MB"), Ok(16_000_000));
        assert!(parse_size("4 parsecs").is_err());
    }
}
