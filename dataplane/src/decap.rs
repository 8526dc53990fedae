//! The backends' side of the data path: the decapsulator (`spillway_decap`) that `lbd agent`
//! loads, and its maps: the host's addresses (a tunnel to one of them is stripped), the
//! balancers allowed to send tunnels (`spw_allow_from`), the GUE port, and the counts per
//! `DecapReason`.

use std::net::IpAddr;

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::Xdp,
};
use spillway_common::{
    addr::to_words,
    limits::{map_names, program_names},
    types::{ALLOW_KEY_FAMILY_BITS, AddrKey, AllowKey, DecapConfig, DecapReason},
};

use crate::{
    DataplaneError,
    maps::{named, take},
    objects,
};

/// The decapsulator, loaded and not yet attached ([`Decap::program`]).
pub struct Decap {
    ebpf: Ebpf,
    local: HashMap<MapData, AddrKey, u32>,
    allow: LpmTrie<MapData, AllowKey, u32>,
    config: Array<MapData, DecapConfig>,
}

/// The decapsulator's counts per reason, read while it runs.
pub struct DecapCounts(PerCpuArray<MapData, u64>);

/// The allow-list key of a prefix (`spw_allow_from`: the family, then the address bits).
pub fn allow_key(addr: IpAddr, prefix_len: u8) -> Key<AllowKey> {
    let (addr, family) = to_words(addr);
    Key::new(ALLOW_KEY_FAMILY_BITS + u32::from(prefix_len), AllowKey { family, _pad: [0; 3], addr })
}

impl Decap {
    /// Loads the decapsulator with room for `max_local_addrs` addresses of this host.
    pub fn load(max_local_addrs: u32) -> Result<(Decap, DecapCounts), DataplaneError> {
        let sizes = [(map_names::LOCAL_ADDRS, max_local_addrs)];
        let mut ebpf = crate::load_sized(objects::DECAP, "spillway-decap", program_names::DECAP, &sizes)?;
        let local = take(&mut ebpf, map_names::LOCAL_ADDRS)?;
        let counts = DecapCounts(take(&mut ebpf, map_names::DECAP_REASONS)?);
        let allow = take(&mut ebpf, map_names::ALLOW_FROM)?;
        let config = take(&mut ebpf, map_names::DECAP_CONFIG)?;
        Ok((Decap { ebpf, local, allow, config }, counts))
    }

    /// Accepts tunnels from `addr/prefix_len`.
    pub fn allow_from(&mut self, addr: IpAddr, prefix_len: u8) -> Result<(), DataplaneError> {
        named(map_names::ALLOW_FROM, self.allow.insert(&allow_key(addr, prefix_len), &1, 0))
    }

    /// The UDP port of GUE tunnels (0: IPIP only).
    pub fn set_gue_port(&mut self, port: u16) -> Result<(), DataplaneError> {
        named(map_names::DECAP_CONFIG, self.config.set(0, &DecapConfig { gue_port: port.to_be(), _pad: 0 }, 0))
    }

    /// The addresses it decapsulates for.
    pub fn local_addrs(&self) -> Result<Vec<AddrKey>, DataplaneError> {
        named(map_names::LOCAL_ADDRS, self.local.keys().collect())
    }

    pub fn add_local_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::LOCAL_ADDRS, self.local.insert(key, &1, 0))
    }

    pub fn remove_local_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::LOCAL_ADDRS, self.local.remove(key))
    }

    /// Its rare events as log lines (see [`crate::logs`]), until the returned task is aborted.
    pub fn forward_logs(&mut self) -> Result<tokio::task::JoinHandle<()>, DataplaneError> {
        crate::logs::forward(&mut self.ebpf)
    }

    /// The program, to attach.
    pub fn program(&mut self) -> Result<&mut Xdp, DataplaneError> {
        crate::xdp(&mut self.ebpf, program_names::DECAP)
    }
}

impl DecapCounts {
    /// Every `DecapReason` with its count summed over CPUs (0 when unreadable).
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        DecapReason::ALL.iter().map(|r| (r.label(), self.0.get(&(*r as u32), 0).map_or(0, |per_cpu| per_cpu.iter().sum()))).collect()
    }
}
