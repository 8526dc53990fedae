//! The maps the balancer reads, as plain values: what the model decides from.

use std::collections::BTreeMap;

use crate::{frame::Dst, routes::Routes};

use spillway_common::{
    quic_lb::QuicLbConfig,
    types::{BackendInfo, EchoConfig, LbConfig, Limits, QuicServer, QuicServerKey, RuleSlotKey, RuleValue, VipKey},
};

/// One VIP as the VIP index holds it, its Maglev table read out slot by slot.
#[derive(Clone, Debug)]
pub struct VipEntry {
    pub key: VipKey,
    pub id: u32,
    pub flags: u32,
    /// The backend id in each slot of its active Maglev table (empty: no table).
    pub ring: Vec<u32>,
    /// Its second-chance table: the active one before its last change (empty: none).
    pub prior: Vec<u32>,
    /// A QUIC VIP's QUIC-LB configuration.
    pub quic: Option<QuicLbConfig>,
}

/// Everything the path reads but its own kernel-owned state (the connection table, buckets,
/// fragment records), which the model keeps itself.
#[derive(Clone, Debug, Default)]
pub struct MapState {
    pub config: LbConfig,
    pub vips: Vec<VipEntry>,
    /// The `ADDR_F_*` flags of each VIP address (family, address).
    pub addresses: BTreeMap<(u8, [u32; 4]), u32>,
    /// The echo answers' rates.
    pub echo: EchoConfig,
    /// By id; an id missing here reads as a free slot.
    pub backends: BTreeMap<u32, BackendInfo>,
    /// Configured limits by VIP id.
    pub limits: BTreeMap<u32, Limits>,
    /// The default limits, for VIPs without their own.
    pub default_limits: Option<Limits>,
    pub rules: Vec<(RuleSlotKey, RuleValue)>,
    /// QUIC VIPs' configurations by (VIP id, config id), the one in use and any other.
    pub quic_configs: BTreeMap<(u32, u8), QuicLbConfig>,
    /// QUIC VIPs' servers by (VIP id, server id), each with a copy of its backend.
    pub quic_servers: Vec<(QuicServerKey, QuicServer)>,
    /// Buckets of the connection table (a power of two).
    pub table_buckets: u32,
    /// The interface frames arrive on, and those the redirect map holds.
    pub ingress: u32,
    pub tx_ports: Vec<u32>,
    /// The kernel's routes, for a config without the static next hop.
    pub routes: Routes,
}

impl MapState {
    /// Exact (address, port, protocol) first, then the address's "any port" VIP.
    pub(crate) fn vip(&self, key: &VipKey) -> Option<&VipEntry> {
        self.vips.iter().find(|v| v.key == *key).or_else(|| self.vips.iter().find(|v| v.key == VipKey { port: 0, ..*key }))
    }

    /// The address's `ADDR_F_*` flags (0: no VIP uses it).
    pub(crate) fn address_flags(&self, dst: &Dst) -> u32 {
        self.addresses.get(&(dst.family, dst.addr)).copied().unwrap_or(0)
    }

    /// A VIP's own limits, else the default.
    pub(crate) fn limits_of(&self, vip_id: u32) -> Option<&Limits> {
        self.limits.get(&vip_id).or(self.default_limits.as_ref())
    }
}
