//! Encrypted QUIC-LB connection ids (draft-ietf-quic-load-balancers-21, §5.4 and §5.5).
//!
//! With a key, everything after the first octet (server id and nonce) is encrypted with
//! AES-128, so an observer can neither tell which server a connection is on nor link a
//! migrating client's old and new ids. The first octet stays as it is: the balancer needs its
//! config id to know which key to use. Two modes, chosen by the lengths alone:
//!
//! ```text
//! server id + nonce = 16 octets: one AES block, encrypted once        (single pass, §5.4.1)
//! any other length (5..=19):     a four-round Feistel network of AES  (four pass, §5.4.2)
//! ```

mod four_pass;

use aes::Aes128;
use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use spillway_common::quic_lb::key::QuicLbKey;
use spillway_common::quic_lb::{CidError, ConfigError, MAX_CID_LEN, QuicLbConfig, ServerId, decode_server_id, encode};

use self::four_pass::FourPass;

/// Octets of an AES block.
const BLOCK_LEN: usize = 16;

/// How a configuration with a key encrypts its ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// Server id and nonce make exactly one AES block, encrypted once (§5.4.1).
    SinglePass,
    /// Any other length: a four-round Feistel network whose round function is AES (§5.4.2).
    /// A balancer needs three rounds, or four when the server id is longer than the nonce
    /// (§5.5.2).
    FourPass,
}

impl Encryption {
    /// The mode the draft prescribes for `cfg`'s lengths.
    pub const fn of(cfg: &QuicLbConfig) -> Encryption {
        if cfg.server_id_len as usize + cfg.nonce_len as usize == BLOCK_LEN { Encryption::SinglePass } else { Encryption::FourPass }
    }
}

/// As logs name it: `single_pass`, `four_pass`.
impl core::fmt::Display for Encryption {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Encryption::SinglePass => "single_pass",
            Encryption::FourPass => "four_pass",
        })
    }
}

/// A configuration and its key: encodes and decodes its encrypted ids. The key lives on only
/// as AES's round keys, which are zeroed when this is dropped; `Debug` shows neither.
#[derive(Clone)]
pub struct CidCipher {
    cfg: QuicLbConfig,
    aes: Aes128,
}

impl CidCipher {
    /// `cfg` encrypted with `key`; refuses a configuration outside the draft's limits.
    pub fn new(cfg: QuicLbConfig, key: &QuicLbKey) -> Result<CidCipher, ConfigError> {
        cfg.validate()?;
        Ok(CidCipher { cfg, aes: Aes128::new(&Array::from(*key.octets())) })
    }

    pub fn config(&self) -> &QuicLbConfig {
        &self.cfg
    }

    pub fn encryption(&self) -> Encryption {
        Encryption::of(&self.cfg)
    }

    /// Writes the encrypted id of `server_id` and `nonce` into `out` and returns its length:
    /// the plaintext id of `common::quic_lb::encode` (whose errors these are), with all but
    /// its first octet encrypted. The nonce must never repeat under one key (§9.6).
    pub fn encode(&self, server_id: &ServerId, nonce: &[u8], low_bits: u8, out: &mut [u8; MAX_CID_LEN]) -> Result<usize, ConfigError> {
        let len = encode(&self.cfg, server_id, nonce, low_bits, out)?;
        self.encrypt(&mut out[1..len]);
        Ok(len)
    }

    /// The server id in the encrypted id `cid` (which may run on past the id, as a short
    /// header's does), or why the id is unroutable (§4.1).
    pub fn decode_server_id(&self, cid: &[u8]) -> Result<ServerId, CidError> {
        // The plaintext decoder checks only the first octet and the length before it reads
        // the server id, and encryption changes neither: check the id as it came (its server
        // id read is ciphertext, ignored), then read the server id of the decrypted octets.
        decode_server_id(cid, &self.cfg)?;
        let len = self.cfg.cid_len();
        let mut id = [0u8; MAX_CID_LEN];
        // The check made sure `cid` has `len` octets.
        id[..len].copy_from_slice(&cid[..len]);
        match self.encryption() {
            Encryption::SinglePass => self.single_pass(&mut id[1..len], Direction::Decrypt),
            Encryption::FourPass => self.four_pass().decrypt_server_id(&mut id[1..len], self.cfg.server_id_len as usize),
        }
        decode_server_id(&id[..len], &self.cfg)
    }

    /// Encrypts `plaintext`, server id and nonce, in place.
    fn encrypt(&self, plaintext: &mut [u8]) {
        match self.encryption() {
            Encryption::SinglePass => self.single_pass(plaintext, Direction::Encrypt),
            Encryption::FourPass => self.four_pass().encrypt(plaintext),
        }
    }

    /// `octets`, one block, through AES.
    fn single_pass(&self, octets: &mut [u8], direction: Direction) {
        let Ok(block) = <&mut [u8; BLOCK_LEN]>::try_from(octets) else { return };
        let mut array = Array::from(*block);
        match direction {
            Direction::Encrypt => self.aes.encrypt_block(&mut array),
            Direction::Decrypt => self.aes.decrypt_block(&mut array),
        }
        *block = array.into();
    }

    fn four_pass(&self) -> FourPass<'_> {
        FourPass::new(&self.aes, self.cfg.server_id_len as usize + self.cfg.nonce_len as usize)
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Encrypt,
    Decrypt,
}

impl core::fmt::Debug for CidCipher {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CidCipher").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

#[cfg(test)]
impl CidCipher {
    /// Decrypts all of `octets` (server id and nonce), nonce included, in place: what a test
    /// compares with the plaintext.
    pub(crate) fn decrypt_all(&self, octets: &mut [u8]) {
        match self.encryption() {
            Encryption::SinglePass => self.single_pass(octets, Direction::Decrypt),
            Encryption::FourPass => four_pass::tests::decrypt_all(&self.aes, octets),
        }
    }
}

#[cfg(test)]
mod tests;
