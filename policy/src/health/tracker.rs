//! One VIP's health: its backends' state machines plus the VIP-wide decisions that make a
//! cascade impossible (slow verdicts against peers, the ejection cap, panic).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use super::{
    backend::{Backend, Drain, Health, Pressure, Reason, Restored, State},
    fraction::{permille, share},
};
use spillway_model::{HealthConfig, HealthConfigError, ProbeOutcome, Vip, VipConfig};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HealthError {
    #[error(transparent)]
    Config(#[from] HealthConfigError),
    #[error("backend {backend} is not in VIP {vip}'s health table")]
    UnknownBackend { vip: Vip, backend: IpAddr },
}

/// A change of a backend's reported state; logged as one key=value line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateChange {
    pub vip: Vip,
    pub backend: IpAddr,
    pub from: State,
    pub to: State,
    pub reason: Reason,
    pub at_ms: u64,
}

/// Everything the daemon should log, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthEvent {
    Backend(StateChange),
    /// The VIP entered (`entered`) or left panic.
    Panic {
        vip: Vip,
        entered: bool,
        fail_closed: bool,
        healthy_weight: u64,
        total_weight: u64,
        at_ms: u64,
    },
    /// The backend's agent reported a different port pressure.
    Pressure {
        vip: Vip,
        backend: IpAddr,
        from: Pressure,
        to: Pressure,
        at_ms: u64,
    },
    /// The set of failed backends kept in by the ejection cap changed (empty: none any more).
    EjectionCapped {
        vip: Vip,
        kept: Vec<IpAddr>,
        at_ms: u64,
    },
}

impl fmt::Display for HealthEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthEvent::Backend(StateChange { vip, backend, from, to, reason, at_ms }) => {
                write!(f, "event=health_state vip={vip} backend={backend} from={from} to={to} reason={reason} at_ms={at_ms}")
            }
            HealthEvent::Panic { vip, entered, fail_closed, healthy_weight, total_weight, at_ms } => {
                let what = if *entered { "health_panic_entered" } else { "health_panic_left" };
                let mode = if *fail_closed { "fail_closed" } else { "fail_open" };
                write!(f, "event={what} vip={vip} mode={mode} healthy_weight={healthy_weight} total_weight={total_weight} at_ms={at_ms}")
            }
            HealthEvent::Pressure { vip, backend, from, to, at_ms } => {
                write!(f, "event=port_pressure vip={vip} backend={backend} from={from} to={to} at_ms={at_ms}")
            }
            HealthEvent::EjectionCapped { vip, kept, at_ms } => {
                let kept: Vec<String> = kept.iter().map(ToString::to_string).collect();
                write!(f, "event=health_ejection_capped vip={vip} kept_in=[{}] at_ms={at_ms}", kept.join(","))
            }
        }
    }
}

/// The VIP-wide picture, for `lbctl` and alerts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VipHealth {
    /// The healthy share of weight is below `panic_threshold`.
    pub panic: bool,
    /// Times the VIP entered panic since `lbd` started (a counter for alerting).
    pub panics_entered: u64,
    /// Some failed backends are kept in because ejecting them would exceed
    /// `max_ejection_fraction`.
    pub ejection_capped: bool,
    /// Configured weight of the non-draining backends that pass their probes.
    pub healthy_weight: u64,
    /// Configured weight of the non-draining backends.
    pub total_weight: u64,
    /// Configured weight of the backends given no new flows for failed health.
    pub ejected_weight: u64,
    /// The failed backends kept in by the cap, in address order.
    pub kept_in: Vec<IpAddr>,
}

/// One backend as `lbctl` would show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendHealth {
    pub backend: IpAddr,
    pub state: State,
    pub since_ms: u64,
    pub reason: Reason,
    pub configured_weight: u32,
    pub effective_weight: u32,
    /// Failed but kept in by the ejection cap.
    pub kept_in: bool,
    pub consecutive_unknown: u32,
    pub pressure: Pressure,
    pub flaps: u32,
    /// Smoothed probe latency, microseconds.
    pub latency_ewma_us: Option<u64>,
    pub held_until_ms: Option<u64>,
}

/// The weights and report of one moment: computed together so they never disagree.
struct Plan {
    weights: BTreeMap<IpAddr, u32>,
    report: VipHealth,
}

