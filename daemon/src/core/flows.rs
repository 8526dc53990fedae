//! Answers about single flows, from the maps the data path reads and with its hash: the
//! connection-table entry of a tuple, the Maglev slot a new flow lands on, and what the
//! limits would decide (`lbctl flows get`); a VIP's entries (`flows list`); and deleting a
//! drained or removed backend's entries (`flows purge`).

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    ops::ControlFlow,
};

use spillway_common::{
    addr::{from_words, to_words},
    hash::maglev_hash,
    limits::ANY_VIP,
    prefix::masked,
    types::{
        BACKEND_ACTIVE, BackendInfo, Bucket, FAMILY_V4, FlowInfo, FlowKey, LIMIT_F_OBSERVE_BUDGET, LIMIT_F_OBSERVE_SOURCE, LbConfig,
        Limits, PROTO_TCP, RULE_BLOCK, RULE_LIMIT, Rate, Reason, RingRef, RuleValue, SourceKey, SourceState,
    },
};

use super::{Core, CoreError, Counters};
use crate::store::Store;
use crate::telemetry::{FlowCount, TABLE_FULL_REPEAT, TableFullAlert};
use spillway_api::flows::{Admission, DEFAULT_FLOW_LIST, FlowAnswer, FlowEntry, FlowEntryState, FlowList, MAX_FLOW_LIST, PurgeReport};
use spillway_dataplane::{BalancerMaps, DataplaneError, clock};
use spillway_model::{Proto, Vip};
use spillway_reconcile::Maps;

const NS_PER_S: u64 = 1_000_000_000;

/// Logged when new flows found the connection table full, and an alert for a minute after.
pub(super) const TABLE_FULL_ALERT: &str = "ALERT: the connection table was full where new flows hash: they went to their Maglev \
     backend without an entry (raise --max-flows, or look for a flood: ARCHITECTURE.md, \"What holding entries costs\")";

/// The connection table and the limit state, as the flow answers read them; implemented by
/// the real maps and, in tests, a fake.
pub trait FlowTable {
    fn flow(&self, key: &FlowKey) -> Option<FlowInfo>;
    /// Visits entries until `visit` breaks; returns how many it visited.
    fn scan_flows(&self, visit: &mut dyn FnMut(&FlowKey, &FlowInfo) -> ControlFlow<()>) -> Result<u64, DataplaneError>;
    fn remove_flow(&mut self, key: &FlowKey) -> Result<bool, DataplaneError>;
    fn flow_capacity(&self) -> u64;
    /// The backend id a Maglev table gives a flow of Maglev hash `hash` (`None`: an empty
    /// table).
    fn maglev_choice(&self, table: RingRef, hash: u32) -> Result<Option<u32>, DataplaneError>;
    fn budget_bucket(&self, vip_id: u32) -> Result<Bucket, DataplaneError>;
    fn source_state(&self, key: &SourceKey) -> Option<SourceState>;
    fn lb_config(&self) -> Result<LbConfig, DataplaneError>;
}

impl FlowTable for BalancerMaps {
    fn flow(&self, key: &FlowKey) -> Option<FlowInfo> {
        BalancerMaps::flow(self, key)
    }
    fn scan_flows(&self, visit: &mut dyn FnMut(&FlowKey, &FlowInfo) -> ControlFlow<()>) -> Result<u64, DataplaneError> {
        Ok(BalancerMaps::scan_flows(self, visit))
    }
    fn remove_flow(&mut self, key: &FlowKey) -> Result<bool, DataplaneError> {
        Ok(BalancerMaps::remove_flow(self, key))
    }
    fn flow_capacity(&self) -> u64 {
        BalancerMaps::flow_capacity(self)
    }
    fn maglev_choice(&self, table: RingRef, hash: u32) -> Result<Option<u32>, DataplaneError> {
        Ok(self.rings.choice(table, hash))
    }
    fn budget_bucket(&self, vip_id: u32) -> Result<Bucket, DataplaneError> {
        BalancerMaps::budget_bucket(self, vip_id)
    }
    fn source_state(&self, key: &SourceKey) -> Option<SourceState> {
        BalancerMaps::source_state(self, key)
    }
    fn lb_config(&self) -> Result<LbConfig, DataplaneError> {
        BalancerMaps::config(self)
    }
}

