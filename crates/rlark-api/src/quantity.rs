//! Kubernetes resource quantities (`"500m"`, `"4Gi"`, `"1e3"`), parsed exactly.
//!
//! Syntax (Kubernetes' `resource.Quantity`):
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <sign><number>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <sign>            ::= "+" | "-"
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>
//! ```
//!
//! A parsed quantity is a [`QuantityValue`]: an exact decimal `mantissa × 10^exponent`, so
//! sums of requests (`"100m"` ten times) are exact, unlike with `f64`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Most significant decimal digits a [`QuantityValue`] keeps (an `i128` holds 38 for sure).
pub const MAX_DIGITS: u32 = 38;

/// Kubernetes' message for a string that is not a quantity at all.
pub const FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the form number + suffix (Kubernetes' `ErrFormatWrong`).
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    /// Shaped like a quantity but the suffix is unknown (Kubernetes' `ErrSuffix`).
    #[error("unable to parse quantity's suffix")]
    Suffix,
    /// The number has more significant digits (or is larger) than rlark represents exactly.
    #[error("quantity is too large or too precise (at most 38 significant digits)")]
    Range,
}

/// The exact value of a quantity: `mantissa × 10^exponent`.
///
/// Always normalized (no trailing zero in the mantissa; zero is `0 × 10^0`), so `==` is
/// equality of values, and `Ord` orders by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantityValue {
    mantissa: i128,
    exponent: i32,
}

fn digit_count(mut v: u128) -> u32 {
    let mut n = 0;
    while v > 0 {
        v /= 10;
        n += 1;
    }
    n
}

impl QuantityValue {
    /// Zero.
    pub const ZERO: QuantityValue = QuantityValue {
        mantissa: 0,
        exponent: 0,
    };

    /// `mantissa × 10^exponent`, normalized. `None` when the exponent overflows while
    /// normalizing.
    pub fn new(mantissa: i128, exponent: i32) -> Option<Self> {
        if mantissa == 0 {
            return Some(Self::ZERO);
        }
        let (mut m, mut e) = (mantissa, exponent);
        while m % 10 == 0 {
            m /= 10;
            e = e.checked_add(1)?;
        }
        Some(Self {
            mantissa: m,
            exponent: e,
        })
    }

    /// The integer `m` of `m × 10^e`.
    pub fn mantissa(&self) -> i128 {
        self.mantissa
    }

    /// The power of ten `e` of `m × 10^e`.
    pub fn exponent(&self) -> i32 {
        self.exponent
    }

    /// True for values below zero.
    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// True for zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Nearest `f64` (lossy; for display and ratios, not for sums).
    pub fn to_f64(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exponent)
    }

    /// The value in units of `10^scale`, rounded up (towards +∞), like Kubernetes'
    /// `ScaledValue`. `None` if it does not fit an `i128`.
    pub fn ceil_scaled(&self, scale: i32) -> Option<i128> {
        let shift = i64::from(self.exponent) - i64::from(scale);
        if shift >= 0 {
            let p = 10i128.checked_pow(u32::try_from(shift).ok()?)?;
            self.mantissa.checked_mul(p)
        } else {
            let down = u32::try_from(-shift).ok()?;
            match 10i128.checked_pow(down) {
                Some(d) => {
                    let q = self.mantissa.div_euclid(d);
                    Some(if self.mantissa.rem_euclid(d) != 0 {
                        q + 1
                    } else {
                        q
                    })
                }
                // |mantissa| <= i128::MAX < 10^39 <= d: the quotient is in (-1, 1).
                None => Some(i128::from(self.mantissa > 0)),
            }
        }
    }

    /// The value in thousandths, rounded up (Kubernetes' `MilliValue`): `"100m"` → 100,
    /// `"2"` → 2000. `None` if it does not fit an `i128`.
    pub fn milli_value(&self) -> Option<i128> {
        self.ceil_scaled(-3)
    }

    /// The value in units, rounded up (Kubernetes' `Value`): `"1Ki"` → 1024, `"100m"` → 1.
    /// `None` if it does not fit an `i128`.
    pub fn value(&self) -> Option<i128> {
        self.ceil_scaled(0)
    }

    /// Exact sum; `None` on overflow.
    pub fn checked_add(self, other: Self) -> Option<Self> {
        if self.is_zero() {
            return Some(other);
        }
        if other.is_zero() {
            return Some(self);
        }
        let e = self.exponent.min(other.exponent);
        let a = self
            .mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(self.exponent - e).ok()?)?)?;
        let b = other
            .mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(other.exponent - e).ok()?)?)?;
        Self::new(a.checked_add(b)?, e)
    }

    /// Exact difference; `None` on overflow.
    pub fn checked_sub(self, other: Self) -> Option<Self> {
        self.checked_add(Self {
            mantissa: other.mantissa.checked_neg()?,
            exponent: other.exponent,
        })
    }
}

