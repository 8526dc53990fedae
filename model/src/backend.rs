//! A backend as the operator declares it, and a VIP's health-check settings.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use spillway_common::types::{ENCAP_GUE, ENCAP_IPIP};

use super::{HealthConfig, MAX_RATE_PER_S, ModelError, ProbePath, ProbeSpec};

/// Longest zone label.
pub const MAX_ZONE_LEN: usize = 32;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Share of new flows relative to the VIP's other backends; 0 = draining.
    pub weight: u32,
    #[serde(default, skip_serializing_if = "BackendOptions::is_empty")]
    pub options: BackendOptions,
    /// While draining: when (Unix time, ms) the backend is removed. Wall-clock and
    /// persisted, so a restart of `lbd` neither forgets nor extends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline_unix_ms: Option<u64>,
    /// While serving: when (Unix time, ms) it started, i.e. was added or given a weight again
    /// after a drain. Its slow start runs from here on the wall clock, so every balancer
    /// given the same start ramps it alike (`None`: not known, a state from before the field;
    /// such a backend ramps from when this `lbd` first had it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_unix_ms: Option<u64>,
}

/// What else the operator says about a backend; every part is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendOptions {
    /// Failure domain (site, zone, rack). New flows prefer the balancer's own zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// New flows per second it sustains. When every backend of a VIP declares one, the VIP
    /// admits no more than its backends in service can take (the rest is shed at the edge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_per_s: Option<u32>,
    /// New flows per second it can take for other zones (default: a share of its capacity,
    /// `spare_fraction` in the VIP's health policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_per_s: Option<u32>,
    /// Where to probe it, when not its own address on the VIP's port. Through the tunnel,
    /// the probe goes to the VIP on this target's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_target: Option<SocketAddr>,
    /// How to probe it, when not as its VIP says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_path: Option<ProbePath>,
    /// How to tunnel to it, when not as its VIP says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
}

/// How packets are tunnelled to a backend (the data path's `BackendInfo::encap`); its agent
/// decapsulates both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Encap {
    /// IPIP, IP6IP6 or IPv4-in-IPv6: the outer IP header alone.
    #[default]
    Ipip,
    /// GUE variant 1: the outer IP header, then a UDP header (to `lbd --gue-port`, from a
    /// source port taken from the flow hash, so the backend's RSS spreads flows), then the
    /// packet. 8 bytes more than IPIP; passes network gear that mishandles IPIP.
    Gue,
}

impl Encap {
    pub const fn as_str(self) -> &'static str {
        match self {
            Encap::Ipip => "ipip",
            Encap::Gue => "gue",
        }
    }

    pub fn is_ipip(&self) -> bool {
        *self == Encap::Ipip
    }

    /// `BackendInfo::encap`.
    pub const fn data_path(self) -> u8 {
        match self {
            Encap::Ipip => ENCAP_IPIP,
            Encap::Gue => ENCAP_GUE,
        }
    }
}

impl std::fmt::Display for Encap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl BackendOptions {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    pub fn validate(&self, backend: IpAddr) -> Result<(), ModelError> {
        let Self { zone, capacity_per_s, spare_per_s, probe_target, probe_path: _, encap: _ } = self;
        if let Some(zone) = zone {
            check_zone(zone)?;
        }
        if let Some(per_s) = *capacity_per_s
            && !(1..=MAX_RATE_PER_S).contains(&per_s)
        {
            return Err(ModelError::BadRate { field: format!("backend {backend} capacity_per_s"), per_s });
        }
        if let Some(spare) = *spare_per_s {
            let capacity = capacity_per_s.ok_or(ModelError::SpareWithoutCapacity { backend })?;
            if spare > capacity {
                return Err(ModelError::SpareAboveCapacity { backend, spare, capacity });
            }
        }
        if let Some(target) = probe_target {
            let ip = target.ip();
            if target.port() == 0 || ip.is_unspecified() || ip.is_multicast() {
                return Err(ModelError::BadProbeTarget { backend, target: *target });
            }
        }
        Ok(())
    }
}

/// A zone label: 1 to 32 of `a-z 0-9 . _ -` (it appears in logs and metrics labels).
pub fn check_zone(zone: &str) -> Result<(), ModelError> {
    let valid = (1..=MAX_ZONE_LEN).contains(&zone.len())
        && zone.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-'));
    if valid { Ok(()) } else { Err(ModelError::BadZone { zone: zone.to_owned() }) }
}

/// How a VIP's backends are health-checked, when not `lbd`'s defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipHealth {
    #[serde(default)]
    pub probe: ProbeSpec,
    #[serde(default)]
    pub policy: HealthConfig,
    /// Through the tunnel to the VIP (the default) or directly to each backend.
    #[serde(default, skip_serializing_if = "ProbePath::is_tunnel")]
    pub probe_path: ProbePath,
}

impl VipHealth {
    pub fn validate(&self) -> Result<(), ModelError> {
        self.probe.validate().map_err(|e| ModelError::BadHealth { message: e.to_string() })?;
        self.policy.validate().map_err(|e| ModelError::BadHealth { message: e.to_string() })
    }
}
