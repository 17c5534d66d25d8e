//! Durations on the command line, as kubectl writes them: `30s`, `8m`, `1h30m`, `500ms`; a
//! bare number is seconds.

use std::time::Duration;

/// Parses a duration, or says what is wrong.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a duration (such as 30s, 8m, 1h30m)");
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// A duration as the user would write it (`8m`, `1h30m`, `45s`, `250ms`).
pub fn display(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds == 0 && duration.as_millis() > 0 {
        return format!("{}ms", duration.as_millis());
    }
    let (h, m, s) = (seconds / 3600, (seconds % 3600) / 60, seconds % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_durations_parse() {
        let cases = [
            ("8m", 480_000),
            ("30s", 30_000),
            ("1h30m", 5_400_000),
            ("500ms", 500),
            ("90", 90_000),
            ("0", 0),
            ("1m30s", 90_000),
        ];
        for (text, millis) in cases {
            assert_eq!(parse(text), Ok(Duration::from_millis(millis)), "{text}");
        }
        for bad in ["", "m", "8x", "1.5m", "-3s", "8m!"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_display_as_written() {
        assert_eq!(display(Duration::from_secs(480)), "8m");
        assert_eq!(display(Duration::from_secs(5400)), "1h30m");
        assert_eq!(display(Duration::from_secs(45)), "45s");
        assert_eq!(display(Duration::from_millis(250)), "250ms");
        assert_eq!(display(Duration::ZERO), "0s");
    }
}
