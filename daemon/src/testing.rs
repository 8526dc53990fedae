//! Test helpers shared by the daemon's unit tests: the reconciler's in-memory maps
//! (`spillway_reconcile::testing::FakeMaps`) given the daemon's counter and connection-table
//! traits, the harness's temporary directory and the model's address helpers.

use std::ops::ControlFlow;

use spillway_common::{
    limits::{SOURCE_TABLE_ENTRIES, map_names},
    types::{Bucket, FlowInfo, FlowKey, LbConfig, Observed, Reason, RingRef, RuleState, SourceKey, SourceState, Traffic},
};
use spillway_dataplane::{DataplaneError, MapOccupancy};
pub use spillway_harness::tempdir::TempDir;
pub use spillway_model::testing::{VIP, ip, vip};
pub use spillway_reconcile::testing::FakeMaps;

use crate::core::{Counters, FlowTable};

impl Counters for FakeMaps {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        Ok(self.vip_traffic.get(&id).copied().unwrap_or_default())
    }
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        Ok(self.backend_traffic.get(&id).copied().unwrap_or_default())
    }
    fn vip_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        Ok(self.vip_traffic(id)?.new_flows)
    }
    fn backend_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        Ok(self.backend_traffic(id)?.new_flows)
    }
    fn memory(&self) -> Vec<(&str, Option<u64>)> {
        vec![("spw_flows", Some(1 << 20)), ("spw_unreadable", None)]
    }
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        Ok(Reason::ALL.iter().enumerate().map(|(i, r)| (*r, i as u64)).collect())
    }
    fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError> {
        Ok(Observed::ALL.iter().enumerate().map(|(i, o)| (*o, 10 + i as u64)).collect())
    }
    fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError> {
        Ok(self.rule_state.get(&id).copied().unwrap_or_default())
    }
    fn second_chance_packets(&self) -> Result<u64, DataplaneError> {
        Ok(3)
    }
    fn pass_to_missing(&self) -> Result<u64, DataplaneError> {
        Ok(6)
    }
    fn quic_routing(&self) -> Result<Vec<(spillway_common::types::QuicRouting, u64)>, DataplaneError> {
        Ok(spillway_common::types::QuicRouting::ALL.iter().enumerate().map(|(i, r)| (*r, 20 + i as u64)).collect())
    }
    fn unremembered_flows(&self) -> Result<u64, DataplaneError> {
        Ok(self.unremembered_flows)
    }
    fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError> {
        Ok(self.sources.iter().filter(|(k, _)| k.vip_id == vip_id).map(|(k, v)| (*k, *v)).collect())
    }
    fn occupancy(&self) -> Result<Vec<MapOccupancy>, DataplaneError> {
        let counted = |name, max_entries, entries: usize| MapOccupancy { name, max_entries, entries: Some(entries as u64) };
        Ok(vec![
            counted(map_names::VIPS, self.capacity.vip_slots(), self.vips.len()),
            MapOccupancy { name: map_names::BACKENDS, max_entries: self.capacity.backend_slots(), entries: None },
            counted(map_names::SOURCES, SOURCE_TABLE_ENTRIES, self.sources.len()),
        ])
    }
}

impl FlowTable for FakeMaps {
    fn flow(&self, key: &FlowKey) -> Option<FlowInfo> {
        self.flows.get(key).copied()
    }
    fn scan_flows(&self, visit: &mut dyn FnMut(&FlowKey, &FlowInfo) -> ControlFlow<()>) -> Result<u64, DataplaneError> {
        let mut visited = 0;
        for (key, value) in &self.flows {
            visited += 1;
            if visit(key, value).is_break() {
                break;
            }
        }
        Ok(visited)
    }
    fn remove_flow(&mut self, key: &FlowKey) -> Result<bool, DataplaneError> {
        Ok(self.flows.remove(key).is_some())
    }
    fn flow_capacity(&self) -> u64 {
        u64::from(self.capacity.flows)
    }
    fn maglev_choice(&self, table: RingRef, hash: u32) -> Result<Option<u32>, DataplaneError> {
        let slot = |slot: u32| self.rings.get(&(4 * u64::from(table.base) + u64::from(slot))).copied().unwrap_or(0);
        Ok((table.size != 0).then(|| slot(hash % table.size)))
    }
    fn budget_bucket(&self, vip_id: u32) -> Result<Bucket, DataplaneError> {
        Ok(self.budget.get(&vip_id).copied().unwrap_or_default())
    }
    fn source_state(&self, key: &SourceKey) -> Option<SourceState> {
        self.sources.get(key).copied()
    }
    fn lb_config(&self) -> Result<LbConfig, DataplaneError> {
        Ok(LbConfig { tcp_idle_timeout_s: 900, udp_idle_timeout_s: 120, ..LbConfig::default() })
    }
}
