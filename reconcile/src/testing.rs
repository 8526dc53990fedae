//! An in-memory model of the balancer's maps for unit tests: the reconciler writes into it as
//! into the kernel's maps, and it checks the reconciler's guarantees on every write. Its
//! counter and connection-table fields serve the daemon's tests (which implement their own
//! traits over it).

use std::collections::{BTreeSet, HashMap};

use spillway_common::{
    limits::{ANY_VIP, Capacity, MAX_RULES, VIP_FILTER_WORDS},
    maglev::EMPTY_SLOT,
    types::{
        AddrKey, BACKEND_ACTIVE, BACKEND_FREE, BackendInfo, Bucket, FlowInfo, FlowKey, Limits, QuicServer, QuicServerKey, RingRef,
        RuleSlotKey, RuleState, RuleValue, SourceKey, SourceState, Traffic, VipKey, VipMeta,
    },
};

use crate::{Maps, MapsError};

/// The failure `fail_next_write` and `fail_next_rule` inject.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Injected(&'static str);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct FakeMaps {
    pub capacity: Capacity,
    pub vips: HashMap<VipKey, VipMeta>,
    /// The VIP addresses and their `ADDR_F_*` flags.
    pub addrs: Vec<(AddrKey, u32)>,
    /// Ring pool slots written, by `4 * word + lane`.
    pub rings: HashMap<u64, u32>,
    pub backends: HashMap<u32, BackendInfo>,
    pub vip_traffic: HashMap<u32, Traffic>,
    pub backend_traffic: HashMap<u32, Traffic>,
    pub filter: Vec<u64>,
    /// Limits array slots (absent = zero).
    pub limits: HashMap<u32, Limits>,
    /// Kernel-owned state, as a data path would leave it.
    pub budget: HashMap<u32, Bucket>,
    pub sources: HashMap<SourceKey, SourceState>,
    pub rule_state: HashMap<u32, RuleState>,
    /// Rule index entries.
    pub rules: HashMap<RuleSlotKey, RuleValue>,
    /// The connection table, as a data path would leave it.
    pub flows: HashMap<FlowKey, FlowInfo>,
    /// New flows the full table could not remember, as the data path counts them.
    pub unremembered_flows: u64,
    /// Makes the next `write_slots` fail, to exercise rollback.
    pub fail_next_write: bool,
    /// Makes the next `set_rule` fail, to exercise rollback.
    pub fail_next_rule: bool,
    pub slot_writes: usize,
    pub limit_writes: usize,
    pub rule_writes: usize,
    pub backend_writes: usize,
    /// Server-id entries.
    pub quic_servers: HashMap<QuicServerKey, QuicServer>,
    /// Key files and second config ids, by (VIP id, config id).
    pub quic_keys: std::collections::BTreeMap<(u32, u8), std::path::PathBuf>,
    pub quic_configs: std::collections::BTreeMap<(u32, u8), spillway_common::quic_lb::QuicLbConfig>,
}

impl FakeMaps {
    pub fn active_table(&self, key: &VipKey) -> Vec<u32> {
        self.read_ring(self.vips[key].active).unwrap()
    }

    /// The VIP's second-chance table packets read (empty: none).
    pub fn prior_table(&self, key: &VipKey) -> Vec<u32> {
        self.read_ring(self.vips[key].prior).unwrap()
    }

    /// The reconciler's guarantees, checked after every flip and every free: each slot of
    /// each active table names an active backend of that VIP, and no two tables overlap or
    /// leave the pool.
    fn assert_consistent(&self) {
        let mut tables: Vec<RingRef> = self.vips.values().flat_map(|m| [m.active, m.standby, m.prior]).filter(|t| t.size != 0).collect();
        tables.sort();
        for pair in tables.windows(2) {
            assert!(pair[0].base + RingRef::words(pair[0].size) <= pair[1].base, "tables {pair:?} overlap");
        }
        if let Some(last) = tables.last() {
            assert!(last.base + RingRef::words(last.size) <= self.capacity.ring_words(), "table {last:?} beyond the pool");
        }
        for meta in self.vips.values() {
            for id in self.read_ring(meta.active).unwrap() {
                if id != EMPTY_SLOT {
                    let b = self.backends[&id];
                    assert_eq!((b.state, b.vip_id), (BACKEND_ACTIVE, meta.id), "slot names backend {id}");
                }
            }
        }
        // A server-id entry's copy says its backend is active: the entry goes before the
        // backend does.
        for (key, server) in &self.quic_servers {
            let b = self.backends[&server.backend_id];
            assert_eq!(b.state, BACKEND_ACTIVE, "server id {key:?} names freed backend {}", server.backend_id);
        }
    }
}