/// Whether a GCRA bucket at `tat` would admit a flow at `now`: the data path's
/// `limits::gcra_admit` without its update (a zero rate admits everything).
fn gcra_would_admit(tat: u64, rate: &Rate, now: u64) -> bool {
    rate.per_s == 0 || tat.max(now) + rate.interval_ns - now <= rate.tolerance_ns
}

/// A client's tuple as the data path keys it (ports in network order).
fn flow_key(client: SocketAddr, vip: &Vip, port: u16) -> FlowKey {
    let (src, family) = to_words(client.ip());
    let (dst, _) = to_words(vip.addr);
    FlowKey { src, dst, sport: client.port().to_be(), dport: port.to_be(), proto: vip.proto.number(), family, _pad: [0; 2] }
}

fn client_of(key: &FlowKey) -> Option<SocketAddr> {
    Some(SocketAddr::new(from_words(key.src, key.family)?, u16::from_be(key.sport)))
}

/// The idle timeout of the entry's protocol, in seconds (`select::expired`).
fn idle_timeout_s(proto: u8, config: &LbConfig) -> u32 {
    if proto == PROTO_TCP { config.tcp_idle_timeout_s } else { config.udp_idle_timeout_s }
}

/// Whether an entry of protocol `proto` is idle past its timeout at `now`: the data path
/// no longer follows it (`select::expired`), so it stands for no live connection.
fn expired(proto: u8, flow: &FlowInfo, config: &LbConfig, now: u64) -> bool {
    flow.idle_ns(now) > u64::from(idle_timeout_s(proto, config)) * NS_PER_S
}

/// Backend slots read once per walk (a table holds far more entries than backends), and
/// the timeouts and clock the walk judges idleness by.
struct Backends<'a, M> {
    maps: &'a M,
    seen: HashMap<u32, Option<BackendInfo>>,
    config: LbConfig,
    now: u64,
}

impl<'a, M: Maps + Counters> Backends<'a, M> {
    fn new(maps: &'a M) -> Result<Self, DataplaneError> {
        Ok(Self { maps, seen: HashMap::new(), config: maps.lb_config()?, now: clock::coarse_now_ns() })
    }

    /// The active backend that `flow` still names (same id and generation), if any.
    fn live(&mut self, flow: &FlowInfo) -> Option<BackendInfo> {
        let maps = self.maps;
        let info = *self.seen.entry(flow.backend_id).or_insert_with(|| maps.backend(flow.backend_id).ok());
        info.filter(|b| b.state == BACKEND_ACTIVE && b.generation as u16 == flow.generation)
    }

    /// [`Self::live`] for an entry the data path still follows: not idle past its timeout.
    /// What a live connection is, for every count and listing.
    fn in_force(&mut self, key: &FlowKey, flow: &FlowInfo) -> Option<BackendInfo> {
        if expired(key.proto, flow, &self.config, self.now) {
            return None;
        }
        self.live(flow)
    }
}

