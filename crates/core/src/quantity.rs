//! Kubernetes resource quantities (`resource.Quantity`): parsing, canonical formatting and
//! rounding, as `k8s.io/apimachinery/pkg/api/resource` does them.
//!
//! A quantity is held as an exact integer number of nano-units in an `i128`: `"1n"` is 1,
//! `"1"` is 1 000 000 000, and `"1Ei"` still fits with room to add up a cluster. Kubernetes keeps
//! nothing finer than a nano either: finer input is rounded up, away from zero.
//!
//! Deliberate differences from upstream, all on input the API server never sends back:
//! - a number without any digit (`"-"`, `"+"`, `"."`, `"Ki"`, `"m"`) is rejected; upstream
//!   reads it as zero and the API server re-serializes it as `"0"`;
//! - values beyond the `i128` nano range (about 1.7e29 units) are an error, not a big decimal;
//! - an exponent beyond 32 bits is applied in full (upstream silently truncates it), so the
//!   value is out of range, or rounds up to `1n` for a negative exponent;
//! - canonical DecimalSI above `E` (1e18) keeps the `E` suffix with a larger mantissa, where
//!   upstream prints the mantissa with no suffix at all (a wrong value).
//!
//! Upstream also re-emits a parsed string verbatim in a few "already canonical" cases (so
//! `"1.500"` or `"+1"` serialize unchanged); [`format_quantity`] always computes the canonical
//! form, which parses back to the same value.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Nano-units in one unit.
pub const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// Nano-units in one milli-unit.
pub const NANOS_PER_MILLI: i128 = 1_000_000;

/// Upstream caps BinarySI quantities at 2^63-1 units (see `maxAllowed` in quantity.go).
const BINARY_SI_CAP_NANOS: u128 = (i64::MAX as u128) * (NANOS_PER_UNIT as u128);

/// Decimal SI suffixes by power of ten, from nano to exa.
const DECIMAL_SUFFIXES: [(i32, &str); 10] = [
    (-9, "n"),
    (-6, "u"),
    (-3, "m"),
    (0, ""),
    (3, "k"),
    (6, "M"),
    (9, "G"),
    (12, "T"),
    (15, "P"),
    (18, "E"),
];

/// Binary SI suffixes by power of 1024.
const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// How a quantity is written, remembered from its input like Kubernetes does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantityFormat {
    /// Decimal suffixes (`n u m "" k M G T P E`), e.g. `12M`.
    DecimalSI,
    /// Binary suffixes (`Ki Mi Gi Ti Pi Ei`), e.g. `12Mi`.
    BinarySI,
    /// A decimal exponent, e.g. `12e6`.
    DecimalExponent,
}

/// A parsed quantity: its exact value in nano-units and the format it was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParsedQuantity {
    /// The value in nano-units (1 unit = 1e9).
    pub nanos: i128,
    /// The format used when formatting it back.
    pub format: QuantityFormat,
}

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The empty string.
    #[error("quantity is empty")]
    Empty,
    /// The number part is malformed (no digits, stray characters).
    #[error("quantity {input:?} is malformed: {reason}")]
    Malformed {
        /// The rejected text.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// What follows the number is neither a known suffix nor a valid exponent.
    #[error("quantity {input:?} has an invalid suffix {suffix:?}")]
    InvalidSuffix {
        /// The rejected text.
        input: String,
        /// The unrecognised suffix.
        suffix: String,
    },
    /// The value does not fit the supported range.
    #[error("quantity {input:?} is out of range")]
    OutOfRange {
        /// The rejected text.
        input: String,
    },
}

/// The multiplier a suffix stands for.
#[derive(Debug, Clone, Copy)]
enum Multiplier {
    /// 10^n.
    Decimal(i64),
    /// 1024^n.
    Binary(u32),
}