/// The health policy of one VIP. Pure: time comes in as `now_ms` (a monotonic clock owned
/// by the caller) and nothing here does I/O, so every behaviour is reproducible in tests.
pub struct HealthTracker {
    vip: Vip,
    config: HealthConfig,
    backends: BTreeMap<IpAddr, Backend>,
    events: Vec<HealthEvent>,
    /// What the last event said, so a VIP event is emitted only on a change.
    panic: bool,
    panics_entered: u64,
    kept_in: Vec<IpAddr>,
}

/// Bound on queued events: a daemon that stops draining them loses the oldest, never memory.
pub const MAX_QUEUED_EVENTS: usize = 4096;

impl HealthTracker {
    pub fn new(vip: Vip, config: HealthConfig) -> Result<Self, HealthError> {
        config.validate()?;
        Ok(Self { vip, config, backends: BTreeMap::new(), events: Vec::new(), panic: false, panics_entered: 0, kept_in: Vec::new() })
    }

    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// New settings from now on; the backends keep their states.
    pub fn set_config(&mut self, config: HealthConfig, now_ms: u64) -> Result<(), HealthError> {
        config.validate()?;
        self.config = config;
        self.refresh(now_ms);
        Ok(())
    }

    /// Makes the table follow the desired state's backends and weights (none with a declared
    /// start: see [`Self::sync_config`]).
    pub fn sync(&mut self, backends: impl IntoIterator<Item = (IpAddr, u32)>, now_ms: u64) {
        self.sync_declared(backends.into_iter().map(|(addr, weight)| (addr, weight, None)), now_ms);
    }

    /// `sync` from a VIP of the desired state, with each backend's declared start.
    pub fn sync_config(&mut self, config: &VipConfig, now_ms: u64) {
        self.sync_declared(config.backends.iter().map(|(addr, b)| (*addr, b.weight, b.started_at_unix_ms)), now_ms);
    }

    /// New backends start in slow start from their declared start (else now), weight 0
    /// drains, a weight after a drain restarts slow start, a changed start moves the ramp,
    /// removed backends are forgotten.
    fn sync_declared(&mut self, backends: impl IntoIterator<Item = (IpAddr, u32, Option<u64>)>, now_ms: u64) {
        let wanted: BTreeMap<IpAddr, (u32, Option<u64>)> = backends.into_iter().map(|(addr, w, start)| (addr, (w, start))).collect();
        self.backends.retain(|addr, _| wanted.contains_key(addr));
        for (addr, (weight, start)) in wanted {
            match self.backends.get(&addr) {
                Some(_) => self.update(addr, now_ms, |b, config| b.set_declared(weight, start, config, now_ms)),
                None => {
                    self.backends.insert(addr, Backend::new(weight, start, now_ms));
                }
            }
        }
        self.refresh(now_ms);
    }

    /// Records the port pressure the backend's agent reports.
    pub fn set_pressure(&mut self, backend: IpAddr, pressure: Pressure, now_ms: u64) -> Result<(), HealthError> {
        let b = self.backends.get_mut(&backend).ok_or(HealthError::UnknownBackend { vip: self.vip, backend })?;
        if b.pressure != pressure {
            let from = std::mem::replace(&mut b.pressure, pressure);
            b.pressure_since_ms = now_ms;
            self.push(HealthEvent::Pressure { vip: self.vip, backend, from, to: pressure, at_ms: now_ms });
            self.refresh(now_ms);
        }
        Ok(())
    }

    /// Puts a backend back where a previous `lbd` left it (see [`Restored`]), so a restart
    /// neither restarts slow start for backends that were serving nor hands traffic back to
    /// failed ones before their probes pass. Unknown backends are ignored.
    pub fn restore(&mut self, backend: IpAddr, restored: Restored, now_ms: u64) {
        let Some(b) = self.backends.get_mut(&backend) else { return };
        b.restore(restored, now_ms);
    }

    /// Every backend's health in the form [`Self::restore`] takes, for persisting.
    pub fn snapshot(&self, now_ms: u64) -> Vec<(IpAddr, Restored)> {
        self.backends.iter().map(|(addr, b)| (*addr, b.to_restored(now_ms))).collect()
    }