impl<M: Maps + Counters, S: Store> Core<M, S> {
    pub(super) fn flow_get(&self, vip: &Vip, client: SocketAddr, port: Option<u16>) -> Result<FlowAnswer, CoreError> {
        self.state.vip(vip)?;
        let bad = |problem: String| CoreError::BadFlow { problem };
        if client.is_ipv4() != vip.addr.is_ipv4() {
            return Err(bad(format!("the client {client} and the VIP {vip} are of different address families")));
        }
        let port = match (vip.port, port) {
            (0, None) => return Err(bad(format!("{vip} serves every port: give the destination port (--port)"))),
            (0, Some(p)) if self.state.vips.keys().any(|v| v.addr == vip.addr && v.proto == vip.proto && v.port == p) => {
                return Err(bad(format!("port {p} of {} has a VIP of its own: ask about that VIP", vip.addr)));
            }
            (0, Some(p)) => p,
            (own, Some(p)) if p != own => return Err(bad(format!("{vip} only serves port {own}"))),
            (own, _) => own,
        };
        let key = flow_key(client, vip, port);
        let config = self.maps.lb_config().map_err(CoreError::Counters)?;
        let id = self.reconciler.vip_id(vip).ok_or_else(|| bad(format!("{vip} is not in the maps yet")))?;
        let meta = self.maps.vips().map_err(CoreError::ReadMaps)?.into_iter().map(|(_, m)| m).find(|m| m.id == id);
        let meta = meta.ok_or_else(|| bad(format!("{vip} is not in the maps yet")))?;
        // The VIP's hash mode as its slot says, as the data path reads it.
        let hash = maglev_hash(&key, meta.flags, config.flow_seed);
        let slot = hash % meta.active.size.max(1);
        let owner = self.maps.maglev_choice(meta.active, hash).map_err(CoreError::Counters)?;
        let maglev = owner
            .and_then(|id| self.maps.backend(id).ok())
            .filter(|b| b.state == BACKEND_ACTIVE)
            .and_then(|b| from_words(b.addr, b.family));
        let now = clock::coarse_now_ns();
        let entry = self.maps.flow(&key).map(|value| self.entry_state(&key, &value, &config, now));
        let admission = self.admission(&key, id, now)?;
        // As `second_chance::candidates`: both ids differ and name backends in use.
        let prior = if vip.proto == Proto::Tcp { self.maps.maglev_choice(meta.prior, hash).map_err(CoreError::Counters)? } else { None };
        let second_chance = prior
            .filter(|&p| Some(p) != owner && maglev.is_some())
            .and_then(|p| self.maps.backend(p).ok())
            .filter(|b| b.state == BACKEND_ACTIVE)
            .and_then(|b| from_words(b.addr, b.family));
        let goes_to = match &entry {
            Some(FlowEntryState { in_force: true, backend, .. }) => *backend,
            _ if admission.admitted || second_chance.is_some() => maglev,
            _ => None,
        };
        Ok(FlowAnswer { vip: *vip, client, port, entry, hash, slot, maglev, second_chance, goes_to, admission })
    }

    /// What the data path makes of an existing entry (`select::established`).
    fn entry_state(&self, key: &FlowKey, flow: &FlowInfo, config: &LbConfig, now: u64) -> FlowEntryState {
        let info = self.maps.backend(flow.backend_id).ok().filter(|b| b.state == BACKEND_ACTIVE);
        let stale = match info {
            None => Some("its backend was removed".to_owned()),
            Some(b) if b.generation as u16 != flow.generation => Some("its backend was removed (the id now holds another)".to_owned()),
            Some(_) if expired(key.proto, flow, config, now) => {
                Some(format!("idle past the {} s timeout", idle_timeout_s(key.proto, config)))
            }
            Some(_) => None,
        };
        FlowEntryState {
            backend: info.filter(|b| b.generation as u16 == flow.generation).and_then(|b| from_words(b.addr, b.family)),
            idle_ms: flow.idle_ns(now) / 1_000_000,
            in_force: stale.is_none(),
            stale,
        }
    }