/// Parses a quantity the way `resource.ParseQuantity` does (see the module notes for the few
/// inputs handled differently).
pub fn parse_quantity(s: &str) -> Result<ParsedQuantity, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bytes = s.as_bytes();
    let mut pos = 0;
    let negative = match bytes.first() {
        Some(b'-') => {
            pos += 1;
            true
        }
        Some(b'+') => {
            pos += 1;
            false
        }
        _ => false,
    };
    let int_start = pos;
    while bytes.get(pos).is_some_and(u8::is_ascii_digit) {
        pos += 1;
    }
    let int_digits = bytes.get(int_start..pos).unwrap_or_default();
    let mut frac_digits: &[u8] = &[];
    if bytes.get(pos) == Some(&b'.') {
        pos += 1;
        let frac_start = pos;
        while bytes.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        frac_digits = bytes.get(frac_start..pos).unwrap_or_default();
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(QuantityError::Malformed {
            input: s.to_owned(),
            reason: "no digits",
        });
    }
    // `pos` only ever advanced over ASCII bytes, so it is a char boundary.
    let suffix = s.get(pos..).unwrap_or_default();
    let (multiplier, format) =
        interpret_suffix(suffix).ok_or_else(|| QuantityError::InvalidSuffix {
            input: s.to_owned(),
            suffix: suffix.to_owned(),
        })?;

    let mut digits: Vec<u8> = int_digits
        .iter()
        .chain(frac_digits)
        .map(|d| d - b'0')
        .collect();
    let frac_len = i128::try_from(frac_digits.len()).unwrap_or(i128::MAX);
    let pow10 = match multiplier {
        Multiplier::Decimal(exp) => i128::from(exp).saturating_sub(frac_len).saturating_add(9),
        Multiplier::Binary(power) => {
            for _ in 0..power {
                multiply_digits(&mut digits, 1024);
            }
            9i128.saturating_sub(frac_len)
        }
    };
    let magnitude = match (scale_digits_ceil(&digits, pow10), format) {
        // Upstream caps binary quantities instead of failing; anything that overflowed is
        // above the cap.
        (Some(m), QuantityFormat::BinarySI) => m.min(BINARY_SI_CAP_NANOS),
        (None, QuantityFormat::BinarySI) => BINARY_SI_CAP_NANOS,
        (Some(m), _) => m,
        (None, _) => {
            return Err(QuantityError::OutOfRange {
                input: s.to_owned(),
            });
        }
    };
    let magnitude = i128::try_from(magnitude).map_err(|_| QuantityError::OutOfRange {
        input: s.to_owned(),
    })?;
    // Binary suffixes cannot print a fraction of a unit, so upstream switches such values to
    // decimal at parse time.
    let format =
        if format == QuantityFormat::BinarySI && magnitude > 0 && magnitude < NANOS_PER_UNIT {
            QuantityFormat::DecimalSI
        } else {
            format
        };
    let nanos = if negative { -magnitude } else { magnitude };
    Ok(ParsedQuantity { nanos, format })
}

/// What a suffix means, or `None` if it is not one.
fn interpret_suffix(suffix: &str) -> Option<(Multiplier, QuantityFormat)> {
    if let Some((exp, _)) = DECIMAL_SUFFIXES.iter().find(|(_, text)| *text == suffix) {
        return Some((
            Multiplier::Decimal(i64::from(*exp)),
            QuantityFormat::DecimalSI,
        ));
    }
    if let Some(power) = BINARY_SUFFIXES
        .iter()
        .skip(1)
        .position(|text| *text == suffix)
    {
        let power = u32::try_from(power + 1).ok()?;
        return Some((Multiplier::Binary(power), QuantityFormat::BinarySI));
    }
    // "E" alone is exa (matched above); "e"/"E" followed by a signed integer is an exponent.
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let exp: i64 = exponent.parse().ok()?;
    Some((Multiplier::Decimal(exp), QuantityFormat::DecimalExponent))
}

/// Multiplies a big-endian vector of decimal digits in place by a small factor.
fn multiply_digits(digits: &mut Vec<u8>, factor: u32) {
    let mut carry: u32 = 0;
    for digit in digits.iter_mut().rev() {
        let product = u32::from(*digit) * factor + carry;
        *digit = (product % 10) as u8;
        carry = product / 10;
    }
    let mut head = Vec::new();
    while carry > 0 {
        head.push((carry % 10) as u8);
        carry /= 10;
    }
    head.reverse();
    if !head.is_empty() {
        head.extend_from_slice(digits);
        *digits = head;
    }
}

