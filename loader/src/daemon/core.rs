//! What the API does, independent of sockets: owns the desired state, the reconciler and the
//! maps. A mutation is tried on a copy of the state, reconciled into the maps, persisted, and
//! only then becomes the current state; any failure rolls the maps back and changes nothing.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Instant,
};

use log::{error, info};
use spillway_common::{
    addr::from_words,
    limits::{DEFAULT_RING_SIZE, DEFAULT_SOURCE_PREFIX_V4, DEFAULT_SOURCE_PREFIX_V6},
    maglev::MAX_WEIGHT,
    types::{FAMILY_V4, Observed, Reason, RuleState, SourceKey, SourceState, Traffic},
};

use crate::{
    api::{
        ApiError, BackendEntry, BackendList, BackendState, BackendStats, BudgetLimit, ErrorKind, LimitOrigin, LimitPart, PerSourceLimit,
        RateLimitList, ReasonCount, Reply, Request, RuleActionKind, RuleEntry, RuleList, ScopeLimits, SourceEntry, Stats, TopSourceList,
        VipEntry, VipLimits, VipList, VipStats,
    },
    dataplane::{BalancerMaps, DataplaneError},
    health::{HealthConfig, HealthError, HealthTracker, ProbeKey, ProbeOutcome},
    model::{Cidr, DEFAULT_WEIGHT, DesiredState, LimitConfig, ModelError, RateSpec, RuleAction, RuleConfig, RuleMatch, Vip},
    reconcile::{ApplyReport, Maps, ReconcileError, Reconciler},
    store::{Store, StoreError},
};

/// The counters `lbctl stats`, `rules list` and `top-sources` report; implemented by the
/// real maps and, in tests, a fake.
pub trait Counters {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError>;
    fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError>;
    fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError>;
    /// The source table's entries of VIP id `vip_id`.
    fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError>;
}

