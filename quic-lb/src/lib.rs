//! QUIC-LB connection ids for QUIC servers behind Spillway.
//!
//! A QUIC server behind a balancer that routes by connection id must issue ids that carry its
//! server id. [`QuicLbGenerator`] is a quinn [`ConnectionIdGenerator`] that does, in the
//! plaintext encoding of `spillway_common::quic_lb` (draft-ietf-quic-load-balancers-21):
//!
//! ```no_run
//! # use std::sync::Arc;
//! use spillway_quic_lb::{QuicLbConfig, QuicLbGenerator, ServerId};
//! let cfg = QuicLbConfig { config_id: 0, server_id_len: 2, nonce_len: 6, flags: 0 };
//! let generator = QuicLbGenerator::new(cfg, "0a01".parse::<ServerId>().unwrap()).unwrap();
//! let mut endpoint = quinn::EndpointConfig::default();
//! endpoint.cid_generator(move || Box::new(generator.clone()));
//! ```

use std::time::Duration;

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::Rng;
pub use spillway_common::quic_lb::{CidError, ConfigError, MAX_CID_LEN, QUIC_LB_F_SELF_LEN, QuicLbConfig, ServerId};
use spillway_common::quic_lb::{decode_server_id, encode};

/// Issues connection ids that name one server under one configuration, with random nonces.
///
/// Random nonces, not a counter: with no key the draft wants nonces with "no observable
/// relationship" to earlier ones (§5.4). quinn draws again when an id collides with a live
/// one of the endpoint, so a short nonce repeats only across connections that are gone.
#[derive(Clone, Debug)]
pub struct QuicLbGenerator {
    cfg: QuicLbConfig,
    server_id: ServerId,
    lifetime: Option<Duration>,
}

impl QuicLbGenerator {
    /// A generator for `server_id` under `cfg`; refuses a configuration outside the draft's
    /// limits or a server id of another length than `cfg.server_id_len`.
    pub fn new(cfg: QuicLbConfig, server_id: ServerId) -> Result<QuicLbGenerator, ConfigError> {
        cfg.validate()?;
        if server_id.len != cfg.server_id_len {
            return Err(ConfigError::Length { field: "server id", len: server_id.len as usize, want: cfg.server_id_len });
        }
        Ok(QuicLbGenerator { cfg, server_id, lifetime: None })
    }

    /// Retire each id after `lifetime` (quinn then issues a fresh one); default: never.
    pub fn with_lifetime(mut self, lifetime: Duration) -> QuicLbGenerator {
        self.lifetime = Some(lifetime);
        self
    }

    pub fn config(&self) -> &QuicLbConfig {
        &self.cfg
    }

    pub fn server_id(&self) -> &ServerId {
        &self.server_id
    }
}

impl ConnectionIdGenerator for QuicLbGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut rng = rand::rng();
        let mut nonce = [0u8; MAX_CID_LEN];
        let nonce = &mut nonce[..self.cfg.nonce_len as usize];
        rng.fill_bytes(nonce);
        let mut out = [0u8; MAX_CID_LEN];
        // Cannot fail: `new` checked the configuration and the server id's length, and the
        // nonce has the configuration's length.
        let len = encode(&self.cfg, &self.server_id, nonce, rng.next_u32() as u8, &mut out).unwrap_or(0);
        ConnectionId::new(&out[..len])
    }

    /// Ours only: a packet for an unknown connection whose id names another server (or no
    /// server) was misrouted, and quinn answers it with no stateless reset, which would end
    /// the client's connection with that other server.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        match decode_server_id(cid, &self.cfg) {
            Ok(id) if id == self.server_id => Ok(()),
            _ => Err(InvalidCid),
        }
    }

    fn cid_len(&self) -> usize {
        self.cfg.cid_len()
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.lifetime
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

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
                assert_eq!(decode_server_id(&cid, &cfg).unwrap(), *g.server_id());
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
    }
}
