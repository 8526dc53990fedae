//! A VIP's health policy settings, their defaults and their bounds.

use serde::{Deserialize, Serialize};

/// Upper bound of `rise` and `fall`: beyond it a backend would take minutes to change state.
pub const MAX_RISE_FALL: u32 = 100;
/// Upper bound of every duration setting (one hour).
pub const MAX_DURATION_MS: u64 = 3_600_000;
/// Upper bound of `jitter`: the gap between two probes of one backend stays within
/// `interval × (1 ± jitter)`, so jitter must stay well below one interval.
pub const MAX_JITTER: f64 = 0.5;

/// How a VIP's backends are judged. Every field has a default chosen for the reason given
/// on it; `validate` bounds them all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Time between two probes of one backend. 1 s: with `fall` 2 and `timeout_ms` 1 s a dead
    /// backend is out within ~3 s, at one probe per second per backend per LB.
    pub interval_ms: u64,
    /// A probe without an answer after this long is a `Timeout`. 1 s: far above any healthy
    /// LAN round trip, and no longer than `interval_ms`, so probes of a backend never overlap.
    pub timeout_ms: u64,
    /// Consecutive successes that bring an unhealthy backend back. 2: one lucky answer from a
    /// crash-looping process is not enough.
    pub rise: u32,
    /// Consecutive failures that make a backend unhealthy. 2: one lost probe (a dropped packet)
    /// is not an outage.
    pub fall: u32,
    /// Fraction of `interval_ms` by which each probe is randomly (but deterministically)
    /// delayed; every backend also has its own phase within the interval. 0.1: enough that
    /// probes from many LBs never line up into bursts, small enough to keep detection time.
    pub jitter: f64,
    /// Never remove more than this share of the VIP's configured weight for failed health.
    /// 0.5: losing half the capacity to a bad health check is survivable; ejecting more
    /// turns a probe problem (or an overload that looks like failure) into an outage.
    pub max_ejection_fraction: f64,
    /// When the healthy share of the configured weight falls below this, the VIP panics:
    /// traffic is spread over all non-draining backends (or, with `fail_closed`, only the
    /// healthy ones keep it). 0.5: below half, concentrating everything on the survivors
    /// would overload them too — the cascade this module exists to prevent.
    pub panic_threshold: f64,
    /// In panic, keep only healthy backends (possibly none) instead of spreading over all.
    /// Off: for most services a wrong answer from a sick backend beats no answer. Turn it on
    /// when sending traffic to a failed backend is worse than dropping it.
    pub fail_closed: bool,
    /// Length of the linear ramp a recovered or new backend's weight follows from
    /// `slow_start_floor` of its weight to all of it. 30 s: long enough for caches and JITs to
    /// warm up and connection pools to fill, short against an outage.
    pub slow_start_ms: u64,
    /// Share of its weight a backend gets at the start of slow start. 0.1: it is tried with
    /// real traffic at once, but a backend that fails again costs few flows.
    pub slow_start_floor: f64,
    /// First hold-down of a flapping backend, doubled per flap. 5 s: several probe intervals,
    /// so a single flap is damped without keeping a good backend out for long.
    pub hold_down_base_ms: u64,
    /// Longest hold-down. 5 min: a backend that keeps flapping is kept mostly out, but is
    /// retried often enough that a fixed one returns without an operator.
    pub hold_down_max_ms: u64,
    /// A backend that fails again within this long after recovering has flapped; one that
    /// stays up longer starts over. 60 s: twice `slow_start_ms`, so a backend that falls over
    /// as soon as its ramp reaches full traffic counts as a flap.
    pub flap_window_ms: u64,
    /// A backend is slow when its smoothed latency exceeds
    /// `max(slow_factor × peer median, peer median + slow_margin_ms)`. 3: far outside normal
    /// spread between identical machines.
    pub slow_factor: u32,
    /// See `slow_factor`. 50 ms: on a LAN where peers answer in 1 ms, 3 ms is noise, not slow.
    pub slow_margin_ms: u64,
    /// Fewest peers (other serving backends with latency samples) needed to judge slowness.
    /// 2: with one peer it is one opinion against another.
    pub slow_min_peers: u32,
    /// Share of its weight a slow backend loses per probe judged slow, and regains per probe
    /// judged normal. 0.1: the reduction takes several seconds, so one bad sample does little.
    pub slow_step: f64,
    /// Lowest share of its weight a slow backend keeps. 0.25: a slow backend still serves
    /// (getting slower beats refusing), a quarter of the load usually drains its queues, and
    /// its peers take at most three quarters of its share.
    pub slow_floor: f64,
    /// Share of a backend's declared capacity that other zones may use, when it declares no
    /// spare of its own. 0.2: capacity is usually planned with about that much headroom for
    /// a zone's own peaks; lending more would let one zone's fault overload another.
    pub spare_fraction: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: 1000,
            timeout_ms: 1000,
            rise: 2,
            fall: 2,
            jitter: 0.1,
            max_ejection_fraction: 0.5,
            panic_threshold: 0.5,
            fail_closed: false,
            slow_start_ms: 30_000,
            slow_start_floor: 0.1,
            hold_down_base_ms: 5000,
            hold_down_max_ms: 300_000,
            flap_window_ms: 60_000,
            slow_factor: 3,
            slow_margin_ms: 50,
            slow_min_peers: 2,
            slow_step: 0.1,
            slow_floor: 0.25,
            spare_fraction: 0.2,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HealthConfigError {
    #[error("health {field}: {value} ms is out of range (1..={MAX_DURATION_MS})")]
    BadDuration { field: &'static str, value: u64 },
    #[error("health {field}: {value} ms is out of range (0..={MAX_DURATION_MS})")]
    BadOptionalDuration { field: &'static str, value: u64 },
    #[error("health timeout_ms {timeout_ms} exceeds interval_ms {interval_ms}: probes of one backend would overlap")]
    TimeoutAboveInterval { timeout_ms: u64, interval_ms: u64 },
    #[error("health {field}: {value} is out of range (1..={MAX_RISE_FALL})")]
    BadCount { field: &'static str, value: u32 },
    #[error("health {field}: {value} is out of range ({min}..={max})")]
    BadFraction { field: &'static str, value: f64, min: f64, max: f64 },
    #[error("health hold_down_base_ms {base_ms} exceeds hold_down_max_ms {max_ms}")]
    HoldDownBaseAboveMax { base_ms: u64, max_ms: u64 },
}

impl HealthConfigError {
    /// The field the problem is about.
    pub fn field(&self) -> &'static str {
        match self {
            Self::BadDuration { field, .. }
            | Self::BadOptionalDuration { field, .. }
            | Self::BadCount { field, .. }
            | Self::BadFraction { field, .. } => field,
            Self::TimeoutAboveInterval { .. } => "timeout_ms",
            Self::HoldDownBaseAboveMax { .. } => "hold_down_base_ms",
        }
    }
}

impl HealthConfig {
    /// Checks every field against its bounds; the first problem is returned.
    pub fn validate(&self) -> Result<(), HealthConfigError> {
        let Self {
            interval_ms,
            timeout_ms,
            rise,
            fall,
            jitter,
            max_ejection_fraction,
            panic_threshold,
            fail_closed: _,
            slow_start_ms,
            slow_start_floor,
            hold_down_base_ms,
            hold_down_max_ms,
            flap_window_ms,
            slow_factor,
            slow_margin_ms,
            slow_min_peers,
            slow_step,
            slow_floor,
            spare_fraction,
        } = *self;
        for (field, value) in [
            ("interval_ms", interval_ms),
            ("timeout_ms", timeout_ms),
            ("hold_down_base_ms", hold_down_base_ms),
            ("hold_down_max_ms", hold_down_max_ms),
            ("flap_window_ms", flap_window_ms),
        ] {
            if !(1..=MAX_DURATION_MS).contains(&value) {
                return Err(HealthConfigError::BadDuration { field, value });
            }
        }
        for (field, value) in [("slow_start_ms", slow_start_ms), ("slow_margin_ms", slow_margin_ms)] {
            if value > MAX_DURATION_MS {
                return Err(HealthConfigError::BadOptionalDuration { field, value });
            }
        }
        if timeout_ms > interval_ms {
            return Err(HealthConfigError::TimeoutAboveInterval { timeout_ms, interval_ms });
        }
        for (field, value) in [("rise", rise), ("fall", fall), ("slow_factor", slow_factor), ("slow_min_peers", slow_min_peers)] {
            if !(1..=MAX_RISE_FALL).contains(&value) {
                return Err(HealthConfigError::BadCount { field, value });
            }
        }
        for (field, value, min, max) in [
            ("jitter", jitter, 0.0, MAX_JITTER),
            ("max_ejection_fraction", max_ejection_fraction, 0.0, 1.0),
            ("panic_threshold", panic_threshold, 0.0, 1.0),
            ("slow_start_floor", slow_start_floor, 0.0, 1.0),
            ("slow_step", slow_step, 0.001, 1.0),
            ("slow_floor", slow_floor, 0.001, 1.0),
            ("spare_fraction", spare_fraction, 0.0, 1.0),
        ] {
            // `contains` is false for NaN, so NaN is refused too.
            if !(min..=max).contains(&value) {
                return Err(HealthConfigError::BadFraction { field, value, min, max });
            }
        }
        if hold_down_base_ms > hold_down_max_ms {
            return Err(HealthConfigError::HoldDownBaseAboveMax { base_ms: hold_down_base_ms, max_ms: hold_down_max_ms });
        }
        Ok(())
    }

    /// The hold-down after the `flaps`-th flap (1-based): `hold_down_base_ms × 2^(flaps-1)`,
    /// capped at `hold_down_max_ms`.
    pub fn hold_down_ms(&self, flaps: u32) -> u64 {
        let doublings = flaps.saturating_sub(1).min(63);
        self.hold_down_base_ms.saturating_mul(1u64 << doublings).min(self.hold_down_max_ms)
    }

    /// Detection time of a dead backend in the worst case: `fall` intervals plus one timeout
    /// plus the largest jitter.
    pub fn detection_ms(&self) -> u64 {
        let jitter_ms = (self.interval_ms as f64 * self.jitter) as u64;
        (self.interval_ms + jitter_ms) * u64::from(self.fall) + self.timeout_ms
    }
}
