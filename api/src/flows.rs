//! Answers about connection-table entries: where one flow goes and why (`flow_get`), a
//! VIP's entries (`flow_list`), and a drained or removed backend's entries deleted
//! (`flow_purge`).

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use spillway_model::Vip;

/// Largest `limit` of a `flow_list` (and its default): one answer stays a few MiB.
pub const MAX_FLOW_LIST: u32 = 10_000;
pub const DEFAULT_FLOW_LIST: u32 = 100;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowAnswer {
    pub vip: Vip,
    pub client: SocketAddr,
    /// The destination port of the tuple (the VIP's, or the one asked for an any-port VIP).
    pub port: u16,
    /// The tuple's connection-table entry, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<FlowEntryState>,
    /// The flow hash and the slot of the VIP's active Maglev table it selects.
    pub hash: u32,
    pub slot: u32,
    /// The backend Maglev gives the tuple as a new flow (a SYN always goes there); absent
    /// when the slot names no backend (the VIP has none in service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<IpAddr>,
    /// Second chance: the backend the VIP's table before its last change gave the tuple,
    /// when it differs from `maglev`. A TCP packet other than a SYN, without an entry in
    /// force, goes to `maglev` inside a tunnel to this one (not limited, not remembered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_chance: Option<IpAddr>,
    /// Where the tuple's next packet (not a SYN) goes: the entry's backend while the entry is
    /// in force, else the Maglev choice if a new flow would be admitted or the packet takes
    /// the second chance; absent: dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goes_to: Option<IpAddr>,
    /// Whether a new flow on this tuple would be admitted now.
    pub admission: Admission,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEntryState {
    /// The backend the entry names; absent when its id no longer holds a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<IpAddr>,
    /// Milliseconds since the entry was last refreshed (refreshes are at most 1 s apart
    /// while packets flow, so an active flow shows under about a second).
    pub idle_ms: u64,
    /// The data path follows the entry (same backend generation, not idle past its timeout).
    pub in_force: bool,
    /// Why it is not in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub admitted: bool,
    /// The drop reason that refuses it (`drop_rule_block`, `drop_source_limit`, …), or, with
    /// `observe`, the one that would in enforce mode (the flow is admitted and counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_by: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observe: bool,
    /// The operator rule matching the client, `CIDR` plus ` for VIP` or ` for every VIP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowList {
    pub vip: Vip,
    pub entries: Vec<FlowEntry>,
    /// Connection-table entries read to find these (the walk stops at `limit`).
    pub scanned: u64,
    /// More entries matched than `limit`.
    pub truncated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEntry {
    pub client: SocketAddr,
    /// The destination port (differs between entries of an any-port VIP).
    pub port: u16,
    pub backend: IpAddr,
    pub idle_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReport {
    pub backend: IpAddr,
    /// Entries deleted.
    pub removed: u64,
    /// Entries read.
    pub scanned: u64,
}
