//! Fractions of the health policy (validated to lie in 0..=1) applied to weights.

/// `fraction` of `value`, rounded down (fractions are validated to lie in 0..=1).
pub(super) fn share(value: u64, fraction: f64) -> u64 {
    ((value as f64) * fraction).floor() as u64
}

/// `fraction` in thousandths, rounded to nearest.
pub(super) fn permille(fraction: f64) -> u64 {
    (fraction * 1000.0).round() as u64
}
