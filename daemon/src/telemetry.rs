//! `lbd`'s own counters, for the metrics and `lbctl top`: changes applied to the maps and how
//! long they took, probe outcomes, agent polls, and the last count of the connection table.
//! Kept by the core as it works; read into a [`spillway_api::sample::Sample`].

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use spillway_api::sample::{BuildInfo, DaemonSample, HistogramSample, OutcomeCount, ReconcileCount};
use spillway_model::ProbeOutcome;

/// How often the connection table is counted at most: a count walks every entry (2^20 when
/// full, a fraction of a second of a CPU), so scrapes every second reuse it.
pub const FLOW_COUNT_INTERVAL: Duration = Duration::from_secs(15);

/// Upper bounds (seconds) of the reconcile duration histogram: from a weight change (a few
/// slots, well under a millisecond) to a full 65537-slot table rewritten (~0.1 s).
const RECONCILE_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// What a count of the connection table found.
#[derive(Clone, Debug, Default)]
pub struct FlowCount {
    pub at: Option<Instant>,
    pub entries: u64,
    /// Entries in force (their backend's id and generation hold) per VIP id.
    pub per_vip_id: HashMap<u32, u64>,
}

impl FlowCount {
    pub fn due(&self) -> bool {
        self.at.is_none_or(|at| at.elapsed() >= FLOW_COUNT_INTERVAL)
    }
}

#[derive(Debug)]
pub struct Telemetry {
    pub info: BuildInfo,
    epoch: Instant,
    reconciles: BTreeMap<(&'static str, &'static str), u64>,
    /// Per bucket of `RECONCILE_BUCKETS` (not cumulative), then the sum and count.
    reconcile_buckets: [u64; RECONCILE_BUCKETS.len()],
    reconcile_sum_s: f64,
    reconcile_count: u64,
    probes: BTreeMap<&'static str, u64>,
    agent_polls: BTreeMap<&'static str, u64>,
    pub flow_count: FlowCount,
    pub table_full: TableFullAlert,
}

/// How often a full connection table is told at most.
pub const TABLE_FULL_REPEAT: Duration = Duration::from_secs(60);

/// The unremembered-flow count the last full-table ALERT told of, and when.
#[derive(Clone, Copy, Debug, Default)]
pub struct TableFullAlert {
    pub reported: u64,
    pub at: Option<Instant>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            info: BuildInfo { version: env!("CARGO_PKG_VERSION").to_owned(), ..BuildInfo::default() },
            epoch: Instant::now(),
            reconciles: BTreeMap::new(),
            reconcile_buckets: [0; RECONCILE_BUCKETS.len()],
            reconcile_sum_s: 0.0,
            reconcile_count: 0,
            probes: BTreeMap::new(),
            agent_polls: BTreeMap::new(),
            flow_count: FlowCount::default(),
            table_full: TableFullAlert::default(),
        }
    }
}

impl Telemetry {
    /// Milliseconds since `lbd` started (monotonic).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A change of operation `op` was applied to the maps (or failed) in `took`.
    pub fn reconciled(&mut self, op: &'static str, ok: bool, took: Duration) {
        *self.reconciles.entry((op, if ok { "ok" } else { "error" })).or_default() += 1;
        let seconds = took.as_secs_f64();
        if let Some(bucket) = RECONCILE_BUCKETS.iter().position(|le| seconds <= *le) {
            self.reconcile_buckets[bucket] += 1;
        }
        self.reconcile_sum_s += seconds;
        self.reconcile_count += 1;
    }

    pub fn probed(&mut self, outcome: &ProbeOutcome) {
        let label = match outcome {
            ProbeOutcome::Success { .. } => "success",
            ProbeOutcome::Failure { .. } => "failure",
            ProbeOutcome::Timeout => "timeout",
            ProbeOutcome::VipPathFailed { .. } => "vip_path_failed",
            ProbeOutcome::Unknown => "unknown",
        };
        *self.probes.entry(label).or_default() += 1;
    }

    pub fn agent_polled(&mut self, outcome: &'static str) {
        *self.agent_polls.entry(outcome).or_default() += 1;
    }

    pub fn sample(&self, local_probe_alert: bool) -> DaemonSample {
        let outcomes = |m: &BTreeMap<&'static str, u64>| {
            m.iter().map(|(outcome, count)| OutcomeCount { outcome: (*outcome).to_owned(), count: *count }).collect()
        };
        let mut cumulative = 0;
        let buckets = RECONCILE_BUCKETS
            .iter()
            .zip(self.reconcile_buckets)
            .map(|(le, n)| {
                cumulative += n;
                (*le, cumulative)
            })
            .collect();
        DaemonSample {
            reconciles: self
                .reconciles
                .iter()
                .map(|((op, outcome), count)| ReconcileCount { op: (*op).to_owned(), outcome: (*outcome).to_owned(), count: *count })
                .collect(),
            reconcile_seconds: HistogramSample { buckets, sum: self.reconcile_sum_s, count: self.reconcile_count },
            probes: outcomes(&self.probes),
            local_probe_alert,
            agent_polls: outcomes(&self.agent_polls),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_histogram_is_cumulative_with_overflow_only_in_count() {
        let mut t = Telemetry::default();
        t.reconciled("add_vip", true, Duration::from_micros(300));
        t.reconciled("add_vip", true, Duration::from_millis(30));
        t.reconciled("health", false, Duration::from_secs(10));
        let s = t.sample(false);
        assert_eq!(s.reconcile_seconds.count, 3);
        assert_eq!(s.reconcile_seconds.buckets[0], (0.0005, 1));
        assert_eq!(s.reconcile_seconds.buckets.iter().find(|(le, _)| *le == 0.05).unwrap().1, 2);
        assert_eq!(s.reconcile_seconds.buckets.last().unwrap().1, 2, "10 s is only in +Inf (the count)");
        assert!((s.reconcile_seconds.sum - 10.0303).abs() < 1e-9);
        let ops: Vec<_> = s.reconciles.iter().map(|r| (r.op.as_str(), r.outcome.as_str(), r.count)).collect();
        assert_eq!(ops, [("add_vip", "ok", 2), ("health", "error", 1)]);
    }
}
