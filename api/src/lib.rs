//! `lbd`'s control API: one JSON request per line on a Unix socket, answered by one JSON
//! response line. The field and tag names below are a public interface: add, never rename.
//!
//! ```text
//! -> {"op":"add_backend","vip":"10.0.0.1:80/tcp","backend":"10.0.1.1","weight":100}
//! <- {"ok":{"type":"done","slots_written":2017,"tables_flipped":1}}
//! <- {"error":{"kind":"invalid","message":"unknown VIP 10.0.0.1:80/tcp"}}
//! ```

pub mod announce;
pub mod client;
pub mod flows;
pub mod sample;

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use spillway_model::RuleActionKind;
use spillway_model::config::Change;
use spillway_model::ports_report::PortsReport;
use spillway_model::{BackendOptions, Cidr, Encap, HashMode, ModelError, ProbePath, ProbeSpec, QuicConfig, RateSpec, Vip};

/// Where `lbd` listens and `lbctl` connects unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/spillway/api.sock";

/// Largest request line the server reads; anything longer is refused. Room for the largest
/// configuration file, every byte of it escaped.
pub const MAX_REQUEST_BYTES: usize = 2 * spillway_model::config::MAX_CONFIG_BYTES + 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    ListVips,
    /// `ring_size` defaults to `limits::DEFAULT_RING_SIZE`.
    /// `force`: also on an address of the balancer itself (kept as the VIP's
    /// `allow_local_address`).
    AddVip {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ring_size: Option<u32>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
        /// A QUIC VIP (UDP) with this QUIC-LB configuration.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quic: Option<QuicConfig>,
        /// How its backends are tunnelled to (`ipip` when left out).
        #[serde(default, skip_serializing_if = "Encap::is_ipip")]
        encap: Encap,
        /// What Maglev hashes to place its new flows (`5-tuple` when left out).
        #[serde(default, skip_serializing_if = "HashMode::is_five_tuple")]
        hash: HashMode,
        /// With `hash` `source`: how many leading source address bits (the whole address
        /// when left out).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source_prefix: Option<u8>,
    },
    /// How a VIP's backends are tunnelled to (those without their own `encap` option).
    SetVipEncap {
        vip: Vip,
        encap: Encap,
    },
    /// A QUIC VIP's second config id (`quic_next`, a key rotation), or none.
    SetQuicNext {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<QuicConfig>,
    },
    /// Ends a key rotation: the VIP's `quic_next` becomes its only config id.
    RetireQuic {
        vip: Vip,
    },
    /// A VIP that has backends is removed only with `force` (its connections break).
    RemoveVip {
        vip: Vip,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    ListBackends {
        vip: Vip,
    },
    /// `weight` defaults to `model::DEFAULT_WEIGHT`; 0 is refused (see `DrainBackend`).
    AddBackend {
        vip: Vip,
        backend: IpAddr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
        #[serde(default, skip_serializing_if = "BackendOptions::is_empty")]
        options: BackendOptions,
    },
    /// Replaces a backend's options (zone, capacity, spare, probe target).
    SetBackendOptions {
        vip: Vip,
        backend: IpAddr,
        options: BackendOptions,
    },
    RemoveBackend {
        vip: Vip,
        backend: IpAddr,
    },
    /// Weight 0: the backend keeps its flows but gets no new ones; with `deadline_s` it is
    /// removed that many seconds later. The VIP's last active backend is drained only with
    /// `force` (new flows would have nowhere to go).
    DrainBackend {
        vip: Vip,
        backend: IpAddr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline_s: Option<u64>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// Changes a VIP's health checks: the probe, its path, and policy fields by name (see
    /// `model::HealthConfig`), over the VIP's current settings (or `lbd`'s defaults).
    /// `reset` first drops the VIP's own settings.
    SetHealth {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probe: Option<ProbeSpec>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probe_path: Option<ProbePath>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        policy: BTreeMap<String, serde_json::Value>,
        #[serde(default)]
        reset: bool,
    },
    /// Port pressure of the balancer host (no `host`) or of a backend host, from its agent.
    Ports {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<IpAddr>,
    },
    /// A weight of at least 1 (undrains a drained backend).
    SetWeight {
        vip: Vip,
        backend: IpAddr,
        weight: u32,
    },
    Stats,
    /// Sets (replaces) the per-source limit of a scope, keeping its budget. `burst` defaults
    /// to `per_s`, the prefix lengths to 32 (IPv4) and 64 (IPv6).
    SetRateLimit {
        scope: Scope,
        per_s: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        burst: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source_prefix_v4: Option<u8>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source_prefix_v6: Option<u8>,
        #[serde(default)]
        observe: bool,
    },
    /// Sets (replaces) the new-flow budget of a scope, keeping its per-source limit.
    SetBudget {
        scope: Scope,
        per_s: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        burst: Option<u32>,
        #[serde(default)]
        observe: bool,
    },
    /// Removes one part of a scope's limits, or both (`all`, the default).
    ClearRateLimit {
        scope: Scope,
        #[serde(default)]
        part: LimitPart,
    },
    ListRateLimits,
    /// Adds a rule or changes an existing one (same CIDR and VIP). `per_s` (and optionally
    /// `burst`, default `per_s`) only with `"action": "limit"`. No `vip`: every VIP.
    SetRule {
        cidr: Cidr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<Vip>,
        action: RuleActionKind,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        per_s: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        burst: Option<u32>,
        #[serde(default)]
        observe: bool,
    },
    RemoveRule {
        cidr: Cidr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vip: Option<Vip>,
    },
    ListRules,
    /// The VIP's source prefixes, most dropped first, then most admitted; `limit` caps the
    /// list (default: all).
    TopSources {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Makes the desired state the one a configuration file declares, as one change: all of
    /// it or, on any error, none of it. `dry_run` only checks it and says what would change.
    /// Removing a VIP that still has backends is refused unless `allow_vip_removal`, and
    /// removing a backend that still serves (not drained first) unless `allow_backend_removal`.
    Apply {
        /// The file's text (at most `config::MAX_CONFIG_BYTES`).
        config: String,
        /// Where it came from, for messages.
        source: String,
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        allow_vip_removal: bool,
        #[serde(default)]
        allow_backend_removal: bool,
    },
    /// The running desired state (and `lbd`'s settings) as a configuration file.
    Export,
    /// The daemon at a glance: version, uptime, attachment, maps, watcher, alerts.
    Status,
    /// Every counter and state `lbctl top` and the metrics show (`sample::Sample`).
    Sample,
    /// Where the flow from `client` to `vip` goes and why (`flows::FlowAnswer`); an any-port
    /// VIP needs the destination `port`.
    FlowGet {
        vip: Vip,
        client: SocketAddr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
    },
    /// The VIP's connection-table entries, optionally only those of `backend`; `limit`
    /// defaults to `flows::DEFAULT_FLOW_LIST`, at most `flows::MAX_FLOW_LIST`.
    FlowList {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<IpAddr>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// Deletes the connection-table entries of `backend`; refused unless it is drained in
    /// every VIP it serves, or no longer a backend.
    FlowPurge {
        backend: IpAddr,
    },
}

impl Request {
    /// The request in one line as the server reads it off the socket (the newline, if any,
    /// included): at most [`MAX_REQUEST_BYTES`], one JSON object naming a known `op` with
    /// only its fields. Takes raw bytes, so that text that is not UTF-8 is refused here like
    /// any other bad request.
    pub fn decode(line: &[u8]) -> Result<Request, ApiError> {
        let bad = |message: String| ApiError { kind: ErrorKind::BadRequest, message };
        if line.len() > MAX_REQUEST_BYTES {
            return Err(bad(format!("request longer than {MAX_REQUEST_BYTES} bytes")));
        }
        serde_json::from_slice(line).map_err(|e| bad(format!("bad request: {e}")))
    }
}

/// Which limits a request edits: `"default"` (every VIP without its own) or a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Default,
    Vip(Vip),
}

impl Scope {
    pub fn vip(&self) -> Option<&Vip> {
        match self {
            Scope::Default => None,
            Scope::Vip(vip) => Some(vip),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Default => f.write_str("default"),
            Scope::Vip(vip) => write!(f, "{vip}"),
        }
    }
}

impl FromStr for Scope {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "default" { Ok(Scope::Default) } else { s.parse().map(Scope::Vip) }
    }
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitPart {
    #[default]
    All,
    PerSource,
    Budget,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Error(ApiError),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// A mutation took effect (or changed nothing); what it cost in map writes.
    Done {
        slots_written: usize,
        tables_flipped: usize,
    },
    Vips(VipList),
    Backends(BackendList),
    Stats(Stats),
    RateLimits(RateLimitList),
    Rules(RuleList),
    TopSources(TopSourceList),
    /// Boxed: a report is much larger than the other replies.
    Ports(Box<PortsView>),
    Sample(Box<sample::Sample>),
    Flow(flows::FlowAnswer),
    Flows(flows::FlowList),
    Purged(flows::PurgeReport),
    Applied(Applied),
    Exported(Exported),
    // Boxed: the largest reply by far, and a rare one.
    Status(Box<Status>),
}

/// What an `Apply` changed (or, dry, would change).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// False for a dry run.
    pub applied: bool,
    pub changes: Vec<Change>,
    /// Settings of `[lbd]` that differ from the running ones (they take effect at a restart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub slots_written: usize,
    pub tables_flipped: usize,
    /// Backends the file gives no `started_at` that start serving with it (new here, or
    /// given a weight again): the start `lbd` gave them, which `lbctl apply` writes into the
    /// file so that the other balancers given it ramp them alike.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub started: Vec<Started>,
}

/// The start (`started_at`) of a serving backend the applied file declared none for: given
/// now, or the one it already had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub vip: Vip,
    pub backend: IpAddr,
    pub started_at_unix_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exported {
    /// A configuration file (TOML).
    pub config: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub uptime_s: u64,
    /// The interfaces the balancer runs on, in the order it was given them.
    pub interfaces: Vec<InterfaceStatus>,
    /// Attached nowhere (`lbd --xdp-attach none`): where its entry program is pinned, for the
    /// operator's root program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_program: Option<String>,
    /// `--pass-to`: the pinned program the frames it does not serve are handed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_to: Option<String>,
    pub pin_dir: String,
    pub state_dir: String,
    pub health_checks: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The `--config` file and what became of it; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigStatus>,
    pub vips: usize,
    pub backends: usize,
    pub rules: usize,
    pub maps: Vec<MapUsage>,
    pub watcher: WatcherSummary,
    pub announcements: AnnouncementsStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<String>,
}

/// One interface the balancer runs on, as last checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    pub name: String,
    /// The mode lbd asked for (`native`, `generic`); a taken-over link keeps its own.
    pub xdp_mode: String,
    /// How the program went live on it: `attached`, `took_over` (a running link's program
    /// was replaced) or `reattached`; `-` while it does not drive it.
    pub attachment: String,
    /// `up`; `down` (not up or no carrier); `gone` (no such interface); `not_attached` (the
    /// program does not drive it: `error` says why).
    pub state: String,
    /// The forwarding sysctls found at 0 (VIP packets arriving there are then dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding_off: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl InterfaceStatus {
    /// Every value of `state`, for the metrics' `state` label.
    pub const STATES: [&str; 4] = ["up", "down", "gone", "not_attached"];
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigStatus {
    pub file: String,
    /// What lbd did with it last: e.g. `applied at start (first start)`, `kept the persisted
    /// state (file unchanged)`, `applied on SIGHUP`.
    pub last: String,
    /// Why it was last refused, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One BPF map: its capacity, its use and the memory the kernel accounts for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapUsage {
    pub name: String,
    pub max_entries: u32,
    /// Entries (slots for the rings) in use; absent for counters and per-CPU maps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
    /// The kernel's `memlock` for the map; absent when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The balancer's own port watcher (`lbctl ports --host lb`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherSummary {
    /// `loaded` or `not_loaded`.
    pub state: String,
    /// When loaded: its mode (`btf`, `tracepoint`, `sock_diag`); summary: how many parts it
    /// watches and which it does not (`lbctl ports` says how each is watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Why it is not loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Route announcements of the VIPs (BGP); `off` until this lbd announces any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnouncementsStatus {
    /// `off` (no BIRD configured), `announcing` (every VIP address with backends is
    /// announced normally), `degraded` (some are degraded or withdrawn for a fault, or BIRD
    /// did not take the last change) or `withdrawn` (none is announced).
    pub state: String,
    /// Why it is not `announcing`: the faults (`program_detached`, `interface_down`,
    /// `forwarding_disabled`), `BIRD: ...` (its error, or `not answering`), `no_backends`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// VIP addresses per announcement state (`announced`, `degraded`, `withdrawn`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub addresses: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not a request this server understands (bad JSON, unknown op or field).
    BadRequest,
    /// A well-formed request the desired state refuses (unknown VIP, duplicate, limits).
    Invalid,
    /// The peer is not root.
    PermissionDenied,
    /// Applying or persisting failed; the change was rolled back.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipList {
    pub vips: Vec<VipEntry>,
    /// Loud local problems of the balancer (e.g. it cannot open probe sockets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipEntry {
    pub vip: Vip,
    pub ring_size: u32,
    /// How its backends are tunnelled to, unless their options say otherwise.
    #[serde(default)]
    pub encap: Encap,
    /// What Maglev hashes to place its new flows: `5-tuple` or `source`.
    #[serde(default)]
    pub hash: HashMode,
    /// With `hash` `source`: how many leading source address bits are hashed (the whole
    /// address when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_prefix: Option<u8>,
    /// Number of backends, draining ones included.
    pub backends: usize,
    /// Health checks of the VIP; absent when it is not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<VipHealthView>,
    /// The new-flow budget in force: the operator's, or lower when derived from the
    /// backends' declared capacity; absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_budget: Option<RateSpec>,
    /// The BGP announcement of the VIP's address; absent when `lbd` does not announce
    /// (no `--bird-socket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcement: Option<announce::AnnouncementView>,
    /// Fingerprint of the Maglev table packets read, as backend addresses, with the flow
    /// hash seed: equal on every balancer that sends the VIP's new flows where this one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_digest: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VipHealthView {
    pub probe: ProbeSpec,
    /// `tunnel` (to the VIP, as its traffic goes) or `direct` (each backend's own address);
    /// a backend's options may say otherwise.
    #[serde(default)]
    pub probe_path: ProbePath,
    /// Failed backends whose probes fail through the tunnel only (`vip_path_failed`): the VIP
    /// path, not the hosts, is broken.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub vip_path_failed: usize,
    /// Healthy weight is below the panic threshold: traffic is spread over every backend
    /// (or, with `fail_closed`, only the healthy ones keep it).
    pub panic: bool,
    /// Times the VIP entered panic since `lbd` started.
    #[serde(default)]
    pub panics_entered: u64,
    pub fail_closed: bool,
    /// Failed backends are kept in because ejecting them would pass `max_ejection_fraction`.
    pub ejection_capped: bool,
    pub healthy_weight: u64,
    pub total_weight: u64,
    pub ejected_weight: u64,
    /// New flows per second sent to other zones than the balancer's.
    pub spill_per_s: u32,
    pub policy: spillway_model::HealthConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendList {
    pub vip: Vip,
    pub backends: Vec<BackendEntry>,
    /// Loud local problems of the balancer (e.g. it cannot open probe sockets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<String>,
}

/// Port pressure of one host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PortsView {
    /// `lb` or the backend's address.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<PortsReport>,
    /// Why there is no report (no watcher, agent unreachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds since the report was taken (agents are polled periodically).
    pub age_s: u64,
    /// Why the report is older than the last poll: the answers since were ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendEntry {
    pub address: IpAddr,
    /// The configured (operator's) weight.
    pub weight: u32,
    pub state: BackendState,
    /// How it is tunnelled to: its option, else its VIP's.
    #[serde(default)]
    pub encap: Encap,
    /// The health state (`healthy`, `unhealthy`, `slow_start`, …); absent when the backend is
    /// not probed (health checks off, UDP and any-port VIPs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// The weight programmed into the balancer (health-adjusted); absent from older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_weight: Option<u32>,
    #[serde(default, skip_serializing_if = "BackendOptions::is_empty")]
    pub options: BackendOptions,
    /// Why the backend is in its health state, and for how long (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_for_s: Option<u64>,
    /// Smoothed probe latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// How it is probed (`tunnel` or `direct`); absent when it is not probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_path: Option<ProbePath>,
    /// Port pressure reported by the backend's agent (`none`, `critical`, `exhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<String>,
    /// Seconds since the backend's agent stopped answering the balancer's polls (absent
    /// while it answers): its port pressure is unknown, its health unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_unreachable_s: Option<u64>,
    /// Probes in a row the balancer could not make itself (its own ports or sockets short).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unknown_probes: u32,
    /// Failed but kept in by the ejection cap (or by fail-open panic).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept_in: bool,
    /// Seconds until a draining backend is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline_in_s: Option<u64>,
    /// QUIC VIPs: the server id (hex) its connection ids must carry (`--server-id` of the
    /// servers' id generator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<String>,
}

impl BackendEntry {
    /// A backend as configured, with nothing known about its health.
    pub fn configured(address: IpAddr, weight: u32) -> Self {
        Self {
            address,
            weight,
            state: BackendState::of_weight(weight),
            encap: Encap::Ipip,
            health: None,
            effective_weight: None,
            options: BackendOptions::default(),
            reason: None,
            state_for_s: None,
            latency_ms: None,
            probe_path: None,
            pressure: None,
            agent_unreachable_s: None,
            unknown_probes: 0,
            kept_in: false,
            drain_deadline_in_s: None,
            server_id: None,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    Active,
    /// Weight 0: existing flows only.
    Draining,
}

impl BackendState {
    pub fn of_weight(weight: u32) -> Self {
        if weight == 0 { Self::Draining } else { Self::Active }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub vips: Vec<VipStats>,
    /// Every `Reason` in `Reason::ALL` order, under its `label()`.
    pub reasons: Vec<ReasonCount>,
    /// Every `Observed` in `Observed::ALL` order: what limits and rules in observe mode
    /// would have dropped (those packets were let through and counted under `reasons`).
    #[serde(default)]
    pub observed: Vec<ReasonCount>,
    /// QUIC VIPs' short headers by how they were placed, in `QuicRouting::ALL` order:
    /// `quic_by_connection_id`, `quic_fallback` (by the 5-tuple: the connection id did not
    /// name a backend).
    #[serde(default)]
    pub quic: Vec<ReasonCount>,
    /// Loud local problems of the balancer, as in `VipList::alerts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipStats {
    pub vip: Vip,
    pub packets: u64,
    pub bytes: u64,
    pub backends: Vec<BackendStats>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStats {
    pub address: IpAddr,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCount {
    pub reason: String,
    pub packets: u64,
}

/// Where a part of a VIP's effective limits comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitOrigin {
    /// The VIP's own limits.
    Vip,
    /// The default limits.
    Default,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerSourceLimit {
    pub rate: RateSpec,
    pub source_prefix_v4: u8,
    pub source_prefix_v6: u8,
    pub observe: bool,
    pub from: LimitOrigin,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLimit {
    pub rate: RateSpec,
    pub observe: bool,
    pub from: LimitOrigin,
}

/// Limits of one scope; `null` parts limit nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeLimits {
    pub per_source: Option<PerSourceLimit>,
    pub vip_budget: Option<BudgetLimit>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipLimits {
    pub vip: Vip,
    /// What applies to the VIP, part by part (`from` says whose).
    #[serde(flatten)]
    pub effective: ScopeLimits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitList {
    pub default: ScopeLimits,
    pub vips: Vec<VipLimits>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleList {
    pub rules: Vec<RuleEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleEntry {
    pub cidr: Cidr,
    /// The VIP the rule is scoped to, or `"*"` for every VIP.
    #[serde(with = "any_vip")]
    pub vip: Option<Vip>,
    pub action: RuleActionKind,
    /// `null` unless `action` is `limit`.
    pub rate: Option<RateSpec>,
    pub observe: bool,
    /// New flows the rule matched, and those it dropped (cumulative since it was added).
    pub hits: u64,
    pub dropped: u64,
    /// Those it would have dropped while in observe mode (apart: they were let through).
    #[serde(default)]
    pub would_drop: u64,
}

/// `"*"` for no VIP (every VIP).
mod any_vip {
    use super::*;

    pub fn serialize<S: Serializer>(vip: &Option<Vip>, s: S) -> Result<S::Ok, S::Error> {
        match vip {
            None => s.serialize_str("*"),
            Some(vip) => s.collect_str(vip),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vip>, D::Error> {
        let s = String::deserialize(d)?;
        if s == "*" { Ok(None) } else { s.parse().map(Some).map_err(serde::de::Error::custom) }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopSourceList {
    pub vip: Vip,
    /// Entries the source table holds for this VIP (before `limit`).
    pub tracked: usize,
    pub sources: Vec<SourceEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceEntry {
    /// The source prefix, with the VIP's configured prefix length.
    pub prefix: Cidr,
    /// New flows admitted and dropped since the entry appeared (the table is an LRU: a
    /// quiet source's entry goes, and its counters with it).
    pub admitted: u64,
    pub dropped: u64,
    /// The counts are estimates from a 1-in-16 sample (each sampled flow counts 16): the VIP
    /// has no per-source limit, or a rule matches (part of) the prefix. Exact otherwise.
    #[serde(default)]
    pub estimated: bool,
}

#[cfg(test)]
mod tests;
