//! The read-only answers of the API: lists, counters, health and limits as they stand.

use std::cmp::Reverse;

use spillway_common::{
    addr::from_words,
    types::{FAMILY_V4, RuleState, Traffic},
};

use super::{Core, CoreError, Counters};
use crate::store::Store;
use crate::wall_clock::unix_ms;
use crate::{
    health_checks::{Checks, LocalCause, probe_path},
    ports_book::LB_PORTS_CRITICAL_ALERT,
    telemetry::TABLE_FULL_REPEAT,
};
use spillway_api::{
    BackendEntry, BackendList, BackendStats, BudgetLimit, LimitOrigin, PerSourceLimit, RateLimitList, ReasonCount, RuleActionKind,
    RuleEntry, RuleList, ScopeLimits, SourceEntry, Stats, TopSourceList, VipEntry, VipHealthView, VipLimits, VipList, VipStats,
};
use spillway_dataplane::DataplaneError;
use spillway_model::{Cidr, LimitConfig, ModelError, RuleAction, Vip, server_ids};
use spillway_policy::health::{BackendHealth, Reason, State};
use spillway_reconcile::{Maps, table_digest};

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// Every ALERT in force, from every source: `status`, `vips list`, `backends list` and
    /// `stats` all show the same list (the probe-socket and tunnel ones come before the
    /// per-agent ones, which can last much longer).
    pub(super) fn alerts(&self) -> Vec<String> {
        let mut alerts = Vec::new();
        alerts.extend(self.uplink_alerts());
        if let Some(pin) = &self.pass_to_gone {
            alerts.push(format!(
                "ALERT: nothing is pinned at --pass-to {pin}: the frames the balancer does not serve pass to the kernel \
                 (pass_to_missing) until a program is pinned there again"
            ));
        }
        if let Some(why) = &self.announcer_down {
            alerts.push(format!("ALERT: lbd announces and withdraws nothing ({why}); BIRD keeps announcing what it had; restart lbd"));
        }
        if let Some(announced) = &self.announcements {
            if let Some(error) = &announced.bird_error {
                alerts.push(format!("ALERT: BIRD: {error}"));
            }
            for r in announced.routes.iter().filter(|r| r.is_fault()) {
                let held = if r.held { ", held by the floor" } else { "" };
                let peers = r.peers.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
                alerts.push(format!(
                    "ALERT: {} is {} ({}{held}; {peers} other balancers announce it, floor {})",
                    spillway_announce::host_route(r.address),
                    r.state,
                    r.reason,
                    r.floor
                ));
            }
        }
        alerts.extend(self.ports.rejected().map(|(backend, why)| {
            format!("ALERT: the port report from {backend}'s agent was ignored: {why}; its port pressure is unchanged")
        }));
        if let Some(checks) = self.health.as_ref() {
            let now_ms = checks.now_ms();
            alerts.extend(checks.local_alerts().iter().map(|(cause, alert)| {
                let (probes, for_s) = (alert.unknown_probes, now_ms.saturating_sub(alert.since_ms) / 1000);
                match cause {
                    LocalCause::Sockets => format!(
                        "ALERT: this balancer cannot open probe sockets ({probes} probes in {for_s} s): its own ephemeral ports, \
                         sockets or memory are short; backends keep their states (see lbctl ports)"
                    ),
                    LocalCause::VipPath(why) => format!(
                        "ALERT: this balancer cannot probe through the tunnel ({probes} probes in {for_s} s): {why}; backends keep \
                         their states"
                    ),
                }
            }));
        }
        alerts.extend(self.ports.stopped_agents().map(|(backend, u)| {
            format!(
                "ALERT: {backend}'s agent has not answered for {} s ({}): its port pressure is unknown; its health is unchanged",
                u.since.elapsed().as_secs(),
                u.error
            )
        }));
        if self.ports.local_critical() {
            alerts.push(LB_PORTS_CRITICAL_ALERT.to_owned());
        }
        if self.telemetry.table_full.at.is_some_and(|at| at.elapsed() < TABLE_FULL_REPEAT) {
            alerts.push(super::flows::TABLE_FULL_ALERT.to_owned());
        }
        alerts.extend(self.probe_path.clone());
        alerts
    }

    pub(super) fn vips(&self) -> VipList {
        let seed = self.maps.lb_config().ok().map(|c| c.flow_seed);
        let vips = self
            .state
            .vips
            .iter()
            .map(|(vip, config)| {
                let checks = self.health.as_ref();
                let health = checks.and_then(|c| Some((c, c.tracker(vip)?))).map(|(c, tracker)| {
                    let report = tracker.report(c.now_ms());
                    VipHealthView {
                        probe: config.health.as_ref().map(|h| h.probe.clone()).unwrap_or_default(),
                        probe_path: config.health.as_ref().map(|h| h.probe_path).unwrap_or_default(),
                        vip_path_failed: tracker
                            .backends(c.now_ms())
                            .iter()
                            .filter(|b| matches!(b.reason, Reason::VipPathFailed { .. }) && b.state != State::Draining)
                            .count(),
                        panic: report.panic,
                        panics_entered: report.panics_entered,
                        fail_closed: tracker.config().fail_closed,
                        ejection_capped: report.ejection_capped,
                        healthy_weight: report.healthy_weight,
                        total_weight: report.total_weight,
                        ejected_weight: report.ejected_weight,
                        spill_per_s: c.placement(vip).map_or(0, |p| p.spill_per_s),
                        policy: tracker.config().clone(),
                    }
                });
                let effective_budget = self.programmed().effective_limits(vip).and_then(|l| l.vip_budget);
                let announcement = self.announcements.as_ref().and_then(|a| a.routes.iter().find(|r| r.address == vip.addr)).cloned();
                let table_digest = seed
                    .zip(self.reconciler.active_table(vip))
                    .map(|(seed, table)| table_digest(seed, config.source_prefix_len(vip), &table));
                VipEntry {
                    vip: *vip,
                    ring_size: config.ring_size,
                    encap: config.encap,
                    hash: config.hash,
                    source_prefix: config.source_prefix,
                    backends: config.backends.len(),
                    health,
                    effective_budget,
                    announcement,
                    table_digest,
                }
            })
            .collect();
        VipList { vips, alerts: self.alerts() }
    }

    pub(super) fn backends(&self, vip: &Vip) -> Result<BackendList, ModelError> {
        let config = self.state.vip(vip)?;
        let now_ms = self.health.as_ref().map_or(0, Checks::now_ms);
        let now_unix_ms = unix_ms();
        let health: Vec<BackendHealth> = self.health.as_ref().and_then(|c| c.tracker(vip)).map(|t| t.backends(now_ms)).unwrap_or_default();
        let server_ids = server_ids(config);
        let backends = config
            .backends
            .iter()
            .map(|(address, b)| {
                let h = health.iter().find(|h| h.backend == *address);
                let effective_weight = self.programmed().vips.get(vip).and_then(|c| c.backends.get(address)).map_or(b.weight, |p| p.weight);
                BackendEntry {
                    encap: config.encap_of(b),
                    health: h.map(|h| h.state.as_str().to_owned()),
                    effective_weight: Some(effective_weight),
                    options: b.options.clone(),
                    reason: h.map(|h| h.reason.to_string()),
                    state_for_s: h.map(|h| now_ms.saturating_sub(h.since_ms) / 1000),
                    latency_ms: h.and_then(|h| h.latency_ewma_us).map(|us| us as f64 / 1000.0),
                    probe_path: h.map(|_| probe_path(config, b)),
                    pressure: h.map(|h| h.pressure.as_str().to_owned()),
                    agent_unreachable_s: self.ports.unreachable(*address).map(|u| u.since.elapsed().as_secs()),
                    unknown_probes: h.map_or(0, |h| h.consecutive_unknown),
                    kept_in: h.is_some_and(|h| h.kept_in),
                    drain_deadline_in_s: b.drain_deadline_unix_ms.map(|d| d.saturating_sub(now_unix_ms).div_ceil(1000)),
                    server_id: server_ids.get(address).map(ToString::to_string),
                    ..BackendEntry::configured(*address, b.weight)
                }
            })
            .collect();
        Ok(BackendList { vip: *vip, backends, alerts: self.alerts() })
    }

    pub(super) fn stats(&self) -> Result<Stats, DataplaneError> {
        let traffic = |id: Option<u32>, read: &dyn Fn(u32) -> Result<Traffic, DataplaneError>| match id {
            Some(id) => read(id),
            None => Ok(Traffic::default()),
        };
        let mut vips = Vec::new();
        for (vip, config) in &self.state.vips {
            let t = traffic(self.reconciler.vip_id(vip), &|id| self.maps.vip_traffic(id))?;
            let mut backends = Vec::new();
            for address in config.backends.keys() {
                let b = traffic(self.reconciler.backend_id(vip, address), &|id| self.maps.backend_traffic(id))?;
                backends.push(BackendStats { address: *address, packets: b.packets, bytes: b.bytes });
            }
            vips.push(VipStats { vip: *vip, packets: t.packets, bytes: t.bytes, backends });
        }
        let reasons =
            self.maps.reasons()?.into_iter().map(|(reason, packets)| ReasonCount { reason: reason.label().to_owned(), packets }).collect();
        let observed =
            self.maps.observed()?.into_iter().map(|(o, packets)| ReasonCount { reason: o.label().to_owned(), packets }).collect();
        let quic =
            self.maps.quic_routing()?.into_iter().map(|(r, packets)| ReasonCount { reason: r.label().to_owned(), packets }).collect();
        Ok(Stats { vips, reasons, observed, quic, alerts: self.alerts() })
    }

    pub(super) fn rate_limits(&self) -> RateLimitList {
        let default = self.state.default_limits.as_ref();
        let vips = self
            .state
            .vips
            .iter()
            .map(|(vip, config)| VipLimits { vip: *vip, effective: scope_limits(config.limits.as_ref(), default) })
            .collect();
        RateLimitList { default: scope_limits(None, default), vips }
    }

    pub(super) fn rules(&self) -> Result<RuleList, DataplaneError> {
        let mut rules = Vec::new();
        for (rule, config) in &self.state.rules {
            let counters = match self.reconciler.rule_id(rule) {
                Some(id) => self.maps.rule_state(id)?,
                None => RuleState::default(),
            };
            let (action, rate) = match config.action {
                RuleAction::Limit(rate) => (RuleActionKind::Limit, Some(rate)),
                RuleAction::Block => (RuleActionKind::Block, None),
                RuleAction::Exempt => (RuleActionKind::Exempt, None),
            };
            rules.push(RuleEntry {
                cidr: rule.cidr,
                vip: rule.vip,
                action,
                rate,
                observe: config.observe,
                hits: counters.hits,
                dropped: counters.dropped,
                would_drop: counters.would_drop,
            });
        }
        Ok(RuleList { rules })
    }

    pub(super) fn top_sources(&self, vip: &Vip, limit: Option<u32>) -> Result<TopSourceList, CoreError> {
        if limit == Some(0) {
            return Err(CoreError::BadTopLimit);
        }
        self.state.vip(vip)?;
        let Some(id) = self.reconciler.vip_id(vip) else {
            return Ok(TopSourceList { vip: *vip, tracked: 0, sources: Vec::new() });
        };
        let limits = self.state.effective_limits(vip).unwrap_or_default();
        // The data path counts a source exactly only when it charges the source's bucket:
        // under a per-source limit, for flows no rule matched. Others are sampled.
        let rules: Vec<Cidr> = self.state.rules.keys().filter(|r| r.vip.is_none_or(|v| v == *vip)).map(|r| r.cidr).collect();
        let estimated = |prefix: &Cidr| limits.per_source.is_none() || rules.iter().any(|r| r.overlaps(prefix));
        let mut entries = self.maps.sources(id).map_err(CoreError::Counters)?;
        let tracked = entries.len();
        entries.sort_by_key(|(key, state)| (Reverse(state.dropped), Reverse(state.admitted), key.family, key.prefix));
        let sources = entries
            .into_iter()
            .filter_map(|(key, state)| {
                let addr = from_words(key.prefix, key.family)?;
                let len = if key.family == FAMILY_V4 { limits.source_prefix_v4 } else { limits.source_prefix_v6 };
                let prefix = Cidr { addr: Cidr::mask(addr, len), prefix_len: len };
                Some(SourceEntry { prefix, admitted: state.admitted, dropped: state.dropped, estimated: estimated(&prefix) })
            })
            .take(limit.map_or(usize::MAX, |l| l as usize))
            .collect();
        Ok(TopSourceList { vip: *vip, tracked, sources })
    }
}

/// A scope's effective limits, part by part, with where each part comes from.
fn scope_limits(own: Option<&LimitConfig>, default: Option<&LimitConfig>) -> ScopeLimits {
    let sources = [(own, LimitOrigin::Vip), (default, LimitOrigin::Default)];
    let sources = sources.iter().filter_map(|(c, from)| c.map(|c| (c, *from)));
    let per_source = sources.clone().find_map(|(c, from)| {
        c.per_source.map(|rate| PerSourceLimit {
            rate,
            source_prefix_v4: c.source_prefix_v4,
            source_prefix_v6: c.source_prefix_v6,
            observe: c.observe_source,
            from,
        })
    });
    let vip_budget = sources.clone().find_map(|(c, from)| c.vip_budget.map(|rate| BudgetLimit { rate, observe: c.observe_budget, from }));
    ScopeLimits { per_source, vip_budget }
}
