//! Exact Kubernetes quantities.
//!
//! A [`Quantity`] is a whole number of nano-units held in an `i128`: every quantity form Kubernetes
//! accepts (`500m`, `1.5Gi`, `2G`, `1e3`, `100Ki`, `.5`) that is a multiple of `1n` is represented
//! exactly, and arithmetic is checked (overflow is an error, never a wrap). Floats are never used.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;

/// Why a quantity could not be parsed or computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("invalid quantity {text:?}: {reason}")]
    Invalid { text: String, reason: &'static str },
    #[error("quantity {text:?} is out of range")]
    OutOfRange { text: String },
    #[error("quantity {text:?} is more precise than 1n (one billionth), which is not supported")]
    TooPrecise { text: String },
    #[error("quantity arithmetic overflowed: {0}")]
    Overflow(&'static str),
}

/// An exact Kubernetes quantity, stored as nano-units.
///
/// Packed to 4-byte alignment: an `i128` alone aligns to 16 bytes, which made an
/// `Option<Quantity>` 32 bytes and a `ResourceDetails` (six of them) 192, and the master caches
/// hundreds of thousands of those at 10,000 quotas (issue #34's RSS target). Packed, they are 20
/// and 120. The field is only ever read by value (a reference to a packed field is refused).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(Rust, packed(4))]
pub struct Quantity {
    nanos: i128,
}

/// How a quantity is written back: memory and storage in binary suffixes, everything else decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notation {
    /// Plain integers, `m` (then `u`, `n`) for fractions: `4`, `1500m`.
    Decimal,
    /// The largest binary suffix that divides exactly: `3840Mi`, `2Gi`, `1953125Ki`.
    Binary,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    /// A whole number of units (`4` cpu, `3` machines, `4096` bytes).
    pub const fn from_units(units: i64) -> Quantity {
        Quantity {
            nanos: units as i128 * NANOS,
        }
    }

    /// Thousandths of a unit (`1500` millis = `1500m`).
    pub const fn from_millis(millis: i64) -> Quantity {
        Quantity {
            nanos: millis as i128 * 1_000_000,
        }
    }

    // The byte constructors multiply in i128, where no i64 input can overflow
    // (i64::MAX GiB is about 1e37 nano-bytes; i128 holds 1.7e38).

    /// Whole mebibytes, exactly.
    pub const fn from_mebibytes(mib: i64) -> Quantity {
        Quantity {
            nanos: mib as i128 * (1 << 20) * NANOS,
        }
    }

    /// Whole gibibytes, exactly.
    pub const fn from_gibibytes(gib: i64) -> Quantity {
        Quantity {
            nanos: gib as i128 * (1 << 30) * NANOS,
        }
    }

    /// Whole decimal gigabytes (10^9 bytes), exactly.
    pub const fn from_gigabytes(gb: i64) -> Quantity {
        Quantity {
            nanos: gb as i128 * 1_000_000_000 * NANOS,
        }
    }

    /// The raw value in nano-units.
    pub const fn as_nanos(self) -> i128 {
        self.nanos
    }

    pub const fn from_nanos(nanos: i128) -> Quantity {
        Quantity { nanos }
    }

    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    pub const fn is_negative(self) -> bool {
        self.nanos < 0
    }

    pub fn checked_add(self, other: Quantity) -> Result<Quantity, QuantityError> {
        self.nanos
            .checked_add(other.nanos)
            .map(Quantity::from_nanos)
            .ok_or(QuantityError::Overflow("addition"))
    }

    pub fn checked_sub(self, other: Quantity) -> Result<Quantity, QuantityError> {
        self.nanos
            .checked_sub(other.nanos)
            .map(Quantity::from_nanos)
            .ok_or(QuantityError::Overflow("subtraction"))
    }

    /// `self - other`, never below zero (usage cannot go negative).
    #[must_use]
    pub fn saturating_sub_to_zero(self, other: Quantity) -> Quantity {
        Quantity::from_nanos(self.nanos.saturating_sub(other.nanos).max(0))
    }

    pub fn checked_mul(self, factor: i64) -> Result<Quantity, QuantityError> {
        self.nanos
            .checked_mul(i128::from(factor))
            .map(Quantity::from_nanos)
            .ok_or(QuantityError::Overflow("multiplication"))
    }

    /// Whole units, rounded up (`1500m` -> 2). Used for display of counts.
    pub fn ceil_units(self) -> i128 {
        self.nanos.div_euclid(NANOS) + i128::from(self.nanos.rem_euclid(NANOS) != 0)
    }

    /// Writes the quantity in the given notation; [`Quantity::from_str`] reads it back exactly.
    pub fn format(self, notation: Notation) -> String {
        match notation {
            Notation::Decimal => self.to_decimal_string(),
            Notation::Binary => self.to_binary_string(),
        }
    }

    fn to_decimal_string(self) -> String {
        let n = self.nanos;
        if n % NANOS == 0 {
            return (n / NANOS).to_string();
        }
        if n % 1_000_000 == 0 {
            return format!("{}m", n / 1_000_000);
        }
        if n % 1_000 == 0 {
            return format!("{}u", n / 1_000);
        }
        format!("{n}n")
    }

    fn to_binary_string(self) -> String {
        if self.nanos % NANOS != 0 || self.nanos == 0 {
            return self.to_decimal_string();
        }
        let units = self.nanos / NANOS;
        for (suffix, shift) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            let base = 1_i128 << shift;
            if units % base == 0 {
                return format!("{}{suffix}", units / base);
            }
        }
        units.to_string()
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_decimal_string())
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quantity({})", self.to_decimal_string())
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text)
    }
}