    /// Feeds one probe outcome.
    pub fn observe(&mut self, backend: IpAddr, outcome: &ProbeOutcome, now_ms: u64) -> Result<(), HealthError> {
        if !self.backends.contains_key(&backend) {
            return Err(HealthError::UnknownBackend { vip: self.vip, backend });
        }
        if *outcome == ProbeOutcome::Unknown {
            // The LB's own failure: recorded for display by the backend, nothing else runs.
            if let Some(b) = self.backends.get_mut(&backend) {
                b.observe(outcome, &self.config, now_ms);
            }
            return Ok(());
        }
        self.update(backend, now_ms, |b, config| b.observe(outcome, config, now_ms));
        if matches!(outcome, ProbeOutcome::Success { .. }) {
            let verdict = self.slow_verdict(backend);
            self.update(backend, now_ms, |b, config| b.judge_latency(verdict, config, now_ms));
        }
        self.refresh(now_ms);
        Ok(())
    }

    /// Time-driven transitions (end of slow start, of hold-downs). Call it once per probe
    /// interval, before reading weights.
    pub fn tick(&mut self, now_ms: u64) {
        let addrs: Vec<IpAddr> = self.backends.keys().copied().collect();
        for addr in addrs {
            self.update(addr, now_ms, |b, config| b.advance(config, now_ms));
        }
        self.refresh(now_ms);
    }

    /// What the reconciler should program: every backend's weight, 0 = no new flows
    /// (existing flows stay on it).
    pub fn effective_weights(&self, now_ms: u64) -> BTreeMap<IpAddr, u32> {
        self.plan(now_ms).weights
    }

    pub fn report(&self, now_ms: u64) -> VipHealth {
        self.plan(now_ms).report
    }

    /// Every backend, in address order.
    pub fn backends(&self, now_ms: u64) -> Vec<BackendHealth> {
        let plan = self.plan(now_ms);
        self.backends
            .iter()
            .map(|(addr, b)| {
                let (since_ms, reason) = match b.drain {
                    Some(Drain { since_ms, .. }) => (since_ms, Reason::OperatorDrain),
                    None => (b.since_ms, b.reason.clone()),
                };
                BackendHealth {
                    backend: *addr,
                    state: b.state(),
                    since_ms,
                    reason,
                    configured_weight: b.configured_weight,
                    effective_weight: plan.weights[addr],
                    kept_in: plan.report.kept_in.contains(addr),
                    consecutive_unknown: b.unknowns,
                    pressure: b.pressure,
                    flaps: b.flaps,
                    latency_ewma_us: b.latency_ewma_us,
                    held_until_ms: match b.health {
                        Health::HeldDown { until_ms } => Some(until_ms),
                        _ => None,
                    },
                }
            })
            .collect()
    }