/// `ceil(digits * 10^pow10)` as an unsigned integer, or `None` if it does not fit a `u128`.
///
/// Works on the digit string so that arbitrarily long or tiny inputs round exactly.
fn scale_digits_ceil(digits: &[u8], pow10: i128) -> Option<u128> {
    let first_nonzero = digits.iter().position(|d| *d != 0);
    let Some(first_nonzero) = first_nonzero else {
        return Some(0);
    };
    let digits = digits.get(first_nonzero..).unwrap_or_default();
    let len = i128::try_from(digits.len()).ok()?;
    let accumulate = |ds: &[u8]| -> Option<u128> {
        ds.iter().try_fold(0u128, |acc, d| {
            acc.checked_mul(10)?.checked_add(u128::from(*d))
        })
    };
    if pow10 >= 0 {
        // u128 holds at most 39 decimal digits; checking first bounds the loop below.
        if len.checked_add(pow10)? > 39 {
            return None;
        }
        let mut value = accumulate(digits)?;
        for _ in 0..pow10 {
            value = value.checked_mul(10)?;
        }
        return Some(value);
    }
    let keep = len + pow10;
    if keep <= 0 {
        // Only a non-zero fraction remains: it rounds up to the smallest unit.
        return Some(1);
    }
    let keep = usize::try_from(keep).ok()?;
    let (whole, fraction) = digits.split_at(keep.min(digits.len()));
    let value = accumulate(whole)?;
    if fraction.iter().any(|d| *d != 0) {
        value.checked_add(1)
    } else {
        Some(value)
    }
}

/// Formats a value canonically, exactly like Kubernetes' `Quantity.String()`.
///
/// DecimalSI and DecimalExponent: the largest exponent that is a multiple of 3 and loses no
/// precision (`1500m`, `1k`, `80e-3`). BinarySI: below 1024 in magnitude, or not a whole
/// number, it is printed as DecimalSI; otherwise with the largest `Ki`..`Ei` suffix that divides
/// it (`1536Mi`). Zero is `"0"`.
pub fn format_quantity(nanos: i128, format: QuantityFormat) -> String {
    if nanos == 0 {
        return "0".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let magnitude = nanos.unsigned_abs();
    let unit = NANOS_PER_UNIT.unsigned_abs();
    if format == QuantityFormat::BinarySI
        && magnitude >= 1024 * unit
        && magnitude.is_multiple_of(unit)
    {
        let mut mantissa = magnitude / unit;
        let mut power = 0;
        while power + 1 < BINARY_SUFFIXES.len() && mantissa.is_multiple_of(1024) {
            mantissa /= 1024;
            power += 1;
        }
        let suffix = BINARY_SUFFIXES.get(power).copied().unwrap_or_default();
        return format!("{sign}{mantissa}{suffix}");
    }

    // Move every factor of ten into the exponent, then come back down to a multiple of 3.
    // The mantissa never exceeds the input magnitude, so nothing here can overflow.
    let mut mantissa = magnitude;
    let mut exponent: i32 = -9;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exponent += 1;
    }
    let excess = exponent.rem_euclid(3);
    mantissa *= 10u128.pow(excess.unsigned_abs());
    exponent -= excess;
    if format == QuantityFormat::DecimalExponent {
        return if exponent == 0 {
            format!("{sign}{mantissa}")
        } else {
            format!("{sign}{mantissa}e{exponent}")
        };
    }
    while exponent > 18 {
        mantissa *= 1000;
        exponent -= 3;
    }
    let suffix = DECIMAL_SUFFIXES
        .iter()
        .find(|(exp, _)| *exp == exponent)
        .map(|(_, text)| *text)
        .unwrap_or_default();
    format!("{sign}{mantissa}{suffix}")
}

/// `ceil(nanos / per)`, rounding away from zero like upstream's `negativeScaleInt64`.
fn ceil_away_from_zero(nanos: i128, per: i128) -> i128 {
    let quotient = nanos / per;
    if nanos % per == 0 {
        quotient
    } else {
        quotient + nanos.signum()
    }
}

/// The value in milli-units, rounded up away from zero (Kubernetes' `MilliValue`).
pub fn milli_value(nanos: i128) -> i128 {
    ceil_away_from_zero(nanos, NANOS_PER_MILLI)
}

/// The value in whole units, rounded up away from zero (Kubernetes' `Value`).
pub fn value(nanos: i128) -> i128 {
    ceil_away_from_zero(nanos, NANOS_PER_UNIT)
}

/// Nano-units of a whole number of units.
pub const fn nanos_from_units(units: i64) -> i128 {
    units as i128 * NANOS_PER_UNIT
}

/// Nano-units of a number of milli-units.
pub const fn nanos_from_millis(millis: i64) -> i128 {
    millis as i128 * NANOS_PER_MILLI
}

/// A k8s-openapi [`Quantity`] holding the canonical text of a value.
pub fn to_quantity(nanos: i128, format: QuantityFormat) -> Quantity {
    Quantity(format_quantity(nanos, format))
}

/// Parses a k8s-openapi [`Quantity`]. Surrounding whitespace is ignored, as Kubernetes'
/// JSON decoding of quantities does.
pub fn from_quantity(quantity: &Quantity) -> Result<ParsedQuantity, QuantityError> {
    parse_quantity(quantity.0.trim())
}

