//! Exact money: US dollars as an integer count of nano-dollars, written as decimal strings.
//!
//! No floating point is used anywhere in money. Amounts are never negative; subtraction
//! that would go below zero is an explicit [`Usd::checked_sub`] / [`Usd::saturating_sub`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nano-dollars per dollar.
const NANOS_PER_USD: u64 = 1_000_000_000;
/// Digits after the decimal point that an amount can carry.
const MAX_FRACTION_DIGITS: usize = 9;

/// An exact, non-negative amount of US dollars (resolution: one nano-dollar).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd {
    nanos: u64,
}

impl Usd {
    /// Zero dollars.
    pub const ZERO: Usd = Usd { nanos: 0 };
    /// The largest representable amount.
    pub const MAX: Usd = Usd { nanos: u64::MAX };

    /// An amount from a count of nano-dollars.
    pub const fn from_nanos(nanos: u64) -> Self {
        Usd { nanos }
    }

    /// An amount from whole cents (`from_cents(50)` is `"0.50"`).
    pub const fn from_cents(cents: u64) -> Self {
        Usd {
            nanos: cents * (NANOS_PER_USD / 100),
        }
    }

    /// The amount in nano-dollars.
    pub const fn nanos(self) -> u64 {
        self.nanos
    }

    /// Whether the amount is zero.
    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// `self + other`, or `None` on overflow.
    pub fn checked_add(self, other: Usd) -> Option<Usd> {
        self.nanos.checked_add(other.nanos).map(Usd::from_nanos)
    }

    /// `self - other`, or `None` when `other` is larger.
    pub fn checked_sub(self, other: Usd) -> Option<Usd> {
        self.nanos.checked_sub(other.nanos).map(Usd::from_nanos)
    }

    /// `self + other`, capped at [`Usd::MAX`].
    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd::from_nanos(self.nanos.saturating_add(other.nanos))
    }

    /// `self - other`, floored at zero.
    pub fn saturating_sub(self, other: Usd) -> Usd {
        Usd::from_nanos(self.nanos.saturating_sub(other.nanos))
    }
}

impl std::iter::Sum for Usd {
    fn sum<I: Iterator<Item = Usd>>(iter: I) -> Usd {
        iter.fold(Usd::ZERO, Usd::saturating_add)
    }
}

/// Why a decimal string is not an amount of money.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseUsdError {
    /// The string is empty.
    #[error("an amount of money must not be empty")]
    Empty,
    /// The string has a sign; amounts are non-negative and unsigned.
    #[error("an amount of money is written without a sign, like \"0.50\"")]
    Signed,
    /// A character other than digits and one decimal point.
    #[error("an amount of money is a decimal number like \"0.50\"")]
    NotDecimal,
    /// More than nine digits after the decimal point.
    #[error("an amount of money has at most 9 digits after the decimal point")]
    TooPrecise,
    /// Larger than the largest representable amount.
    #[error("an amount of money must be below 18446744073.709551615")]
    TooLarge,
}

impl FromStr for Usd {
    type Err = ParseUsdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(ParseUsdError::Empty);
        }
        if text.starts_with(['-', '+']) {
            return Err(ParseUsdError::Signed);
        }
        let (whole, fraction) = match text.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (text, ""),
        };
        let digits_only = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty())
            || !digits_only(whole)
            || !digits_only(fraction)
        {
            return Err(ParseUsdError::NotDecimal);
        }
        if fraction.len() > MAX_FRACTION_DIGITS {
            return Err(ParseUsdError::TooPrecise);
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| ParseUsdError::TooLarge)?
        };
        let mut fraction_nanos: u64 = 0;
        for (position, digit) in fraction.bytes().enumerate() {
            let scale = 10u64.pow((MAX_FRACTION_DIGITS - 1 - position) as u32);
            fraction_nanos += u64::from(digit - b'0') * scale;
        }
        whole
            .checked_mul(NANOS_PER_USD)
            .and_then(|nanos| nanos.checked_add(fraction_nanos))
            .map(Usd::from_nanos)
            .ok_or(ParseUsdError::TooLarge)
    }
}

impl fmt::Display for Usd {
    /// At least two decimals ("0.50", "1.00"), more only when the amount needs them
    /// ("0.000123").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.nanos / NANOS_PER_USD;
        let fraction = self.nanos % NANOS_PER_USD;
        let mut digits = format!("{fraction:09}");
        while digits.len() > 2 && digits.ends_with('0') {
            digits.pop();
        }
        write!(f, "{whole}.{digits}")
    }
}

impl Serialize for Usd {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map_err(|e: ParseUsdError| serde::de::Error::custom(format!("{e}, got {text:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_decimal_strings() {
        for (text, nanos, printed) in [
            ("0.50", 500_000_000, "0.50"),
            ("1", 1_000_000_000, "1.00"),
            ("1.", 1_000_000_000, "1.00"),
            (".5", 500_000_000, "0.50"),
            ("0.000000001", 1, "0.000000001"),
            ("12.3456", 12_345_600_000, "12.3456"),
            ("0", 0, "0.00"),
        ] {
            let usd: Usd = text.parse().expect(text);
            assert_eq!(usd.nanos(), nanos, "{text}");
            assert_eq!(usd.to_string(), printed, "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_money() {
        assert_eq!("".parse::<Usd>(), Err(ParseUsdError::Empty));
        assert_eq!("-1".parse::<Usd>(), Err(ParseUsdError::Signed));
        assert_eq!("+1".parse::<Usd>(), Err(ParseUsdError::Signed));
        assert_eq!("1e3".parse::<Usd>(), Err(ParseUsdError::NotDecimal));
        assert_eq!(".".parse::<Usd>(), Err(ParseUsdError::NotDecimal));
        assert_eq!("1.2.3".parse::<Usd>(), Err(ParseUsdError::NotDecimal));
        assert_eq!(" 1".parse::<Usd>(), Err(ParseUsdError::NotDecimal));
        assert_eq!(
            "0.0000000001".parse::<Usd>(),
            Err(ParseUsdError::TooPrecise)
        );
        assert_eq!(
            "99999999999999".parse::<Usd>(),
            Err(ParseUsdError::TooLarge)
        );
    }

    #[test]
    fn json_form_is_a_string() {
        let usd = Usd::from_cents(60);
        assert_eq!(serde_json::to_string(&usd).expect("serialize"), "\"0.60\"");
        let back: Usd = serde_json::from_str("\"0.60\"").expect("deserialize");
        assert_eq!(back, usd);
        let err = serde_json::from_str::<Usd>("0.6").expect_err("a JSON number is refused");
        assert!(err.to_string().contains("string"), "{err}");
    }

    proptest! {
        #[test]
        fn display_round_trips(nanos in any::<u64>()) {
            let usd = Usd::from_nanos(nanos);
            prop_assert_eq!(usd.to_string().parse::<Usd>(), Ok(usd));
        }

        #[test]
        fn addition_is_exact(a in 0u64..u64::MAX / 2, b in 0u64..u64::MAX / 2) {
            let sum = Usd::from_nanos(a).checked_add(Usd::from_nanos(b));
            prop_assert_eq!(sum, Some(Usd::from_nanos(a + b)));
            prop_assert_eq!(sum.and_then(|s| s.checked_sub(Usd::from_nanos(b))), Some(Usd::from_nanos(a)));
        }
    }
}
