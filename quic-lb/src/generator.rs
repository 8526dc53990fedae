//! [`QuicLbGenerator`]: the quinn `ConnectionIdGenerator` of a server behind a QUIC VIP.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::Rng;
use spillway_common::quic_lb::key::QuicLbKey;
use spillway_common::quic_lb::{
    CONFIG_ID_UNROUTABLE, ConfigError, FIRST_OCTET_LEN_MASK, MAX_CID_LEN, QuicLbConfig, ServerId, decode_server_id, encode,
};

use crate::cipher::{CidCipher, Encryption};
use crate::nonce::NonceCounter;

/// Issues connection ids that name one server under one configuration, plaintext or
/// encrypted, and moves to a new configuration when told ([`Self::rotate`]).
///
/// Plaintext ids take random nonces, not a counter: with no key the draft wants nonces with
/// "no observable relationship" to earlier ones (§5.4). quinn draws again when an id collides
/// with a live one of the endpoint, so a short nonce repeats only across connections that are
/// gone. Encrypted ids take a counter's nonces, which never repeat under the key (§9.6).
/// Clones share all of it (quinn asks the factory for one generator per endpoint): every
/// endpoint built from one generator draws from one counter and rotates with it.
#[derive(Clone, Debug)]
pub struct QuicLbGenerator {
    configs: Arc<RwLock<Configs>>,
    lifetime: Option<Duration>,
}

/// The configuration new ids are issued under, and the one before it, whose ids the
/// connections made before the rotation go on using (§3.1: two config ids live at once).
#[derive(Debug)]
struct Configs {
    current: Issuer,
    previous: Option<Issuer>,
}

/// One configuration with this server's id, and its key if it has one.
#[derive(Debug)]
struct Issuer {
    cfg: QuicLbConfig,
    server_id: ServerId,
    encrypted: Option<Encrypted>,
}

/// What a key adds: the cipher, and the nonces not yet used under it.
#[derive(Debug)]
struct Encrypted {
    cipher: CidCipher,
    nonces: Mutex<NonceCounter>,
}

/// Why [`QuicLbGenerator::rotate`] refused a configuration; the generator is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RotateError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The balancer tells configurations apart by their config id only (§3.1).
    #[error("config_id {config_id} is the one in use: a new configuration takes another config id")]
    SameConfigId { config_id: u8 },
    /// quinn reads every short header's id with the one length its generator gives.
    #[error("the new configuration's ids have {len} octets, the one in use {current}: a rotation keeps the length")]
    CidLength { len: usize, current: usize },
}

impl QuicLbGenerator {
    /// A generator of plaintext ids for `server_id` under `cfg`; refuses a configuration
    /// outside the draft's limits or a server id of another length than `cfg.server_id_len`.
    pub fn new(cfg: QuicLbConfig, server_id: ServerId) -> Result<QuicLbGenerator, ConfigError> {
        QuicLbGenerator::issuing(Issuer::new(cfg, server_id, None)?)
    }

    /// A generator of ids encrypted with `key` ([`Encryption::of`] `cfg` says which mode);
    /// refuses what [`Self::new`] refuses.
    ///
    /// After every nonce of `cfg.nonce_len` octets (2^32 ids at the shortest) it issues
    /// unroutable ids (config id 0b111, random octets), which the balancer places by 5-tuple,
    /// as §9.6 asks of a server out of nonces: rotate to a new configuration before that.
    pub fn encrypted(cfg: QuicLbConfig, server_id: ServerId, key: &QuicLbKey) -> Result<QuicLbGenerator, ConfigError> {
        QuicLbGenerator::issuing(Issuer::new(cfg, server_id, Some(key))?)
    }

    fn issuing(current: Issuer) -> Result<QuicLbGenerator, ConfigError> {
        Ok(QuicLbGenerator { configs: Arc::new(RwLock::new(Configs { current, previous: None })), lifetime: None })
    }

    /// Retire each id after `lifetime` (quinn then issues a fresh one); default: never.
    pub fn with_lifetime(mut self, lifetime: Duration) -> QuicLbGenerator {
        self.lifetime = Some(lifetime);
        self
    }