    /// The limits' verdict on a new flow (`limits::decide`, read-only): the operator rule,
    /// else the per-source bucket, then the VIP budget. An observed refusal lets the flow on.
    fn admission(&self, key: &FlowKey, vip_id: u32, now: u64) -> Result<Admission, CoreError> {
        let limits = self.maps.limits().map_err(CoreError::ReadMaps)?;
        let configured = |slot: u32| limits.get(slot as usize).filter(|l| l.configured != 0).copied();
        let limits: Option<Limits> = configured(vip_id).or_else(|| configured(self.maps.capacity().default_limit_slot()));
        let flags = limits.map_or(0, |l| l.flags);
        let mut refusals: Vec<(Reason, bool)> = Vec::new();
        let rule = self.matching_rule(key, vip_id)?;
        match &rule {
            Some(rule) => {
                let observe = rule.flags & LIMIT_F_OBSERVE_SOURCE != 0;
                if rule.action == RULE_BLOCK {
                    refusals.push((Reason::DropRuleBlock, observe));
                } else if rule.action == RULE_LIMIT {
                    let bucket = self.maps.rule_state(rule.id).map_err(CoreError::Counters)?.bucket;
                    if !gcra_would_admit(bucket.tat_ns, &rule.rate, now) {
                        refusals.push((Reason::DropRuleLimit, observe));
                    }
                }
            }
            None => {
                if let Some(l) = limits.filter(|l| l.per_source.per_s != 0) {
                    let len = if key.family == FAMILY_V4 { l.source_prefix_v4 } else { l.source_prefix_v6 };
                    let skey = SourceKey { vip_id, family: key.family, _pad: [0; 3], prefix: masked(&key.src, len) };
                    let tat = self.maps.source_state(&skey).map_or(0, |s| s.bucket.tat_ns);
                    if !gcra_would_admit(tat, &l.per_source, now) {
                        refusals.push((Reason::DropSourceLimit, flags & LIMIT_F_OBSERVE_SOURCE != 0));
                    }
                }
            }
        }
        if let Some(l) = limits.filter(|l| l.vip_budget.per_s != 0) {
            let tat = self.maps.budget_bucket(vip_id).map_err(CoreError::Counters)?.tat_ns;
            if !gcra_would_admit(tat, &l.vip_budget, now) {
                refusals.push((Reason::DropVipBudget, flags & LIMIT_F_OBSERVE_BUDGET != 0));
            }
        }
        let enforced = refusals.iter().find(|(_, observe)| !observe);
        let (admitted, shown) = match enforced {
            Some(refusal) => (false, Some(refusal)),
            None => (true, refusals.first()),
        };
        let rule = rule.and_then(|r| self.state.rules.keys().find(|m| self.reconciler.rule_id(m) == Some(r.id))).map(|m| m.describe());
        Ok(Admission {
            admitted,
            refused_by: shown.map(|(reason, _)| reason.label().to_owned()),
            observe: shown.is_some_and(|(_, observe)| *observe),
            rule,
        })
    }

    /// The rule the data path applies (`limits::matching_rule`): the longest matching prefix
    /// of the rules scoped to the VIP and the global ones, the VIP's own at equal length.
    fn matching_rule(&self, key: &FlowKey, vip_id: u32) -> Result<Option<RuleValue>, CoreError> {
        let rules = self.maps.rules().map_err(CoreError::ReadMaps)?;
        let matching = rules.into_iter().filter(|(k, _)| {
            (k.scope == vip_id || k.scope == ANY_VIP) && k.family == key.family && k.addr == masked(&key.src, k.prefix_len)
        });
        Ok(matching.max_by_key(|(k, _)| (k.prefix_len, k.scope != ANY_VIP)).map(|(_, rule)| rule))
    }

    pub(super) fn flow_list(&self, vip: &Vip, backend: Option<IpAddr>, limit: Option<u32>) -> Result<FlowList, CoreError> {
        let config = self.state.vip(vip)?;
        let limit = match limit.unwrap_or(DEFAULT_FLOW_LIST) {
            n @ 1..=MAX_FLOW_LIST => n as usize,
            n => return Err(CoreError::BadFlow { problem: format!("limit {n} is out of range (1..={MAX_FLOW_LIST})") }),
        };
        if let Some(b) = backend.filter(|b| !config.backends.contains_key(b)) {
            return Err(CoreError::BadFlow { problem: format!("{b} is not a backend of {vip}") });
        }
        let wanted: HashMap<u32, IpAddr> = config
            .backends
            .keys()
            .filter(|a| backend.is_none_or(|b| b == **a))
            .filter_map(|a| Some((self.reconciler.backend_id(vip, a)?, *a)))
            .collect();
        let mut backends = Backends::new(&self.maps).map_err(CoreError::Counters)?;
        let (mut entries, mut truncated) = (Vec::new(), false);
        let now = backends.now;
        let scanned = self
            .maps
            .scan_flows(&mut |key, flow| {
                let Some(address) = wanted.get(&flow.backend_id) else { return ControlFlow::Continue(()) };
                if backends.in_force(key, flow).is_none() {
                    return ControlFlow::Continue(());
                }
                if entries.len() == limit {
                    truncated = true;
                    return ControlFlow::Break(());
                }
                if let Some(client) = client_of(key) {
                    let idle_ms = flow.idle_ns(now) / 1_000_000;
                    entries.push(FlowEntry { client, port: u16::from_be(key.dport), backend: *address, idle_ms });
                }
                ControlFlow::Continue(())
            })
            .map_err(CoreError::Counters)?;
        Ok(FlowList { vip: *vip, entries, scanned, truncated })
    }

