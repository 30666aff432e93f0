//! The CLI's size and duration arguments: `1g`, `512m`, `30s`, `10m`, or plain numbers in the
//! unit each flag documents (so scripts written before units existed keep working).

/// A size in MiB: `512m`, `1g`, `1.5G`, `2GiB`, `1t`, `1024k`, or a plain number of MiB.
pub fn parse_mib(text: &str) -> Result<u64, String> {
    parse_size(text, 1024 * 1024)
}

/// A size in GiB: `10g`, `1t`, `512m` (rounded up to whole GiB), or a plain number of GiB.
pub fn parse_gib(text: &str) -> Result<u64, String> {
    parse_size(text, 1024 * 1024 * 1024)
}

/// A size rounded up to whole multiples of `unit` bytes; a plain number counts in `unit`.
fn parse_size(text: &str, unit: u64) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a size: use a number and a unit (k, m, g or t), such as 512m or 1g");
    let lower = text.trim().to_ascii_lowercase();
    let t = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (number, scale) = match t.char_indices().last() {
        Some((i, 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'm')) => (&t[..i], 1 << 20),
        Some((i, 'g')) => (&t[..i], 1 << 30),
        Some((i, 't')) => (&t[..i], 1 << 40),
        Some((_, c)) if c.is_ascii_digit() && t.len() == lower.len() => (t, unit),
        _ => return Err(bad()),
    };
    let bytes = scaled(number, scale).ok_or_else(bad)?;
    let units = (bytes / unit as f64).ceil();
    if units > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(units as u64)
}

/// A duration in whole seconds: `90s`, `10m`, `2h`, `7d`, or a plain number of seconds.
pub fn parse_secs(text: &str) -> Result<u64, String> {
    parse_millis(text).map(|ms| ms.div_ceil(1000))
}

/// A duration in milliseconds: `500ms`, `1.5s`, `10m`, `2h`, `1d`, or a plain number of
/// seconds (fractions allowed: `2.5`).
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not a duration: use a number and a unit (ms, s, m, h or d), such as 30s or 10m");
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = scaled(number, scale).ok_or_else(bad)?;
    if ms > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(ms.ceil() as u64)
}

/// `number × scale` for a non-negative decimal `number`.
fn scaled(number: &str, scale: u64) -> Option<f64> {
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let n: f64 = number.parse().ok()?;
    n.is_finite().then_some(n * scale as f64)
}

/// A duration as a human reads it in a table: `3m ago`, `in 2h`, `just now`.
pub fn relative(ms: i64, now_ms: i64) -> String {
    let delta = now_ms - ms;
    let secs = delta.unsigned_abs() / 1000;
    if secs < 5 {
        return "just now".into();
    }
    let amount = match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    if delta >= 0 { format!("{amount} ago") } else { format!("in {amount}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units_and_plain_numbers_keep_their_unit() {
        assert_eq!(parse_mib("512"), Ok(512));
        assert_eq!(parse_mib("512m"), Ok(512));
        assert_eq!(parse_mib("512M"), Ok(512));
        assert_eq!(parse_mib("1g"), Ok(1024));
        assert_eq!(parse_mib("1GiB"), Ok(1024));
        assert_eq!(parse_mib("1.5G"), Ok(1536));
        assert_eq!(parse_mib("10GB"), Ok(10240));
        assert_eq!(parse_mib("1t"), Ok(1 << 20));
        assert_eq!(parse_mib("1k"), Ok(1), "rounds up");
        assert_eq!(parse_gib("10"), Ok(10));
        assert_eq!(parse_gib("512m"), Ok(1), "rounds up");
        assert_eq!(parse_gib("2t"), Ok(2048));
        for bad in ["", "g", "1x", "-1g", "1..2g", "1 g", "ib", "1e3"] {
            assert!(parse_mib(bad).is_err(), "{bad:?}");
        }
        assert!(parse_mib("99999999999999999999t").unwrap_err().contains("too large"));
    }

    #[test]
    fn durations_take_units_and_plain_numbers_are_seconds() {
        assert_eq!(parse_millis("30"), Ok(30_000));
        assert_eq!(parse_millis("2.5"), Ok(2_500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("10m"), Ok(600_000));
        assert_eq!(parse_millis("1.5h"), Ok(5_400_000));
        assert_eq!(parse_secs("7d"), Ok(604_800));
        assert_eq!(parse_secs("0s"), Ok(0));
        assert_eq!(parse_secs("1ms"), Ok(1), "rounds up");
        for bad in ["", "s", "10x", "-5s", "1.2.3s", "10 m", "5M"] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relative_times_read_like_a_human_wrote_them() {
        let now = 1_000_000_000;
        assert_eq!(relative(now - 1000, now), "just now");
        assert_eq!(relative(now - 42_000, now), "42s ago");
        assert_eq!(relative(now - 180_000, now), "3m ago");
        assert_eq!(relative(now - 7_200_000, now), "2h ago");
        assert_eq!(relative(now - 3 * 86_400_000, now), "3d ago");
        assert_eq!(relative(now + 7_200_000, now), "in 2h");
    }
}