    /// Issues every new id, on this generator and its clones, under `cfg` with `server_id`,
    /// encrypted with `key` if given (a key rotation, §3.1). Ids of the configuration in use
    /// until now stay this server's (connections keep the ids they have); those of the one
    /// before it no longer do. `cfg` needs a config id other than the current one's and ids of
    /// the same length; give the balancer the new configuration first.
    pub fn rotate(&self, cfg: QuicLbConfig, server_id: ServerId, key: Option<&QuicLbKey>) -> Result<(), RotateError> {
        let next = Issuer::new(cfg, server_id, key)?;
        let mut configs = self.configs.write().unwrap_or_else(PoisonError::into_inner);
        let current = configs.current.cfg;
        if cfg.config_id == current.config_id {
            return Err(RotateError::SameConfigId { config_id: cfg.config_id });
        }
        if cfg.cid_len() != current.cid_len() {
            return Err(RotateError::CidLength { len: cfg.cid_len(), current: current.cid_len() });
        }
        let before = std::mem::replace(&mut configs.current, next);
        configs.previous = Some(before);
        Ok(())
    }

    /// The configuration new ids are issued under.
    pub fn config(&self) -> QuicLbConfig {
        self.configs().current.cfg
    }

    /// The server id new ids carry.
    pub fn server_id(&self) -> ServerId {
        self.configs().current.server_id
    }

    /// How new ids are encrypted; None: plaintext.
    pub fn encryption(&self) -> Option<Encryption> {
        self.configs().current.encrypted.as_ref().map(|encrypted| encrypted.cipher.encryption())
    }

    fn configs(&self) -> std::sync::RwLockReadGuard<'_, Configs> {
        self.configs.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Issuer {
    fn new(cfg: QuicLbConfig, server_id: ServerId, key: Option<&QuicLbKey>) -> Result<Issuer, ConfigError> {
        cfg.validate()?;
        if server_id.len != cfg.server_id_len {
            return Err(ConfigError::Length { field: "server id", len: server_id.len as usize, want: cfg.server_id_len });
        }
        let encrypted = match key {
            Some(key) => Some(Encrypted {
                cipher: CidCipher::new(cfg, key)?,
                nonces: Mutex::new(NonceCounter::random(cfg.nonce_len as usize, &mut rand::rng())),
            }),
            None => None,
        };
        Ok(Issuer { cfg, server_id, encrypted })
    }

    /// Writes a new id into `out`; returns its length.
    fn generate(&self, out: &mut [u8; MAX_CID_LEN], rng: &mut impl Rng) -> usize {
        let low_bits = rng.next_u32() as u8;
        let nonce_len = self.cfg.nonce_len as usize;
        // Cannot fail: `new` checked the configuration and the server id's length, and the
        // nonce has the configuration's length.
        let encoded = match &self.encrypted {
            None => {
                let mut nonce = [0u8; MAX_CID_LEN];
                rng.fill_bytes(&mut nonce[..nonce_len]);
                encode(&self.cfg, &self.server_id, &nonce[..nonce_len], low_bits, out)
            }
            Some(encrypted) => match encrypted.nonces.lock().unwrap_or_else(PoisonError::into_inner).take() {
                Some(nonce) => encrypted.cipher.encode(&self.server_id, &nonce[..nonce_len], low_bits, out),
                None => Ok(unroutable(out, self.cfg.cid_len(), rng)),
            },
        };
        encoded.unwrap_or(0)
    }

    /// Whether `cid` names this server under this configuration (and key).
    fn claims(&self, cid: &[u8]) -> bool {
        let decoded = match &self.encrypted {
            Some(encrypted) => encrypted.cipher.decode_server_id(cid),
            None => decode_server_id(cid, &self.cfg),
        };
        decoded == Ok(self.server_id)
    }
}

impl ConnectionIdGenerator for QuicLbGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut out = [0u8; MAX_CID_LEN];
        let len = self.configs().current.generate(&mut out, &mut rand::rng());
        ConnectionId::new(&out[..len])
    }

    /// Ours only: a packet for an unknown connection whose id names another server (or no
    /// server) was misrouted, and quinn answers it with no stateless reset, which would end
    /// the client's connection with that other server.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        let configs = self.configs();
        let ours = configs.current.claims(cid) || configs.previous.as_ref().is_some_and(|previous| previous.claims(cid));
        if ours { Ok(()) } else { Err(InvalidCid) }
    }

    fn cid_len(&self) -> usize {
        self.configs().current.cfg.cid_len()
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.lifetime
    }
}

