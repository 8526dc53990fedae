//! The health checks' side of the core: one policy tracker per checked VIP, the zone and
//! capacity placement on top of it, port pressure from the backends' agents, and the
//! balancer's own trouble probing. Produces the *effective* state the maps are given; the
//! operator's desired state (persisted) is never changed here.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Instant,
};

use crate::store::{HealthSnapshot, SnapshotEntry};
use spillway_logging::event;
use spillway_model::{
    Backend, DesiredState, HealthConfig, LimitConfig, ProbeOutcome, ProbePath, ProbeSpec, Proto, RateSpec, Vip, VipConfig,
};
use spillway_policy::health::{Candidate, HealthError, HealthTracker, Placement, Pressure, ProbeKey, place};

/// One backend of one VIP to probe, with the VIP's settings.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    pub key: ProbeKey,
    pub route: ProbeRoute,
    pub spec: ProbeSpec,
    pub config: HealthConfig,
}

/// Where a probe goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeRoute {
    /// To this address, as the kernel routes it.
    Direct(SocketAddr),
    /// To `vip` (the VIP's address, the probe port) through the tunnel to the backend with
    /// this id and generation in the maps, with a direct probe of `direct` beside it.
    Tunnel { vip: SocketAddr, backend_id: u32, generation: u32, direct: SocketAddr },
}

/// What one probe found.
#[derive(Clone, Debug)]
pub struct ProbeResult {
    pub key: ProbeKey,
    pub outcome: ProbeOutcome,
    /// Why the balancer could not probe, for an `Unknown` outcome; `None`: its sockets.
    pub local_cause: Option<LocalCause>,
}

/// The balancer's own reason for an `Unknown` probe: never the backend's fault.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LocalCause {
    /// Its ephemeral ports, sockets or memory ran short (a socket error).
    Sockets,
    /// The probe path through the tunnel is broken here: why.
    VipPath(String),
}

impl LocalCause {
    const fn label(&self) -> &'static str {
        match self {
            LocalCause::Sockets => "sockets",
            LocalCause::VipPath(_) => "vip_path",
        }
    }
}

/// How long after the last probe the balancer could not make (its own ports or sockets
/// short) the local alert stays raised.
const LOCAL_ALERT_HOLD_MS: u64 = 10_000;
/// How often a raised local alert is logged again while it lasts.
const LOCAL_ALERT_REPEAT_MS: u64 = 10_000;

/// A derived budget admits this share of a second's worth at once: enough for the jitter of
/// real arrivals, small enough that a burst cannot overrun the capacity it protects.
const DERIVED_BURST_DIVISOR: u32 = 10;

/// Settings of the checks that are `lbd`'s, not a VIP's.
#[derive(Clone, Debug, Default)]
pub struct ChecksConfig {
    /// Policy of every VIP without its own.
    pub defaults: HealthConfig,
    /// The balancer's zone; `None`: every backend is local.
    pub local_zone: Option<String>,
}

/// The balancer could not probe, for one [`LocalCause`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAlert {
    pub since_ms: u64,
    pub last_ms: u64,
    /// Probes that came back `Unknown` since the alert was raised.
    pub unknown_probes: u64,
    last_logged_ms: u64,
}

pub struct Checks {
    config: ChecksConfig,
    trackers: BTreeMap<Vip, HealthTracker>,
    placements: BTreeMap<Vip, Placement>,
    /// Port pressure by backend host, from its agent.
    pressure: BTreeMap<IpAddr, Pressure>,
    local_alerts: BTreeMap<LocalCause, LocalAlert>,
    /// `now_ms` counts from here (monotonic)...
    epoch: Instant,
    /// ...starting at the wall-clock time (Unix ms) read then: slow starts are functions of
    /// wall-clock time (the desired state's starts are Unix times), and a clock step while
    /// `lbd` runs moves no ramp or hold-down.
    epoch_unix_ms: u64,
    /// The effective state last applied to the maps.
    pub programmed: DesiredState,
    /// When the effective state was last programmed by a health round (`None`: never).
    pub last_programmed_ms: Option<u64>,
    /// Backend states changed since the snapshot was last taken.
    pub snapshot_due: bool,
}

