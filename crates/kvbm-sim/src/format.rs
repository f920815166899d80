//! Number formatting for the readable reports.

/// `1234567` as `1,234,567`.
pub(crate) fn group(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A rate in `0.0..=1.0` as a percentage with two decimals: `16.12%`.
pub(crate) fn percent(rate: f64) -> String {
    format!("{:.2}%", rate * 100.0)
}

/// A byte count in gigabytes (10^9 bytes) with two decimals, `12.00 GB`;
/// counts under 10 MB in megabytes and under 10 kB in bytes, so a small
/// number never reads as zero.
pub(crate) fn gigabytes(bytes: &u64) -> String {
    match *bytes {
        bytes if bytes >= 10_000_000 => format!("{:.2} GB", bytes as f64 / 1e9),
        bytes if bytes >= 10_000 => format!("{:.2} MB", bytes as f64 / 1e6),
        bytes => format!("{bytes} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(144_793_823), "144,793,823");
        assert_eq!(percent(0.366_412), "36.64%");
        assert_eq!(gigabytes(&12_000_000_000), "12.00 GB");
        assert_eq!(gigabytes(&45_678_901), "0.05 GB");
        assert_eq!(gigabytes(&9_999_999), "10.00 MB");
        assert_eq!(gigabytes(&12_345), "0.01 MB");
        assert_eq!(gigabytes(&9_999), "9999 bytes");
    }
}
