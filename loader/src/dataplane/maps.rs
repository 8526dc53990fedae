//! Typed handles on the balancer's maps, and the few operations the rest of the daemon
//! needs. Per-CPU counters are summed here.

use aya::{
    Ebpf,
    maps::{Array, DevMapHash, HashMap, Map, MapData, MapError, PerCpuArray},
};
use spillway_common::{
    limits::map_names,
    types::{AddrKey, BackendInfo, FlowKey, FlowValue, LbConfig, Reason, Traffic, VipKey, VipMeta},
};

use super::DataplaneError;

pub struct BalancerMaps {
    pub config: Array<MapData, LbConfig>,
    pub vips: HashMap<MapData, VipKey, VipMeta>,
    pub vip_addrs: HashMap<MapData, AddrKey, u32>,
    pub rings: Array<MapData, u32>,
    pub backends: Array<MapData, BackendInfo>,
    pub flows: HashMap<MapData, FlowKey, FlowValue>,
    pub vip_stats: PerCpuArray<MapData, Traffic>,
    pub backend_stats: PerCpuArray<MapData, Traffic>,
    pub reasons: PerCpuArray<MapData, u64>,
    pub tx_ports: DevMapHash<MapData>,
    pub vip_filter: Array<MapData, u64>,
}

fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, DataplaneError> {
    let map = ebpf.take_map(name).ok_or(DataplaneError::MissingMap { name })?;
    T::try_from(map).map_err(|source| DataplaneError::Map { name, source })
}

/// Wraps a map error with the map's name.
pub(crate) fn named<T>(name: &'static str, r: Result<T, MapError>) -> Result<T, DataplaneError> {
    r.map_err(|source| DataplaneError::Map { name, source })
}

impl BalancerMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        Ok(Self {
            config: take(ebpf, map_names::CONFIG)?,
            vips: take(ebpf, map_names::VIPS)?,
            vip_addrs: take(ebpf, map_names::VIP_ADDRS)?,
            rings: take(ebpf, map_names::RINGS)?,
            backends: take(ebpf, map_names::BACKENDS)?,
            flows: take(ebpf, map_names::FLOWS)?,
            vip_stats: take(ebpf, map_names::VIP_STATS)?,
            backend_stats: take(ebpf, map_names::BACKEND_STATS)?,
            reasons: take(ebpf, map_names::REASONS)?,
            tx_ports: take(ebpf, map_names::TX_PORTS)?,
            vip_filter: take(ebpf, map_names::VIP_FILTER)?,
        })
    }

    pub fn set_config(&mut self, config: &LbConfig) -> Result<(), DataplaneError> {
        named(map_names::CONFIG, self.config.set(0, config, 0))
    }

    pub fn config(&self) -> Result<LbConfig, DataplaneError> {
        named(map_names::CONFIG, self.config.get(&0, 0))
    }

    /// Writes `(slot, backend id)` pairs into table `half` of VIP `vip_id`.
    pub fn write_slots(&mut self, vip_id: u32, half: u32, slots: impl IntoIterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        let base = VipMeta::ring_base(vip_id, half);
        let mut written = 0;
        for (slot, owner) in slots {
            named(map_names::RINGS, self.rings.set(base + slot, &owner, 0))?;
            written += 1;
        }
        Ok(written)
    }

    /// Reads table `half` of VIP `vip_id` (`size` slots).
    pub fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError> {
        let base = VipMeta::ring_base(vip_id, half);
        (base..base + size).map(|i| named(map_names::RINGS, self.rings.get(&i, 0))).collect()
    }

    /// Makes the redirect map hold exactly `ifindexes`, each redirecting to itself.
    pub fn set_tx_ports(&mut self, ifindexes: &[u32]) -> Result<(), DataplaneError> {
        let have: Vec<u32> = named(map_names::TX_PORTS, self.tx_ports.keys().collect())?;
        for stale in have.iter().filter(|i| !ifindexes.contains(i)) {
            named(map_names::TX_PORTS, self.tx_ports.remove(*stale))?;
        }
        for &ifindex in ifindexes.iter().filter(|i| !have.contains(i)) {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .map_err(|source| DataplaneError::XdpMap { name: map_names::TX_PORTS, source })?;
        }
        Ok(())
    }

    pub fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        named(map_names::BACKENDS, self.backends.set(id, info, 0))
    }

    pub fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        named(map_names::BACKENDS, self.backends.get(&id, 0))
    }

    pub fn flow(&self, key: &FlowKey) -> Option<FlowValue> {
        self.flows.get(key, 0).ok()
    }

    pub fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::VIP_STATS, &self.vip_stats, id)
    }

    pub fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::BACKEND_STATS, &self.backend_stats, id)
    }

    /// Every reason with its count summed over CPUs.
    pub fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        Reason::ALL
            .iter()
            .map(|&r| {
                let per_cpu = named(map_names::REASONS, self.reasons.get(&(r as u32), 0))?;
                Ok((r, per_cpu.iter().sum()))
            })
            .collect()
    }
}

fn sum_traffic(name: &'static str, map: &PerCpuArray<MapData, Traffic>, id: u32) -> Result<Traffic, DataplaneError> {
    let per_cpu = named(name, map.get(&id, 0))?;
    Ok(per_cpu.iter().fold(Traffic::default(), |acc, t| Traffic { packets: acc.packets + t.packets, bytes: acc.bytes + t.bytes }))
}

impl crate::reconcile::Maps for BalancerMaps {
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, DataplaneError> {
        self.vips.iter().map(|r| named(map_names::VIPS, r)).collect()
    }

    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        named(map_names::VIPS, self.vips.insert(key, meta, 0))
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError> {
        named(map_names::VIPS, self.vips.remove(key))
    }

    fn vip_addrs(&self) -> Result<Vec<AddrKey>, DataplaneError> {
        self.vip_addrs.keys().map(|r| named(map_names::VIP_ADDRS, r)).collect()
    }

    fn set_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.insert(key, &1, 0))
    }

    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.remove(key))
    }

    fn write_slots(&mut self, vip_id: u32, half: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        BalancerMaps::write_slots(self, vip_id, half, slots)
    }

    fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError> {
        BalancerMaps::read_ring(self, vip_id, half, size)
    }

    fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        BalancerMaps::backend(self, id)
    }

    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        BalancerMaps::set_backend(self, id, info)
    }

    fn vip_filter(&self) -> Result<Vec<u64>, DataplaneError> {
        self.vip_filter.iter().map(|r| named(map_names::VIP_FILTER, r)).collect()
    }

    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        named(map_names::VIP_FILTER, self.vip_filter.set(index, &word, 0))
    }

    fn reset_vip_stats(&mut self, id: u32) -> Result<(), DataplaneError> {
        zero_traffic(map_names::VIP_STATS, &mut self.vip_stats, id)
    }

    fn reset_backend_stats(&mut self, id: u32) -> Result<(), DataplaneError> {
        zero_traffic(map_names::BACKEND_STATS, &mut self.backend_stats, id)
    }
}

fn zero_traffic(name: &'static str, map: &mut PerCpuArray<MapData, Traffic>, id: u32) -> Result<(), DataplaneError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| DataplaneError::Cpus(source))?;
    let zeros = aya::maps::PerCpuValues::try_from(vec![Traffic::default(); cpus.get() as usize]).map_err(DataplaneError::Cpus)?;
    named(name, map.set(id, zeros, 0))
}
