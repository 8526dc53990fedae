//! The health *policy*: from probe outcomes over time, each backend's state and the weight
//! the reconciler should program — decided so that a cascade cannot happen by design.
//!
//! In the Gmail outage routers declared themselves unavailable under overload, and each
//! refusal pushed load onto the survivors until almost all failed. A balancer that ejects
//! every backend that looks sick does the same to its backends. This module is pure and
//! deterministic: no sockets, no clocks (time comes in as `now_ms`, owned by the caller: in
//! `lbd` wall-clock Unix milliseconds, read once at start and advanced monotonically), no
//! daemon wiring. Probes feed [`HealthTracker::observe`]; the daemon programs
//! [`HealthTracker::effective_weights`] and logs [`HealthEvent`]s (one key=value line each).
//!
//! # One backend (`backend.rs`)
//!
//! ```text
//!             added / undrained / recovered (flaps = 0) / hold-down expired
//!                               │
//!                               ▼
//!   ┌──────────── SlowStart ── slow_start_ms elapsed ──► Healthy ◄─── latency back ───┐
//!   │   weight: floor → full                               │  ▲                       │
//!   │                                                      │  └─ weight fully back ── Slow
//!   │                                       slower than peers ───────────────────────►│
//!   │                                                      │            (never below slow_floor)
//!   └─ fall failures ─► Unhealthy ◄─── fall failures ──────┴──────────────────────────┘
//!                        │     ▲
//!   rise successes,      │     └──────── fall failures ────┐
//!   flaps > 0            ▼                                 │
//!                     HeldDown ── expired, passing ────────┴──► SlowStart
//!                     (hold_down_base_ms × 2^(flaps-1), capped at hold_down_max_ms)
//!
//!   Draining (operator weight 0) overlays any state: weight 0, probes still tracked;
//!   a weight again → SlowStart if passing, else the failed state underneath.
//! ```
//!
//! - `Unknown` outcomes (the LB could not probe: its own ports exhausted, no route of its
//!   own) are counted for display and change nothing — not the state, not the streaks, not
//!   even a time-driven transition. The LB's trouble is never the backend's fault.
//! - A *flap* is failing again within `flap_window_ms` of recovering. With flaps in a row, a
//!   recovery is held down for `hold_down_base_ms × 2^(flaps-1)` (capped) before slow start;
//!   staying up longer than the window resets the count.
//! - Slow start is linear from `slow_start_floor` of the weight (at least 1) to exactly the
//!   configured weight at `slow_start_ms`; non-decreasing in between. It is a function of
//!   its start and the wall clock only ([`ramp_elapsed_ms`]: whole steps between wall-clock
//!   multiples of `slow_start_ms / 10`), so every balancer computes the same weight at the
//!   same moment. The start is the operator's (`started_at` in the desired state: added, or
//!   given a weight again; the same on every balancer given the same file) or, after a
//!   readmission by the probes, the moment this balancer readmitted it: per balancer by
//!   nature, and still the same ramp on balancers that readmit it within the same step.
//! - Slow: smoothed latency (EWMA over ~4 probes) above `max(slow_factor × peer median,
//!   peer median + slow_margin_ms)`, with at least `slow_min_peers` peers. Each slow verdict
//!   takes `slow_step` of the weight away down to `slow_floor`; each normal one gives it back.
//!   Peer-relative on purpose: when everyone is slow (shared overload), nobody is punished.
//!
//! # One VIP (`tracker.rs`)
//!
//! Weights are computed in one place (`plan`), in this order:
//! 1. Draining backends get 0 and are left out of `total_weight` (the sum of configured
//!    weights) — the operator's decision, not the health check's.
//! 2. **Panic** when the healthy share of `total_weight` is below `panic_threshold`: fail open
//!    (default) gives every non-draining backend its configured weight, spreading load over
//!    all rather than crushing the few survivors; `fail_closed` keeps only the serving ones
//!    (possibly none). Entering and leaving panic are events; [`VipHealth::panic`] reports it.
//! 3. Otherwise serving backends get their own weight (slow start, slowness) and failed ones
//!    are ejected **oldest failure first** (ties by address) while the ejected configured
//!    weight fits in `max_ejection_fraction × total_weight`; the first that does not fit and
//!    every later one are *kept in* at configured weight and reported (`ejection_capped`, an
//!    event when the kept set changes). Oldest first, because a newer failure then never
//!    undoes an earlier ejection (no table churn as more backends fail) and the backends kept
//!    in are those with the least evidence against them.
//!
//! Slow start and slowness reduce weight but are not ejections and do not count against the
//! cap: a backend judged slow is far slower than the median of its peers, so typically a
//! minority is reduced, each by at most `1 - slow_floor` (bounding this formally is future
//! work).
//!
//! # Invariants (checked after every step of the seeded simulation in `sim.rs`)
//!
//! 1. Outside fail-closed panic, the configured weight of backends given 0 for failed health
//!    never exceeds `max_ejection_fraction` of the VIP's configured weight.
//! 2. `Unknown` never changes any backend's state or any weight.
//! 3. In fail-open panic every non-draining backend carries weight.
//! 4. Slow start is non-decreasing and reaches the configured weight exactly at its end.
//! 5. Each flap in a row holds a backend down longer (until the cap).
//! 6. Draining backends get 0 (their drain deadlines are the daemon's: wall-clock, persisted).
//!
//! Also: no effective weight exceeds the configured one, and a serving backend never gets 0.
//!
//! # Defaults
//!
//! See [`HealthConfig`](spillway_model::HealthConfig) (the declared policy, part of the model):
//! every field says why its default is what it is. In short: probe every 1 s with a 1 s
//! timeout, `fall` 2 / `rise` 2 (a dead backend is out within ~3 s,
//! [`HealthConfig::detection_ms`](spillway_model::HealthConfig::detection_ms)), 10% jitter,
//! eject at most half the weight, panic below half healthy, 30 s slow start, hold-downs from
//! 5 s doubling to 5 min.
//!
//! # Scheduling (`schedule.rs`)
//!
//! [`next_probe_at`] gives each backend a fixed phase in the interval and each probe a jitter,
//! both from a seeded hash: probes are spread, never synchronised, and reproducible.

mod backend;
mod fraction;
mod placement;
mod schedule;
mod tracker;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use backend::{Pressure, Reason, Restored, SLOW_START_STEPS, State, ramp_elapsed_ms, slow_start_weight};
pub use placement::{Candidate, Placement, place};
pub use schedule::{ProbeKey, next_probe_at};
pub use tracker::{BackendHealth, HealthError, HealthEvent, HealthTracker, MAX_QUEUED_EVENTS, StateChange, VipHealth};
