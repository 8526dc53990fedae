//! One reading of the balancer's counters and state (`{"op":"sample"}`): what `lbctl top`
//! computes its rates from and what the metrics endpoint renders. Counters are cumulative
//! since the counted thing appeared (a VIP or backend id, a rule, `lbd`'s start); rates come
//! from the deltas of two samples.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{ReasonCount, RuleActionKind, any_vip};
use spillway_model::{Cidr, RateSpec, Vip};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds on `lbd`'s monotonic clock when taken.
    pub at_ms: u64,
    pub info: BuildInfo,
    pub vips: Vec<VipSample>,
    /// Every `Reason` (packets), as in `lbctl stats`.
    pub reasons: Vec<ReasonCount>,
    /// Every `Observed` would-drop (packets let through by observe mode).
    pub observed: Vec<ReasonCount>,
    pub rules: Vec<RuleSample>,
    pub flow_table: FlowTableSample,
    /// Memory the kernel accounts to each map, by map name.
    pub maps: Vec<MapMemory>,
    pub daemon: DaemonSample,
    /// Packets sent with a second candidate (connections this balancer had no entry for,
    /// whose backend the VIP's last table change may have moved).
    #[serde(default)]
    pub second_chance_packets: u64,
    /// Frames the balancer does not serve that found no `lbd --pass-to` program (they passed
    /// to the kernel).
    #[serde(default)]
    pub pass_to_missing: u64,
    /// QUIC VIPs' short headers, by how they were placed (`quic_by_connection_id`,
    /// `quic_fallback`: the id named no backend, so the 5-tuple did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quic: Vec<super::ReasonCount>,
    /// What is announced through BIRD; absent when `lbd` does not announce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcements: Option<super::announce::Announcements>,
    /// The interfaces the balancer runs on (the metrics' `interface` label).
    #[serde(default)]
    pub interfaces: Vec<super::InterfaceStatus>,
}

/// What runs: `lbd`'s version, the loaded program's tag, the XDP mode asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildInfo {
    pub version: String,
    pub program_tag: String,
    pub xdp_mode: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipSample {
    pub vip: Vip,
    /// Every packet of the VIP's flows, dropped ones included.
    pub packets: u64,
    pub bytes: u64,
    /// Connection-table entries created (new flows admitted and placed on a backend).
    pub new_flows: u64,
    /// The VIP's entries in force in the connection table (live connections: of a backend
    /// still in place, not idle past the timeout) at the last count (see `flow_table`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_entries: Option<u64>,
    /// Absent when the VIP is not health-checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<VipHealthSample>,
    /// The new-flow budget in force (the operator's, or lower from declared capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RateSpec>,
    /// New flows per second the placement sends to other zones.
    pub spill_per_s: u32,
    pub backends: Vec<BackendSample>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipHealthSample {
    pub panic: bool,
    pub panics_entered: u64,
    pub healthy_weight: u64,
    pub total_weight: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendSample {
    pub address: IpAddr,
    /// The operator's weight, and the one programmed after health, zones and pressure.
    pub weight: u32,
    pub effective_weight: u32,
    /// Packets and bytes forwarded to the backend.
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// Health state (`healthy`, `unhealthy`, …); absent when not probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// Smoothed probe latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Port pressure from the backend's agent (`none`, `critical`, `exhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSample {
    pub cidr: Cidr,
    #[serde(with = "any_vip")]
    pub vip: Option<Vip>,
    pub action: RuleActionKind,
    pub observe: bool,
    pub hits: u64,
    pub dropped: u64,
    /// Would-drops while in observe mode (not in `dropped`).
    #[serde(default)]
    pub would_drop: u64,
}

/// The connection table's size, and its entries when last counted: a count walks the whole
/// table, so it is taken at most every `FLOW_COUNT_INTERVAL` (not on every sample).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowTableSample {
    pub capacity: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// Seconds since the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_s_ago: Option<u64>,
    /// New flows forwarded without an entry because every way they could take was held.
    #[serde(default)]
    pub unremembered: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemory {
    pub map: String,
    pub bytes: u64,
}

/// `lbd`'s own counters since it started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonSample {
    /// Changes applied to the maps, by operation and outcome (`ok`, `error`).
    pub reconciles: Vec<ReconcileCount>,
    /// How long those took.
    pub reconcile_seconds: HistogramSample,
    /// Health probes by outcome (`success`, `failure`, `timeout`, `vip_path_failed`, `unknown`).
    pub probes: Vec<OutcomeCount>,
    /// The balancer cannot open probe sockets (see `lbctl vips list`'s ALERT).
    pub local_probe_alert: bool,
    /// Polls of the backends' agents by outcome (`ok`, `error`).
    pub agent_polls: Vec<OutcomeCount>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileCount {
    pub op: String,
    pub outcome: String,
    pub count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeCount {
    pub outcome: String,
    pub count: u64,
}

/// A histogram: cumulative counts per upper bound (`le`), the sum and the count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HistogramSample {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}
