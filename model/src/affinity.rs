//! Client affinity: what Maglev hashes to place a VIP's new flows. The 5-tuple spreads a
//! client's connections over the backends; the source address keeps them on one (several
//! connections per session, UDP sessions on changing ports), and a source prefix keeps a
//! group of addresses together (an IPv6 client's privacy addresses share its /64).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ModelError, Vip, VipConfig};

/// What Maglev hashes to place a VIP's new flows (`hash` in the file and the API).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
pub enum HashMode {
    /// Source and destination address, ports and protocol: a client's connections spread.
    #[default]
    #[serde(rename = "5-tuple")]
    #[value(name = "5-tuple")]
    FiveTuple,
    /// The source address alone (its first source_prefix bits): every connection of a
    /// client goes to one backend.
    #[serde(rename = "source")]
    Source,
}

impl HashMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            HashMode::FiveTuple => "5-tuple",
            HashMode::Source => "source",
        }
    }

    pub fn is_five_tuple(&self) -> bool {
        *self == HashMode::FiveTuple
    }
}

impl fmt::Display for HashMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest source prefix of a VIP's family: its whole address (32 or 128 bits).
pub const fn address_bits(vip: &Vip) -> u8 {
    if vip.addr.is_ipv4() { 32 } else { 128 }
}

/// Checks a VIP's hash mode and source prefix: a prefix only with the source hash, and
/// 1..=32 bits for an IPv4 VIP, 1..=128 for an IPv6 one (0 would send every client to one
/// backend).
pub fn check(vip: &Vip, hash: HashMode, source_prefix: Option<u8>) -> Result<(), ModelError> {
    let Some(len) = source_prefix else { return Ok(()) };
    if hash != HashMode::Source {
        return Err(ModelError::SourcePrefixWithoutSourceHash { vip: *vip });
    }
    let max = address_bits(vip);
    if !(1..=max).contains(&len) {
        return Err(ModelError::SourcePrefixOutOfRange { vip: *vip, len, max, family: if max == 32 { 4 } else { 6 } });
    }
    Ok(())
}

impl VipConfig {
    /// How many leading source address bits place the VIP's new flows: `None` for the
    /// 5-tuple hash, the whole address when no prefix is set.
    pub fn source_prefix_len(&self, vip: &Vip) -> Option<u8> {
        (self.hash == HashMode::Source).then(|| self.source_prefix.unwrap_or(address_bits(vip)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DesiredState;

    fn vip(s: &str) -> Vip {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_prefix_is_bounded_by_the_vips_family_and_needs_the_source_hash() {
        let (v4, v6) = (vip("10.0.0.1:80/tcp"), vip("[fd00::1]:80/tcp"));
        assert_eq!(check(&v4, HashMode::Source, Some(24)), Ok(()));
        assert_eq!(check(&v6, HashMode::Source, Some(64)), Ok(()));
        assert_eq!(check(&v6, HashMode::Source, Some(128)), Ok(()));
        let refused = |v: &Vip, hash, len| check(v, hash, Some(len)).unwrap_err().to_string();
        assert_eq!(refused(&v4, HashMode::Source, 33), "VIP 10.0.0.1:80/tcp source_prefix: 33 is out of range for an IPv4 VIP (1..=32)");
        assert_eq!(
            refused(&v6, HashMode::Source, 129),
            "VIP [fd00::1]:80/tcp source_prefix: 129 is out of range for an IPv6 VIP (1..=128)"
        );
        assert!(refused(&v4, HashMode::Source, 0).contains("0 is out of range"));
        assert_eq!(refused(&v4, HashMode::FiveTuple, 24), "VIP 10.0.0.1:80/tcp source_prefix: only a VIP with hash \"source\" has one");
    }

    #[test]
    fn a_refused_hash_leaves_the_state_unchanged() {
        let v = vip("[fd00::1]:80/tcp");
        let mut state = DesiredState::default();
        state.add_vip(v, 13).unwrap();
        state.set_hash(&v, HashMode::Source, Some(64)).unwrap();
        assert_eq!(state.vips[&v].source_prefix_len(&v), Some(64));
        let before = state.clone();
        assert!(state.set_hash(&v, HashMode::Source, Some(200)).is_err());
        assert!(state.set_hash(&v, HashMode::FiveTuple, Some(64)).is_err());
        assert_eq!(state, before);
        state.set_hash(&v, HashMode::Source, None).unwrap();
        assert_eq!(state.vips[&v].source_prefix_len(&v), Some(128));
        state.set_hash(&v, HashMode::FiveTuple, None).unwrap();
        assert_eq!(state.vips[&v].source_prefix_len(&v), None);
    }

    #[test]
    fn the_state_file_keeps_the_hash_and_reads_older_states_as_the_5_tuple() {
        let v = vip("10.0.0.1:80/tcp");
        let mut state = DesiredState::default();
        state.add_vip(v, 13).unwrap();
        let older = serde_json::to_string(&state).unwrap();
        assert!(!older.contains("hash"), "{older}");
        state.set_hash(&v, HashMode::Source, Some(24)).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        assert!(json.contains(r#""hash":"source","source_prefix":24"#), "{json}");
        assert_eq!(serde_json::from_str::<DesiredState>(&json).unwrap(), state);
        assert_eq!(serde_json::from_str::<DesiredState>(&older).unwrap().vips[&v].hash, HashMode::FiveTuple);
    }
}
