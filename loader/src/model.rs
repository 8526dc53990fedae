//! The desired state an operator declares: VIPs, their backends and weights. This is what
//! `lbd` persists and what the reconciler turns into map updates.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use spillway_common::{
    limits::{DEFAULT_RING_SIZE, MAX_BACKENDS, MAX_BACKENDS_PER_VIP, MAX_VIPS, valid_ring_size},
    maglev::MAX_WEIGHT,
    types::{PROTO_TCP, PROTO_UDP},
};

/// Weight a backend gets when none is given.
pub const DEFAULT_WEIGHT: u32 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => PROTO_TCP,
            Proto::Udp => PROTO_UDP,
        }
    }
}

/// A service address: `10.0.0.1:80/tcp`, `[fd00::1]:53/udp`; port 0 means any port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Vip {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Proto,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("VIP {input:?}: expected <IP>:<PORT>/<tcp|udp>, e.g. 10.0.0.1:80/tcp or [fd00::1]:443/tcp")]
    BadVip { input: String },
    #[error("unknown VIP {vip}")]
    UnknownVip { vip: Vip },
    #[error("VIP {vip} already exists")]
    DuplicateVip { vip: Vip },
    #[error("backend {backend} already exists in VIP {vip}")]
    DuplicateBackend { vip: Vip, backend: IpAddr },
    #[error("backend {backend} is not in VIP {vip}")]
    UnknownBackend { vip: Vip, backend: IpAddr },
    #[error("weight {weight} is out of range (0..={MAX_WEIGHT})")]
    WeightOutOfRange { weight: u32 },
    #[error("ring size {size} must be a prime between 13 and 65537")]
    BadRingSize { size: u32 },
    #[error("too many VIPs (limit {MAX_VIPS})")]
    TooManyVips,
    #[error("too many backends in VIP {vip} (limit {MAX_BACKENDS_PER_VIP})")]
    TooManyBackendsInVip { vip: Vip },
    #[error("too many backends in total (limit {})", MAX_BACKENDS - 1)]
    TooManyBackends,
    #[error("backend {backend}: an IPv6 VIP needs an IPv6 backend (IPv6 cannot be carried in IPv4)")]
    FamilyMismatch { backend: IpAddr },
    #[error("backend address {backend} is not usable (unspecified, multicast or broadcast)")]
    BadBackendAddress { backend: IpAddr },
}

impl FromStr for Vip {
    type Err = ModelError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = || ModelError::BadVip { input: input.to_owned() };
        let (sock, proto) = input.rsplit_once('/').ok_or_else(bad)?;
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => return Err(bad()),
        };
        let sock: SocketAddr = sock.parse().map_err(|_| bad())?;
        let addr = sock.ip();
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(bad());
        }
        Ok(Vip { addr, port: sock.port(), proto })
    }
}

impl fmt::Display for Vip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        write!(f, "{}/{proto}", SocketAddr::new(self.addr, self.port))
    }
}

impl Serialize for Vip {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Vip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Share of new flows relative to the VIP's other backends; 0 = draining.
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    pub ring_size: u32,
    pub backends: BTreeMap<IpAddr, Backend>,
}

impl Default for VipConfig {
    fn default() -> Self {
        Self { ring_size: DEFAULT_RING_SIZE, backends: BTreeMap::new() }
    }
}

/// Everything the balancer should be doing. Edits go through the checked methods, which
/// leave the state unchanged on error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesiredState {
    pub vips: BTreeMap<Vip, VipConfig>,
}

impl DesiredState {
    pub fn add_vip(&mut self, vip: Vip, ring_size: u32) -> Result<(), ModelError> {
        if self.vips.contains_key(&vip) {
            return Err(ModelError::DuplicateVip { vip });
        }
        if self.vips.len() >= MAX_VIPS as usize {
            return Err(ModelError::TooManyVips);
        }
        if !valid_ring_size(ring_size) {
            return Err(ModelError::BadRingSize { size: ring_size });
        }
        self.vips.insert(vip, VipConfig { ring_size, backends: BTreeMap::new() });
        Ok(())
    }

    pub fn remove_vip(&mut self, vip: &Vip) -> Result<VipConfig, ModelError> {
        self.vips.remove(vip).ok_or(ModelError::UnknownVip { vip: *vip })
    }

    pub fn vip(&self, vip: &Vip) -> Result<&VipConfig, ModelError> {
        self.vips.get(vip).ok_or(ModelError::UnknownVip { vip: *vip })
    }

    pub fn add_backend(&mut self, vip: &Vip, backend: IpAddr, weight: u32) -> Result<(), ModelError> {
        check_weight(weight)?;
        check_backend_address(vip, backend)?;
        let total: usize = self.vips.values().map(|v| v.backends.len()).sum();
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        if config.backends.contains_key(&backend) {
            return Err(ModelError::DuplicateBackend { vip: *vip, backend });
        }
        if config.backends.len() >= MAX_BACKENDS_PER_VIP as usize {
            return Err(ModelError::TooManyBackendsInVip { vip: *vip });
        }
        if total >= (MAX_BACKENDS - 1) as usize {
            return Err(ModelError::TooManyBackends);
        }
        config.backends.insert(backend, Backend { weight });
        Ok(())
    }

    pub fn remove_backend(&mut self, vip: &Vip, backend: IpAddr) -> Result<(), ModelError> {
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        config.backends.remove(&backend).map(|_| ()).ok_or(ModelError::UnknownBackend { vip: *vip, backend })
    }

