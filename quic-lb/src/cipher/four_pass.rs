//! The four-pass mode (§5.4.2, §5.5.2): server id and nonce, `len` octets, split into two
//! halves of `half_len` = `len` / 2 rounded up octets; in each pass one half is expanded to a
//! block, encrypted, and XORed into the other. With an odd `len` the middle octet is shared:
//! the left half keeps its high four bits, the right half its low four, and every pass clears
//! the other four again.

use aes::Aes128;
use aes::cipher::{Array, BlockCipherEncrypt};
use spillway_common::quic_lb::MAX_PLAINTEXT_LEN;

use super::BLOCK_LEN;

/// The longest half: half of the longest plaintext, rounded up.
const MAX_HALF_LEN: usize = (MAX_PLAINTEXT_LEN as usize).div_ceil(2);

/// A half, zero past its `half_len` octets, so that expanding it is a copy.
type Half = [u8; MAX_HALF_LEN];

/// The passes in encryption's order; decryption runs them backwards.
const PASSES: core::ops::RangeInclusive<u8> = 1..=4;

pub(super) struct FourPass<'a> {
    aes: &'a Aes128,
    len: usize,
    half_len: usize,
}

impl<'a> FourPass<'a> {
    /// For `len` octets of server id and nonce (5..=19, as a valid configuration has).
    pub(super) fn new(aes: &'a Aes128, len: usize) -> FourPass<'a> {
        FourPass { aes, len, half_len: len.div_ceil(2) }
    }

    pub(super) fn encrypt(&self, octets: &mut [u8]) {
        let (mut left, mut right) = self.split(octets);
        for pass in PASSES {
            self.pass(pass, &mut left, &mut right);
        }
        self.join(&left, &right, octets);
    }

    /// Decrypts `octets` far enough to read their first `server_id_len`: three passes when the
    /// server id lies in the left half (it is no longer than the nonce), four otherwise
    /// (§5.5.2). After three passes the right half is not yet plaintext.
    pub(super) fn decrypt_server_id(&self, octets: &mut [u8], server_id_len: usize) {
        let first = if 2 * server_id_len <= self.len { 2 } else { 1 };
        self.decrypt_from(octets, first);
    }

    /// Runs the passes from the fourth back to `first`.
    fn decrypt_from(&self, octets: &mut [u8], first: u8) {
        let (mut left, mut right) = self.split(octets);
        for pass in PASSES.rev().take_while(|&pass| pass >= first) {
            self.pass(pass, &mut left, &mut right);
        }
        self.join(&left, &right, octets);
    }

    fn odd(&self) -> bool {
        self.len % 2 == 1
    }

    /// Passes 1 and 3 change the right half, 2 and 4 the left, each from the other; the
    /// same step undoes itself, so encryption and decryption differ only in the order.
    fn pass(&self, pass: u8, left: &mut Half, right: &mut Half) {
        if pass % 2 == 1 {
            self.mix(pass, left, right);
        } else {
            self.mix(pass, right, left);
        }
        self.clear_shared_bits(left, right);
    }

    /// `into` ^= the first `half_len` octets of AES(expand(len, pass, `from`)).
    fn mix(&self, pass: u8, from: &Half, into: &mut Half) {
        let mut block = [0u8; BLOCK_LEN];
        // expand (§5.4.2): the half, zeros, then the plaintext's length and the pass, so
        // every pass of every length encrypts a different block.
        block[..MAX_HALF_LEN].copy_from_slice(from);
        block[BLOCK_LEN - 2] = self.len as u8;
        block[BLOCK_LEN - 1] = pass;
        let mut block = Array::from(block);
        self.aes.encrypt_block(&mut block);
        for (octet, key) in into[..self.half_len].iter_mut().zip(block.iter()) {
            *octet ^= key;
        }
    }

    /// With an odd length, the left half's last four bits and the right half's first four
    /// belong to the other half: zero.
    fn clear_shared_bits(&self, left: &mut Half, right: &mut Half) {
        if self.odd() {
            left[self.half_len - 1] &= 0xf0;
            right[0] &= 0x0f;
        }
    }

    /// The halves of `octets`: the first and the last `half_len` octets, which overlap by the
    /// middle octet when the length is odd.
    fn split(&self, octets: &[u8]) -> (Half, Half) {
        let (mut left, mut right) = ([0u8; MAX_HALF_LEN], [0u8; MAX_HALF_LEN]);
        left[..self.half_len].copy_from_slice(&octets[..self.half_len]);
        right[..self.half_len].copy_from_slice(&octets[self.len - self.half_len..self.len]);
        self.clear_shared_bits(&mut left, &mut right);
        (left, right)
    }

    /// `octets` of the halves: the inverse of [`Self::split`].
    fn join(&self, left: &Half, right: &Half, octets: &mut [u8]) {
        let shared = 2 * self.half_len - self.len;
        octets[..self.half_len].copy_from_slice(&left[..self.half_len]);
        octets[self.half_len..self.len].copy_from_slice(&right[shared..self.half_len]);
        if self.odd() {
            octets[self.half_len - 1] |= right[0];
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Every pass, so a test can compare the whole plaintext, nonce included.
    pub(in super::super) fn decrypt_all(aes: &Aes128, octets: &mut [u8]) {
        FourPass::new(aes, octets.len()).decrypt_from(octets, 1);
    }

    /// The draft's worked example (§5.4.2, "Encryption Example"), pass by pass.
    #[test]
    fn the_drafts_encryption_example() {
        use aes::cipher::KeyInit;
        let aes = Aes128::new(&Array::from(hex::<16>("fdf726a9893ec05c0632d3956680baf0")));
        let mut octets = hex::<7>("31441a9c69c275");
        let four = FourPass::new(&aes, octets.len());
        let (mut left, mut right) = four.split(&octets);
        assert_eq!((&left[..4], &right[..4]), (&hex::<4>("31441a90")[..], &hex::<4>("0c69c275")[..]));
        let after = [("31441a90", "0e3c1ff9"), ("d4a04850", "0e3c1ff9"), ("d4a04850", "09be054a"), ("67947d20", "09be054a")];
        for (pass, (l, r)) in PASSES.zip(after) {
            four.pass(pass, &mut left, &mut right);
            assert_eq!((&left[..4], &right[..4]), (&hex::<4>(l)[..], &hex::<4>(r)[..]), "after pass {pass}");
        }
        four.encrypt(&mut octets);
        assert_eq!(octets, hex::<7>("67947d29be054a"));
        decrypt_all(&aes, &mut octets);
        assert_eq!(octets, hex::<7>("31441a9c69c275"));
    }

    pub(in super::super) fn hex<const N: usize>(digits: &str) -> [u8; N] {
        let mut out = [0u8; N];
        assert_eq!(digits.len(), 2 * N, "{digits}");
        for (i, octet) in out.iter_mut().enumerate() {
            *octet = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
}