    /// The events since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<HealthEvent> {
        std::mem::take(&mut self.events)
    }

    /// Runs `change` on one backend and records a state change if its reported state moved.
    fn update(&mut self, addr: IpAddr, now_ms: u64, change: impl FnOnce(&mut Backend, &HealthConfig)) {
        let Some(b) = self.backends.get_mut(&addr) else { return };
        let from = b.state();
        change(b, &self.config);
        let to = b.state();
        if from != to {
            let reason = if b.is_draining() { Reason::OperatorDrain } else { b.reason.clone() };
            self.push(HealthEvent::Backend(StateChange { vip: self.vip, backend: addr, from, to, reason, at_ms: now_ms }));
        }
    }

    fn push(&mut self, event: HealthEvent) {
        if self.events.len() >= MAX_QUEUED_EVENTS {
            self.events.remove(0);
        }
        self.events.push(event);
    }

    /// `Some(reason)` when `addr`'s smoothed latency is far above the median of its peers
    /// (other non-draining, serving backends with samples); `None` when it is not or when
    /// there are fewer than `slow_min_peers` peers to compare with. The upper median is used,
    /// so with an even count the verdict leans towards "not slow".
    fn slow_verdict(&self, addr: IpAddr) -> Option<Reason> {
        let latency_us = self.backends.get(&addr)?.latency_ewma_us?;
        let mut peers: Vec<u64> = self
            .backends
            .iter()
            .filter(|(a, b)| **a != addr && !b.is_draining() && !b.is_failed())
            .filter_map(|(_, b)| b.latency_ewma_us)
            .collect();
        if peers.len() < self.config.slow_min_peers as usize {
            return None;
        }
        peers.sort_unstable();
        let peer_median_us = peers[peers.len() / 2];
        let threshold_us = peer_median_us
            .saturating_mul(u64::from(self.config.slow_factor))
            .max(peer_median_us.saturating_add(self.config.slow_margin_ms.saturating_mul(1000)));
        (latency_us > threshold_us)
            .then_some(Reason::SlowerThanPeers { latency_ms: latency_us / 1000, peer_median_ms: peer_median_us / 1000 })
    }

    /// Emits the VIP-level events (panic, ejection cap) whose condition changed.
    fn refresh(&mut self, now_ms: u64) {
        let VipHealth { panic, healthy_weight, total_weight, kept_in, .. } = self.plan(now_ms).report;
        if panic != self.panic {
            self.panic = panic;
            self.panics_entered += u64::from(panic);
            let fail_closed = self.config.fail_closed;
            self.push(HealthEvent::Panic { vip: self.vip, entered: panic, fail_closed, healthy_weight, total_weight, at_ms: now_ms });
        }
        if kept_in != self.kept_in {
            self.kept_in = kept_in.clone();
            self.push(HealthEvent::EjectionCapped { vip: self.vip, kept: kept_in, at_ms: now_ms });
        }
    }

    /// The whole decision, in order:
    /// 1. draining backends get 0; the rest make up `total_weight` (configured weights);
    /// 2. panic when `healthy_weight < panic_threshold × total_weight`: fail open gives every
    ///    non-draining backend its configured weight, fail closed only the serving ones
    ///    theirs;
    /// 3. otherwise serving backends get their own weight (slow start and slowness applied)
    ///    and failed ones are ejected, oldest failure first (ties by address), for as long
    ///    as the ejected configured weight stays within `max_ejection_fraction × total`.
    ///    The rest are kept in at their configured weight and reported.
    ///
    /// Oldest first because an ejection, once made, is never undone by a newer failure: the
    /// tables (and the flows hashed through them) do not churn as more backends fail, and the
    /// backends kept in are those with the least evidence against them.
    fn plan(&self, now_ms: u64) -> Plan {
        let config = &self.config;
        let active = || self.backends.iter().filter(|(_, b)| !b.is_draining());
        let total_weight: u64 = active().map(|(_, b)| u64::from(b.configured_weight)).sum();
        let healthy_weight: u64 = active().filter(|(_, b)| !b.is_failed()).map(|(_, b)| u64::from(b.configured_weight)).sum();
        let panic = total_weight > 0 && (healthy_weight as f64) < (total_weight as f64) * config.panic_threshold;

        let mut weights: BTreeMap<IpAddr, u32> = self.backends.iter().map(|(addr, b)| (*addr, b.own_weight(config, now_ms))).collect();
        let mut report = VipHealth { panic, panics_entered: self.panics_entered, healthy_weight, total_weight, ..VipHealth::default() };
        if panic {
            for (addr, b) in active().filter(|(_, b)| b.is_failed()) {
                if config.fail_closed {
                    report.ejected_weight += u64::from(b.configured_weight);
                } else {
                    weights.insert(*addr, b.configured_weight);
                }
            }
            if !config.fail_closed {
                // Spread over all: slow start and slowness are suspended too.
                for (addr, b) in active() {
                    weights.insert(*addr, b.configured_weight);
                }
            }
            return Plan { weights, report };
        }

        // Port pressure on a serving backend: critical lowers its weight like slowness does
        // (not an ejection); exhausted makes it a candidate for ejection after every health
        // failure, under the same cap, so pressure never empties a VIP either.
        let pressured = |b: &Backend| (b.own_weight(config, now_ms) * permille(config.slow_floor).clamp(1, 1000) as u32 / 1000).max(1);
        for (addr, b) in active().filter(|(_, b)| !b.is_failed() && b.pressure != Pressure::None) {
            weights.insert(*addr, pressured(b));
        }
        let mut candidates: Vec<(bool, u64, IpAddr, u32)> = active()
            .filter_map(|(addr, b)| match (b.is_failed(), b.pressure) {
                (true, _) => Some((false, b.failed_since_ms.unwrap_or(0), *addr, b.configured_weight)),
                (false, Pressure::Exhausted) => Some((true, b.pressure_since_ms, *addr, pressured(b))),
                (false, _) => None,
            })
            .collect();
        candidates.sort_unstable();
        let budget = share(total_weight, config.max_ejection_fraction);
        let mut kept_in = BTreeSet::new();
        for (_, _, addr, kept_weight) in candidates {
            let weight = u64::from(self.backends[&addr].configured_weight);
            if kept_in.is_empty() && report.ejected_weight + weight <= budget {
                report.ejected_weight += weight;
                weights.insert(addr, 0);
            } else {
                kept_in.insert(addr);
                weights.insert(addr, kept_weight);
            }
        }
        report.ejection_capped = !kept_in.is_empty();
        report.kept_in = kept_in.into_iter().collect();
        Plan { weights, report }
    }
}