/// How a backend is probed: its own choice, else its VIP's (through the tunnel by default).
pub fn probe_path(config: &VipConfig, backend: &Backend) -> ProbePath {
    backend.options.probe_path.or(config.health.as_ref().map(|h| h.probe_path)).unwrap_or_default()
}

/// A VIP is health-checked when it has settings of its own, or is TCP (a TCP connect is a
/// meaningful default; for UDP it says nothing, so UDP VIPs need a UDP probe configured).
pub fn is_checked(vip: &Vip, config: &VipConfig) -> bool {
    config.health.is_some() || vip.proto == Proto::Tcp
}

impl Checks {
    pub fn new(config: ChecksConfig, state: &DesiredState) -> Result<Self, HealthError> {
        config.defaults.validate()?;
        let mut checks = Self {
            config,
            trackers: BTreeMap::new(),
            placements: BTreeMap::new(),
            pressure: BTreeMap::new(),
            local_alerts: BTreeMap::new(),
            epoch: Instant::now(),
            epoch_unix_ms: crate::wall_clock::unix_ms(),
            programmed: state.clone(),
            last_programmed_ms: None,
            snapshot_due: false,
        };
        checks.sync(state, checks.now_ms())?;
        Ok(checks)
    }

    pub fn defaults(&self) -> &HealthConfig {
        &self.config.defaults
    }

    /// The health clock: wall-clock Unix milliseconds, advanced monotonically since start.
    pub fn now_ms(&self) -> u64 {
        self.epoch_unix_ms + self.epoch.elapsed().as_millis() as u64
    }

    fn policy<'a>(&'a self, config: &'a VipConfig) -> &'a HealthConfig {
        config.health.as_ref().map_or(&self.config.defaults, |h| &h.policy)
    }

