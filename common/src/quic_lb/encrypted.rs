//! QUIC-LB's encrypted connection ids (draft §5.4-5.5): how the balancer reads the server id
//! back, given AES-128-ECB with the configuration's key ([`BlockCipher`]: the kernel's crypto
//! kfuncs in the data path, a software AES in tests).
//!
//! With server id and nonce summing to 16 octets they are one AES block ("single pass",
//! §5.4.1, one decryption). Otherwise they are a 4-round Feistel network whose round function
//! is AES-ECB *encryption* of one half, expanded to a block (§5.4.2): the balancer undoes 3
//! rounds, or 4 when the server id reaches into the right half (§5.5.2).
//!
//! No allocation, no panics, every loop bounded by a constant: the XDP program uses it as is.

use super::{CidError, MAX_PLAINTEXT_LEN, QuicLbConfig, ServerId, check};
use crate::quic_lb::MAX_CID_LEN;

/// Octets of an AES block.
pub const BLOCK_LEN: usize = 16;
/// One AES block.
pub type Block = [u8; BLOCK_LEN];
/// The octets after a connection id's first, as many as any configuration encrypts.
pub type Sealed = [u8; MAX_PLAINTEXT_LEN as usize];
/// The longest half of the Feistel network: 19 octets, halved, rounded up.
const HALF_MAX: usize = (MAX_PLAINTEXT_LEN as usize).div_ceil(2);
/// Where `expand` writes the plaintext's length and the pass (§5.4.2 "expand").
const EXPAND_LEN_AT: usize = 14;
const EXPAND_PASS_AT: usize = 15;

/// AES-128-ECB under one configuration's key, one block in place. `false`: the block could
/// not be processed (the data path's kfunc failed); the id is then not decoded.
pub trait BlockCipher {
    fn encrypt(&mut self, block: &mut Block) -> bool;
    fn decrypt(&mut self, block: &mut Block) -> bool;
}

/// Why an encrypted id yields no server id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealedError {
    /// What [`CidError`] says of any id (§4.1).
    Cid(CidError),
    /// The cipher failed.
    Cipher,
}

impl From<CidError> for SealedError {
    fn from(e: CidError) -> Self {
        SealedError::Cid(e)
    }
}

/// Whether `cfg`'s ids are one AES block after the first octet (§5.4.1).
#[inline(always)]
pub const fn is_single_pass(cfg: &QuicLbConfig) -> bool {
    cfg.server_id_len as usize + cfg.nonce_len as usize == BLOCK_LEN
}

/// The server id of an encrypted connection id whose first octet is `first` and whose next
/// octets are `sealed` (past the configuration's length: anything, not read), under `cfg`,
/// the configuration its config id names; `cipher` holds that configuration's key.
#[inline(always)]
pub fn decrypt_server_id(first: u8, sealed: &Sealed, cfg: &QuicLbConfig, cipher: &mut impl BlockCipher) -> Result<ServerId, SealedError> {
    // The caller read MAX_CID_LEN octets (a short header always has them, §5.5 of quic.rs).
    check(first, MAX_CID_LEN, cfg)?;
    let mut id = ServerId { len: cfg.server_id_len, ..ServerId::default() };
    if is_single_pass(cfg) {
        let mut block = [0u8; BLOCK_LEN];
        copy(&mut block, 0, sealed, 0, BLOCK_LEN);
        if !cipher.decrypt(&mut block) {
            return Err(SealedError::Cipher);
        }
        copy(&mut id.bytes, 0, &block, 0, cfg.server_id_len as usize);
        return Ok(id);
    }
    let len = cfg.server_id_len as usize + cfg.nonce_len as usize;
    let half = len.div_ceil(2);
    let odd = len % 2 == 1;
    // left_2 and right_2: the first and last `half` octets; of an odd length, the nibble
    // both share is cleared in each (left keeps the high one, right the low one).
    let mut left = [0u8; HALF_MAX];
    let mut right = [0u8; HALF_MAX];
    copy(&mut left, 0, sealed, 0, half);
    copy(&mut right, 0, sealed, len - half, half);
    let clear = |left: &mut [u8; HALF_MAX], right: &mut [u8; HALF_MAX]| {
        if odd {
            if let Some(last) = left.get_mut(half - 1) {
                *last &= 0xf0;
            }
            right[0] &= 0x0f;
        }
    };
    clear(&mut left, &mut right);
    // Passes 4, 3 and 2 give left_0; pass 1 gives right_0, needed only when the server id
    // does not fit in left_0's whole octets.
    round(&mut left, &right, len, half, 4, cipher)?;
    clear(&mut left, &mut right);
    round(&mut right, &left, len, half, 3, cipher)?;
    clear(&mut left, &mut right);
    round(&mut left, &right, len, half, 2, cipher)?;
    clear(&mut left, &mut right);
    let whole_in_left = if odd { half - 1 } else { half };
    if cfg.server_id_len as usize > whole_in_left {
        round(&mut right, &left, len, half, 1, cipher)?;
        clear(&mut left, &mut right);
    }
    // plaintext[i] = left_0[i] | right_0[i - (len - half)]: the halves overlap in one octet
    // of an odd length, where each holds a nibble.
    let mut i = 0;
    while i < HALF_MAX * 2 && i < cfg.server_id_len as usize {
        let from_left = if i < half { left.get(i).copied().unwrap_or(0) } else { 0 };
        let from_right = if i + half >= len { right.get(i + half - len).copied().unwrap_or(0) } else { 0 };
        if let Some(octet) = id.bytes.get_mut(i) {
            *octet = from_left | from_right;
        }
        i += 1;
    }
    Ok(id)
}

