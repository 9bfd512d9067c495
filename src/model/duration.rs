//! Go-style durations (`90s`, `1h30m`) for `renew-duration` and
//! `orphanGracePeriod`, and RFC 3339 timestamps for `renewed-at`.
//!
//! Go's syntax is what Kubernetes users type everywhere, so we accept exactly
//! it rather than a Rust crate's dialect.

/// The system clock in unix seconds (0 before 1970). The one place that
/// reads it: the policy's fallback when the host has no clock, `review`'s
/// default, and serve.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Why a Go duration was refused; the text quotes what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("negative duration {0:?}")]
    Negative(String),
    #[error("invalid duration {0:?}: expected a number")]
    NoNumber(String),
    #[error("invalid duration {0:?}: missing unit")]
    NoUnit(String),
    #[error("invalid duration {input:?}: unknown unit {unit:?}")]
    UnknownUnit { input: String, unit: String },
    #[error("invalid duration {0:?}: too large")]
    TooLarge(String),
}

/// Parses a Go duration into whole seconds. Sub-second units are accepted but
/// the total is truncated, because everything downstream is second-grained.
pub fn parse_go_duration(input: &str) -> Result<u64, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s == "0" {
        return Ok(0);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative(input.to_string()));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total_nanos: u128 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let number = &s[start..i];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(DurationError::NoNumber(input.to_string()));
        }
        let unit_start = i;
        while i < bytes.len() && !(bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let unit = &s[unit_start..i];
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(DurationError::NoUnit(input.to_string())),
            other => {
                return Err(DurationError::UnknownUnit {
                    input: input.to_string(),
                    unit: other.to_string(),
                })
            }
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| DurationError::TooLarge(input.to_string()))?
        };
        let mut part = whole
            .checked_mul(nanos_per_unit)
            .ok_or_else(|| DurationError::TooLarge(input.to_string()))?;
        if !frac.is_empty() {
            let digits = &frac[..frac.len().min(18)];
            let frac_value: u128 = digits.parse().unwrap_or(0);
            part += frac_value * nanos_per_unit / 10u128.pow(digits.len() as u32);
        }
        total_nanos = total_nanos
            .checked_add(part)
            .ok_or_else(|| DurationError::TooLarge(input.to_string()))?;
    }
    let secs = total_nanos / 1_000_000_000;
    // Go's time.Duration caps at about 292 years; refuse anything beyond.
    if secs > 9_223_372_036 {
        return Err(DurationError::TooLarge(input.to_string()));
    }
    Ok(secs as u64)
}

/// Formats unix seconds as RFC 3339 UTC (`2026-11-22T07:05:49Z`).
pub fn format_rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Parses an RFC 3339 timestamp into unix seconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text).ok().map(|t| t.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("90s"), Ok(90));
        assert_eq!(parse_go_duration("12h"), Ok(43_200));
        assert_eq!(parse_go_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_go_duration("1.5h"), Ok(5_400));
        assert_eq!(parse_go_duration("10m"), Ok(600));
        assert_eq!(parse_go_duration("1500ms"), Ok(1));
        assert_eq!(parse_go_duration("0"), Ok(0));
    }

    #[test]
    fn bad_durations_are_refused_with_the_reason() {
        for bad in ["", "10", "1d", "-5m", "h", "1..5h", "99999999999999999999h", "5 m"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(
            parse_go_duration("1d"),
            Err(DurationError::UnknownUnit { unit, .. }) if unit == "d"
        ));
        assert!(parse_go_duration("1d")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
    }

    #[test]
    fn rfc3339_round_trip() {
        let t = 1_795_000_000;
        let s = format_rfc3339(t);
        assert!(s.ends_with('Z'));
        assert_eq!(parse_rfc3339(&s), Some(t));
        assert_eq!(parse_rfc3339("not a time"), None);
    }
}