fn invalid(text: &str, reason: &'static str) -> QuantityError {
    QuantityError::Invalid {
        text: text.to_owned(),
        reason,
    }
}

/// The Kubernetes grammar: `[+-] digits [. digits] [suffix]` where suffix is a binary SI suffix
/// (`Ki`..`Ei`), a decimal SI suffix (`n u m k M G T P E`) or a decimal exponent (`e3`, `E-2`).
fn parse(text: &str) -> Result<Quantity, QuantityError> {
    let out_of_range = || QuantityError::OutOfRange {
        text: text.to_owned(),
    };
    if text.is_empty() {
        return Err(invalid(text, "empty string"));
    }
    let bytes = text.as_bytes();
    let mut pos = 0;
    let negative = match bytes[0] {
        b'-' => {
            pos = 1;
            true
        }
        b'+' => {
            pos = 1;
            false
        }
        _ => false,
    };
    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &text[int_start..pos];
    let mut frac_digits = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &text[frac_start..pos];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(invalid(text, "expected a number"));
    }
    let suffix = &text[pos..];
    // (power of 1024, power of 10)
    let (binary_power, mut decimal_power): (u32, i64) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        _ if suffix.starts_with(['e', 'E']) => (0, parse_exponent(text, &suffix[1..])?),
        _ => return Err(invalid(text, "unknown suffix")),
    };

    // Trailing zeros of the fraction carry no value; dropping them keeps long inputs in range.
    let frac_digits = frac_digits.trim_end_matches('0');
    let digits = int_digits.trim_start_matches('0').to_owned() + frac_digits;
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(Quantity::ZERO);
    }
    let mut mantissa: i128 = 0;
    for digit in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(digit - b'0')))
            .ok_or_else(out_of_range)?;
    }
    let frac_len = i64::try_from(frac_digits.len()).map_err(|_| out_of_range())?;
    decimal_power = decimal_power + 9 - frac_len; // to nano-units
    let mut value = mantissa;
    for _ in 0..binary_power {
        value = value.checked_mul(1024).ok_or_else(out_of_range)?;
    }
    if decimal_power >= 0 {
        let scale = u32::try_from(decimal_power).map_err(|_| out_of_range())?;
        let factor = 10_i128.checked_pow(scale).ok_or_else(out_of_range)?;
        value = value.checked_mul(factor).ok_or_else(out_of_range)?;
    } else {
        let scale = u32::try_from(-decimal_power).map_err(|_| out_of_range())?;
        match 10_i128.checked_pow(scale) {
            Some(divisor) if value % divisor == 0 => value /= divisor,
            _ => {
                return Err(QuantityError::TooPrecise {
                    text: text.to_owned(),
                });
            }
        }
    }
    Ok(Quantity::from_nanos(if negative { -value } else { value }))
}