    /// Makes the trackers follow `state`: one per checked VIP, with its settings, backends
    /// and weights, and the port pressure known for its backends.
    pub fn sync(&mut self, state: &DesiredState, now_ms: u64) -> Result<(), HealthError> {
        self.trackers.retain(|vip, _| state.vips.get(vip).is_some_and(|c| is_checked(vip, c)));
        self.pressure.retain(|backend, _| state.vips.values().any(|c| c.backends.contains_key(backend)));
        for (vip, config) in state.vips.iter().filter(|(vip, c)| is_checked(vip, c)) {
            let policy = self.policy(config).clone();
            let tracker = match self.trackers.entry(*vip) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => e.insert(HealthTracker::new(*vip, policy.clone())?),
            };
            if *tracker.config() != policy {
                tracker.set_config(policy, now_ms)?;
            }
            tracker.sync_config(config, now_ms);
            for backend in config.backends.keys() {
                let pressure = self.pressure.get(backend).copied().unwrap_or_default();
                tracker.set_pressure(*backend, pressure, now_ms)?;
            }
        }
        self.log_events();
        Ok(())
    }

    /// Puts backends back in the states a previous `lbd` persisted.
    pub fn restore(&mut self, snapshot: &HealthSnapshot) {
        let now_ms = self.now_ms();
        for entry in &snapshot.backends {
            if let Some(tracker) = self.trackers.get_mut(&entry.vip) {
                tracker.restore(entry.backend, entry.state, now_ms);
            }
        }
        let restored = snapshot.backends.len();
        event!(info, "health_restored", entries = restored);
        self.log_events();
    }

    pub fn snapshot(&self, now_ms: u64) -> HealthSnapshot {
        let backends = self
            .trackers
            .iter()
            .flat_map(|(vip, t)| t.snapshot(now_ms).into_iter().map(|(backend, state)| SnapshotEntry { vip: *vip, backend, state }))
            .collect();
        HealthSnapshot { backends }
    }

    /// Feeds probe outcomes and runs time-driven transitions.
    pub fn observe(&mut self, results: Vec<ProbeResult>, now_ms: u64) {
        for ProbeResult { key, outcome, local_cause } in results {
            // A backend removed while its probe was in flight: nothing to record, and no
            // alert (its probe found no backend because there is none).
            let known = self.trackers.get_mut(&key.vip).is_some_and(|t| t.observe(key.backend, &outcome, now_ms).is_ok());
            if known && outcome == ProbeOutcome::Unknown {
                self.raise_local_alert(&key, local_cause.unwrap_or(LocalCause::Sockets), now_ms);
            }
        }
        for tracker in self.trackers.values_mut() {
            tracker.tick(now_ms);
        }
        self.local_alerts.retain(|cause, alert| {
            let holds = now_ms.saturating_sub(alert.last_ms) <= LOCAL_ALERT_HOLD_MS;
            if !holds {
                event!(info, "lb_probe_alert_cleared", cause = cause.label());
            }
            holds
        });
        self.log_events();
    }

    /// The balancer's own failure to probe: never the backend's fault, always loud.
    fn raise_local_alert(&mut self, key: &ProbeKey, cause: LocalCause, now_ms: u64) {
        let alert = self.local_alerts.entry(cause.clone()).or_insert(LocalAlert {
            since_ms: now_ms,
            last_ms: now_ms,
            unknown_probes: 0,
            last_logged_ms: 0,
        });
        alert.last_ms = now_ms;
        alert.unknown_probes += 1;
        if alert.unknown_probes == 1 || now_ms.saturating_sub(alert.last_logged_ms) >= LOCAL_ALERT_REPEAT_MS {
            alert.last_logged_ms = now_ms;
            let message = match &cause {
                LocalCause::Sockets => "ALERT: this balancer cannot open probe sockets (ephemeral ports, sockets or memory exhausted on \
                                        the LB host); backends keep their states"
                    .to_owned(),
                LocalCause::VipPath(why) => {
                    format!("ALERT: this balancer cannot probe through the tunnel: {why}; backends keep their states")
                }
            };
            event!(
                error,
                "lb_probe_alert",
                cause = cause.label(),
                message = message,
                unknown_probes = alert.unknown_probes,
                since_ms = alert.since_ms,
                last_vip = key.vip,
                last_backend = key.backend
            );
        }
    }

    /// Every raised local alert, by cause.
    pub fn local_alerts(&self) -> &BTreeMap<LocalCause, LocalAlert> {
        &self.local_alerts
    }

    /// Records the port pressure a backend's agent reported, for every VIP it serves.
    /// Returns whether it changed.
    pub fn set_pressure(&mut self, backend: IpAddr, pressure: Pressure, now_ms: u64) -> bool {
        if self.pressure.insert(backend, pressure).unwrap_or_default() == pressure {
            return false;
        }
        for tracker in self.trackers.values_mut() {
            // Not every VIP has this backend.
            let _ = tracker.set_pressure(backend, pressure, now_ms);
        }
        self.log_events();
        true
    }

    /// What to probe: every backend of every checked VIP that has somewhere to probe (its
    /// own probe target, or its address on the VIP's port; any-port VIPs need a target), the
    /// way its options or else its VIP say. A probe through the tunnel goes to the VIP on
    /// that port and names the backend by its slot in the maps (`slot`: id and generation).
    pub fn targets(&self, state: &DesiredState, slot: impl Fn(&Vip, &IpAddr) -> Option<(u32, u32)>) -> Vec<ProbeTarget> {
        let mut targets = Vec::new();
        for (vip, tracker) in &self.trackers {
            let Some(config) = state.vips.get(vip) else { continue };
            let spec = config.health.as_ref().map(|h| h.probe.clone()).unwrap_or_default();
            for (backend, b) in &config.backends {
                let direct = match b.options.probe_target {
                    Some(target) => target,
                    None if vip.port != 0 => SocketAddr::new(*backend, vip.port),
                    None => continue,
                };
                let route = match (probe_path(config, b), slot(vip, backend)) {
                    (ProbePath::Direct, _) => ProbeRoute::Direct(direct),
                    (ProbePath::Tunnel, Some((backend_id, generation))) => {
                        ProbeRoute::Tunnel { vip: SocketAddr::new(vip.addr, direct.port()), backend_id, generation, direct }
                    }
                    // Not in the maps yet: no traffic reaches it either.
                    (ProbePath::Tunnel, None) => continue,
                };
                let key = ProbeKey { vip: *vip, backend: *backend };
                targets.push(ProbeTarget { key, route, spec: spec.clone(), config: tracker.config().clone() });
            }
        }
        targets
    }

    /// `state` as the maps should carry it: every checked VIP's weights from its health
    /// policy, then placed across zones; a VIP whose backends all declare a capacity gets a
    /// budget no larger than what they can take.
    pub fn effective(&mut self, state: &DesiredState, now_ms: u64) -> DesiredState {
        let mut effective = state.clone();
        self.placements.clear();
        for (vip, config) in &mut effective.vips {
            let Some(tracker) = self.trackers.get(vip) else { continue };
            let weights = tracker.effective_weights(now_ms);
            let candidates: Vec<Candidate<'_>> = state.vips[vip]
                .backends
                .iter()
                .map(|(addr, b)| Candidate {
                    backend: *addr,
                    zone: b.options.zone.as_deref(),
                    configured_weight: b.weight,
                    weight: weights.get(addr).copied().unwrap_or(b.weight),
                    capacity_per_s: b.options.capacity_per_s,
                    spare_per_s: b.options.spare_per_s,
                })
                .collect();
            let placement = place(self.config.local_zone.as_deref(), &candidates, tracker.config().spare_fraction);
            for (addr, backend) in &mut config.backends {
                if let Some(weight) = placement.weights.get(addr) {
                    backend.weight = *weight;
                }
            }
            if let Some(derived) = placement.budget_per_s {
                let own = state.effective_limits(vip);
                config.limits = Some(with_derived_budget(own, derived));
            }
            self.placements.insert(*vip, placement);
        }
        effective
    }

    pub fn tracker(&self, vip: &Vip) -> Option<&HealthTracker> {
        self.trackers.get(vip)
    }

    pub fn placement(&self, vip: &Vip) -> Option<&Placement> {
        self.placements.get(vip)
    }

    fn log_events(&mut self) {
        for tracker in self.trackers.values_mut() {
            for event in tracker.take_events() {
                if matches!(event, spillway_policy::health::HealthEvent::Backend(_)) {
                    self.snapshot_due = true;
                }
                log::info!("{event}");
            }
        }
    }
}

/// The VIP's limits with its budget lowered to `derived_per_s` new flows per second (when
/// that is lower than the operator's, or there is none). A derived budget is enforced even
/// if the operator's budget is in observe mode: it protects backends, not a guess.
fn with_derived_budget(own: Option<LimitConfig>, derived_per_s: u32) -> LimitConfig {
    let mut limits = own.unwrap_or_default();
    // 0 reads as "no limit" in the kernel: an empty VIP admits one flow a second.
    let derived = RateSpec::new(derived_per_s.max(1), Some((derived_per_s / DERIVED_BURST_DIVISOR).max(1)));
    let binding = match limits.vip_budget {
        Some(operator) if operator.per_s <= derived.per_s => RateSpec::new(operator.per_s, Some(operator.burst.min(derived.burst))),
        _ => {
            limits.observe_budget = false;
            derived
        }
    };
    limits.vip_budget = Some(binding);
    limits
}
