//! One backend's state machine. Knows nothing of its peers: the VIP-level decisions (slow
//! verdicts, the ejection cap, panic) are the tracker's.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::fraction::permille;
use spillway_model::{HealthConfig, ProbeOutcome};

/// A backend's state as reported (and logged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Passing probes at normal latency: full configured weight.
    Healthy,
    /// Failed `fall` consecutive probes: no new flows (unless the ejection cap or panic keeps it).
    Unhealthy,
    /// Passing, but much slower than its peers: weight reduced gradually, never to zero.
    Slow,
    /// New or recovering: weight ramps linearly from a floor to full over `slow_start_ms`.
    SlowStart,
    /// The operator set its weight to 0: no new flows, existing flows stay.
    Draining,
    /// Recovered after flapping: kept out until its hold-down expires.
    HeldDown,
}

impl State {
    /// Every state, for reports that list each (the metrics' state set).
    pub const ALL: [State; 6] = [State::Healthy, State::Unhealthy, State::Slow, State::SlowStart, State::Draining, State::HeldDown];

    pub const fn as_str(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Unhealthy => "unhealthy",
            State::Slow => "slow",
            State::SlowStart => "slow_start",
            State::Draining => "draining",
            State::HeldDown => "held_down",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a backend is in its state; printed as `reason=<kind> [key=value…]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Newly added to the desired state.
    Added,
    /// `failures` consecutive failed probes, the last one described by `last`.
    ConsecutiveFailures { failures: u32, last: String },
    /// `failures` consecutive failed probes, the last one through the tunnel only (see
    /// [`ProbeOutcome::VipPathFailed`]); `tunnel` is how that one failed.
    VipPathFailed { failures: u32, tunnel: String },
    /// `successes` consecutive passed probes.
    ConsecutiveSuccesses { successes: u32 },
    /// Its slow start ran for its full length.
    SlowStartComplete,
    /// Recovered, but had flapped `flaps` times in a row: held down for `hold_ms`.
    Flapping { flaps: u32, hold_ms: u64 },
    /// Its hold-down expired while it was passing probes.
    HoldDownExpired,
    /// Smoothed latency `latency_ms` against a peer median of `peer_median_ms`.
    SlowerThanPeers { latency_ms: u64, peer_median_ms: u64 },
    /// Its latency is back in line with its peers' and its weight fully restored.
    LatencyRecovered,
    /// The operator set its weight to 0.
    OperatorDrain,
    /// The operator gave it a weight again.
    OperatorUndrain,
    /// Carried over from the previous `lbd` across a restart.
    Restored,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Added => f.write_str("added"),
            Reason::ConsecutiveFailures { failures, last } => write!(f, "consecutive_failures failures={failures} last={last:?}"),
            Reason::VipPathFailed { failures, tunnel } => write!(f, "vip_path_failed failures={failures} tunnel={tunnel:?} direct=passed"),
            Reason::ConsecutiveSuccesses { successes } => write!(f, "consecutive_successes successes={successes}"),
            Reason::SlowStartComplete => f.write_str("slow_start_complete"),
            Reason::Flapping { flaps, hold_ms } => write!(f, "flapping flaps={flaps} hold_ms={hold_ms}"),
            Reason::HoldDownExpired => f.write_str("hold_down_expired"),
            Reason::SlowerThanPeers { latency_ms, peer_median_ms } => {
                write!(f, "slower_than_peers latency_ms={latency_ms} peer_median_ms={peer_median_ms}")
            }
            Reason::LatencyRecovered => f.write_str("latency_recovered"),
            Reason::OperatorDrain => f.write_str("operator_drain"),
            Reason::OperatorUndrain => f.write_str("operator_undrain"),
            Reason::Restored => f.write_str("restored"),
        }
    }
}

/// Port pressure on the backend host, from its agent. Not health: it never changes the
/// state, only the weight (see the tracker's plan), and never counts towards panic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pressure {
    #[default]
    None,
    /// Ephemeral ports at or above the critical threshold: weight reduced.
    Critical,
    /// Connects failing for want of ports: no new flows, within the ejection cap.
    Exhausted,
}

impl Pressure {
    pub const ALL: [Pressure; 3] = [Pressure::None, Pressure::Critical, Pressure::Exhausted];

    pub const fn as_str(self) -> &'static str {
        match self {
            Pressure::None => "none",
            Pressure::Critical => "critical",
            Pressure::Exhausted => "exhausted",
        }
    }
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The health part of the state (draining is an operator overlay on top of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Health {
    Healthy,
    /// `scale_permille` of the configured weight, in `slow_floor..1000`.
    Slow {
        scale_permille: u64,
    },
    /// Ramp from `from_ms` (see [`ramp_elapsed_ms`]): the backend's declared start, or when
    /// this balancer readmitted it.
    SlowStart {
        from_ms: u64,
    },
    Unhealthy,
    HeldDown {
        until_ms: u64,
    },
}

impl Health {
    pub(super) const fn state(self) -> State {
        match self {
            Health::Healthy => State::Healthy,
            Health::Slow { .. } => State::Slow,
            Health::SlowStart { .. } => State::SlowStart,
            Health::Unhealthy => State::Unhealthy,
            Health::HeldDown { .. } => State::HeldDown,
        }
    }

    /// Takes new flows on its own merits (before the ejection cap and panic are applied).
    pub(super) const fn is_serving(self) -> bool {
        matches!(self, Health::Healthy | Health::Slow { .. } | Health::SlowStart { .. })
    }
}

/// A backend's health as a previous `lbd` left it (persisted across restarts; the JSON is
/// `{"kind":"serving"}`, `{"kind":"slow_start","elapsed_ms":N,"from_unix_ms":T}`,
/// `{"kind":"failed","flaps":N}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Restored {
    /// Healthy or slow: serving at full weight again (slowness is re-measured).
    Serving,
    /// In slow start since `from_unix_ms` (the health clock is wall-clock time): the ramp
    /// continues where it is. `elapsed_ms` alone (an older `lbd`'s file): that far in.
    SlowStart {
        #[serde(default)]
        elapsed_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_unix_ms: Option<u64>,
    },
    /// Unhealthy or held down: out until its probes pass `rise` times.
    Failed { flaps: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Drain {
    pub since_ms: u64,
}

/// Smoothing of latency samples: `ewma = (3 × ewma + sample) / 4`, about the last 4 probes.
const EWMA_KEEP_QUARTERS: u64 = 3;

#[derive(Clone, Debug)]
pub(super) struct Backend {
    /// The operator's weight (0 while draining).
    pub configured_weight: u32,
    pub health: Health,
    pub since_ms: u64,
    pub reason: Reason,
    pub drain: Option<Drain>,
    /// Consecutive passed and failed probes; `Unknown` touches neither.
    pub successes: u32,
    pub failures: u32,
    /// Consecutive `Unknown` outcomes (shown to operators: the LB cannot probe this backend).
    pub unknowns: u32,
    pub latency_ewma_us: Option<u64>,
    /// Flaps in a row: failing again within `flap_window_ms` of recovering.
    pub flaps: u32,
    pub last_recovered_ms: Option<u64>,
    /// When it last went from serving to failed (Unhealthy or HeldDown); orders ejections.
    pub failed_since_ms: Option<u64>,
    /// The operator's start (`model::Backend::started_at_unix_ms`) last seen.
    pub declared_start_ms: Option<u64>,
    pub pressure: Pressure,
    /// When `pressure` last changed; orders pressure ejections after health ones.
    pub pressure_since_ms: u64,
}

impl Backend {
    /// A new backend starts in slow start from its declared start (`None`: now): it takes a
    /// little traffic at once and all of it after `slow_start_ms`, unless its probes fail
    /// first. A start long enough ago is a finished ramp: the first `advance` makes it healthy.
    pub fn new(configured_weight: u32, declared_start_ms: Option<u64>, now_ms: u64) -> Self {
        let mut backend = Self {
            configured_weight,
            health: Health::SlowStart { from_ms: declared_start_ms.unwrap_or(now_ms) },
            since_ms: now_ms,
            reason: Reason::Added,
            drain: None,
            successes: 0,
            failures: 0,
            unknowns: 0,
            latency_ewma_us: None,
            flaps: 0,
            last_recovered_ms: None,
            failed_since_ms: None,
            declared_start_ms,
            pressure: Pressure::None,
            pressure_since_ms: now_ms,
        };
        if configured_weight == 0 {
            backend.drain = Some(Drain { since_ms: now_ms });
            backend.reason = Reason::OperatorDrain;
        }
        backend
    }

    /// The state reported to operators: draining hides the health underneath.
    pub fn state(&self) -> State {
        if self.drain.is_some() { State::Draining } else { self.health.state() }
    }

    pub fn is_draining(&self) -> bool {
        self.drain.is_some()
    }

    pub fn is_failed(&self) -> bool {
        !self.health.is_serving()
    }

    fn set(&mut self, health: Health, reason: Reason, now_ms: u64) {
        if !self.health.is_serving() && health.is_serving() {
            self.failed_since_ms = None;
        }
        if self.health.is_serving() && !health.is_serving() {
            self.failed_since_ms = Some(now_ms);
        }
        self.health = health;
        self.reason = reason;
        self.since_ms = now_ms;
    }

    /// Applies one probe outcome (no slow verdict: that needs the peers, see `judge_latency`).
    pub fn observe(&mut self, outcome: &ProbeOutcome, config: &HealthConfig, now_ms: u64) {
        if *outcome == ProbeOutcome::Unknown {
            // Counted for display only: never a state change, not even a time-driven one.
            self.unknowns = self.unknowns.saturating_add(1);
            return;
        }
        self.advance(config, now_ms);
        let last = match outcome {
            ProbeOutcome::Unknown => return,
            ProbeOutcome::Success { latency_us } => {
                self.unknowns = 0;
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                let sample = *latency_us;
                self.latency_ewma_us = Some(match self.latency_ewma_us {
                    None => sample,
                    Some(old) => (old.saturating_mul(EWMA_KEEP_QUARTERS).saturating_add(sample)) / (EWMA_KEEP_QUARTERS + 1),
                });
                self.on_success(config, now_ms);
                return;
            }
            ProbeOutcome::Failure { reason } => reason,
            ProbeOutcome::Timeout => "timeout",
            ProbeOutcome::VipPathFailed { tunnel } => tunnel,
        };
        self.unknowns = 0;
        self.successes = 0;
        self.failures = self.failures.saturating_add(1);
        if self.failures < config.fall {
            return;
        }
        let failures = self.failures;
        let reason = match outcome {
            ProbeOutcome::VipPathFailed { .. } => Reason::VipPathFailed { failures, tunnel: last.to_owned() },
            _ => Reason::ConsecutiveFailures { failures, last: last.to_owned() },
        };
        match self.health {
            Health::Healthy | Health::Slow { .. } | Health::SlowStart { .. } => {
                let flapped = self.last_recovered_ms.is_some_and(|at| now_ms.saturating_sub(at) < config.flap_window_ms);
                self.flaps = if flapped { self.flaps.saturating_add(1) } else { 0 };
                self.set(Health::Unhealthy, reason, now_ms);
            }
            // Failing while held down: back to unhealthy, which is no new flap (it never
            // recovered), so the next recovery is held down as long as this one.
            Health::HeldDown { .. } => self.set(Health::Unhealthy, reason, now_ms),
            Health::Unhealthy => {}
        }
    }

    fn on_success(&mut self, config: &HealthConfig, now_ms: u64) {
        match self.health {
            Health::Unhealthy if self.successes >= config.rise => {
                let reason = Reason::ConsecutiveSuccesses { successes: self.successes };
                if self.flaps == 0 {
                    self.recover(reason, now_ms);
                } else {
                    let hold_ms = config.hold_down_ms(self.flaps);
                    self.set(
                        Health::HeldDown { until_ms: now_ms.saturating_add(hold_ms) },
                        Reason::Flapping { flaps: self.flaps, hold_ms },
                        now_ms,
                    );
                }
            }
            // Expired while failing: the first success lets it out.
            Health::HeldDown { until_ms } if now_ms >= until_ms => self.recover(Reason::HoldDownExpired, now_ms),
            _ => {}
        }
    }

    /// Readmitted by its probes: this balancer's own ramp, from now (on wall-clock steps, so
    /// balancers that readmit it within the same step ramp it alike).
    fn recover(&mut self, reason: Reason, now_ms: u64) {
        self.last_recovered_ms = Some(now_ms);
        self.set(Health::SlowStart { from_ms: now_ms }, reason, now_ms);
    }

    /// Time-driven transitions: the end of slow start, the end of a hold-down.
    pub fn advance(&mut self, config: &HealthConfig, now_ms: u64) {
        match self.health {
            Health::SlowStart { from_ms } if ramp_elapsed_ms(from_ms, now_ms, config) >= config.slow_start_ms => {
                self.set(Health::Healthy, Reason::SlowStartComplete, now_ms);
            }
            Health::HeldDown { until_ms } if now_ms >= until_ms && self.failures == 0 => self.recover(Reason::HoldDownExpired, now_ms),
            _ => {}
        }
    }

    /// One latency verdict against the peers (only for Healthy and Slow backends: slow start
    /// already holds the weight down, failed backends carry none).
    pub fn judge_latency(&mut self, slow: Option<Reason>, config: &HealthConfig, now_ms: u64) {
        let step = permille(config.slow_step).max(1);
        let floor = permille(config.slow_floor).clamp(1, 1000);
        match (self.health, slow) {
            (Health::Healthy, Some(reason)) => {
                self.set(Health::Slow { scale_permille: 1000u64.saturating_sub(step).max(floor) }, reason, now_ms)
            }
            (Health::Slow { scale_permille }, Some(_)) => {
                // Still slow: lose another step; the state (and its since) stays.
                self.health = Health::Slow { scale_permille: scale_permille.saturating_sub(step).max(floor) };
            }
            (Health::Slow { scale_permille }, None) => {
                let scale_permille = scale_permille + step;
                if scale_permille >= 1000 {
                    self.set(Health::Healthy, Reason::LatencyRecovered, now_ms);
                } else {
                    self.health = Health::Slow { scale_permille };
                }
            }
            _ => {}
        }
    }

    /// The weight this backend earns on its own (0 when failed or draining).
    pub fn own_weight(&self, config: &HealthConfig, now_ms: u64) -> u32 {
        if self.is_draining() {
            return 0;
        }
        let weight = u64::from(self.configured_weight);
        let own = match self.health {
            Health::Healthy => weight,
            Health::Slow { scale_permille } => (weight * scale_permille / 1000).max(1),
            Health::SlowStart { from_ms } => slow_start_weight(weight, ramp_elapsed_ms(from_ms, now_ms, config), config),
            Health::Unhealthy | Health::HeldDown { .. } => 0,
        };
        own.min(weight) as u32
    }

    pub fn restore(&mut self, restored: Restored, now_ms: u64) {
        match restored {
            Restored::Serving => self.set(Health::Healthy, Reason::Restored, now_ms),
            Restored::SlowStart { elapsed_ms, from_unix_ms } => {
                let from_ms = from_unix_ms.unwrap_or_else(|| now_ms.saturating_sub(elapsed_ms));
                self.set(Health::SlowStart { from_ms }, Reason::Restored, now_ms);
            }
            Restored::Failed { flaps } => {
                self.flaps = flaps;
                self.set(Health::Unhealthy, Reason::Restored, now_ms);
            }
        }
    }

    /// What to persist so that [`Self::restore`] can bring this state back.
    pub fn to_restored(&self, now_ms: u64) -> Restored {
        match self.health {
            Health::Healthy | Health::Slow { .. } => Restored::Serving,
            Health::SlowStart { from_ms } => {
                Restored::SlowStart { elapsed_ms: now_ms.saturating_sub(from_ms), from_unix_ms: Some(from_ms) }
            }
            Health::Unhealthy | Health::HeldDown { .. } => Restored::Failed { flaps: self.flaps },
        }
    }

    /// Operator weight and start from the desired state: 0 drains, a weight after a drain
    /// restarts with slow start from the declared start (it had no new flows). A backend
    /// that failed while drained stays failed for the reason it failed (`vip_path_failed`
    /// says more than `operator_undrain`). A serving backend whose declared start changed
    /// (a file gave the start another balancer gave) ramps from the new one, as that
    /// balancer does; a start whose ramp is over leaves a healthy backend healthy.
    pub fn set_declared(&mut self, weight: u32, declared_start_ms: Option<u64>, config: &HealthConfig, now_ms: u64) {
        self.configured_weight = weight;
        let start_changed = declared_start_ms.is_some() && declared_start_ms != self.declared_start_ms;
        self.declared_start_ms = declared_start_ms;
        match (weight, self.drain) {
            (0, None) => self.drain = Some(Drain { since_ms: now_ms }),
            (1.., Some(_)) => {
                self.drain = None;
                if self.health.is_serving() {
                    self.set(Health::SlowStart { from_ms: declared_start_ms.unwrap_or(now_ms) }, Reason::OperatorUndrain, now_ms);
                }
            }
            (1.., None) if start_changed && self.health.is_serving() => {
                let from_ms = declared_start_ms.unwrap_or(now_ms);
                match self.health {
                    Health::SlowStart { .. } => self.health = Health::SlowStart { from_ms },
                    _ if ramp_elapsed_ms(from_ms, now_ms, config) < config.slow_start_ms => {
                        self.set(Health::SlowStart { from_ms }, Reason::Added, now_ms)
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

/// Steps of a slow start: its weight changes only at wall-clock multiples of
/// `slow_start_ms / SLOW_START_STEPS` (3 s of the default 30 s).
pub const SLOW_START_STEPS: u64 = 10;

/// How far a ramp from `from_ms` is at `now_ms` (both wall-clock, Unix ms), counted in whole
/// steps between wall-clock multiples of the step: the ramp starts at the first multiple at
/// or after `from_ms` and moves at each later one. So the weight is a function of the start
/// and the wall clock alone: balancers with the same start (or starts within the same step)
/// compute the same weight at every moment but the few milliseconds their clocks differ
/// around a step, and a table changes `SLOW_START_STEPS` times a ramp, not every second.
pub fn ramp_elapsed_ms(from_ms: u64, now_ms: u64, config: &HealthConfig) -> u64 {
    let step = (config.slow_start_ms / SLOW_START_STEPS).max(1);
    let start = from_ms.div_ceil(step).saturating_mul(step);
    (now_ms / step * step).saturating_sub(start)
}

/// The slow-start ramp: `floor + (weight - floor) × elapsed / slow_start_ms`, where the
/// floor is `slow_start_floor` of the weight (at least 1). Non-decreasing in `elapsed_ms`,
/// exactly `weight` from `slow_start_ms` on.
pub fn slow_start_weight(weight: u64, elapsed_ms: u64, config: &HealthConfig) -> u64 {
    if weight == 0 || elapsed_ms >= config.slow_start_ms {
        return weight;
    }
    let floor = (weight * permille(config.slow_start_floor) / 1000).clamp(1, weight);
    floor + (weight - floor) * elapsed_ms / config.slow_start_ms
}