    pub fn set_weight(&mut self, vip: &Vip, backend: IpAddr, weight: u32) -> Result<(), ModelError> {
        check_weight(weight)?;
        let config = self.vips.get_mut(vip).ok_or(ModelError::UnknownVip { vip: *vip })?;
        let entry = config.backends.get_mut(&backend).ok_or(ModelError::UnknownBackend { vip: *vip, backend })?;
        entry.weight = weight;
        Ok(())
    }

    /// Re-checks a whole state (e.g. one read from disk) against every rule the edits enforce.
    pub fn validate(&self) -> Result<(), ModelError> {
        let mut rebuilt = DesiredState::default();
        for (vip, config) in &self.vips {
            rebuilt.add_vip(*vip, config.ring_size)?;
            for (backend, b) in &config.backends {
                rebuilt.add_backend(vip, *backend, b.weight)?;
            }
        }
        Ok(())
    }
}

fn check_weight(weight: u32) -> Result<(), ModelError> {
    if weight > MAX_WEIGHT {
        return Err(ModelError::WeightOutOfRange { weight });
    }
    Ok(())
}

fn check_backend_address(vip: &Vip, backend: IpAddr) -> Result<(), ModelError> {
    let unusable = backend.is_unspecified() || backend.is_multicast() || matches!(backend, IpAddr::V4(v4) if v4.is_broadcast());
    if unusable {
        return Err(ModelError::BadBackendAddress { backend });
    }
    if vip.addr.is_ipv6() && backend.is_ipv4() {
        return Err(ModelError::FamilyMismatch { backend });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(s: &str) -> Vip {
        s.parse().unwrap()
    }

    #[test]
    fn vip_syntax() {
        for (input, shown) in
            [("10.0.0.1:80/tcp", "10.0.0.1:80/tcp"), ("10.0.0.1:0/UDP", "10.0.0.1:0/udp"), ("[fd00::1]:443/tcp", "[fd00::1]:443/tcp")]
        {
            assert_eq!(vip(input).to_string(), shown);
        }
        for bad in [
            "10.0.0.1:80",
            "10.0.0.1/tcp",
            "10.0.0.1:80/sctp",
            "fd00::1:80/tcp",
            "0.0.0.0:80/tcp",
            "10.0.0.1:99999/tcp",
            "224.0.0.1:80/udp",
        ] {
            assert!(matches!(bad.parse::<Vip>(), Err(ModelError::BadVip { .. })), "{bad} accepted");
        }
    }

    #[test]
    fn edits_refuse_bad_input_and_change_nothing() {
        let mut state = DesiredState::default();
        let v = vip("10.0.0.1:80/tcp");
        state.add_vip(v, DEFAULT_RING_SIZE).unwrap();
        state.add_backend(&v, "10.0.0.101".parse().unwrap(), 100).unwrap();
        let before = state.clone();
        let cases: Vec<(Result<(), ModelError>, ModelError)> = vec![
            (state.add_vip(v, DEFAULT_RING_SIZE), ModelError::DuplicateVip { vip: v }),
            (state.add_vip(vip("10.0.0.2:80/tcp"), 100), ModelError::BadRingSize { size: 100 }),
            (
                state.add_backend(&v, "10.0.0.101".parse().unwrap(), 1),
                ModelError::DuplicateBackend { vip: v, backend: "10.0.0.101".parse().unwrap() },
            ),
            (state.add_backend(&v, "10.0.0.102".parse().unwrap(), MAX_WEIGHT + 1), ModelError::WeightOutOfRange { weight: MAX_WEIGHT + 1 }),
            (
                state.add_backend(&vip("10.9.9.9:80/tcp"), "10.0.0.102".parse().unwrap(), 1),
                ModelError::UnknownVip { vip: vip("10.9.9.9:80/tcp") },
            ),
            (
                state.remove_backend(&v, "10.0.0.199".parse().unwrap()),
                ModelError::UnknownBackend { vip: v, backend: "10.0.0.199".parse().unwrap() },
            ),
            (state.add_backend(&v, "0.0.0.0".parse().unwrap(), 1), ModelError::BadBackendAddress { backend: "0.0.0.0".parse().unwrap() }),
        ];
        for (got, want) in cases {
            assert_eq!(got, Err(want));
        }
        assert_eq!(state, before);
    }

    #[test]
    fn v6_vip_refuses_v4_backend_but_v4_vip_takes_v6() {
        let mut state = DesiredState::default();
        let v6 = vip("[fd00:100::1]:80/tcp");
        let v4 = vip("10.100.0.1:80/tcp");
        state.add_vip(v6, 251).unwrap();
        state.add_vip(v4, 251).unwrap();
        assert!(matches!(state.add_backend(&v6, "10.0.0.1".parse().unwrap(), 1), Err(ModelError::FamilyMismatch { .. })));
        state.add_backend(&v4, "fd00::101".parse().unwrap(), 1).unwrap();
    }

    #[test]
    fn state_round_trips_through_json_and_validates() {
        let mut state = DesiredState::default();
        let v = vip("[fd00::1]:0/udp");
        state.add_vip(v, 4099).unwrap();
        state.add_backend(&v, "fd00::101".parse().unwrap(), 0).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        let back: DesiredState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        back.validate().unwrap();
        let mut broken = state;
        broken.vips.get_mut(&v).unwrap().ring_size = 10;
        assert_eq!(broken.validate(), Err(ModelError::BadRingSize { size: 10 }));
    }
}