fn parse_exponent(text: &str, exponent: &str) -> Result<i64, QuantityError> {
    let (negative, digits) = match exponent.as_bytes().first() {
        Some(b'-') => (true, &exponent[1..]),
        Some(b'+') => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(text, "exponent must be a whole number"));
    }
    // Anything beyond a few hundred is out of range for i128 nano-units anyway.
    let value: i64 = digits
        .parse::<u16>()
        .map(i64::from)
        .map_err(|_| QuantityError::OutOfRange {
            text: text.to_owned(),
        })?;
    Ok(if negative { -value } else { value })
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_decimal_string())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Kubernetes accepts a quantity as a JSON string or a JSON number.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
            Raw::Int(units) => Ok(Quantity::from_units(units)),
            // serde_json prints the shortest form that round-trips, which our parser reads exactly.
            Raw::Float(value) => value.to_string().parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A quantity as a non-negative string or integer, checked by the API server with the Kubernetes
/// grammar narrowed to what this type holds exactly ([`exact_quantity_pattern`]), so malformed,
/// negative, too precise (`0.5n`) or too large (`1e40`) values never reach the controllers: one
/// such value in one object would fail every listing of its kind (issue #32, finding 7).
///
/// `minimum` and `pattern` sit side by side under `x-kubernetes-int-or-string`: each applies only
/// to its own JSON type. (An `anyOf` of typed branches does not survive the structural-schema
/// rewrite: the branches lose their types and then accept everything.)
impl schemars::JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "minimum": 0,
            "maximum": MAX_INTEGER_UNITS,
            "pattern": exact_quantity_pattern()
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// The Kubernetes quantity grammar without a minus sign.
pub const QUANTITY_PATTERN: &str =
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$";

/// The largest quantity written as a JSON integer that this project's CRDs accept.
pub const MAX_INTEGER_UNITS: i64 = 1_000_000_000_000_000_000;

/// The part of the Kubernetes quantity grammar this type holds exactly, below `10^28` units
/// (far inside `i128` nano-units, so sums of many stay in range): per suffix, at most as many
/// integer digits as keep the value below that bound, and at most as many decimal places as keep
/// it a whole number of nano-units (`0.5n` and `1.0000000001` are refused, `1.5m` is not).
/// Exponents: `e0`..`e9` with up to 9 decimal places, and `e-1`..`e-9` on whole numbers.
/// Everything [`Quantity::format`] writes for such values matches it.
pub fn exact_quantity_pattern() -> String {
    // (suffix as a regex, most integer digits, most decimal places)
    const FORMS: [(&str, u32, u32); 17] = [
        ("n", 37, 0),
        ("u", 34, 3),
        ("m", 31, 6),
        ("", 28, 9),
        ("k", 25, 9),
        ("M", 22, 9),
        ("G", 19, 9),
        ("T", 16, 9),
        ("P", 13, 9),
        ("E", 10, 9),
        ("Ki", 24, 9),
        ("Mi", 21, 9),
        ("Gi", 18, 9),
        ("Ti", 15, 9),
        ("Pi", 12, 9),
        ("Ei", 9, 9),
        ("[eE]\\+?[0-9]", 19, 9),
    ];
    let mut alternatives: Vec<String> = FORMS
        .iter()
        .map(|(suffix, digits, places)| {
            if *places == 0 {
                format!("[0-9]{{1,{digits}}}\\.?{suffix}")
            } else {
                format!("([0-9]{{1,{digits}}}(\\.[0-9]{{0,{places}}})?|\\.[0-9]{{1,{places}}}){suffix}")
            }
        })
        .collect();
    alternatives.push("[0-9]{1,28}\\.?[eE]-[1-9]".to_owned());
    format!("^\\+?({})$", alternatives.join("|"))
}