    /// Deletes `backend`'s entries where it is drained; when it is no longer a backend at
    /// all, its entries are already dead (its ids' generations moved on) and every dead
    /// entry is deleted, which frees table space.
    pub(super) fn flow_purge(&mut self, backend: IpAddr) -> Result<PurgeReport, CoreError> {
        let serving: Vec<(&Vip, u32)> =
            self.state.vips.iter().filter_map(|(vip, c)| c.backends.get(&backend).map(|b| (vip, b.weight))).collect();
        if let Some((vip, weight)) = serving.iter().find(|(_, weight)| *weight != 0) {
            return Err(CoreError::BadFlow {
                problem: format!(
                    "{backend} is in service on {vip} (weight {weight}); purging would break its connections: \
                     drain it first (lbctl backends drain --vip {vip} {backend})"
                ),
            });
        }
        let ids: HashSet<u32> = serving.iter().filter_map(|(vip, _)| self.reconciler.backend_id(vip, &backend)).collect();
        let removed_backend = serving.is_empty();
        let mut doomed = Vec::new();
        let mut backends = Backends::new(&self.maps).map_err(CoreError::Counters)?;
        let scanned = self
            .maps
            .scan_flows(&mut |key, flow| {
                let live = backends.live(flow).is_some();
                if (removed_backend && !live) || (live && ids.contains(&flow.backend_id)) {
                    doomed.push(*key);
                }
                ControlFlow::Continue(())
            })
            .map_err(CoreError::Counters)?;
        let mut removed = 0;
        for key in &doomed {
            removed += u64::from(self.maps.remove_flow(key).map_err(CoreError::Counters)?);
        }
        spillway_logging::event!(
            info,
            "flows_purged",
            backend = backend,
            removed = removed,
            scanned = scanned,
            removed_backend = removed_backend
        );
        Ok(PurgeReport { backend, removed, scanned })
    }

    /// The live connections of `vip` now (its connection-table entries in force: of a
    /// backend still in place, not idle past the protocol's timeout): what removing it would
    /// break. With that timeout in seconds, to say what was counted.
    pub(super) fn vip_connections(&self, vip: &Vip) -> Result<(u64, u32), CoreError> {
        let mut backends = Backends::new(&self.maps).map_err(CoreError::Counters)?;
        let timeout_s = idle_timeout_s(vip.proto.number(), &backends.config);
        let Some(id) = self.reconciler.vip_id(vip) else { return Ok((0, timeout_s)) };
        let mut count = 0;
        self.maps
            .scan_flows(&mut |key, flow| {
                count += u64::from(backends.in_force(key, flow).is_some_and(|b| b.vip_id == id));
                ControlFlow::Continue(())
            })
            .map_err(CoreError::Counters)?;
        Ok((count, timeout_s))
    }

    /// Logs an ALERT when new flows found the table full since the last one (at most one a
    /// minute): they are forwarded without an entry, so a change of their VIP's table would
    /// move them.
    pub fn watch_flow_table(&mut self) {
        let Ok(unremembered) = self.maps.unremembered_flows() else { return };
        let alert = &mut self.telemetry.table_full;
        if unremembered <= alert.reported || alert.at.is_some_and(|at| at.elapsed() < TABLE_FULL_REPEAT) {
            return;
        }
        spillway_logging::event!(
            error,
            "flow_table_full",
            unremembered = unremembered - alert.reported,
            max_flows = self.maps.flow_capacity(),
            message = TABLE_FULL_ALERT
        );
        *alert = TableFullAlert { reported: unremembered, at: Some(std::time::Instant::now()) };
    }