/// Compares two non-zero magnitudes `a × 10^ea` and `b × 10^eb`.
fn cmp_magnitude(a: u128, ea: i32, b: u128, eb: i32) -> Ordering {
    let order_a = i64::from(digit_count(a)) + i64::from(ea);
    let order_b = i64::from(digit_count(b)) + i64::from(eb);
    if order_a != order_b {
        return order_a.cmp(&order_b);
    }
    // Same order of magnitude, so |ea - eb| < 39 digits: align the larger exponent down.
    let scale = |m: u128, shift: i32| {
        u32::try_from(shift)
            .ok()
            .and_then(|s| 10u128.checked_pow(s))
            .and_then(|p| m.checked_mul(p))
    };
    if ea >= eb {
        match scale(a, ea - eb) {
            Some(a) => a.cmp(&b),
            None => Ordering::Greater,
        }
    } else {
        match scale(b, eb - ea) {
            Some(b) => a.cmp(&b),
            None => Ordering::Less,
        }
    }
}

impl Ord for QuantityValue {
    fn cmp(&self, other: &Self) -> Ordering {
        let (sa, sb) = (self.mantissa.signum(), other.mantissa.signum());
        if sa != sb || sa == 0 {
            return sa.cmp(&sb);
        }
        let by_magnitude = cmp_magnitude(
            self.mantissa.unsigned_abs(),
            self.exponent,
            other.mantissa.unsigned_abs(),
            other.exponent,
        );
        if sa > 0 {
            by_magnitude
        } else {
            by_magnitude.reverse()
        }
    }
}

impl PartialOrd for QuantityValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for QuantityValue {
    /// A plain decimal (`"0.1"`, `"1536"`), or `<m>e<exp>` for extreme exponents. The output
    /// parses back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, e) = (self.mantissa, self.exponent);
        if (0..=18).contains(&e) {
            write!(f, "{m}{}", "0".repeat(e.unsigned_abs() as usize))
        } else if (-40..0).contains(&e) {
            let digits = m.unsigned_abs().to_string();
            let frac = e.unsigned_abs() as usize;
            let sign = if m < 0 { "-" } else { "" };
            if digits.len() > frac {
                let (int, dec) = digits.split_at(digits.len() - frac);
                write!(f, "{sign}{int}.{dec}")
            } else {
                write!(f, "{sign}0.{}{digits}", "0".repeat(frac - digits.len()))
            }
        } else {
            write!(f, "{m}e{e}")
        }
    }
}

impl FromStr for QuantityValue {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
    }
}

/// Power of ten (decimal) or of two (binary) that a suffix stands for.
enum Suffix {
    Decimal(i32),
    Binary(u32),
}