impl PartialOrd<i64> for Quantity {
    fn partial_cmp(&self, other: &i64) -> Option<Ordering> {
        Some(self.cmp(&Quantity::from_units(*other)))
    }
}

impl PartialEq<i64> for Quantity {
    fn eq(&self, other: &i64) -> bool {
        *self == Quantity::from_units(*other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_stay_small() {
        assert_eq!(std::mem::size_of::<Option<Quantity>>(), 20);
        assert_eq!(std::mem::size_of::<crate::ResourceDetails>(), 120);
    }

    fn q(text: &str) -> Quantity {
        text.parse().unwrap()
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(q("500m"), Quantity::from_millis(500));
        assert_eq!(q("2"), Quantity::from_units(2));
        assert_eq!(q("1.5Gi"), Quantity::from_mebibytes(1536));
        assert_eq!(q("2G"), Quantity::from_units(2_000_000_000));
        assert_eq!(q("100Ki"), Quantity::from_units(102_400));
        assert_eq!(q("1e3"), Quantity::from_units(1000));
        assert_eq!(q("1E-3"), Quantity::from_millis(1));
        assert_eq!(q("0.5"), Quantity::from_millis(500));
        assert_eq!(q(".5"), Quantity::from_millis(500));
        assert_eq!(q("5."), Quantity::from_units(5));
        assert_eq!(q("+3"), Quantity::from_units(3));
        assert_eq!(q("-3"), Quantity::from_units(-3));
        assert_eq!(q("1n"), Quantity::from_nanos(1));
        assert_eq!(q("250u"), Quantity::from_nanos(250_000));
        assert_eq!(q("3.75Gi"), Quantity::from_mebibytes(3840));
        assert_eq!(q("1Ei"), Quantity::from_units(1 << 60));
        assert_eq!(q("0.000000001"), Quantity::from_nanos(1));
        assert_eq!(
            q("1.000000000000000000000000000000000000000000"),
            Quantity::from_units(1)
        );
        assert_eq!(
            q("0000000000000000000000000000000000000000007"),
            Quantity::from_units(7)
        );
        assert_eq!(q("0e9999"), Quantity::ZERO);
    }

    #[test]
    fn orders_across_units() {
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("1k"), q("1e3"));
        assert!(q("1Ki") > q("1k"));
        assert!(q("999m") < q("1"));
        assert!(q("-1") < Quantity::ZERO);
    }

    #[test]
    fn rejects_malformed_input_with_the_text() {
        for bad in [
            "", "abc", "1.2.3", "5Gb", "1e", "1e+", "--1", "1 Gi", " 1", "Gi", ".", "1ee3", "1e3.5", "+",
        ] {
            let err = bad.parse::<Quantity>().unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        assert!(matches!(
            "0.1n".parse::<Quantity>(),
            Err(QuantityError::TooPrecise { .. })
        ));
        assert!(matches!(
            "1e999".parse::<Quantity>(),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert!(matches!(
            "1e99999".parse::<Quantity>(),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert!(matches!(
            "999999999999999999999999999999999999999999Ei".parse::<Quantity>(),
            Err(QuantityError::OutOfRange { .. })
        ));
    }

    #[test]
    fn byte_constructors_never_overflow() {
        assert_eq!(
            Quantity::from_gibibytes(i64::MAX).format(Notation::Binary),
            format!("{}Gi", i64::MAX)
        );
        assert_eq!(
            Quantity::from_mebibytes(i64::MIN).format(Notation::Binary),
            "-8388608Ei"
        ); // -2^63 Mi = -2^23 Ei
        assert_eq!(Quantity::from_gigabytes(3), q("3G"));
    }

    #[test]
    fn arithmetic_is_checked() {
        let max = Quantity::from_nanos(i128::MAX);
        assert_eq!(
            max.checked_add(Quantity::from_nanos(1)),
            Err(QuantityError::Overflow("addition"))
        );
        let min = Quantity::from_nanos(i128::MIN);
        assert_eq!(
            min.checked_sub(Quantity::from_nanos(1)),
            Err(QuantityError::Overflow("subtraction"))
        );
        assert!(max.checked_mul(2).is_err());
        assert_eq!(q("1").checked_add(q("500m")).unwrap(), q("1.5"));
        assert_eq!(q("1Gi").checked_sub(q("512Mi")).unwrap(), q("512Mi"));
        assert_eq!(q("1").saturating_sub_to_zero(q("2")), Quantity::ZERO);
        assert_eq!(min.saturating_sub_to_zero(max), Quantity::ZERO);
        assert_eq!(q("1500m").ceil_units(), 2);
        assert_eq!(q("2").ceil_units(), 2);
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(q("1.5").format(Notation::Decimal), "1500m");
        assert_eq!(q("4000m").format(Notation::Decimal), "4");
        assert_eq!(q("1.5u").format(Notation::Decimal), "1500n");
        assert_eq!(q("3.75Gi").format(Notation::Binary), "3840Mi");
        assert_eq!(q("2Gi").format(Notation::Binary), "2Gi");
        assert_eq!(q("2G").format(Notation::Binary), "1953125Ki");
        assert_eq!(q("1000").format(Notation::Binary), "1000");
        assert_eq!(q("0").format(Notation::Binary), "0");
        assert_eq!(q("500m").format(Notation::Binary), "500m");
        assert_eq!(q("-2Gi").format(Notation::Binary), "-2Gi");
    }

    #[test]
    fn json_accepts_strings_and_numbers() {
        let parsed: Vec<Quantity> = serde_json::from_str(r#"["4", 4, 0.5, "1Gi"]"#).unwrap();
        assert_eq!(parsed, vec![q("4"), q("4"), q("500m"), q("1Gi")]);
        assert!(serde_json::from_str::<Quantity>(r#""nope""#).is_err());
        assert_eq!(serde_json::to_string(&q("1500m")).unwrap(), r#""1500m""#);
    }

    #[test]
    fn the_exact_pattern_refuses_what_cannot_be_held_exactly() {
        let pattern = regex_lite::Regex::new(&exact_quantity_pattern()).unwrap();
        for good in [
            "500m",
            "2",
            "1.5Gi",
            "2G",
            "100Ki",
            "1e3",
            "0.5",
            ".5",
            "5.",
            "+3",
            "1E-3",
            "1500n",
            "1.5m",
            "0.000000001",
            "1000000000000000000000000000",
            "999999999Ei",
        ] {
            assert!(pattern.is_match(good), "{good}");
            assert!(good.parse::<Quantity>().is_ok(), "{good}");
        }
        for bad in [
            "-1",
            "1Gb",
            "",
            "abc",
            "1 Gi",
            "1e",
            "0.5n",
            "1.0000000001",
            "1e40",
            "1e10",
            "10000000000000000000000000000",
            "1.5u5",
            "1.0001u",
        ] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }

    #[test]
    fn schema_pattern_matches_the_parser() {
        let pattern = regex_lite::Regex::new(QUANTITY_PATTERN).unwrap();
        for good in [
            "500m", "2", "1.5Gi", "2G", "100Ki", "1e3", "0.5", ".5", "5.", "+3", "1E-3",
        ] {
            assert!(pattern.is_match(good), "{good}");
            assert!(good.parse::<Quantity>().is_ok(), "{good}");
        }
        for bad in ["-1", "1Gb", "", "abc", "1 Gi", "1e"] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }
}
