//! A QUIC-LB key (draft §5.4): the 16 octets of AES-128 the servers encrypt their connection
//! ids with and the balancer decrypts them with. Operators give it to both in a file of 32
//! hexadecimal digits, so one file serves `lbd` and every server of a config id.

use core::fmt;

/// Octets in a key: AES-128.
pub const KEY_LEN: usize = 16;

/// A key, read from its file's text. Its `Debug` never shows the octets, so a key cannot reach
/// a log line by accident; the octets are overwritten when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct QuicLbKey([u8; KEY_LEN]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a QUIC-LB key is 32 hexadecimal digits (16 octets); found {found} characters")]
    Length { found: usize },
    #[error("a QUIC-LB key is 32 hexadecimal digits; character {at} is not one")]
    NotHex { at: usize },
}

impl QuicLbKey {
    pub const fn new(octets: [u8; KEY_LEN]) -> Self {
        Self(octets)
    }

    /// A key file's text: 32 hexadecimal digits, either case; white space around them (a
    /// trailing newline) is ignored, anything else is refused.
    pub fn from_file_text(text: &str) -> Result<Self, KeyError> {
        let digits = text.trim_matches(|c: char| c.is_ascii_whitespace());
        if digits.len() != 2 * KEY_LEN {
            return Err(KeyError::Length { found: digits.chars().count() });
        }
        let leading = text.len() - text.trim_start_matches(|c: char| c.is_ascii_whitespace()).len();
        let mut octets = [0u8; KEY_LEN];
        for (i, pair) in digits.as_bytes().as_chunks::<2>().0.iter().enumerate() {
            let digit = |j: usize| (pair[j] as char).to_digit(16).ok_or(KeyError::NotHex { at: leading + 2 * i + j + 1 });
            octets[i] = (digit(0)? << 4 | digit(1)?) as u8;
        }
        Ok(Self(octets))
    }

    pub fn octets(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for QuicLbKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("QuicLbKey(..)")
    }
}

impl Drop for QuicLbKey {
    fn drop(&mut self) {
        for octet in self.0.iter_mut() {
            // SAFETY: a valid, aligned pointer to a u8 this value owns; volatile so the
            // compiler keeps the write of memory about to be freed.
            unsafe { core::ptr::write_volatile(octet, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_32_hex_digits_and_white_space_around_them() {
        let key = QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f\n").unwrap();
        assert_eq!(key.octets()[..3], [0x8f, 0x95, 0xf0]);
        assert_eq!(QuicLbKey::from_file_text("  8F95F09245765F80256934E50C66207F"), Ok(key));
    }

    #[test]
    fn anything_else_is_refused_saying_where() {
        assert_eq!(QuicLbKey::from_file_text("8f95"), Err(KeyError::Length { found: 4 }));
        assert_eq!(QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f00"), Err(KeyError::Length { found: 34 }));
        assert_eq!(QuicLbKey::from_file_text("\n8f95f09245765f80256934e50c66207x"), Err(KeyError::NotHex { at: 33 }));
        assert_eq!(QuicLbKey::from_file_text("8f95f092 5765f80256934e50c66207f"), Err(KeyError::NotHex { at: 9 }));
    }

    #[test]
    fn debug_never_shows_the_octets() {
        let key = QuicLbKey::new([0xab; KEY_LEN]);
        assert_eq!(std::format!("{key:?}"), "QuicLbKey(..)");
    }
}
