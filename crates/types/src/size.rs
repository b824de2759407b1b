//! Byte sizes as people write them. Suffixes are binary (K = 1024), as in
//! qemu-img and LVM: `512M`, `32G`, `4T`, `4096`, `1.5G`, `64KiB`.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("size is empty: give a number with an optional suffix K, M, G, T or P (e.g. 32G)")]
    Empty,
    #[error("size '{0}' is not a number with an optional suffix K, M, G, T or P (e.g. 512M, 32G)")]
    Malformed(String),
    #[error("size '{0}' is larger than 2^64 - 1 bytes")]
    TooLarge(String),
}

const UNITS: [(char, u32); 5] = [('K', 10), ('M', 20), ('G', 30), ('T', 40), ('P', 50)];

/// Parses `512M`, `32G`, `4T`, `1.5G`, `64KiB`, `4096` into bytes.
/// Fractions are allowed as long as the result is a whole number of bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(SizeError::Empty);
    }
    let malformed = || SizeError::Malformed(text.to_string());
    let upper = text.to_ascii_uppercase();
    let without_bytes = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (number, shift) = match without_bytes.chars().last() {
        Some(last) if last.is_ascii_alphabetic() => {
            let shift = UNITS
                .iter()
                .find(|(unit, _)| *unit == last)
                .map(|(_, shift)| *shift)
                .ok_or_else(malformed)?;
            (&without_bytes[..without_bytes.len() - 1], shift)
        }
        _ => (without_bytes, 0),
    };
    if upper.ends_with("IB") && shift == 0 {
        return Err(malformed());
    }
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || fraction.len() > 9 {
        return Err(malformed());
    }
    let too_large = || SizeError::TooLarge(text.to_string());
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let mut bytes = whole.checked_shl(shift).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        let denominator = 10u128.pow(fraction.len() as u32);
        let numerator: u128 = fraction.parse().map_err(|_| malformed())?;
        let scaled = numerator << shift;
        if !scaled.is_multiple_of(denominator) {
            return Err(malformed());
        }
        bytes += scaled / denominator;
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Formats bytes for people: `0 B`, `4.0 KiB`, `512 MiB`, `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const NAMES: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < NAMES.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", NAMES[unit])
    } else {
        format!("{value:.1} {}", NAMES[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_write() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("32G"), Ok(32 << 30));
        assert_eq!(parse_size("4T"), Ok(4 << 40));
        assert_eq!(parse_size("4t"), Ok(4 << 40));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn refuses_the_rest_with_a_reason() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("12X"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("-1G"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("G"), Err(SizeError::Malformed(_))));
        assert!(matches!(parse_size("0.3"), Err(SizeError::Malformed(_))));
        assert!(parse_size("16P").is_ok());
        assert!(matches!(parse_size("16384P"), Err(SizeError::TooLarge(_))));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(text in ".{0,24}") {
            let _ = parse_size(&text);
        }

        #[test]
        fn round_trips_plain_numbers(bytes in proptest::num::u64::ANY) {
            proptest::prop_assert_eq!(parse_size(&bytes.to_string()), Ok(bytes));
        }
    }
}
