//! Byte sizes as people write them: `64MiB`, `4GiB`, `1.5G`, `4096`.
//!
//! Binary (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`, `T`) and
//! decimal (`kB`, `MB`, `GB`, `TB`) units are accepted; plain numbers are bytes.

use std::fmt;

/// A size that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (examples: 4096, 64MiB, 4GiB, 1.5G)")]
pub struct SizeError {
    input: String,
    reason: &'static str,
}

/// Parses a byte size.
///
/// # Errors
/// [`SizeError`] for an empty string, an unknown unit, a negative or
/// fractional byte count, or a value above `u64::MAX`.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(err("missing number"));
    }
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "M" | "MiB" | "Mi" => 1 << 20,
        "G" | "GiB" | "Gi" => 1 << 30,
        "T" | "TiB" | "Ti" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(err("unknown unit")),
    };
    if let Ok(whole) = num.parse::<u64>() {
        return whole.checked_mul(mult).ok_or_else(|| err("too large"));
    }
    let value: f64 = num.parse().map_err(|_| err("not a number"))?;
    let bytes = value * mult as f64;
    if bytes.fract() != 0.0 {
        return Err(err("not a whole number of bytes"));
    }
    if bytes >= u64::MAX as f64 {
        return Err(err("too large"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Formats a byte count with a binary unit, e.g. `64.0 MiB`.
#[derive(Debug, Clone, Copy)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

/// Rounds `len` up to a multiple of `page` (a page of 0 counts as 1).
pub fn round_up(len: u64, page: u64) -> u64 {
    len.div_ceil(page.max(1)) * page.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size(" 8 KiB "), Ok(8192));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("0.3B").is_err());
        assert!(parse_size("99999999999T").is_err());
        let msg = parse_size("12XB").unwrap_err().to_string();
        assert!(msg.contains("unknown unit"), "{msg}");
    }

    #[test]
    fn formats_human() {
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(64 << 20).to_string(), "64.0 MiB");
        assert_eq!(HumanBytes(3 << 29).to_string(), "1.5 GiB");
    }
}
