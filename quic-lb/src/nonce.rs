//! Nonces for encrypted ids: a counter from a random start (§9.6, "Connection ID Entropy").
//!
//! Under a key a nonce must never repeat: the same server id and nonce give the same id, so
//! two clients would share it (and each other's stateless reset token), and repeats help an
//! attacker at the key. Random nonces of N bits repeat after about 2^(N/2) ids; a counter
//! only after all 2^N. The random start keeps a server's first ids unlike another's. Without
//! a key the nonce must look unrelated to the last one, so plaintext ids draw random nonces
//! instead.

use spillway_common::quic_lb::{MAX_PLAINTEXT_LEN, MIN_SERVER_ID_LEN};

/// The longest nonce: all of the plaintext but the shortest server id.
pub(crate) const MAX_NONCE_LEN: usize = (MAX_PLAINTEXT_LEN - MIN_SERVER_ID_LEN) as usize;

/// A nonce, in its first `len` octets.
pub(crate) type Nonce = [u8; MAX_NONCE_LEN];

/// Counts through every nonce of `len` octets once, big-endian, wrapping past the largest,
/// from a random start; then has none left.
pub(crate) struct NonceCounter {
    len: usize,
    start: Nonce,
    next: Nonce,
    exhausted: bool,
}

impl NonceCounter {
    /// A counter of `len` octets (at most [`MAX_NONCE_LEN`]) from a random start.
    pub(crate) fn random(len: usize, rng: &mut impl rand::Rng) -> NonceCounter {
        let len = len.min(MAX_NONCE_LEN);
        let mut start = [0u8; MAX_NONCE_LEN];
        rng.fill_bytes(&mut start[..len]);
        NonceCounter { len, start, next: start, exhausted: false }
    }

    /// The next nonce, or None once every nonce of this length has been given out.
    pub(crate) fn take(&mut self) -> Option<Nonce> {
        if self.exhausted {
            return None;
        }
        let nonce = self.next;
        for octet in self.next[..self.len].iter_mut().rev() {
            *octet = octet.wrapping_add(1);
            if *octet != 0 {
                break;
            }
        }
        self.exhausted = self.next == self.start;
        Some(nonce)
    }
}

#[cfg(test)]
impl NonceCounter {
    /// As after its last nonce: what a test of its user starts from instead of 2^32 ids.
    pub(crate) fn use_up(&mut self) {
        self.exhausted = true;
    }
}

/// Shows no nonce: the next ones are known plaintext to whoever sees them.
impl core::fmt::Debug for NonceCounter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NonceCounter").field("len", &self.len).field("exhausted", &self.exhausted).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn counts_with_carry_and_wraps_past_the_largest() {
        let mut counter = NonceCounter::random(4, &mut StdRng::seed_from_u64(1));
        counter.next[..4].copy_from_slice(&[0x00, 0x01, 0xff, 0xff]);
        assert_eq!(counter.take().unwrap()[..4], [0x00, 0x01, 0xff, 0xff]);
        assert_eq!(counter.take().unwrap()[..4], [0x00, 0x02, 0x00, 0x00]);
        counter.next[..4].copy_from_slice(&[0xff; 4]);
        assert_eq!(counter.take().unwrap()[..4], [0xff; 4]);
        assert_eq!(counter.take().unwrap()[..4], [0; 4]);
        // Only the nonce's own octets count.
        assert!(counter.next[4..].iter().all(|&octet| octet == 0));
    }

    /// After every nonce of its length, none: the last one is the one before the start.
    #[test]
    fn stops_at_its_start_again() {
        let mut counter = NonceCounter::random(4, &mut StdRng::seed_from_u64(2));
        let start = counter.start;
        let first = counter.take().unwrap();
        assert_eq!(first, start);
        // Skip to the last nonce before the start (start - 1, big-endian).
        let before = u32::from_be_bytes(start[..4].try_into().unwrap()).wrapping_sub(1);
        counter.next[..4].copy_from_slice(&before.to_be_bytes());
        assert_eq!(counter.take().unwrap()[..4], before.to_be_bytes());
        assert_eq!(counter.take(), None);
        assert_eq!(counter.take(), None);
    }

    #[test]
    fn random_starts_and_no_repeats() {
        let mut rng = StdRng::seed_from_u64(3);
        let starts: HashSet<Nonce> = (0..16).map(|_| NonceCounter::random(18, &mut rng).start).collect();
        assert_eq!(starts.len(), 16);
        let mut counter = NonceCounter::random(4, &mut rng);
        let taken: HashSet<Nonce> = (0..1000).map(|_| counter.take().unwrap()).collect();
        assert_eq!(taken.len(), 1000);
    }

    #[test]
    fn debug_shows_no_nonce() {
        let counter = NonceCounter::random(4, &mut StdRng::seed_from_u64(4));
        assert_eq!(format!("{counter:?}"), "NonceCounter { len: 4, exhausted: false, .. }");
    }
}
