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

use super::{CidError, MAX_CID_LEN, QuicLbConfig, ServerId, check};

/// Octets of an AES block.
pub const BLOCK_LEN: usize = 16;
/// One AES block.
pub type Block = [u8; BLOCK_LEN];
/// The octets after a connection id's first: [`super::MAX_PLAINTEXT_LEN`] at most are read, the
/// rest is room so that every index the decoder computes is masked into the array (the
/// verifier then proves each access without a branch of its own).
pub type Sealed = [u8; SEALED_LEN];
const SEALED_LEN: usize = 32;
/// A half of the Feistel network (10 octets at most), in an array indexed under a mask.
type Half = [u8; BLOCK_LEN];
/// Where `expand` writes the plaintext's length and the pass (§5.4.2 "expand").
const EXPAND_LEN_AT: usize = 14;
const EXPAND_PASS_AT: usize = 15;

/// The decoder's working memory: on the stack on a host, in a per-CPU map in XDP (the
/// program's stack has no room for it beside the forwarding path's). `sealed` is the input.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Scratch {
    pub sealed: Sealed,
    left: Half,
    right: Half,
    block: Block,
}

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
/// octets are `scratch.sealed` (past the configuration's length: anything, not read), under
/// `cfg`, the configuration its config id names; `cipher` holds that configuration's key.
///
/// Written without a branch on the lengths but the mode's and the fourth pass's: each octet
/// is masked in or out ([`below`]), so the verifier walks the decoder once, not once per
/// length (a branch per octet made it walk 300k instructions).
#[inline(always)]
pub fn decrypt_server_id(
    first: u8,
    scratch: &mut Scratch,
    cfg: &QuicLbConfig,
    cipher: &mut impl BlockCipher,
) -> Result<ServerId, SealedError> {
    // The caller read MAX_CID_LEN octets (a short header always has them).
    check(first, MAX_CID_LEN, cfg)?;
    let mut id = ServerId { len: cfg.server_id_len, ..ServerId::default() };
    let sid_len = cfg.server_id_len as usize;
    let s = scratch;
    if is_single_pass(cfg) {
        let mut i = 0;
        while i < BLOCK_LEN {
            s.block[i] = s.sealed[i];
            i += 1;
        }
        if !cipher.decrypt(&mut s.block) {
            return Err(SealedError::Cipher);
        }
        let mut i = 0;
        while i < id.bytes.len() {
            id.bytes[i] = s.block[i] & below(i, sid_len);
            i += 1;
        }
        return Ok(id);
    }
    // `check` bounds both lengths: 5..=19 octets, halves of 3..=10.
    let len = sid_len + cfg.nonce_len as usize;
    let half = len.div_ceil(2);
    // 0xff for an odd length, whose halves share the middle octet's nibbles.
    let odd = 0u8.wrapping_sub((len & 1) as u8);
    // left_2 and right_2: the first and last `half` octets.
    let mut i = 0;
    while i < BLOCK_LEN {
        let inside = below(i, half);
        s.left[i] = s.sealed[i] & inside;
        s.right[i] = s.sealed[(len - half + i) & (SEALED_LEN - 1)] & inside;
        i += 1;
    }
    // Of an odd length, left keeps the shared octet's high nibble and right its low one.
    let clear = |s: &mut Scratch| {
        s.left[(half - 1) & (BLOCK_LEN - 1)] &= !(0x0f & odd);
        s.right[0] &= !(0xf0 & odd);
    };
    clear(s);
    // Passes 4, 3 and 2 give left_0; pass 1 gives right_0, needed only when the server id
    // does not fit in left_0's whole octets.
    round(s, Into::Left, len, half, 4, cipher)?;
    clear(s);
    round(s, Into::Right, len, half, 3, cipher)?;
    clear(s);
    round(s, Into::Left, len, half, 2, cipher)?;
    clear(s);
    let whole_in_left = half - (len & 1);
    if sid_len > whole_in_left {
        round(s, Into::Right, len, half, 1, cipher)?;
        clear(s);
    }
    // plaintext[i] = left_0[i] | right_0[i - (len - half)]: the halves overlap in one octet
    // of an odd length, where each holds a nibble.
    let mut i = 0;
    while i < id.bytes.len() {
        let from_left = s.left[i] & below(i, half);
        let from_right = s.right[(i + half).wrapping_sub(len) & (BLOCK_LEN - 1)] & !below(i + half, len);
        id.bytes[i] = (from_left | from_right) & below(i, sid_len);
        i += 1;
    }
    Ok(id)
}

/// 0xff when `i < n`, else 0, without a branch: the sign of `i - n`, spread.
#[inline(always)]
pub const fn below(i: usize, n: usize) -> u8 {
    ((i as isize).wrapping_sub(n as isize) >> (isize::BITS - 1)) as u8
}

/// The half a round writes; it expands the other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Into {
    Left,
    Right,
}

/// One Feistel round: `target ^= truncate(AES_ECB(key, expand(len, pass, source)), half)`.
#[inline(always)]
fn round(s: &mut Scratch, into: Into, len: usize, half: usize, pass: u8, cipher: &mut impl BlockCipher) -> Result<(), SealedError> {
    let mut i = 0;
    while i < EXPAND_LEN_AT {
        let source = if into == Into::Left { s.right[i] } else { s.left[i] };
        s.block[i] = source & below(i, half);
        i += 1;
    }
    s.block[EXPAND_LEN_AT] = len as u8;
    s.block[EXPAND_PASS_AT] = pass;
    if !cipher.encrypt(&mut s.block) {
        return Err(SealedError::Cipher);
    }
    let mut i = 0;
    while i < BLOCK_LEN {
        let pad = s.block[i] & below(i, half);
        if into == Into::Left {
            s.left[i] ^= pad;
        } else {
            s.right[i] ^= pad;
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quic_lb::{QUIC_LB_F_SELF_LEN, tests::hex};
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

    /// The draft's key for every encrypted vector (appendix B.2).
    fn draft_key() -> Soft {
        let key: [u8; 16] = hex("8f95f09245765f80256934e50c66207f").try_into().unwrap();
        Soft(aes::Aes128::new(&key.into()))
    }

    fn decoded(config_id: u8, sid_len: u8, nonce_len: u8, cid: &str) -> Result<ServerId, SealedError> {
        let cfg = QuicLbConfig { config_id, server_id_len: sid_len, nonce_len, flags: QUIC_LB_F_SELF_LEN };
        let cid = hex(cid);
        let mut scratch = Scratch::default();
        scratch.sealed[..cid.len() - 1].copy_from_slice(&cid[1..]);
        decrypt_server_id(cid[0], &mut scratch, &cfg, &mut draft_key())
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
