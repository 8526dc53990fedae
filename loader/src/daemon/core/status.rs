//! `lbctl status`: how this `lbd` runs, what its maps hold, and its alerts.

use super::{Core, CoreError, Counters};
use crate::{
    api::{AnnouncementsStatus, MapUsage, Status, WatcherStatus},
    reconcile::Maps,
    store::Store,
};

impl<M: Maps + Counters, S: Store> Core<M, S> {
    pub(super) fn status(&mut self) -> Result<Status, CoreError> {
        self.count_flows_if_due().map_err(CoreError::Counters)?;
        let flows = self.telemetry.flow_count.entries;
        let memory = self.maps.memory();
        let state = &self.state;
        let ring_pool = self.reconciler.ring_pool();
        let backends: usize = state.vips.values().map(|c| c.backends.len()).sum();
        // Arrays and the trie hold what the state puts there; the hash maps were counted.
        let in_use = |name: &str| -> Option<u64> {
            use spillway_common::limits::map_names as n;
            let used = match name {
                n::RINGS => {
                    let (free, total) = ring_pool;
                    total - free
                }
                n::BACKENDS => backends as u64,
                n::LIMITS => state.vips.values().filter(|c| c.limits.is_some()).count() as u64 + u64::from(state.default_limits.is_some()),
                n::RULES => state.rules.len() as u64,
                n::FLOWS => flows,
                _ => return None,
            };
            Some(used)
        };
        let maps = self
            .maps
            .occupancy()
            .map_err(CoreError::Counters)?
            .into_iter()
            .map(|m| MapUsage {
                name: m.name.to_owned(),
                max_entries: m.max_entries,
                used: m.entries.or_else(|| in_use(m.name)),
                bytes: memory.iter().find(|(name, _)| *name == m.name).and_then(|(_, bytes)| *bytes),
            })
            .collect();
        let info = &self.info;
        let watcher = match &info.watcher {
            Ok(w) => WatcherStatus { state: "loaded".to_owned(), mode: Some(w.mode.to_string()), summary: Some(w.summary()), error: None },
            Err(e) => WatcherStatus { state: "not_loaded".to_owned(), mode: None, summary: None, error: Some(e.clone()) },
        };
        Ok(Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_s: info.started.elapsed().as_secs(),
            iface: info.iface.clone(),
            xdp_mode: info.xdp_mode.to_owned(),
            attachment: info.attachment.to_owned(),
            pin_dir: info.pin_dir.display().to_string(),
            state_dir: info.state_dir.display().to_string(),
            health_checks: self.health.is_some(),
            zone: info.zone.clone(),
            config: info.config.clone(),
            vips: state.vips.len(),
            backends,
            rules: state.rules.len(),
            maps,
            watcher,
            announcements: AnnouncementsStatus { state: "off".to_owned() },
            alerts: self.alerts(),
        })
    }
}
