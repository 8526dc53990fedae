//! One reading of every counter and state (`Request::Sample`): what `lbctl top` and the
//! metrics endpoint show.

use super::{Core, CoreError, Counters};
use crate::health_checks::Checks;
use crate::store::Store;
use spillway_api::sample::{BackendSample, FlowTableSample, MapMemory, RuleSample, Sample, VipHealthSample, VipSample};
use spillway_reconcile::Maps;

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// Reads the counters now; the connection table is counted again only when its last
    /// count is older than `telemetry::FLOW_COUNT_INTERVAL`.
    pub fn sample(&mut self) -> Result<Sample, CoreError> {
        self.count_flows_if_due().map_err(CoreError::Counters)?;
        let stats = self.stats().map_err(CoreError::Counters)?;
        let now_ms = self.health.as_ref().map_or(0, Checks::now_ms);
        let count = &self.telemetry.flow_count;
        let mut vips = Vec::new();
        for (vip_stats, backends) in stats.vips.iter().zip(self.backends_of_every_vip()?) {
            let vip = &vip_stats.vip;
            let id = self.reconciler.vip_id(vip);
            let new_flows = |read: &dyn Fn(u32) -> Result<u64, _>, id: Option<u32>| id.map_or(Ok(0), read).map_err(CoreError::Counters);
            let health = self.health.as_ref().and_then(|c| c.tracker(vip)).map(|t| {
                let r = t.report(now_ms);
                VipHealthSample {
                    panic: r.panic,
                    panics_entered: r.panics_entered,
                    healthy_weight: r.healthy_weight,
                    total_weight: r.total_weight,
                }
            });
            let mut samples = Vec::new();
            for (b, entry) in vip_stats.backends.iter().zip(backends) {
                let id = self.reconciler.backend_id(vip, &b.address);
                samples.push(BackendSample {
                    address: b.address,
                    weight: entry.weight,
                    effective_weight: entry.effective_weight.unwrap_or(entry.weight),
                    packets: b.packets,
                    bytes: b.bytes,
                    new_flows: new_flows(&|id| self.maps.backend_new_flows(id), id)?,
                    health: entry.health,
                    latency_ms: entry.latency_ms,
                    pressure: entry.pressure,
                });
            }
            vips.push(VipSample {
                vip: *vip,
                packets: vip_stats.packets,
                bytes: vip_stats.bytes,
                new_flows: new_flows(&|id| self.maps.vip_new_flows(id), id)?,
                flow_entries: count.at.map(|_| id.and_then(|id| count.per_vip_id.get(&id).copied()).unwrap_or(0)),
                health,
                budget: self.programmed().effective_limits(vip).and_then(|l| l.vip_budget),
                spill_per_s: self.health.as_ref().and_then(|c| c.placement(vip)).map_or(0, |p| p.spill_per_s),
                backends: samples,
            });
        }
        let rules = self
            .rules()
            .map_err(CoreError::Counters)?
            .rules
            .into_iter()
            .map(|r| RuleSample {
                cidr: r.cidr,
                vip: r.vip,
                action: r.action,
                observe: r.observe,
                hits: r.hits,
                dropped: r.dropped,
                would_drop: r.would_drop,
            })
            .collect();
        let flow_table = FlowTableSample {
            capacity: self.maps.flow_capacity(),
            entries: count.at.map(|_| count.entries),
            counted_s_ago: count.at.map(|at| at.elapsed().as_secs()),
            unremembered: self.maps.unremembered_flows().map_err(CoreError::Counters)?,
        };
        let maps =
            self.maps.memory().into_iter().filter_map(|(map, bytes)| Some(MapMemory { map: map.to_owned(), bytes: bytes? })).collect();
        let alert = self.health.as_ref().is_some_and(|c| !c.local_alerts().is_empty());
        Ok(Sample {
            at_ms: self.telemetry.now_ms(),
            info: self.telemetry.info.clone(),
            vips,
            reasons: stats.reasons,
            observed: stats.observed,
            rules,
            flow_table,
            maps,
            daemon: self.telemetry.sample(alert),
            second_chance_packets: self.maps.second_chance_packets().map_err(CoreError::Counters)?,
            pass_to_missing: self.maps.pass_to_missing().map_err(CoreError::Counters)?,
            quic: stats.quic,
            announcements: self.announcements.clone(),
            interfaces: self.interface_statuses(),
        })
    }

    /// `backends list` of every VIP, in the state's order.
    fn backends_of_every_vip(&self) -> Result<Vec<Vec<spillway_api::BackendEntry>>, CoreError> {
        self.state.vips.keys().map(|vip| Ok(self.backends(vip)?.backends)).collect()
    }
}