impl Counters for BalancerMaps {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::vip_traffic(self, id)
    }
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::backend_traffic(self, id)
    }
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        BalancerMaps::reasons(self)
    }
    fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError> {
        BalancerMaps::observed(self)
    }
    fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError> {
        BalancerMaps::rule_state(self, id)
    }
    fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError> {
        BalancerMaps::sources(self, vip_id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("weight {weight} is out of range (1..={MAX_WEIGHT}); weight 0 is set by draining the backend")]
    WeightOutOfRange { weight: u32 },
    #[error("rule {rule}: {problem}")]
    BadRule { rule: String, problem: &'static str },
    #[error("top sources: limit must be at least 1")]
    BadTopLimit,
    #[error("applying the change to the balancer's maps (rolled back)")]
    Apply(#[source] ReconcileError),
    #[error("saving the state (change rolled back)")]
    Persist(#[source] StoreError),
    #[error("reading counters")]
    Counters(#[source] DataplaneError),
    #[error("health checks")]
    Health(#[source] HealthError),
}

impl CoreError {
    pub fn to_api(&self) -> ApiError {
        let kind = match self {
            Self::Model(_) | Self::WeightOutOfRange { .. } | Self::BadRule { .. } | Self::BadTopLimit => ErrorKind::Invalid,
            Self::Apply(_) | Self::Persist(_) | Self::Counters(_) | Self::Health(_) => ErrorKind::Internal,
        };
        ApiError { kind, message: error_chain(self) }
    }
}

/// `error: cause: cause`, so a single line names the root problem.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub struct Core<M, S> {
    state: DesiredState,
    reconciler: Reconciler,
    maps: M,
    store: S,
    /// `None` with `--no-health-checks`: the configured weights are programmed as they are.
    health: Option<Health>,
}

/// One backend of one VIP to probe, with the VIP's settings.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    pub key: ProbeKey,
    pub addr: SocketAddr,
    pub config: HealthConfig,
}

/// What one probe found.
#[derive(Clone, Debug)]
pub struct ProbeResult {
    pub key: ProbeKey,
    pub outcome: ProbeOutcome,
}

/// The health policy of every probed VIP and what the maps were last given.
struct Health {
    config: HealthConfig,
    /// One per probed VIP (see `probes::probe_port`), in step with the desired state.
    trackers: BTreeMap<Vip, HealthTracker>,
    /// `now_ms` counts from here (monotonic).
    epoch: Instant,
    /// The desired state with effective weights, as last applied to the maps.
    programmed: DesiredState,
    last_programmed_ms: u64,
}

impl Health {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Makes the trackers follow `state`: a tracker per probed VIP, its backends and weights.
    fn sync(&mut self, state: &DesiredState, now_ms: u64) -> Result<(), HealthError> {
        self.trackers.retain(|vip, _| state.vips.contains_key(vip) && super::probes::probe_port(vip).is_some());
        for (vip, config) in &state.vips {
            if super::probes::probe_port(vip).is_none() {
                continue;
            }
            if !self.trackers.contains_key(vip) {
                self.trackers.insert(*vip, HealthTracker::new(*vip, self.config.clone())?);
            }
            if let Some(tracker) = self.trackers.get_mut(vip) {
                tracker.sync_config(config, now_ms);
            }
        }
        self.log_events();
        Ok(())
    }

    /// `state` with every probed backend's weight replaced by its effective weight. The
    /// operator's state (persisted) is never changed; only this copy reaches the maps.
    fn effective(&self, state: &DesiredState, now_ms: u64) -> DesiredState {
        let mut effective = state.clone();
        for (vip, config) in &mut effective.vips {
            let Some(tracker) = self.trackers.get(vip) else { continue };
            let weights = tracker.effective_weights(now_ms);
            for (addr, backend) in &mut config.backends {
                if let Some(weight) = weights.get(addr) {
                    backend.weight = *weight;
                }
            }
        }
        effective
    }

    fn log_events(&mut self) {
        for tracker in self.trackers.values_mut() {
            for event in tracker.take_events() {
                info!("{event}");
            }
        }
    }
}

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// Adopts what the maps hold and makes them carry `state` (which was loaded from `store`).
    pub fn start(mut maps: M, store: S, state: DesiredState) -> Result<(Self, ApplyReport), ReconcileError> {
        let mut reconciler = Reconciler::adopt(&maps)?;
        let report = reconciler.apply(&mut maps, &state)?;
        Ok((Self { state, reconciler, maps, store, health: None }, report))
    }

    /// Turns health checks on: from now on the maps carry effective (health-adjusted)
    /// weights, and [`Self::health_round`] must be called regularly.
    pub fn enable_health(&mut self, config: HealthConfig) -> Result<ApplyReport, CoreError> {
        let mut health =
            Health { config, trackers: BTreeMap::new(), epoch: Instant::now(), programmed: self.state.clone(), last_programmed_ms: 0 };
        health.config.validate().map_err(|e| CoreError::Health(e.into()))?;
        health.sync(&self.state, 0).map_err(CoreError::Health)?;
        let effective = health.effective(&self.state, 0);
        let report = self.reconciler.apply(&mut self.maps, &effective);
        self.health = Some(health);
        match report {
            Ok(report) => {
                if let Some(h) = &mut self.health {
                    h.programmed = effective;
                }
                Ok(report)
            }
            Err(e) => {
                self.roll_back();
                Err(CoreError::Apply(e))
            }
        }
    }

    /// Feeds probe outcomes, runs time-driven transitions, logs health events and, at most
    /// once per probe interval and only when they changed, programs the effective weights.
    /// Returns what to probe now and the health clock.
    pub fn health_round(&mut self, results: Vec<ProbeResult>) -> Result<(Vec<ProbeTarget>, u64), CoreError> {
        let Some(health) = &mut self.health else { return Ok((Vec::new(), 0)) };
        let now_ms = health.now_ms();
        for ProbeResult { key, outcome } in results {
            if let Some(tracker) = health.trackers.get_mut(&key.vip) {
                // A backend removed while its probe was in flight: nothing to record.
                let _ = tracker.observe(key.backend, &outcome, now_ms);
            }
        }
        for tracker in health.trackers.values_mut() {
            // No drain deadlines are set yet, so no removals are asked for.
            let _ = tracker.tick(now_ms);
        }
        health.log_events();
        let targets = health
            .trackers
            .iter()
            .filter_map(|(vip, tracker)| Some((vip, tracker, super::probes::probe_port(vip)?)))
            .flat_map(|(vip, tracker, port)| {
                let config = tracker.config().clone();
                tracker.backends(now_ms).into_iter().map(move |b| ProbeTarget {
                    key: ProbeKey { vip: *vip, backend: b.backend },
                    addr: SocketAddr::new(b.backend, port),
                    config: config.clone(),
                })
            })
            .collect();
        if now_ms.saturating_sub(health.last_programmed_ms) < health.config.interval_ms {
            return Ok((targets, now_ms));
        }
        let effective = health.effective(&self.state, now_ms);
        if effective == health.programmed {
            return Ok((targets, now_ms));
        }
        match self.reconciler.apply(&mut self.maps, &effective) {
            Ok(report) => {
                let changed = changed_weights(&health.programmed, &effective);
                info!(
                    "event=health_weights_programmed changed=[{changed}] slots_written={} tables_flipped={}",
                    report.slots_written, report.tables_flipped
                );
                health.programmed = effective;
                health.last_programmed_ms = now_ms;
                Ok((targets, now_ms))
            }
            Err(e) => {
                health.last_programmed_ms = now_ms;
                self.roll_back();
                Err(CoreError::Apply(e))
            }
        }
    }

    /// What the maps should carry for `state`: itself, or its effective weights.
    fn programmed(&self) -> &DesiredState {
        self.health.as_ref().map_or(&self.state, |h| &h.programmed)
    }

    pub fn state(&self) -> &DesiredState {
        &self.state
    }

    #[cfg(test)]
    pub fn maps(&self) -> &M {
        &self.maps
    }

    /// Every backend address of every VIP (for neighbour upkeep).
    pub fn backend_addrs(&self) -> BTreeSet<IpAddr> {
        self.state.vips.values().flat_map(|c| c.backends.keys().copied()).collect()
    }

    pub fn handle(&mut self, request: Request) -> Result<Reply, CoreError> {
        match request {
            Request::ListVips => Ok(Reply::Vips(self.vips())),
            Request::ListBackends { vip } => Ok(Reply::Backends(self.backends(&vip)?)),
            Request::Stats => self.stats().map(Reply::Stats).map_err(CoreError::Counters),
            Request::AddVip { vip, ring_size } => {
                let ring_size = ring_size.unwrap_or(DEFAULT_RING_SIZE);
                self.mutate(&format!("op=add_vip vip={vip} ring_size={ring_size}"), |s| s.add_vip(vip, ring_size))
            }
            Request::RemoveVip { vip } => self.mutate(&format!("op=remove_vip vip={vip}"), |s| s.remove_vip(&vip).map(drop)),
            Request::AddBackend { vip, backend, weight } => {
                let weight = check_weight(weight.unwrap_or(DEFAULT_WEIGHT))?;
                self.mutate(&format!("op=add_backend vip={vip} backend={backend} weight={weight}"), |s| {
                    s.add_backend(&vip, backend, weight)
                })
            }
            Request::RemoveBackend { vip, backend } => {
                self.mutate(&format!("op=remove_backend vip={vip} backend={backend}"), |s| s.remove_backend(&vip, backend))
            }
            Request::DrainBackend { vip, backend } => {
                self.mutate(&format!("op=drain_backend vip={vip} backend={backend}"), |s| s.set_weight(&vip, backend, 0))
            }
            Request::SetWeight { vip, backend, weight } => {
                let weight = check_weight(weight)?;
                self.mutate(&format!("op=set_weight vip={vip} backend={backend} weight={weight}"), |s| s.set_weight(&vip, backend, weight))
            }
            Request::SetRateLimit { scope, per_s, burst, source_prefix_v4, source_prefix_v6, observe } => {
                let rate = RateSpec::new(per_s, burst);
                let what = format!(
                    "op=set_rate_limit scope={scope} per_s={} burst={} source_prefix_v4={} source_prefix_v6={} observe={observe}",
                    rate.per_s,
                    rate.burst,
                    source_prefix_v4.unwrap_or(DEFAULT_SOURCE_PREFIX_V4),
                    source_prefix_v6.unwrap_or(DEFAULT_SOURCE_PREFIX_V6),
                );
                self.mutate(&what, |s| s.set_per_source(scope.vip(), rate, source_prefix_v4, source_prefix_v6, observe))
            }
            Request::SetBudget { scope, per_s, burst, observe } => {
                let rate = RateSpec::new(per_s, burst);
                let what = format!("op=set_budget scope={scope} per_s={} burst={} observe={observe}", rate.per_s, rate.burst);
                self.mutate(&what, |s| s.set_budget(scope.vip(), rate, observe))
            }
            Request::ClearRateLimit { scope, part } => {
                let (per_source, budget) = match part {
                    LimitPart::All => (true, true),
                    LimitPart::PerSource => (true, false),
                    LimitPart::Budget => (false, true),
                };
                self.mutate(&format!("op=clear_rate_limit scope={scope} part={part:?}"), |s| {
                    s.clear_limit_parts(scope.vip(), per_source, budget)
                })
            }
            Request::ListRateLimits => Ok(Reply::RateLimits(self.rate_limits())),
            Request::SetRule { cidr, vip, action, per_s, burst, observe } => {
                let rule = RuleMatch { cidr, vip };
                let config = rule_config(&rule, action, per_s, burst, observe)?;
                self.mutate(&format!("op=set_rule rule={rule} action={action:?} per_s={per_s:?} burst={burst:?} observe={observe}"), |s| {
                    s.set_rule(rule, config)
                })
            }
            Request::RemoveRule { cidr, vip } => {
                let rule = RuleMatch { cidr, vip };
                self.mutate(&format!("op=remove_rule rule={rule}"), |s| s.remove_rule(&rule))
            }
            Request::ListRules => self.rules().map(Reply::Rules).map_err(CoreError::Counters),
            Request::TopSources { vip, limit } => self.top_sources(&vip, limit).map(Reply::TopSources),
        }
    }

    fn mutate(&mut self, what: &str, edit: impl FnOnce(&mut DesiredState) -> Result<(), ModelError>) -> Result<Reply, CoreError> {
        let mut next = self.state.clone();
        edit(&mut next)?;
        next.validate()?;
        if next == self.state {
            info!("{what} changed=false");
            return Ok(Reply::Done { slots_written: 0, tables_flipped: 0 });
        }
        // With health checks, the trackers follow `next` and the maps get its effective weights.
        let target = match &mut self.health {
            Some(health) => {
                let now_ms = health.now_ms();
                health.sync(&next, now_ms).map_err(CoreError::Health)?;
                health.effective(&next, now_ms)
            }
            None => next.clone(),
        };
        let report = match self.reconciler.apply(&mut self.maps, &target) {
            Ok(report) => report,
            Err(e) => {
                self.resync_health();
                self.roll_back();
                return Err(CoreError::Apply(e));
            }
        };
        if let Err(e) = self.store.save(&next) {
            self.resync_health();
            self.roll_back();
            return Err(CoreError::Persist(e));
        }
        self.state = next;
        if let Some(health) = &mut self.health {
            health.programmed = target;
        }
        info!(
            "{what} slots_written={} tables_flipped={} limits_written={} rules_written={}",
            report.slots_written, report.tables_flipped, report.limits_written, report.rules_written
        );
        Ok(Reply::Done { slots_written: report.slots_written, tables_flipped: report.tables_flipped })
    }

    /// Puts the maps back to the current state. The reconciler's view may be stale after a
    /// failed apply, so it is rebuilt from the maps first.
    fn roll_back(&mut self) {
        let programmed = self.programmed().clone();
        let result = Reconciler::adopt(&self.maps).and_then(|mut r| {
            r.apply(&mut self.maps, &programmed)?;
            Ok(r)
        });
        match result {
            Ok(reconciler) => self.reconciler = reconciler,
            Err(e) => error!("rolling back the maps failed; restart lbd to resync: {}", error_chain(&e)),
        }
    }

    /// After a failed change: the trackers follow the current state again.
    fn resync_health(&mut self) {
        if let Some(health) = &mut self.health {
            let now_ms = health.now_ms();
            if let Err(e) = health.sync(&self.state, now_ms) {
                error!("health: resyncing after a failed change: {}", error_chain(&e));
            }
        }
    }

    fn vips(&self) -> VipList {
        let vips = self
            .state
            .vips
            .iter()
            .map(|(vip, config)| VipEntry { vip: *vip, ring_size: config.ring_size, backends: config.backends.len() })
            .collect();
        VipList { vips }
    }

    fn backends(&self, vip: &crate::model::Vip) -> Result<BackendList, ModelError> {
        let config = self.state.vip(vip)?;
        let backends = config
            .backends
            .iter()
            .map(|(address, b)| {
                let health = self.health.as_ref().and_then(|h| h.trackers.get(vip)).and_then(|t| {
                    let now_ms = self.health.as_ref().map_or(0, Health::now_ms);
                    t.backends(now_ms).into_iter().find(|e| e.backend == *address)
                });
                let effective_weight = self.programmed().vips.get(vip).and_then(|c| c.backends.get(address)).map_or(b.weight, |p| p.weight);
                BackendEntry {
                    address: *address,
                    weight: b.weight,
                    state: BackendState::of_weight(b.weight),
                    health: health.map(|h| h.state.as_str().to_owned()),
                    effective_weight: Some(effective_weight),
                }
            })
            .collect();
        Ok(BackendList { vip: *vip, backends })
    }

    fn stats(&self) -> Result<Stats, DataplaneError> {
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
        Ok(Stats { vips, reasons, observed })
    }

    fn rate_limits(&self) -> RateLimitList {
        let default = self.state.default_limits.as_ref();
        let vips = self
            .state
            .vips
            .iter()
            .map(|(vip, config)| VipLimits { vip: *vip, effective: scope_limits(config.limits.as_ref(), default) })
            .collect();
        RateLimitList { default: scope_limits(None, default), vips }
    }

    fn rules(&self) -> Result<RuleList, DataplaneError> {
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
            });
        }
        Ok(RuleList { rules })
    }

    fn top_sources(&self, vip: &Vip, limit: Option<u32>) -> Result<TopSourceList, CoreError> {
        if limit == Some(0) {
            return Err(CoreError::BadTopLimit);
        }
        self.state.vip(vip)?;
        let Some(id) = self.reconciler.vip_id(vip) else {
            return Ok(TopSourceList { vip: *vip, tracked: 0, sources: Vec::new() });
        };
        let limits = self.state.effective_limits(vip).unwrap_or_default();
        let mut entries = self.maps.sources(id).map_err(CoreError::Counters)?;
        let tracked = entries.len();
        entries.sort_by_key(|(key, state)| (Reverse(state.dropped), Reverse(state.admitted), key.family, key.prefix));
        let sources = entries
            .into_iter()
            .filter_map(|(key, state)| {
                let addr = from_words(key.prefix, key.family)?;
                let len = if key.family == FAMILY_V4 { limits.source_prefix_v4 } else { limits.source_prefix_v6 };
                let prefix = Cidr { addr: Cidr::mask(addr, len), prefix_len: len };
                Some(SourceEntry { prefix, admitted: state.admitted, dropped: state.dropped })
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

/// A rule's configuration from the request's flat fields.
fn rule_config(
    rule: &RuleMatch,
    action: RuleActionKind,
    per_s: Option<u32>,
    burst: Option<u32>,
    observe: bool,
) -> Result<RuleConfig, CoreError> {
    let bad = |problem| CoreError::BadRule { rule: rule.describe(), problem };
    let action = match (action, per_s) {
        (RuleActionKind::Limit, Some(per_s)) => RuleAction::Limit(RateSpec::new(per_s, burst)),
        (RuleActionKind::Limit, None) => return Err(bad("a limit needs a rate (per_s)")),
        (_, Some(_)) => return Err(bad("only a limit takes a rate")),
        (RuleActionKind::Block, None) => RuleAction::Block,
        (RuleActionKind::Exempt, None) => RuleAction::Exempt,
    };
    if burst.is_some() && !matches!(action, RuleAction::Limit(_)) {
        return Err(bad("only a limit takes a burst"));
    }
    Ok(RuleConfig { action, observe })
}

/// `addr:old->new` for every backend whose programmed weight changed, for the log.
fn changed_weights(old: &DesiredState, new: &DesiredState) -> String {
    let mut changed = Vec::new();
    for (vip, config) in &new.vips {
        for (addr, b) in &config.backends {
            let before = old.vips.get(vip).and_then(|c| c.backends.get(addr)).map(|o| o.weight);
            if before != Some(b.weight) {
                changed.push(format!("{vip}/{addr}:{}->{}", before.map_or("-".to_owned(), |w| w.to_string()), b.weight));
            }
        }
    }
    changed.join(",")
}

fn check_weight(weight: u32) -> Result<u32, CoreError> {
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(CoreError::WeightOutOfRange { weight });
    }
    Ok(weight)
}

#[cfg(test)]
mod tests;