impl QuantityError {
    /// The rejected text (empty for [`QuantityError::Empty`]).
    pub fn input(&self) -> &str {
        match self {
            Self::Empty => "",
            Self::Malformed { input, .. }
            | Self::InvalidSuffix { input, .. }
            | Self::OutOfRange { input } => input,
        }
    }
}

impl ParsedQuantity {
    /// The canonical text, see [`format_quantity`].
    pub fn canonical(&self) -> String {
        format_quantity(self.nanos, self.format)
    }

    /// The value in milli-units, rounded up (Kubernetes' `MilliValue`).
    pub fn milli_value(&self) -> i128 {
        milli_value(self.nanos)
    }

    /// The value in whole units, rounded up (Kubernetes' `Value`).
    pub fn value(&self) -> i128 {
        value(self.nanos)
    }

    /// As a k8s-openapi [`Quantity`] in canonical form.
    pub fn to_quantity(&self) -> Quantity {
        to_quantity(self.nanos, self.format)
    }
}

impl fmt::Display for ParsedQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl FromStr for ParsedQuantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
    }
}

impl TryFrom<&Quantity> for ParsedQuantity {
    type Error = QuantityError;

    fn try_from(quantity: &Quantity) -> Result<Self, Self::Error> {
        from_quantity(quantity)
    }
}

impl From<ParsedQuantity> for Quantity {
    fn from(parsed: ParsedQuantity) -> Self {
        parsed.to_quantity()
    }
}

#[cfg(test)]
mod tests {
    use super::QuantityFormat::{BinarySI, DecimalExponent, DecimalSI};
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const U: i128 = NANOS_PER_UNIT;
    const CAP: i128 = i64::MAX as i128 * NANOS_PER_UNIT;

