//! QUIC VIPs: the QUIC-LB configuration an operator gives a UDP VIP, and the server id each
//! of its backends gets.
//!
//! A backend's server id is the last `server_id_len` octets of its address (zero-padded in
//! front when the id is longer than the address): a function of the desired state alone, so
//! it survives restarts and every balancer of a fleet computes the same one, with nothing
//! to agree on. Two backends of a VIP whose addresses end alike are refused (a longer
//! `server_id_len` separates them).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use spillway_common::quic_lb::{QUIC_LB_F_ENCRYPTED, QUIC_LB_F_SELF_LEN, QuicLbConfig, ServerId};

use super::{ModelError, Proto, Vip, VipConfig};

/// Server id length when none is given: two octets name 65536 backends.
pub const DEFAULT_SERVER_ID_LEN: u8 = 2;
/// Nonce length when none is given: with the first octet and a two-octet server id, the
/// 9-octet ids many servers use; 6 octets of nonce are 2^48 ids per server (draft §9.6).
pub const DEFAULT_NONCE_LEN: u8 = 6;

/// A QUIC VIP's plaintext QUIC-LB configuration (draft-ietf-quic-load-balancers-21): what
/// its backends' connection-id generators must be given too (`spillway-quic-lb`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuicConfig {
    /// The config rotation codepoint, 0..=6.
    #[serde(default)]
    pub config_id: u8,
    #[serde(default = "default_server_id_len")]
    pub server_id_len: u8,
    #[serde(default = "default_nonce_len")]
    pub nonce_len: u8,
    /// The servers write the id's length into its first octet (draft §3.3), and the balancer
    /// checks it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub self_len: bool,
    /// The servers encrypt their ids (draft §5.4) with the 16-octet key in this file (32
    /// hexadecimal digits, root's alone: `lbd` reads it when it programs the VIP). Only the
    /// path is part of the state: the key is never stored, logged or exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

fn default_server_id_len() -> u8 {
    DEFAULT_SERVER_ID_LEN
}

fn default_nonce_len() -> u8 {
    DEFAULT_NONCE_LEN
}

impl Default for QuicConfig {
    fn default() -> Self {
        Self { config_id: 0, server_id_len: DEFAULT_SERVER_ID_LEN, nonce_len: DEFAULT_NONCE_LEN, self_len: false, key_file: None }
    }
}

impl QuicConfig {
    /// The data path's form of it.
    pub fn to_lb(&self) -> QuicLbConfig {
        QuicLbConfig {
            config_id: self.config_id,
            server_id_len: self.server_id_len,
            nonce_len: self.nonce_len,
            flags: if self.self_len { QUIC_LB_F_SELF_LEN } else { 0 } | if self.key_file.is_some() { QUIC_LB_F_ENCRYPTED } else { 0 },
        }
    }

    /// The key file of an encrypted configuration.
    pub fn key_file(&self) -> Option<&Path> {
        self.key_file.as_deref()
    }

    /// The draft's limits, for a UDP VIP.
    pub fn check(&self, vip: &Vip) -> Result<(), ModelError> {
        if vip.proto != Proto::Udp {
            return Err(ModelError::QuicNotUdp { vip: *vip });
        }
        // lbd reads it from its own working directory, whatever the file's or the operator's.
        if self.key_file.as_deref().is_some_and(Path::is_relative) {
            return Err(ModelError::BadQuic { vip: *vip, message: "key_file must be an absolute path".into() });
        }
        self.to_lb().validate().map_err(|e| ModelError::BadQuic { vip: *vip, message: e.to_string() })
    }
}

/// The server id of the backend at `addr` under a configuration with `len`-octet server ids.
pub fn server_id_of(addr: IpAddr, len: u8) -> ServerId {
    let octets = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let len = usize::from(len);
    let mut id = vec![0u8; len.saturating_sub(octets.len())];
    id.extend_from_slice(&octets[octets.len().saturating_sub(len)..]);
    // `len` is a validated server id length (1..=15), so this cannot fail.
    ServerId::new(&id).unwrap_or_default()
}

/// Every backend's server id, for a QUIC VIP (empty otherwise).
pub fn server_ids(config: &VipConfig) -> BTreeMap<IpAddr, ServerId> {
    let Some(quic) = &config.quic else { return BTreeMap::new() };
    config.backends.keys().map(|&addr| (addr, server_id_of(addr, quic.server_id_len))).collect()
}

/// Refuses a second config id that cannot live beside `quic`: the same config id, or
/// another server id length (the backends' server ids, and so the index, are the same for
/// both).
pub fn check_next(vip: &Vip, quic: &QuicConfig, next: &QuicConfig) -> Result<(), ModelError> {
    if next.config_id == quic.config_id {
        let message = format!("quic_next.config_id {} is the current config id: a rotation takes another one", next.config_id);
        return Err(ModelError::BadQuic { vip: *vip, message });
    }
    if next.server_id_len != quic.server_id_len {
        let message = format!(
            "quic_next.server_id_len {} differs from quic.server_id_len {}: the backends keep their server ids",
            next.server_id_len, quic.server_id_len
        );
        return Err(ModelError::BadQuic { vip: *vip, message });
    }
    Ok(())
}

/// Refuses a QUIC VIP two of whose backends would share a server id.
pub fn check_server_ids(vip: &Vip, config: &VipConfig) -> Result<(), ModelError> {
    let mut seen: BTreeMap<ServerId, IpAddr> = BTreeMap::new();
    for (addr, id) in server_ids(config) {
        if let Some(other) = seen.insert(id, addr) {
            return Err(ModelError::QuicServerIdTaken { vip: *vip, backend: addr, other, server_id: id.to_string() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids_are_the_addresses_last_octets() {
        assert_eq!(server_id_of("10.1.2.3".parse().unwrap(), 2).to_string(), "0203");
        assert_eq!(server_id_of("10.1.2.3".parse().unwrap(), 4).to_string(), "0a010203");
        assert_eq!(server_id_of("10.1.2.3".parse().unwrap(), 6).to_string(), "00000a010203");
        assert_eq!(server_id_of("fd00::1:2".parse().unwrap(), 3).to_string(), "010002");
    }

    #[test]
    fn refuses_what_the_draft_does_and_tcp() {
        let udp: Vip = "10.0.0.1:443/udp".parse().unwrap();
        let tcp: Vip = "10.0.0.1:443/tcp".parse().unwrap();
        assert_eq!(QuicConfig::default().check(&udp), Ok(()));
        assert_eq!(QuicConfig::default().check(&tcp), Err(ModelError::QuicNotUdp { vip: tcp }));
        let bad = QuicConfig { nonce_len: 3, ..QuicConfig::default() };
        assert!(matches!(bad.check(&udp), Err(ModelError::BadQuic { .. })));
        let bad = QuicConfig { config_id: 7, ..QuicConfig::default() };
        assert!(matches!(bad.check(&udp), Err(ModelError::BadQuic { .. })));
    }
}