/// One Feistel round: `target ^= truncate(AES_ECB(key, expand(len, pass, source)), half)`.
#[inline(always)]
fn round(
    target: &mut [u8; HALF_MAX],
    source: &[u8; HALF_MAX],
    len: usize,
    half: usize,
    pass: u8,
    cipher: &mut impl BlockCipher,
) -> Result<(), SealedError> {
    let mut block = [0u8; BLOCK_LEN];
    copy(&mut block, 0, source, 0, half);
    block[EXPAND_LEN_AT] = len as u8;
    block[EXPAND_PASS_AT] = pass;
    if !cipher.encrypt(&mut block) {
        return Err(SealedError::Cipher);
    }
    let mut i = 0;
    while i < HALF_MAX && i < half {
        if let (Some(t), Some(b)) = (target.get_mut(i), block.get(i)) {
            *t ^= *b;
        }
        i += 1;
    }
    Ok(())
}

/// `dst[dst_at..][..len] = src[src_at..][..len]`, octet by octet, at most a block.
#[inline(always)]
fn copy(dst: &mut [u8], dst_at: usize, src: &[u8], src_at: usize, len: usize) {
    let mut i = 0;
    while i < BLOCK_LEN + 4 && i < len {
        if let (Some(d), Some(s)) = (dst.get_mut(dst_at + i), src.get(src_at + i)) {
            *d = *s;
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quic_lb::QUIC_LB_F_SELF_LEN;
    use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

    struct Soft(aes::Aes128);

    impl BlockCipher for Soft {
        fn encrypt(&mut self, block: &mut Block) -> bool {
            self.0.encrypt_block(block.into());
            true
        }
        fn decrypt(&mut self, block: &mut Block) -> bool {
            self.0.decrypt_block(block.into());
            true
        }
    }

    fn hex(s: &str) -> std::vec::Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The draft's key for every encrypted vector (appendix B.2).
    fn draft_key() -> Soft {
        let key: [u8; 16] = hex("8f95f09245765f80256934e50c66207f").try_into().unwrap();
        Soft(aes::Aes128::new(&key.into()))
    }

    fn decoded(config_id: u8, sid_len: u8, nonce_len: u8, cid: &str) -> Result<ServerId, SealedError> {
        let cfg = QuicLbConfig { config_id, server_id_len: sid_len, nonce_len, flags: QUIC_LB_F_SELF_LEN };
        let cid = hex(cid);
        let mut sealed = [0u8; MAX_PLAINTEXT_LEN as usize];
        sealed[..cid.len() - 1].copy_from_slice(&cid[1..]);
        decrypt_server_id(cid[0], &sealed, &cfg, &mut draft_key())
    }

    /// Appendix B.2, "Encrypted CIDs": odd length, 3 passes; 4 passes (the server id is longer
    /// than the nonce); single pass; and odd with 4 passes. The last vector is printed with
    /// first octet 0x12 (config 0) where its config rotation bits are 3: the first octet is
    /// not encrypted, so it is read here with 0x72.
    #[test]
    fn the_drafts_encrypted_vectors() {
        assert_eq!(decoded(0, 3, 4, "0720b1d07b359d3c").unwrap().as_bytes(), hex("ed793a"));
        assert_eq!(decoded(1, 10, 5, "2fcc381bc74cb4fbad2823a3d1f8fed2").unwrap().as_bytes(), hex("ed793a51d49b8f5fab65"));
        assert_eq!(decoded(2, 8, 8, "504dd2d05a7b0de9b2b9907afb5ecf8cc3").unwrap().as_bytes(), hex("ed793a51d49b8f5f"));
        assert_eq!(decoded(3, 9, 9, "725779c9cc86beb3a3a4a3ca96fce4bfe0cdbc").unwrap().as_bytes(), hex("ed793a51d49b8f5fab"));
    }

    #[test]
    fn the_first_octet_is_checked_as_for_plaintext_ids() {
        assert_eq!(decoded(1, 3, 4, "0720b1d07b359d3c"), Err(SealedError::Cid(CidError::UnknownConfig { config_id: 0 })));
    }
}