/// Writes an id of `len` octets that no balancer routes (§3.2): the reserved config id in the
/// three high bits, its length (such ids must describe it), and random octets. Returns `len`.
fn unroutable(out: &mut [u8; MAX_CID_LEN], len: usize, rng: &mut impl Rng) -> usize {
    out[0] = CONFIG_ID_UNROUTABLE << 5 | ((len - 1) as u8 & FIRST_OCTET_LEN_MASK);
    rng.fill_bytes(&mut out[1..len]);
    len
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::{CidError, QUIC_LB_F_SELF_LEN, QuicLbKey};

    fn generator(cfg: QuicLbConfig, sid: &str) -> QuicLbGenerator {
        QuicLbGenerator::new(cfg, sid.parse().unwrap()).unwrap()
    }

    #[test]
    fn ids_decode_to_the_server_id() {
        for (cfg, sid) in [
            (QuicLbConfig { config_id: 0, server_id_len: 1, nonce_len: 4, flags: 0 }, "07"),
            (QuicLbConfig { config_id: 3, server_id_len: 2, nonce_len: 6, flags: QUIC_LB_F_SELF_LEN }, "0a01"),
            (QuicLbConfig { config_id: 6, server_id_len: 15, nonce_len: 4, flags: QUIC_LB_F_SELF_LEN }, "000102030405060708090a0b0c0d0e"),
        ] {
            let mut g = generator(cfg, sid);
            let mut seen = HashSet::new();
            for _ in 0..64 {
                let cid = g.generate_cid();
                assert_eq!(cid.len(), g.cid_len());
                assert_eq!(cid[0] >> 5, cfg.config_id);
                assert_eq!(decode_server_id(&cid, &cfg).unwrap(), g.server_id());
                g.validate(&cid).unwrap();
                seen.insert(cid);
            }
            // Random nonces: 64 draws of 32 bits or more do not collide in practice.
            assert_eq!(seen.len(), 64);
        }
    }

    #[test]
    fn random_low_bits_without_self_length() {
        let cfg = QuicLbConfig { config_id: 1, server_id_len: 2, nonce_len: 4, flags: 0 };
        let mut g = generator(cfg, "beef");
        let lows: HashSet<u8> = (0..256).map(|_| g.generate_cid()[0] & 0x1f).collect();
        assert!(lows.len() > 1, "low bits never vary: {lows:?}");
        let cfg = QuicLbConfig { flags: QUIC_LB_F_SELF_LEN, ..cfg };
        let mut g = generator(cfg, "beef");
        assert!((0..64).all(|_| g.generate_cid()[0] == 0x20 | 6));
    }

    #[test]
    fn validate_refuses_other_servers_and_configs() {
        let cfg = QuicLbConfig { config_id: 2, server_id_len: 2, nonce_len: 5, flags: 0 };
        let ours = generator(cfg, "0001");
        let mut other = generator(cfg, "0002");
        assert!(ours.validate(&other.generate_cid()).is_err());
        let mut other_config = generator(QuicLbConfig { config_id: 4, ..cfg }, "0001");
        assert!(ours.validate(&other_config.generate_cid()).is_err());
        assert!(ours.validate(&ConnectionId::new(&[0xe0, 0, 1, 2, 3, 4, 5, 6])).is_err());
        assert!(ours.validate(&ConnectionId::new(&[0x40, 0])).is_err());
    }

    fn encrypted(cfg: QuicLbConfig, sid: &str) -> QuicLbGenerator {
        QuicLbGenerator::encrypted(cfg, sid.parse().unwrap(), &key()).unwrap()
    }

    fn key() -> QuicLbKey {
        QuicLbKey::from_file_text("8f95f09245765f80256934e50c66207f").unwrap()
    }

    /// Both modes: every id decodes to the server id with the key, not without it; the first
    /// octet is as a plaintext id's.
    #[test]
    fn encrypted_ids_decode_to_the_server_id_with_the_key_only() {
        for (cfg, sid, encryption) in [
            (QuicLbConfig { config_id: 0, server_id_len: 2, nonce_len: 6, flags: 0 }, "0a01", Encryption::FourPass),
            (
                QuicLbConfig { config_id: 3, server_id_len: 8, nonce_len: 8, flags: QUIC_LB_F_SELF_LEN },
                "0001020304050607",
                Encryption::SinglePass,
            ),
            (
                QuicLbConfig { config_id: 5, server_id_len: 12, nonce_len: 5, flags: QUIC_LB_F_SELF_LEN },
                "0102030405060708090a0b0c",
                Encryption::FourPass,
            ),
        ] {
            let mut g = encrypted(cfg, sid);
            assert_eq!(g.encryption(), Some(encryption));
            let cipher = CidCipher::new(cfg, &key()).unwrap();
            let mut seen = HashSet::new();
            let mut plaintext_matches = 0;
            for _ in 0..64 {
                let cid = g.generate_cid();
                assert_eq!(cid.len(), g.cid_len());
                assert_eq!(cid[0] >> 5, cfg.config_id);
                assert_eq!(cipher.decode_server_id(&cid), Ok(g.server_id()));
                g.validate(&cid).unwrap();
                plaintext_matches += usize::from(decode_server_id(&cid, &cfg) == Ok(g.server_id()));
                seen.insert(cid);
            }
            assert_eq!(seen.len(), 64);
            assert_eq!(plaintext_matches, 0, "{cfg:?}: the server id shows in the clear");
        }
    }

    /// An encrypting generator's clones (quinn asks the factory for one per endpoint) take
    /// consecutive nonces from one counter: no nonce twice under the key.
    #[test]
    fn clones_share_the_nonces() {
        let cfg = QuicLbConfig { config_id: 1, server_id_len: 2, nonce_len: 5, flags: 0 };
        let mut first = encrypted(cfg, "beef");
        let mut second = first.clone();
        let cipher = CidCipher::new(cfg, &key()).unwrap();
        let nonce = |cid: ConnectionId| {
            let mut octets = cid[1..].to_vec();
            cipher.decrypt_all(&mut octets);
            assert_eq!(octets[..2], [0xbe, 0xef]);
            octets[2..].iter().fold(0u64, |n, &octet| n << 8 | octet as u64)
        };
        let a = nonce(first.generate_cid());
        let b = nonce(second.generate_cid());
        let c = nonce(first.generate_cid());
        let next = |n: u64| (n + 1) % (1 << 40);
        assert_eq!((b, c), (next(a), next(next(a))));
    }

    /// Out of nonces, ids of the reserved config id: routed by 5-tuple, never a repeat.
    #[test]
    fn out_of_nonces_issues_unroutable_ids() {
        let cfg = QuicLbConfig { config_id: 2, server_id_len: 2, nonce_len: 6, flags: 0 };
        let mut g = encrypted(cfg, "0a01");
        g.configs.read().unwrap().current.encrypted.as_ref().unwrap().nonces.lock().unwrap().use_up();
        let ids: HashSet<ConnectionId> = (0..16).map(|_| g.generate_cid()).collect();
        assert_eq!(ids.len(), 16);
        for cid in ids {
            assert_eq!(cid.len(), g.cid_len());
            assert_eq!(cid[0], 0xe0 | 8, "config id 0b111 and the length: {cid:?}");
            assert_eq!(decode_server_id(&cid, &cfg), Err(CidError::Unroutable));
        }
    }

    #[test]
    fn validate_refuses_other_keys_servers_and_plaintext() {
        let cfg = QuicLbConfig { config_id: 2, server_id_len: 2, nonce_len: 5, flags: 0 };
        let ours = encrypted(cfg, "0001");
        let mut other_server = encrypted(cfg, "0002");
        let mut other_key = QuicLbGenerator::encrypted(cfg, "0001".parse().unwrap(), &QuicLbKey::new([7; 16])).unwrap();
        let mut plaintext = generator(cfg, "0001");
        for (name, g) in [("other server", &mut other_server), ("other key", &mut other_key), ("plaintext", &mut plaintext)] {
            let refused = (0..32).filter(|_| ours.validate(&g.generate_cid()).is_err()).count();
            // A random 2-octet server id is ours once in 65536 draws.
            assert!(refused >= 31, "{name}: {refused} of 32 refused");
        }
    }

    #[test]
    fn debug_shows_no_key_and_no_nonce() {
        let g = encrypted(QuicLbConfig { config_id: 0, server_id_len: 3, nonce_len: 4, flags: 0 }, "0a0b0c");
        let shown = format!("{g:?}");
        assert!(shown.contains("CidCipher { cfg: QuicLbConfig") && shown.contains("NonceCounter { len: 4"), "{shown}");
    }

    #[test]
    fn refuses_bad_configs() {
        let cfg = QuicLbConfig { config_id: 0, server_id_len: 2, nonce_len: 4, flags: 0 };
        assert_eq!(
            QuicLbGenerator::new(cfg, "01".parse().unwrap()).unwrap_err(),
            ConfigError::Length { field: "server id", len: 1, want: 2 }
        );
        assert_eq!(
            QuicLbGenerator::new(QuicLbConfig { config_id: 7, ..cfg }, "0102".parse().unwrap()).unwrap_err(),
            ConfigError::ConfigId { config_id: 7 }
        );
        assert_eq!(
            QuicLbGenerator::new(QuicLbConfig { nonce_len: 2, ..cfg }, "0102".parse().unwrap()).unwrap_err(),
            ConfigError::NonceLen { len: 2 }
        );
        assert_eq!(
            QuicLbGenerator::encrypted(QuicLbConfig { nonce_len: 18, ..cfg }, "0102".parse().unwrap(), &key()).unwrap_err(),
            ConfigError::TooLong { server_id_len: 2, nonce_len: 18 }
        );
        assert_eq!(
            QuicLbGenerator::encrypted(cfg, "01".parse().unwrap(), &key()).unwrap_err(),
            ConfigError::Length { field: "server id", len: 1, want: 2 }
        );
    }

    /// After a rotation new ids name the new configuration (and its key), and the server still
    /// claims the ids of the one before, which its connections go on using; not the one before
    /// that.
    #[test]
    fn a_rotation_issues_under_the_new_config_and_still_claims_the_old() {
        let cfg = QuicLbConfig { config_id: 0, server_id_len: 2, nonce_len: 6, flags: 0 };
        let mut g = encrypted(cfg, "0a01");
        let old = g.generate_cid();
        let mut endpoint = g.clone();
        let new_key = QuicLbKey::new([9; 16]);
        g.rotate(QuicLbConfig { config_id: 1, ..cfg }, "0a01".parse().unwrap(), Some(&new_key)).unwrap();
        // The clone quinn holds issues under the new configuration too.
        let new = endpoint.generate_cid();
        assert_eq!(new[0] >> 5, 1);
        let new_cipher = CidCipher::new(QuicLbConfig { config_id: 1, ..cfg }, &new_key).unwrap();
        assert_eq!(new_cipher.decode_server_id(&new).unwrap(), "0a01".parse().unwrap());
        assert_eq!((g.config().config_id, g.encryption()), (1, Some(Encryption::FourPass)));
        endpoint.validate(&old).unwrap();
        endpoint.validate(&new).unwrap();
        // A second rotation, to plaintext ids: the first configuration's ids are no longer ours.
        g.rotate(QuicLbConfig { config_id: 2, ..cfg }, "0a01".parse().unwrap(), None).unwrap();
        let plain = endpoint.generate_cid();
        assert_eq!(decode_server_id(&plain, &QuicLbConfig { config_id: 2, ..cfg }), Ok("0a01".parse().unwrap()));
        assert_eq!(g.encryption(), None);
        assert!(endpoint.validate(&old).is_err());
        endpoint.validate(&new).unwrap();
        endpoint.validate(&plain).unwrap();
    }

    #[test]
    fn a_rotation_keeps_the_id_length_and_takes_a_new_config_id() {
        let cfg = QuicLbConfig { config_id: 3, server_id_len: 2, nonce_len: 6, flags: 0 };
        let g = encrypted(cfg, "0a01");
        let sid = "0a01".parse().unwrap();
        assert_eq!(g.rotate(cfg, sid, None), Err(RotateError::SameConfigId { config_id: 3 }));
        assert_eq!(
            g.rotate(QuicLbConfig { config_id: 4, nonce_len: 7, ..cfg }, sid, None),
            Err(RotateError::CidLength { len: 10, current: 9 })
        );
        assert_eq!(
            g.rotate(QuicLbConfig { config_id: 7, ..cfg }, sid, None),
            Err(RotateError::Config(ConfigError::ConfigId { config_id: 7 }))
        );
        // Another split of the same length is fine: quinn reads only the length.
        let other = QuicLbConfig { config_id: 4, server_id_len: 3, nonce_len: 5, flags: 0 };
        g.rotate(other, "0a0102".parse().unwrap(), Some(&key())).unwrap();
        assert_eq!((g.config(), g.server_id()), (other, "0a0102".parse().unwrap()));
        // Refused rotations changed nothing before it.
        assert!(format!("{g:?}").contains("config_id: 3"), "the previous configuration is kept");
    }
}
