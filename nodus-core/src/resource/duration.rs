//! Durations written as text: `"90s"`, `"10m"`, `"1h30m"`, or plain seconds (`"3600"`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A whole number of seconds, written with `h`, `m` and `s` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationSpec {
    seconds: u64,
}

impl DurationSpec {
    /// A duration of whole seconds.
    pub const fn from_secs(seconds: u64) -> Self {
        DurationSpec { seconds }
    }

    /// The number of seconds.
    pub const fn as_secs(self) -> u64 {
        self.seconds
    }

    /// As a standard duration.
    pub const fn to_std(self) -> Duration {
        Duration::from_secs(self.seconds)
    }
}

/// Why text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a duration is a whole number of hours, minutes and seconds such as \"90s\", \"10m\" or \"1h30m\""
)]
pub struct ParseDurationError;

impl FromStr for DurationSpec {
    type Err = ParseDurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(ParseDurationError);
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse()
                .map(DurationSpec::from_secs)
                .map_err(|_| ParseDurationError);
        }
        let mut seconds: u64 = 0;
        let mut number: Option<u64> = None;
        let mut last_unit = u64::MAX;
        for byte in text.bytes() {
            if byte.is_ascii_digit() {
                let digit = u64::from(byte - b'0');
                number = Some(
                    number
                        .unwrap_or(0)
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(digit))
                        .ok_or(ParseDurationError)?,
                );
                continue;
            }
            let unit = match byte {
                b'h' => 3600,
                b'm' => 60,
                b's' => 1,
                _ => return Err(ParseDurationError),
            };
            // Units appear at most once, largest first.
            if unit >= last_unit {
                return Err(ParseDurationError);
            }
            last_unit = unit;
            let count = number.take().ok_or(ParseDurationError)?;
            seconds = count
                .checked_mul(unit)
                .and_then(|part| seconds.checked_add(part))
                .ok_or(ParseDurationError)?;
        }
        if number.is_some() {
            return Err(ParseDurationError);
        }
        Ok(DurationSpec::from_secs(seconds))
    }
}

impl fmt::Display for DurationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (hours, minutes, seconds) = (
            self.seconds / 3600,
            self.seconds / 60 % 60,
            self.seconds % 60,
        );
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        if seconds > 0 || self.seconds == 0 {
            write!(f, "{seconds}s")?;
        }
        Ok(())
    }
}

impl Serialize for DurationSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Seconds(u64),
            Text(String),
        }
        match Repr::deserialize(deserializer)? {
            Repr::Seconds(seconds) => Ok(DurationSpec::from_secs(seconds)),
            Repr::Text(text) => text
                .parse()
                .map_err(|e| serde::de::Error::custom(format!("{e}, got {text:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_prints_them_back() {
        for (text, seconds, printed) in [
            ("90s", 90, "1m30s"),
            ("10m", 600, "10m"),
            ("1h30m", 5400, "1h30m"),
            ("3600", 3600, "1h"),
            ("0s", 0, "0s"),
            ("2h0m5s", 7205, "2h5s"),
        ] {
            let parsed: DurationSpec = text.parse().expect(text);
            assert_eq!(parsed.as_secs(), seconds, "{text}");
            assert_eq!(parsed.to_string(), printed, "{text}");
        }
    }

    #[test]
    fn refuses_malformed_durations() {
        for text in ["", "m", "10x", "1m1h", "1h1h", "-5s", "1.5h", "10m5"] {
            assert_eq!(
                text.parse::<DurationSpec>(),
                Err(ParseDurationError),
                "{text:?}"
            );
        }
    }
}