fn parse_suffix(suffix: &str) -> Result<Suffix, QuantityError> {
    Ok(match suffix {
        "" => Suffix::Decimal(0),
        "n" => Suffix::Decimal(-9),
        "u" => Suffix::Decimal(-6),
        "m" => Suffix::Decimal(-3),
        "k" => Suffix::Decimal(3),
        "M" => Suffix::Decimal(6),
        "G" => Suffix::Decimal(9),
        "T" => Suffix::Decimal(12),
        "P" => Suffix::Decimal(15),
        "E" => Suffix::Decimal(18),
        "Ki" => Suffix::Binary(10),
        "Mi" => Suffix::Binary(20),
        "Gi" => Suffix::Binary(30),
        "Ti" => Suffix::Binary(40),
        "Pi" => Suffix::Binary(50),
        "Ei" => Suffix::Binary(60),
        _ => {
            let exp = suffix
                .strip_prefix(['e', 'E'])
                .filter(|rest| {
                    let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|rest| rest.parse::<i32>().ok());
            match exp {
                Some(e) => Suffix::Decimal(e),
                None => {
                    // Kubernetes tells a malformed string from a well-formed unknown suffix.
                    let body = suffix.trim_start_matches(|c| "eEinumkKMGTP".contains(c));
                    let body = body.strip_prefix(['+', '-']).unwrap_or(body);
                    if body.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(QuantityError::Suffix);
                    }
                    return Err(QuantityError::Format);
                }
            }
        }
    })
}