    /// Counts the connection table's entries, and those in force per VIP id, when the last
    /// count is older than `FLOW_COUNT_INTERVAL`.
    pub(super) fn count_flows_if_due(&mut self) -> Result<(), DataplaneError> {
        if !self.telemetry.flow_count.due() {
            return Ok(());
        }
        let mut backends = Backends::new(&self.maps)?;
        let mut per_vip_id: HashMap<u32, u64> = HashMap::new();
        let entries = self.maps.scan_flows(&mut |key, flow| {
            if let Some(b) = backends.in_force(key, flow) {
                *per_vip_id.entry(b.vip_id).or_default() += 1;
            }
            ControlFlow::Continue(())
        })?;
        self.telemetry.flow_count = FlowCount { at: Some(std::time::Instant::now()), entries, per_vip_id };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use spillway_common::{limits::FLOW_TICK_SHIFT, types::FLOW_CONFIRMED};

    use super::*;
    use crate::core::tests::Fixture;
    use crate::testing::{VIP, ip, vip};
    use spillway_api::Request;

    #[test]
    fn only_entries_in_force_count_as_live_connections() {
        let mut f = Fixture::with_two_backends();
        let id = f.core.reconciler.backend_id(&vip(VIP), &ip("10.0.0.1")).unwrap();
        let generation = f.core.maps.backend(id).unwrap().generation as u16;
        let tick = |ns: u64| (ns >> FLOW_TICK_SHIFT) as u32 & !FLOW_CONFIRMED;
        let now = clock::coarse_now_ns();
        // The fake's TCP idle timeout is 900 s: one entry used now, one closed 901 s ago.
        for (port, touched_tick) in [(40000, tick(now)), (40001, tick(now.wrapping_sub(901 * NS_PER_S)))] {
            let key = flow_key(SocketAddr::new(ip("198.51.100.7"), port), &vip(VIP), 80);
            f.core.maps.flows.insert(key, FlowInfo { backend_id: id, generation, confirmed: true, touched_tick });
        }
        let err = f.core.handle(Request::RemoveVip { vip: vip(VIP), force: false }).unwrap_err().to_string();
        assert!(err.contains("has 2 backends and 1 live connections (connection-table entries used in the last 900 s"), "{err}");
        let listed: Vec<u16> = f.core.flow_list(&vip(VIP), None, None).unwrap().entries.iter().map(|e| e.client.port()).collect();
        assert_eq!(listed, [40000], "flows list shows only what the data path follows");
    }

    #[test]
    fn gcra_check_matches_the_data_path_rule() {
        let rate = Rate::new(10, 2);
        let now = 1_000 * NS_PER_S;
        // An idle bucket (TAT in the past) admits; one a full tolerance ahead refuses.
        assert!(gcra_would_admit(0, &rate, now));
        let interval = NS_PER_S / 10;
        assert!(gcra_would_admit(now + 2 * interval, &rate, now), "TAT + T - now = 3T = tolerance: admitted");
        assert!(!gcra_would_admit(now + 2 * interval + 1, &rate, now));
        assert!(gcra_would_admit(u64::MAX / 2, &Rate::new(0, 0), now), "no limit");
    }

    #[test]
    fn keys_are_in_network_order() {
        let vip: Vip = "10.100.0.1:80/tcp".parse().unwrap();
        let key = flow_key("10.0.1.5:40000".parse().unwrap(), &vip, 80);
        assert_eq!((key.sport, key.dport), (40000u16.to_be(), 80u16.to_be()));
        assert_eq!(key.src[0], u32::from_ne_bytes([10, 0, 1, 5]));
        assert_eq!(client_of(&key), Some("10.0.1.5:40000".parse().unwrap()));
    }
}