    fn parse(s: &str) -> ParsedQuantity {
        parse_quantity(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    /// Upstream's TestQuantityParse table: input, value in nanos, format.
    fn parse_table() -> Vec<(&'static str, i128, QuantityFormat)> {
        let ki = 1024 * U;
        vec![
            ("0", 0, DecimalSI),
            ("0n", 0, DecimalSI),
            ("0u", 0, DecimalSI),
            ("0m", 0, DecimalSI),
            ("0Ki", 0, BinarySI),
            ("0k", 0, DecimalSI),
            ("0Mi", 0, BinarySI),
            ("0M", 0, DecimalSI),
            ("0Gi", 0, BinarySI),
            ("0G", 0, DecimalSI),
            ("0Ti", 0, BinarySI),
            ("0T", 0, DecimalSI),
            ("1", U, DecimalSI),
            ("1Ki", ki, BinarySI),
            ("8Ki", 8 * ki, BinarySI),
            ("7Mi", 7 * 1024 * ki, BinarySI),
            ("6Gi", 6 * 1024 * 1024 * ki, BinarySI),
            ("5Ti", 5 * (1 << 40) * U, BinarySI),
            ("4Pi", 4 * (1 << 50) * U, BinarySI),
            ("3Ei", 3 * (1 << 60) * U, BinarySI),
            ("10Ti", 10 * (1 << 40) * U, BinarySI),
            ("100Ti", 100 * (1 << 40) * U, BinarySI),
            ("5n", 5, DecimalSI),
            ("4u", 4_000, DecimalSI),
            ("3m", 3_000_000, DecimalSI),
            ("9", 9 * U, DecimalSI),
            ("8k", 8_000 * U, DecimalSI),
            ("50k", 50_000 * U, DecimalSI),
            ("7M", 7_000_000 * U, DecimalSI),
            ("6G", 6_000_000_000 * U, DecimalSI),
            ("5T", 5 * 10i128.pow(12) * U, DecimalSI),
            ("40T", 40 * 10i128.pow(12) * U, DecimalSI),
            ("300T", 300 * 10i128.pow(12) * U, DecimalSI),
            ("2P", 2 * 10i128.pow(15) * U, DecimalSI),
            ("1E", 10i128.pow(18) * U, DecimalSI),
            ("1E-3", 1_000_000, DecimalExponent),
            ("1e3", 1_000 * U, DecimalExponent),
            ("1E6", 1_000_000 * U, DecimalExponent),
            ("1e9", 10i128.pow(9) * U, DecimalExponent),
            ("1E12", 10i128.pow(12) * U, DecimalExponent),
            ("1e15", 10i128.pow(15) * U, DecimalExponent),
            ("1E18", 10i128.pow(18) * U, DecimalExponent),
            ("1e14", 10i128.pow(14) * U, DecimalExponent),
            ("1e13", 10i128.pow(13) * U, DecimalExponent),
            ("100.035k", 100_035 * U, DecimalSI),
            ("0.001", 1_000_000, DecimalSI),
            ("0.0005k", U / 2, DecimalSI),
            ("0.005", 5_000_000, DecimalSI),
            ("0.05", 50_000_000, DecimalSI),
            ("0.5", U / 2, DecimalSI),
            ("0.00050k", U / 2, DecimalSI),
            ("0.00500", 5_000_000, DecimalSI),
            ("0.05000", 50_000_000, DecimalSI),
            ("0.50000", U / 2, DecimalSI),
            ("0.5e0", U / 2, DecimalExponent),
            ("0.5e-1", 50_000_000, DecimalExponent),
            ("0.5e-2", 5_000_000, DecimalExponent),
            ("10.035M", 10_035_000 * U, DecimalSI),
            ("1.2e3", 1_200 * U, DecimalExponent),
            ("1.3E+6", 1_300_000 * U, DecimalExponent),
            ("1.40e9", 1_400_000_000 * U, DecimalExponent),
            ("1.53E12", 153 * 10i128.pow(10) * U, DecimalExponent),
            ("1.6e15", 16 * 10i128.pow(14) * U, DecimalExponent),
            ("1.7E18", 17 * 10i128.pow(17) * U, DecimalExponent),
            ("9.01", 9_010_000_000, DecimalSI),
            ("8.1k", 8_100 * U, DecimalSI),
            ("7.123456M", 7_123_456 * U, DecimalSI),
            ("6.987654321G", 6_987_654_321 * U, DecimalSI),
            ("5.444T", 5_444 * 10i128.pow(9) * U, DecimalSI),
            ("40.1T", 401 * 10i128.pow(11) * U, DecimalSI),
            ("300.2T", 3_002 * 10i128.pow(11) * U, DecimalSI),
            ("2.5P", 25 * 10i128.pow(14) * U, DecimalSI),
            ("1.01E", 101 * 10i128.pow(16) * U, DecimalSI),
            // Things that saturate or round up.
            ("3.001n", 4, DecimalSI),
            ("1.1E-9", 2, DecimalExponent),
            ("0.0000000001", 1, DecimalSI),
            ("0.0000000005", 1, DecimalSI),
            ("0.00000000050", 1, DecimalSI),
            ("0.5e-9", 1, DecimalExponent),
            ("0.9n", 1, DecimalSI),
            ("0.00000012345", 124, DecimalSI),
            ("0.00000012354", 124, DecimalSI),
            ("9Ei", CAP, BinarySI),
            ("9223372036854775807Ki", CAP, BinarySI),
            ("12E", 12 * 10i128.pow(18) * U, DecimalSI),
            // Fractional binary quantities.
            ("100.035Ki", 102_435_840_000_000, BinarySI),
            ("0.5Mi", 524_288 * U, BinarySI),
            ("0.05Gi", 53_687_091_200_000_000, BinarySI),
            ("0.025Ti", 27_487_790_694_400_000_000, BinarySI),
            // Things written by trolls.
            ("0.000000000001Ki", 2, DecimalSI),
            (".001", 1_000_000, DecimalSI),
            (".0001k", 100_000_000, DecimalSI),
            ("1.", U, DecimalSI),
            ("1.G", 10i128.pow(9) * U, DecimalSI),
        ]
    }

    #[test]
    fn parses_upstream_table_with_sign_variants() {
        for (input, nanos, format) in parse_table() {
            assert_eq!(parse(input), ParsedQuantity { nanos, format }, "{input}");
            let negated = parse(&format!("-{input}"));
            assert_eq!(
                negated,
                ParsedQuantity {
                    nanos: -nanos,
                    format
                },
                "-{input}"
            );
            let plus = parse(&format!("+{input}"));
            assert_eq!(plus, ParsedQuantity { nanos, format }, "+{input}");
        }
    }

    #[test]
    fn rejects_invalid_input_with_typed_errors() {
        for input in [
            "1.1.M", "1+1.0M", "0.1mi", "0.1am", ".5i", "1i", "-3.01i", "-3.01e-", "1 ", "1.2.3",
            "1e", "1e+", "1K", "1ki", "1KiB", "1e3m", "1Mi3", "1ee3", "1e3e3", "1e1_0",
        ] {
            assert!(
                matches!(
                    parse_quantity(input),
                    Err(QuantityError::InvalidSuffix { .. })
                ),
                "{input}: {:?}",
                parse_quantity(input)
            );
        }
        for input in [
            "-",
            "+",
            ".",
            "-.",
            "Ki",
            "m",
            "--1",
            "+-1",
            "e3",
            " ",
            " 1",
            "\t1",
            "aoeu",
            "Non-Numeric",
        ] {
            assert!(
                matches!(parse_quantity(input), Err(QuantityError::Malformed { .. })),
                "{input}: {:?}",
                parse_quantity(input)
            );
        }
        assert_eq!(parse_quantity(""), Err(QuantityError::Empty));
    }

    #[test]
    fn errors_name_the_input() {
        let err = parse_quantity("12Q").unwrap_err();
        assert_eq!(
            err,
            QuantityError::InvalidSuffix {
                input: "12Q".to_owned(),
                suffix: "Q".to_owned()
            }
        );
        assert_eq!(
            err.to_string(),
            r#"quantity "12Q" has an invalid suffix "Q""#
        );
        assert_eq!(
            parse_quantity("1e40").unwrap_err().to_string(),
            r#"quantity "1e40" is out of range"#
        );
    }

    #[test]
    fn out_of_range_is_an_error_not_an_overflow() {
        for input in [
            "1e30",
            "-1e30",
            "1e9223372036854775807",
            "999999999999999999999999999999E",
        ] {
            assert_eq!(
                parse_quantity(input),
                Err(QuantityError::OutOfRange {
                    input: input.to_owned()
                }),
                "{input}"
            );
        }
        // An exponent that does not even fit an i64 is not an exponent (upstream: ErrSuffix).
        assert!(matches!(
            parse_quantity("1e99999999999999999999"),
            Err(QuantityError::InvalidSuffix { .. })
        ));
        // The largest decimal that fits.
        assert_eq!(
            parse("170141183460469231731687303715884105727n").nanos,
            i128::MAX
        );
        assert!(parse_quantity("170141183460469231731687303715884105728n").is_err());
    }

    #[test]
    fn tiny_and_long_inputs_round_up_exactly() {
        assert_eq!(parse("1e-100").nanos, 1);
        assert_eq!(parse("-1e-9223372036854775808").nanos, -1);
        assert_eq!(parse("0e99999").nanos, 0);
        assert_eq!(
            parse("0.000000000000000000000000000000000000000000001").nanos,
            1
        );
        assert_eq!(
            parse("1.0000000000000000000000000000000000000000000001").nanos,
            U + 1
        );
        assert_eq!(
            parse("00000000000000000000000000000000000000000000001").nanos,
            U
        );
        // Binary: rounding happens after multiplying by the suffix.
        assert_eq!(parse("0.0000000001Ki").nanos, 103);
        assert_eq!(parse("99999999999999999999999999999999999999Ki").nanos, CAP);
        assert_eq!(parse("-9Ei").nanos, -CAP);
    }

    /// Upstream's TestQuantityString table plus the alternates that canonicalize to it.
    #[test]
    fn formats_canonically_like_upstream() {
        let cases: Vec<(i128, QuantityFormat, &str)> = vec![
            ((1 << 30) * U, BinarySI, "1Gi"),
            (300 * (1 << 20) * U, BinarySI, "300Mi"),
            (6 * 1024 * U, BinarySI, "6Ki"),
            (1001 * (1 << 30) * U, BinarySI, "1001Gi"),
            ((1 << 40) * U, BinarySI, "1Ti"),
            (5 * U, BinarySI, "5"),
            (U / 2, BinarySI, "500m"),
            (10i128.pow(9) * U, DecimalSI, "1G"),
            (1_000_000, DecimalSI, "1m"),
            (80_000_000, DecimalSI, "80m"),
            (1_080_000_000, DecimalSI, "1080m"),
            (300_000_000 * U, DecimalSI, "300M"),
            (10i128.pow(12) * U, DecimalSI, "1T"),
            (1_234_567_000_000 * U, DecimalSI, "1234567M"),
            (1_234_567_000_000, BinarySI, "1234567m"),
            (3_000 * U, DecimalSI, "3k"),
            (1025 * U, BinarySI, "1025"),
            (0, DecimalSI, "0"),
            (0, BinarySI, "0"),
            (0, DecimalExponent, "0"),
            (10i128.pow(9) * U, DecimalExponent, "1e9"),
            (1_000_000, DecimalExponent, "1e-3"),
            (1, DecimalExponent, "1e-9"),
            (80_000_000, DecimalExponent, "80e-3"),
            (300_000_000 * U, DecimalExponent, "300e6"),
            (10i128.pow(12) * U, DecimalExponent, "1e12"),
            (1_000 * U, DecimalExponent, "1e3"),
            (3_000 * U, DecimalExponent, "3e3"),
            (1_200 * U, DecimalExponent, "1200"),
            (1, DecimalSI, "1n"),
            (80, DecimalSI, "80n"),
            (1_080, DecimalSI, "1080n"),
            (1_000, DecimalSI, "1u"),
            (80_000, DecimalSI, "80u"),
            (1_080_000, DecimalSI, "1080u"),
            (1536 * (1 << 20) * U, BinarySI, "1536Mi"),
            (1000 * U, DecimalSI, "1k"),
            (1000 * U, BinarySI, "1k"),
            (1024 * U, BinarySI, "1Ki"),
            (1024 * U, DecimalSI, "1024"),
            (1024 * U + 1, BinarySI, "1024000000001n"),
            (CAP, BinarySI, "9223372036854775807"),
            ((1 << 62) * U, BinarySI, "4Ei"),
            // Above Ei upstream has no suffix; we keep Ei with a larger mantissa.
            ((1 << 70) * U, BinarySI, "1024Ei"),
            (10i128.pow(21) * U, DecimalSI, "1000E"),
            (10i128.pow(21) * U, DecimalExponent, "1e21"),
            (
                i128::MAX,
                DecimalSI,
                "170141183460469231731687303715884105727n",
            ),
            (
                i128::MIN,
                DecimalSI,
                "-170141183460469231731687303715884105728n",
            ),
        ];
        for (nanos, format, expected) in cases {
            assert_eq!(
                format_quantity(nanos, format),
                expected,
                "{nanos} {format:?}"
            );
            if nanos != 0 && nanos != i128::MIN {
                assert_eq!(
                    format_quantity(-nanos, format),
                    format!("-{expected}"),
                    "-{nanos} {format:?}"
                );
            }
        }
    }

    /// Upstream's TestQuantityParseEmit, alternates of TestQuantityString and the large values
    /// of TestParseQuantity: parse then print.
    #[test]
    fn parse_then_emit_matches_upstream() {
        let cases = [
            ("1Ki", "1Ki"),
            ("1Mi", "1Mi"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1000M", "1G"),
            (".001Ki", "1024m"),
            (".000001Ki", "1024u"),
            (".000000001Ki", "1024n"),
            (".000000000001Ki", "2n"),
            ("307200Ki", "300Mi"),
            ("5000m", "5"),
            ("0.5", "500m"),
            ("0.001T", "1G"),
            ("1000u", "1m"),
            ("1.08", "1080m"),
            ("1080000000n", "1080m"),
            (".001e12", "1e9"),
            ("0.001e0", "1e-3"),
            ("1000e-12", "1e-9"),
            ("00", "0"),
            ("1.5Gi", "1536Mi"),
            // Not a whole number of Ki: printed without a suffix, which reads back as
            // DecimalSI and prints with one (apimachinery v0.34.4 does both; found by AFL++).
            ("01111312.5Ki", "1137984000"),
            ("1137984000", "1137984k"),
            ("1000", "1k"),
            ("1000m", "1"),
            ("1500m", "1500m"),
            ("100Mi", "100Mi"),
            ("512Ki", "512Ki"),
            ("0.1m", "100u"),
            ("1.5", "1500m"),
            ("1E3", "1e3"),
            ("+1", "1"),
            ("1.500", "1500m"),
            ("999999999999999999", "999999999999999999"),
            ("999999999999999999.1", "999999999999999999100m"),
            ("9999999999999999999", "9999999999999999999"),
            ("1000000000000000000", "1E"),
            ("1.0E", "1E"),
            ("9999999999999999999000m", "9999999999999999999"),
            ("1.0000000000000000001E", "1000000000000000000100m"),
            ("1.000000000000000001E", "1000000000000000001"),
            ("10E", "10E"),
            ("10000000000000000000", "10E"),
            ("10000000000000000000000m", "10E"),
            ("10.0000000000000000001E", "10000000000000000000100m"),
            ("9223372036854775807000m", "9223372036854775807"),
            ("9223372036854775808.1", "9223372036854775808100m"),
            ("9Ei", "9223372036854775807"),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input).canonical(), expected, "{input}");
            if parse(input).nanos != 0 && !input.starts_with('+') {
                assert_eq!(
                    parse(&format!("-{input}")).canonical(),
                    format!("-{expected}")
                );
            }
        }
    }

    #[test]
    fn value_and_milli_value_round_up_away_from_zero() {
        assert_eq!(parse("1500m").value(), 2);
        assert_eq!(parse("1500m").milli_value(), 1500);
        assert_eq!(parse("1n").value(), 1);
        assert_eq!(parse("1n").milli_value(), 1);
        assert_eq!(parse("0.1m").milli_value(), 1);
        assert_eq!(parse("-1.5").value(), -2);
        assert_eq!(parse("-1n").milli_value(), -1);
        assert_eq!(parse("2").value(), 2);
        assert_eq!(parse("0").milli_value(), 0);
        assert_eq!(parse("1Gi").value(), 1 << 30);
        assert_eq!(value(i128::MIN), i128::MIN / U - 1);
        assert_eq!(milli_value(i128::MAX), i128::MAX / NANOS_PER_MILLI + 1);
    }

    #[test]
    fn converts_to_and_from_k8s_quantity() {
        let q = Quantity("1.5Gi".to_owned());
        let parsed = ParsedQuantity::try_from(&q).unwrap();
        assert_eq!(
            parsed,
            ParsedQuantity {
                nanos: 1536 * (1 << 20) * U,
                format: BinarySI
            }
        );
        assert_eq!(Quantity::from(parsed), Quantity("1536Mi".to_owned()));
        assert_eq!(
            to_quantity(500_000_000, DecimalSI),
            Quantity("500m".to_owned())
        );
        // Like UnmarshalJSON, surrounding whitespace is tolerated on decoded quantities only.
        assert_eq!(from_quantity(&Quantity(" 1 ".to_owned())).unwrap().nanos, U);
        assert!(parse_quantity(" 1 ").is_err());
        assert_eq!("2k".parse::<ParsedQuantity>().unwrap().to_string(), "2k");
        assert_eq!(nanos_from_units(3), 3 * U);
        assert_eq!(nanos_from_millis(-250), -250_000_000);
    }

    fn quantity_text() -> impl Strategy<Value = String> {
        let sign = prop_oneof![Just(""), Just("-"), Just("+")];
        let number = prop_oneof![
            "[0-9]{1,12}",
            "[0-9]{1,6}\\.[0-9]{0,12}",
            "\\.[0-9]{1,12}",
            "[0-9]{1,30}",
        ];
        let suffix = prop_oneof![
            prop::sample::select(vec![
                "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
                "Ei",
            ])
            .prop_map(str::to_owned),
            (prop::sample::select(vec!["e", "E"]), -30i32..30).prop_map(|(e, x)| format!("{e}{x}")),
        ];
        (sign, number, suffix).prop_map(|(s, n, x)| format!("{s}{n}{x}"))
    }

    proptest! {
        #[test]
        fn canonical_text_reparses_to_the_same_value(text in quantity_text()) {
            let parsed = match parse_quantity(&text) {
                Ok(p) => p,
                Err(QuantityError::OutOfRange { .. }) => return Ok(()),
                Err(e) => panic!("{text}: {e}"),
            };
            let canonical = parsed.canonical();
            let again = parse_quantity(&canonical).unwrap();
            prop_assert_eq!(again.nanos, parsed.nanos, "{} -> {}", text, canonical);
            // Stable from the second print on: a BinarySI value that is not a whole number of
            // its unit prints without a suffix and reads back as DecimalSI, as upstream's does.
            let twice = again.canonical();
            prop_assert_eq!(parse_quantity(&twice).unwrap().canonical(), twice);
        }

        #[test]
        fn formatted_values_parse_back(nanos in (i128::MIN + 1)..=i128::MAX) {
            for format in [DecimalSI, DecimalExponent] {
                let text = format_quantity(nanos, format);
                prop_assert_eq!(parse_quantity(&text).unwrap().nanos, nanos, "{}", text);
            }
        }

        #[test]
        fn formatted_binary_values_parse_back(nanos in -CAP..=CAP) {
            let text = format_quantity(nanos, BinarySI);
            prop_assert_eq!(parse_quantity(&text).unwrap().nanos, nanos, "{}", text);
        }

        #[test]
        fn formatted_whole_binary_values_parse_back(units in -(1i128 << 62)..(1i128 << 62), shift in 0u32..50) {
            let nanos = ((units >> shift) << shift) * U;
            let text = format_quantity(nanos, BinarySI);
            prop_assert_eq!(parse_quantity(&text).unwrap().nanos, nanos, "{}", text);
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,40}") {
            let _ = parse_quantity(&text);
        }

        #[test]
        fn parse_never_panics_on_quantity_like_noise(text in "[-+0-9.eEinumkKMGTP ]{0,40}") {
            let _ = parse_quantity(&text);
        }
    }
}