/// Parses a Kubernetes quantity string exactly.
///
/// Contract: accepts exactly the grammar in the module docs (sign, digits with an optional
/// `.`, at least one digit, then one suffix); returns the exact value, or
/// [`QuantityError::Format`] / [`QuantityError::Suffix`] (Kubernetes' messages), or
/// [`QuantityError::Range`] past 38 significant digits. Negative values parse; callers that
/// need non-negative amounts check [`QuantityValue::is_negative`].
pub fn parse_quantity(s: &str) -> Result<QuantityValue, QuantityError> {
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, after_int) = rest.split_at(int_len);
    let (frac_part, suffix) = match after_int.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            after_dot.split_at(frac_len)
        }
        None => ("", after_int),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(QuantityError::Format);
    }
    let suffix = parse_suffix(suffix)?;

    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    let trailing_zeros = digits.len() - trimmed.len();
    if trimmed.len() > MAX_DIGITS as usize {
        return Err(QuantityError::Range);
    }
    let magnitude: i128 = if trimmed.is_empty() {
        0
    } else {
        trimmed.parse().map_err(|_| QuantityError::Format)?
    };
    let mut mantissa = if negative { -magnitude } else { magnitude };
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| QuantityError::Range)?;
    let zeros = i32::try_from(trailing_zeros).map_err(|_| QuantityError::Range)?;
    let mut exponent = zeros.checked_sub(frac_len).ok_or(QuantityError::Range)?;
    match suffix {
        Suffix::Decimal(e) => {
            exponent = exponent.checked_add(e).ok_or(QuantityError::Range)?;
        }
        Suffix::Binary(bits) => {
            mantissa = mantissa
                .checked_mul(1i128 << bits)
                .ok_or(QuantityError::Range)?;
        }
    }
    let value = QuantityValue::new(mantissa, exponent).ok_or(QuantityError::Range)?;
    if digit_count(value.mantissa.unsigned_abs()) > MAX_DIGITS {
        return Err(QuantityError::Range);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> QuantityValue {
        parse_quantity(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn decimal_si() {
        assert_eq!(q("100m").milli_value(), Some(100));
        assert_eq!(q("1").milli_value(), Some(1000));
        assert_eq!(q("1.5").milli_value(), Some(1500));
        assert_eq!(q("2k").value(), Some(2000));
        assert_eq!(q("3M").value(), Some(3_000_000));
        assert_eq!(q("1G").value(), Some(1_000_000_000));
        assert_eq!(q("1T").value(), Some(1_000_000_000_000));
        assert_eq!(q("1P").value(), Some(10i128.pow(15)));
        assert_eq!(q("1E").value(), Some(10i128.pow(18)));
        assert_eq!(q("5n").ceil_scaled(-9), Some(5));
        assert_eq!(q("7u").ceil_scaled(-6), Some(7));
        assert_eq!(q("0").value(), Some(0));
        assert_eq!(q("000.000"), QuantityValue::ZERO);
    }

    #[test]
    fn binary_si() {
        assert_eq!(q("1Ki").value(), Some(1024));
        assert_eq!(q("1Mi").value(), Some(1 << 20));
        assert_eq!(q("4Gi").value(), Some(4 << 30));
        assert_eq!(q("1.5Gi").value(), Some(1_610_612_736));
        assert_eq!(q("1Ti").value(), Some(1 << 40));
        assert_eq!(q("1Pi").value(), Some(1 << 50));
        assert_eq!(q("1Ei").value(), Some(1 << 60));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
    }

    #[test]
    fn exponents_and_signs() {
        assert_eq!(q("1e3").value(), Some(1000));
        assert_eq!(q("1E3").value(), Some(1000));
        assert_eq!(q("1e+3"), q("1k"));
        assert_eq!(q("12e-1").milli_value(), Some(1200));
        assert_eq!(q("+5").value(), Some(5));
        assert!(q("-5").is_negative());
        assert_eq!(q("-1.5").milli_value(), Some(-1500));
        assert_eq!(q(".5").milli_value(), Some(500));
        assert_eq!(q("5.").value(), Some(5));
        assert_eq!(q("1.G").value(), Some(1_000_000_000));
    }

    #[test]
    fn rounding_is_up_like_kubernetes() {
        assert_eq!(q("0.1m").milli_value(), Some(1));
        assert_eq!(q("100m").value(), Some(1));
        assert_eq!(q("-100m").value(), Some(0));
        assert_eq!(q("1e-100").value(), Some(1));
        assert_eq!(q("-1e-100").value(), Some(0));
        assert_eq!(q("1e100").value(), None);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "", "-", "+", ".", "abc", "1 ", " 1", "1..2", "1.2.3", "1Kii", "--1", "1e",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_quantity("abc"), Err(QuantityError::Format));
        assert_eq!(parse_quantity("1x"), Err(QuantityError::Format));
        assert_eq!(parse_quantity("1Q"), Err(QuantityError::Format));
        assert_eq!(parse_quantity("1KK"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("1mi"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity(&"9".repeat(39)), Err(QuantityError::Range));
        assert!(parse_quantity(&format!("{}Ei", "9".repeat(30))).is_err());
        assert_eq!(QuantityError::Format.to_string(), FORMAT_ERROR);
    }

    #[test]
    fn sums_are_exact() {
        let tenth = q("100m");
        let mut sum = QuantityValue::ZERO;
        for _ in 0..10 {
            sum = sum.checked_add(tenth).unwrap();
        }
        assert_eq!(sum, q("1"));
        assert_eq!(q("1Gi").checked_add(q("512Mi")), Some(q("1.5Gi")));
        assert_eq!(q("1").checked_sub(q("250m")), Some(q("750m")));
        assert_eq!(q("1").checked_sub(q("1")), Some(QuantityValue::ZERO));
    }

    #[test]
    fn ordering() {
        assert!(q("100m") < q("1"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("-1") < q("0"));
        assert!(q("-2") < q("-1"));
        assert!(q("1e100") > q("99999999999999999999999999999999999999"));
        assert!(q("1e-100") < q("1n"));
        assert_eq!(q("1000m").cmp(&q("1")), Ordering::Equal);
        assert!(q("12") > q("9"));
        assert!(q("0.12") < q("0.9"));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "0",
            "1",
            "100m",
            "1.5Gi",
            "-0.25",
            "1e100",
            "1e-100",
            "12345678n",
            "7E",
        ] {
            let v = q(s);
            assert_eq!(q(&v.to_string()), v, "{s} -> {v}");
        }
        assert_eq!(q("100m").to_string(), "0.1");
        assert_eq!(q("2k").to_string(), "2000");
        assert_eq!(q("-1.5").to_string(), "-1.5");
    }

    #[test]
    fn to_f64() {
        assert!((q("100m").to_f64() - 0.1).abs() < 1e-12);
        assert!((q("2Ki").to_f64() - 2048.0).abs() < 1e-9);
    }
}