impl FakeMaps {
    /// Rule guarantees, checked on every index write: ids are unique and in range, and a
    /// scoped entry names a VIP packets can reach.
    fn assert_rules_consistent(&self) {
        let mut ids = BTreeSet::new();
        for (key, value) in &self.rules {
            assert!(value.id < MAX_RULES && ids.insert(value.id), "rule id {} out of range or used twice", value.id);
            let vip_id = key.scope;
            assert!(vip_id == ANY_VIP || self.vips.values().any(|m| m.id == vip_id), "rule scoped to VIP id {vip_id}, which is not live");
        }
    }
}

impl Maps for FakeMaps {
    fn capacity(&self) -> Capacity {
        self.capacity
    }
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, MapsError> {
        Ok(self.vips.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), MapsError> {
        // An encrypted configuration names a key already in.
        if meta.quic.is_encrypted() {
            assert!(
                self.quic_keys.contains_key(&(meta.id, meta.quic.config_id)),
                "VIP id {} names config id {} before its key",
                meta.id,
                meta.quic.config_id
            );
        }
        self.vips.insert(*key, *meta);
        self.assert_consistent();
        Ok(())
    }
    fn remove_vip(&mut self, key: &VipKey) -> Result<(), MapsError> {
        if let Some(meta) = self.vips.remove(key) {
            let scoped = self.rules.keys().any(|k| k.scope == meta.id);
            assert!(!scoped, "VIP id {} removed while rules are scoped to it", meta.id);
        }
        Ok(())
    }
    fn vip_addrs(&self) -> Result<Vec<(AddrKey, u32)>, MapsError> {
        Ok(self.addrs.clone())
    }
    fn set_vip_addr(&mut self, key: &AddrKey, flags: u32) -> Result<(), MapsError> {
        self.addrs.retain(|(k, _)| k != key);
        self.addrs.push((*key, flags));
        Ok(())
    }
    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), MapsError> {
        self.addrs.retain(|(k, _)| k != key);
        Ok(())
    }
    fn write_slots(&mut self, table: RingRef, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, MapsError> {
        if std::mem::take(&mut self.fail_next_write) {
            return Err(MapsError::new(Injected("injected failure")));
        }
        // Writing a table packets read would expose a half-written table.
        let overlaps = |a: RingRef| a.base < table.base + RingRef::words(table.size) && table.base < a.base + RingRef::words(a.size);
        assert!(!self.vips.values().any(|m| overlaps(m.active)), "wrote into an active table");
        assert!(!self.vips.values().any(|m| overlaps(m.prior)), "wrote into a second-chance table in force");
        let mut n = 0;
        for (slot, owner) in slots {
            assert!(slot < table.size, "slot {slot} of a table of {}", table.size);
            self.rings.insert(4 * u64::from(table.base) + u64::from(slot), owner);
            n += 1;
        }
        self.slot_writes += n;
        Ok(n)
    }
    fn read_ring(&self, table: RingRef) -> Result<Vec<u32>, MapsError> {
        let base = 4 * u64::from(table.base);
        Ok((0..u64::from(table.size)).map(|s| self.rings.get(&(base + s)).copied().unwrap_or(0)).collect())
    }
    fn backend(&self, id: u32) -> Result<BackendInfo, MapsError> {
        Ok(self.backends.get(&id).copied().unwrap_or_default())
    }
    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), MapsError> {
        self.backends.insert(id, *info);
        self.backend_writes += 1;
        if info.state == BACKEND_FREE {
            self.assert_consistent();
        }
        Ok(())
    }
    fn vip_filter(&self) -> Result<Vec<u64>, MapsError> {
        let mut words = self.filter.clone();
        words.resize(VIP_FILTER_WORDS as usize, 0);
        Ok(words)
    }
    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapsError> {
        self.filter.resize(VIP_FILTER_WORDS as usize, 0);
        self.filter[index as usize] = word;
        Ok(())
    }
    fn reset_vip_stats(&mut self, id: u32) -> Result<(), MapsError> {
        self.vip_traffic.remove(&id);
        self.budget.remove(&id);
        self.sources.retain(|k, _| k.vip_id != id);
        Ok(())
    }
    fn reset_backend_stats(&mut self, id: u32) -> Result<(), MapsError> {
        self.backend_traffic.remove(&id);
        Ok(())
    }
    fn limits(&self) -> Result<Vec<Limits>, MapsError> {
        Ok((0..=self.capacity.default_limit_slot()).map(|slot| self.limits.get(&slot).copied().unwrap_or_default()).collect())
    }
    fn set_limits(&mut self, slot: u32, limits: &Limits) -> Result<(), MapsError> {
        assert!(slot <= self.capacity.default_limit_slot(), "limits slot {slot} out of range");
        self.limits.insert(slot, *limits);
        self.limit_writes += 1;
        Ok(())
    }
    fn rules(&self) -> Result<Vec<(RuleSlotKey, RuleValue)>, MapsError> {
        Ok(self.rules.iter().map(|(key, value)| (*key, *value)).collect())
    }
    fn set_rule(&mut self, key: &RuleSlotKey, value: &RuleValue) -> Result<(), MapsError> {
        if std::mem::take(&mut self.fail_next_rule) {
            return Err(MapsError::new(Injected("injected rule failure")));
        }
        self.rules.insert(*key, *value);
        self.rule_writes += 1;
        self.assert_rules_consistent();
        Ok(())
    }
    fn remove_rule(&mut self, key: &RuleSlotKey) -> Result<(), MapsError> {
        self.rules.remove(key);
        self.rule_writes += 1;
        Ok(())
    }
    fn reset_rule_state(&mut self, id: u32) -> Result<(), MapsError> {
        assert!(!self.rules.values().any(|v| v.id == id), "zeroed the counters of live rule id {id}");
        self.rule_state.remove(&id);
        Ok(())
    }
    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, QuicServer)>, MapsError> {
        Ok(self.quic_servers.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn set_quic_server(&mut self, key: &QuicServerKey, server: &QuicServer) -> Result<(), MapsError> {
        let id = server.backend_id;
        let b = self.backends[&id];
        assert_eq!((b.state, b.vip_id), (BACKEND_ACTIVE, key.vip_id), "server id entry names backend {id}");
        assert_eq!(server.backend, b, "server id entry's copy of backend {id}");
        self.quic_servers.insert(*key, *server);
        Ok(())
    }
    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<(), MapsError> {
        self.quic_servers.remove(key);
        Ok(())
    }
    fn set_quic_key(&mut self, vip_id: u32, config_id: u8, key_file: Option<&std::path::Path>) -> Result<(), MapsError> {
        match key_file {
            Some(file) => self.quic_keys.insert((vip_id, config_id), file.to_path_buf()),
            None => self.quic_keys.remove(&(vip_id, config_id)),
        };
        Ok(())
    }
    fn set_quic_config(
        &mut self,
        vip_id: u32,
        config_id: u8,
        config: Option<spillway_common::quic_lb::QuicLbConfig>,
    ) -> Result<(), MapsError> {
        // A config id beside the slot's names a key already in (keys go first).
        if let Some(config) = config.filter(|c| c.is_encrypted()) {
            assert!(
                self.quic_keys.contains_key(&(vip_id, config.config_id)),
                "config id {} of VIP id {vip_id} before its key",
                config.config_id
            );
        }
        match config {
            Some(config) => self.quic_configs.insert((vip_id, config_id), config),
            None => self.quic_configs.remove(&(vip_id, config_id)),
        };
        Ok(())
    }
}
