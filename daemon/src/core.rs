//! What the API does, independent of sockets: owns the desired state, the reconciler and the
//! maps. A mutation is tried on a copy of the state, reconciled into the maps, persisted, and
//! only then becomes the current state; any failure rolls the maps back and changes nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Instant,
};

use spillway_common::{
    limits::{DEFAULT_RING_SIZE, DEFAULT_SOURCE_PREFIX_V4, DEFAULT_SOURCE_PREFIX_V6},
    types::{Observed, Reason, RuleState, SourceKey, SourceState, Traffic},
};

pub use self::flows::FlowTable;
use super::{
    health_checks::{Checks, ChecksConfig},
    ports_book::{AgentPoll, PortsBook},
    telemetry::Telemetry,
};
use crate::{
    store::{HealthSnapshot, Store, StoreError},
    wall_clock::unix_ms,
};
use spillway_api::{ApiError, ErrorKind, LimitPart, PortsView, Reply, Request, announce::Announcements, sample::BuildInfo};
use spillway_dataplane::{BalancerMaps, DataplaneError, MapOccupancy};
use spillway_logging::{Line, error_chain, event};
use spillway_model::config::{ConfigError, Document};
use spillway_model::ports_report::PortsReport;
use spillway_model::{
    Backend, DEFAULT_WEIGHT, DesiredState, ModelError, ProbePath, ProbeSpec, RateSpec, RuleConfig, RuleMatch, Vip, VipHealth,
    check_serving_weight, host::HostError,
};
use spillway_policy::health::{HealthError, Pressure};
use spillway_reconcile::{ApplyReport, Maps, MapsError, ReconcileError, Reconciler};

/// The counters `lbctl stats`, `rules list`, `top-sources`, `top` and the metrics report,
/// and (`FlowTable`) the connection table; implemented by the real maps and, in tests, a
/// fake.
pub trait Counters: FlowTable {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn vip_new_flows(&self, id: u32) -> Result<u64, DataplaneError>;
    fn backend_new_flows(&self, id: u32) -> Result<u64, DataplaneError>;
    /// The kernel's memory accounting per map (`None`: unreadable).
    fn memory(&self) -> Vec<(&str, Option<u64>)>;
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError>;
    fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError>;
    /// Packets sent with a second candidate (second chance).
    fn second_chance_packets(&self) -> Result<u64, DataplaneError>;
    /// Frames not served that found no `--pass-to` program.
    fn pass_to_missing(&self) -> Result<u64, DataplaneError>;
    /// QUIC VIPs' short headers by how they were placed.
    fn quic_routing(&self) -> Result<Vec<(spillway_common::types::QuicRouting, u64)>, DataplaneError>;
    /// New flows forwarded without an entry: the table was full where they hash.
    fn unremembered_flows(&self) -> Result<u64, DataplaneError>;
    fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError>;
    /// The source table's entries of VIP id `vip_id`.
    fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError>;
    /// Capacity of every map, entries of the hash maps (`lbctl status`).
    fn occupancy(&self) -> Result<Vec<MapOccupancy>, DataplaneError>;
}

impl Counters for BalancerMaps {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::vip_traffic(self, id)
    }
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::backend_traffic(self, id)
    }
    fn vip_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        BalancerMaps::vip_new_flows(self, id)
    }
    fn backend_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        BalancerMaps::backend_new_flows(self, id)
    }
    fn memory(&self) -> Vec<(&str, Option<u64>)> {
        BalancerMaps::memory(self).iter().map(|m| (m.name.as_str(), Some(m.bytes))).collect()
    }
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        BalancerMaps::reasons(self)
    }
    fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError> {
        BalancerMaps::observed(self)
    }
    fn second_chance_packets(&self) -> Result<u64, DataplaneError> {
        BalancerMaps::second_chance_packets(self)
    }
    fn pass_to_missing(&self) -> Result<u64, DataplaneError> {
        BalancerMaps::pass_to_missing(self)
    }
    fn quic_routing(&self) -> Result<Vec<(spillway_common::types::QuicRouting, u64)>, DataplaneError> {
        BalancerMaps::quic_routing(self)
    }
    fn unremembered_flows(&self) -> Result<u64, DataplaneError> {
        BalancerMaps::unremembered_flows(self)
    }
    fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError> {
        BalancerMaps::rule_state(self, id)
    }
    fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError> {
        BalancerMaps::sources(self, vip_id)
    }
    fn occupancy(&self) -> Result<Vec<MapOccupancy>, DataplaneError> {
        BalancerMaps::occupancy(self)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("top sources: limit must be at least 1")]
    BadTopLimit,
    #[error("applying the change to the balancer's maps (rolled back)")]
    Apply(#[source] ReconcileError),
    #[error("saving the state (change rolled back)")]
    Persist(#[source] StoreError),
    #[error("reading counters")]
    Counters(#[source] DataplaneError),
    /// A read through the reconciler's `Maps` trait, reported like `Counters`.
    #[error("reading counters")]
    ReadMaps(#[source] MapsError),
    #[error("health checks")]
    Health(#[source] HealthError),
    #[error("drain deadline: {seconds} s is out of range (1..{MAX_DRAIN_DEADLINE_S})")]
    BadDrainDeadline { seconds: u64 },
    #[error("health policy: {message}")]
    BadHealthPolicy { message: String },
    #[error("health: this lbd runs without health checks (--no-health-checks)")]
    HealthChecksOff,
    #[error("flows: {problem}")]
    BadFlow { problem: String },
    #[error(transparent)]
    Config(ConfigError),
    #[error(
        "{file}: removes VIP {vips}, whose connections would break; remove or drain its backends first, \
         or apply with --allow-vip-removal"
    )]
    VipRemoval { file: String, vips: String },
    #[error(
        "{file}: removes backend {backends}, which still serves and whose connections would break; drain it first \
         (lbctl backends drain, or weight = 0 in the file), or apply with --allow-backend-removal"
    )]
    BackendRemoval { file: String, backends: String },
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(
        "VIP {vip} has {backends} backends and {connections} live connections (connection-table entries used in the last \
         {idle_timeout_s} s, the idle timeout), which would break; drain and remove its backends first, or remove it with --force"
    )]
    VipInUse { vip: Vip, backends: usize, connections: u64, idle_timeout_s: u32 },
    #[error(
        "backend {backend} is the last active backend of VIP {vip}: drained, there is nowhere else for new flows, \
         and new connections to the VIP fail (drop_no_backend); add or undrain another backend first, or drain \
         with --force"
    )]
    LastActiveBackend { vip: Vip, backend: IpAddr },
}

/// Longest drain deadline: a week. Longer is a forgotten drain, not a plan.
pub const MAX_DRAIN_DEADLINE_S: u64 = 7 * 24 * 3600;

impl CoreError {
    pub fn to_api(&self) -> ApiError {
        let kind = match self {
            Self::Model(_)
            | Self::BadTopLimit
            | Self::BadDrainDeadline { .. }
            | Self::BadHealthPolicy { .. }
            | Self::HealthChecksOff
            | Self::BadFlow { .. }
            | Self::Config(_)
            | Self::VipRemoval { .. }
            | Self::BackendRemoval { .. }
            | Self::Host(_)
            | Self::VipInUse { .. }
            | Self::LastActiveBackend { .. } => ErrorKind::Invalid,
            Self::Apply(_) | Self::Persist(_) | Self::Counters(_) | Self::ReadMaps(_) | Self::Health(_) => ErrorKind::Internal,
        };
        ApiError { kind, message: error_chain(self) }
    }
}

pub struct Core<M, S> {
    state: DesiredState,
    reconciler: Reconciler,
    maps: M,
    store: S,
    /// `None` with `--no-health-checks`: the configured weights are programmed as they are.
    health: Option<Checks>,
    /// Port pressure of the balancer and of the backends (from their agents).
    ports: PortsBook,
    /// The interfaces to run on: as started, or as the last applied file named them.
    wanted_uplinks: Vec<String>,
    /// The interfaces as last checked (their alerts: down, gone, not forwarding, dropping).
    uplinks: Vec<UplinkState>,
    /// The alert while the probe path is not there (not installed, or not restored).
    probe_path: Option<String>,
    /// `lbd`'s own counters (metrics, `lbctl top`).
    telemetry: Telemetry,
    info: DaemonInfo,
    /// What is announced through BIRD (`None`: `lbd` does not announce).
    announcements: Option<Announcements>,
    /// Why the announcer stopped (did not start, or failed), when BIRD is configured.
    announcer_down: Option<String>,
    /// The `--pass-to` pin while nothing is pinned there (`beside::follow_pass_to`).
    pass_to_gone: Option<String>,
    /// See [`Reconciler::set_second_chance_settle`]; kept for rebuilt reconcilers.
    second_chance_settle: Option<std::time::Duration>,
    /// `None` without `--config`.
    own_config: Option<apply::OwnConfig>,
}

/// A change to apply: its operation (the metrics' `op` label) and its log line.
struct Change {
    op: &'static str,
    line: Line,
}

fn change(op: &'static str) -> Change {
    Change { op, line: Line::new("change").field("op", &op) }
}

/// A QUIC-LB configuration's fields in a change's log line: its key file's path, never the
/// key.
fn quic_fields(change: Change, q: &spillway_model::QuicConfig) -> Change {
    let change =
        change.field("quic_config_id", &q.config_id).field("quic_server_id_len", &q.server_id_len).field("quic_nonce_len", &q.nonce_len);
    match q.key_file() {
        Some(file) => change.field("quic_key_file", &file.display()),
        None => change,
    }
}

impl Change {
    fn field(mut self, key: &str, value: &dyn std::fmt::Display) -> Self {
        self.line = self.line.field(key, value);
        self
    }
}

/// `-` for an absent optional value in a log line.
fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

pub use self::apply::{ApplyOptions, DaemonInfo, host_refusal};
pub use self::uplinks::{Driven, UplinkState};
pub use super::health_checks::{ProbeResult, ProbeTarget};

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// Adopts what the maps hold and makes them carry `state` (which was loaded from `store`).
    /// With `checks`, health checks are on from the first write: the maps get the effective
    /// (health-adjusted) state, backends restored from `snapshot` keep the states a previous
    /// `lbd` left them in, and [`Self::health_round`] must be called regularly.
    pub fn start(
        mut maps: M,
        store: S,
        state: DesiredState,
        checks: Option<(ChecksConfig, HealthSnapshot)>,
    ) -> Result<(Self, ApplyReport), CoreError> {
        let mut reconciler = Reconciler::adopt(&maps).map_err(CoreError::Apply)?;
        let mut health = match checks {
            Some((config, snapshot)) => {
                let mut checks = Checks::new(config, &state).map_err(CoreError::Health)?;
                checks.restore(&snapshot);
                Some(checks)
            }
            None => None,
        };
        let target = match &mut health {
            Some(checks) => {
                let now_ms = checks.now_ms();
                let effective = checks.effective(&state, now_ms);
                checks.programmed = effective.clone();
                effective
            }
            None => state.clone(),
        };
        let mut telemetry = Telemetry::default();
        let started = Instant::now();
        let report = reconciler.apply(&mut maps, &target);
        telemetry.reconciled("restore", report.is_ok(), started.elapsed());
        let report = report.map_err(CoreError::Apply)?;
        warn_second_chance_lacking(&report);
        let core = Self {
            state,
            reconciler,
            maps,
            store,
            health,
            ports: PortsBook::default(),
            wanted_uplinks: Vec::new(),
            uplinks: Vec::new(),
            probe_path: None,
            telemetry,
            info: DaemonInfo::default(),
            announcements: None,
            announcer_down: None,
            pass_to_gone: None,
            second_chance_settle: None,
            own_config: None,
        };
        Ok((core, report))
    }

    /// Feeds probe outcomes, runs time-driven transitions, logs health events and, at most
    /// once per probe interval and only when they changed, programs the effective state.
    /// Returns what to probe now and the health clock.
    pub fn health_round(&mut self, results: Vec<ProbeResult>) -> Result<(Vec<ProbeTarget>, u64), CoreError> {
        let Some(checks) = &mut self.health else { return Ok((Vec::new(), 0)) };
        let now_ms = checks.now_ms();
        for result in &results {
            self.telemetry.probed(&result.outcome);
        }
        checks.observe(results, now_ms);
        let reconciler = &self.reconciler;
        let targets = checks.targets(&self.state, |vip, backend| reconciler.backend_slot(vip, backend));
        self.save_health_snapshot(now_ms);
        self.program_effective(now_ms)?;
        Ok((targets, now_ms))
    }

    /// The probe path's alert in force (`None`: the path is whole); its task logs it.
    pub fn set_probe_path_alert(&mut self, alert: Option<String>) {
        self.probe_path = alert;
    }

    /// How long a VIP's table must stay unchanged before its next change replaces its
    /// second-chance table.
    pub fn set_second_chance_settle(&mut self, settle: std::time::Duration) {
        self.second_chance_settle = Some(settle);
        self.reconciler.set_second_chance_settle(settle);
    }

    /// Records what the announcer did this round (`lbctl vips list`, metrics).
    pub fn set_announcements(&mut self, announcements: Announcements) {
        self.announcements = Some(announcements);
    }

    /// Whether the `--pass-to` pin is gone (`Some(pin)`): an ALERT while it is.
    pub fn set_pass_to_gone(&mut self, pin: Option<String>) {
        self.pass_to_gone = pin;
    }

    /// The announcer stopped (`why`): nothing is announced or withdrawn any more, which
    /// `status` and its alerts say until `lbd` restarts.
    pub fn set_announcer_down(&mut self, why: String) {
        self.announcements = None;
        self.announcer_down = Some(why);
    }

    /// Every VIP address, with whether some VIP on it has a backend (draining ones count:
    /// they carry established flows): what the announcer decides on.
    pub fn announce_wanted(&self) -> BTreeMap<IpAddr, bool> {
        let mut wanted = BTreeMap::new();
        for (vip, config) in &self.state.vips {
            *wanted.entry(vip.addr).or_insert(false) |= !config.backends.is_empty();
        }
        wanted
    }

    /// Records port pressure reported by a backend's agent (see `ports_book::classify`).
    pub fn set_pressure(&mut self, backend: IpAddr, pressure: Pressure) -> Result<(), CoreError> {
        let Some(checks) = &mut self.health else { return Ok(()) };
        let now_ms = checks.now_ms();
        // Pressure changes at most once per agent poll: no need to wait for the interval,
        // and nothing to compute when it stays the same.
        if checks.set_pressure(backend, pressure, now_ms) { self.program_changes(now_ms) } else { Ok(()) }
    }

    /// Persists backend health as it is now (on a clean exit: slow starts resume exactly).
    pub fn persist_health(&mut self) {
        if let Some(checks) = &mut self.health {
            checks.snapshot_due = true;
            let now_ms = checks.now_ms();
            self.save_health_snapshot(now_ms);
        }
    }

    /// Persists backend health when a state changed, so a restart keeps it.
    fn save_health_snapshot(&mut self, now_ms: u64) {
        let Some(checks) = &mut self.health else { return };
        if !checks.snapshot_due {
            return;
        }
        checks.snapshot_due = false;
        if let Err(e) = self.store.save_health(&checks.snapshot(now_ms)) {
            event!(warn, "health_persist_failed", error = error_chain(&e));
        }
    }

    /// Programs the effective state if it changed, at most once per probe interval: probe
    /// outcomes arrive every 100 ms, and each table rewrite moves flows.
    fn program_effective(&mut self, now_ms: u64) -> Result<(), CoreError> {
        let Some(checks) = &self.health else { return Ok(()) };
        let interval_ms = self.state.vips.values().filter_map(|c| c.health.as_ref().map(|h| h.policy.interval_ms)).min();
        let interval_ms = interval_ms.unwrap_or(u64::MAX).min(checks.defaults().interval_ms);
        if checks.last_programmed_ms.is_some_and(|last| now_ms.saturating_sub(last) < interval_ms) {
            return Ok(());
        }
        self.program_changes(now_ms)
    }

    /// Programs the effective state if it differs from what the maps carry.
    fn program_changes(&mut self, now_ms: u64) -> Result<(), CoreError> {
        let Some(checks) = &mut self.health else { return Ok(()) };
        let effective = checks.effective(&self.state, now_ms);
        if effective == checks.programmed {
            return Ok(());
        }
        checks.last_programmed_ms = Some(now_ms);
        let started = Instant::now();
        let applied = self.reconciler.apply(&mut self.maps, &effective);
        self.telemetry.reconciled("health", applied.is_ok(), started.elapsed());
        match applied {
            Ok(report) => {
                warn_second_chance_lacking(&report);
                let changed = changed_weights(&checks.programmed, &effective);
                event!(
                    info,
                    "health_weights_programmed",
                    changed = format!("[{changed}]"),
                    slots_written = report.slots_written,
                    tables_flipped = report.tables_flipped,
                    limits_written = report.limits_written
                );
                checks.programmed = effective;
                Ok(())
            }
            Err(e) => {
                self.roll_back();
                Err(CoreError::Apply(e))
            }
        }
    }

    /// A VIP's health settings after a `SetHealth`: `policy` fields by name over the VIP's
    /// current policy (or `lbd`'s defaults), so unknown names and bad values are refused by
    /// the same checks as a state file.
    fn health_settings(
        &self,
        vip: &Vip,
        probe: Option<ProbeSpec>,
        probe_path: Option<ProbePath>,
        policy: BTreeMap<String, serde_json::Value>,
        reset: bool,
    ) -> Result<Option<VipHealth>, CoreError> {
        let checks = self.health.as_ref().ok_or(CoreError::HealthChecksOff)?;
        let current = self.state.vip(vip)?.health.clone().filter(|_| !reset);
        if reset && probe.is_none() && probe_path.is_none() && policy.is_empty() {
            return Ok(None);
        }
        let mut health = current.unwrap_or_else(|| VipHealth {
            probe: ProbeSpec::default(),
            policy: checks.defaults().clone(),
            probe_path: ProbePath::default(),
        });
        if let Some(probe) = probe {
            health.probe = probe;
        }
        if let Some(probe_path) = probe_path {
            health.probe_path = probe_path;
        }
        let bad = |e: serde_json::Error| CoreError::BadHealthPolicy { message: e.to_string() };
        let mut fields = match serde_json::to_value(&health.policy).map_err(bad)? {
            serde_json::Value::Object(fields) => fields,
            _ => unreachable!("a struct serializes to an object"),
        };
        fields.extend(policy);
        health.policy = serde_json::from_value(serde_json::Value::Object(fields)).map_err(bad)?;
        Ok(Some(health))
    }

    /// Records the balancer's own port report (from its watcher) or why there is none, and
    /// returns the hosts whose agents to poll (reports of hosts no longer backends are dropped).
    pub fn record_local_ports(&mut self, report: Result<PortsReport, String>) -> BTreeSet<IpAddr> {
        self.ports.record_local(report);
        let hosts = self.backend_addrs();
        self.ports.retain(&hosts);
        hosts
    }

    /// Records an agent's report, and the pressure it means for the backend.
    pub fn record_agent_ports(&mut self, backend: IpAddr, poll: AgentPoll) -> Result<(), CoreError> {
        self.telemetry.agent_polled(poll.outcome());
        let stopped_since = self.ports.stopped_agent(backend).map(|u| u.since);
        let pressure = match poll {
            AgentPoll::Report(report) => Some(self.ports.record_agent(backend, Ok(*report))),
            AgentPoll::Failed(error) => Some(self.ports.record_agent(backend, Err(error))),
            // Whoever answered may be anyone: the backend's pressure stays as it was.
            AgentPoll::Unauthenticated(why) => {
                if self.ports.record_rejected(backend, why.clone()) {
                    event!(
                        warn,
                        "agent_report_rejected",
                        backend = backend,
                        reason = why,
                        message = "ALERT: a port report that is not the agent's was ignored"
                    );
                }
                None
            }
        };
        self.log_stopped_agent(backend, stopped_since);
        match pressure {
            Some(pressure) => self.set_pressure(backend, pressure),
            None => Ok(()),
        }
    }

    /// Logs once when `backend`'s agent, which answered before, stops answering, and once
    /// when it answers again (`stopped_since`: it was stopped before this poll, since then).
    fn log_stopped_agent(&self, backend: IpAddr, stopped_since: Option<Instant>) {
        match (stopped_since, self.ports.stopped_agent(backend)) {
            (None, Some(now)) => event!(
                warn,
                "agent_unreachable",
                backend = backend,
                error = now.error,
                message = "ALERT: a backend's agent stopped answering: its port pressure is unknown; its health is unchanged"
            ),
            (Some(since), None) => event!(info, "agent_unreachable_cleared", backend = backend, after_s = since.elapsed().as_secs()),
            _ => {}
        }
    }

    fn ports(&self, host: Option<IpAddr>) -> PortsView {
        self.ports.view(host)
    }

    /// The balancer's own port report, or why there is none.
    pub fn local_ports(&self) -> Result<PortsReport, String> {
        let view = self.ports.view(None);
        view.report.ok_or_else(|| view.error.unwrap_or_default())
    }

    /// Removes draining backends whose deadline (Unix ms) has passed; returns how many.
    pub fn expire_drains(&mut self, now_unix_ms: u64) -> Result<usize, CoreError> {
        let expired: Vec<(Vip, IpAddr)> = self
            .state
            .vips
            .iter()
            .flat_map(|(vip, c)| c.backends.iter().map(move |(addr, b)| (*vip, *addr, b.drain_deadline_unix_ms)))
            .filter(|(_, _, deadline)| deadline.is_some_and(|d| d <= now_unix_ms))
            .map(|(vip, addr, _)| (vip, addr))
            .collect();
        for (vip, backend) in &expired {
            let change = change("remove_backend").field("vip", vip).field("backend", backend).field("reason", &"drain_deadline");
            self.mutate(change, |s| s.remove_backend(vip, *backend))?;
        }
        Ok(expired.len())
    }

    /// What the maps should carry for `state`: itself, or its effective weights.
    fn programmed(&self) -> &DesiredState {
        self.health.as_ref().map_or(&self.state, |h| &h.programmed)
    }

    pub fn state(&self) -> &DesiredState {
        &self.state
    }

    /// What the metrics' info line says about this `lbd` (the loaded program, the mode).
    pub fn set_build_info(&mut self, info: BuildInfo) {
        self.telemetry.info = info;
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
            Request::AddVip { vip, ring_size, force, quic, encap, hash, source_prefix } => {
                let ring_size = ring_size.unwrap_or(DEFAULT_RING_SIZE);
                let mut change = change("add_vip")
                    .field("vip", &vip)
                    .field("ring_size", &ring_size)
                    .field("force", &force)
                    .field("encap", &encap)
                    .field("hash", &hash)
                    .field("source_prefix", &or_dash(source_prefix));
                if let Some(q) = &quic {
                    change = quic_fields(change, q);
                }
                self.mutate(change, |s| {
                    s.add_vip(vip, ring_size)?;
                    s.allow_local_address(&vip, force)?;
                    s.set_encap(&vip, encap)?;
                    s.set_hash(&vip, hash, source_prefix)?;
                    s.set_quic(&vip, quic)
                })
            }
            Request::SetQuicNext { vip, next } => {
                let mut change = change("set_quic_next").field("vip", &vip);
                if let Some(q) = &next {
                    change = quic_fields(change, q);
                }
                self.mutate(change, |s| s.set_quic_next(&vip, next))
            }
            Request::RetireQuic { vip } => self.mutate(change("retire_quic").field("vip", &vip), |s| s.retire_quic(&vip)),
            Request::SetVipEncap { vip, encap } => {
                self.mutate(change("set_vip_encap").field("vip", &vip).field("encap", &encap), |s| s.set_encap(&vip, encap))
            }
            Request::RemoveVip { vip, force } => {
                let backends = self.state.vip(&vip)?.backends.len();
                if backends > 0 && !force {
                    let (connections, idle_timeout_s) = self.vip_connections(&vip)?;
                    return Err(CoreError::VipInUse { vip, backends, connections, idle_timeout_s });
                }
                self.mutate(change("remove_vip").field("vip", &vip).field("force", &force), |s| s.remove_vip(&vip).map(drop))
            }
            Request::AddBackend { vip, backend, weight, options } => {
                let weight = check_serving_weight(weight.unwrap_or(DEFAULT_WEIGHT))?;
                let change =
                    backend_options(change("add_backend").field("vip", &vip).field("backend", &backend).field("weight", &weight), &options);
                self.mutate(change, |s| s.add_backend_with(&vip, backend, Backend { weight, options, ..Backend::default() }))
            }
            Request::SetBackendOptions { vip, backend, options } => {
                let change = backend_options(change("set_backend_options").field("vip", &vip).field("backend", &backend), &options);
                self.mutate(change, |s| s.set_backend_options(&vip, backend, options))
            }
            Request::SetHealth { vip, probe, probe_path, policy, reset } => {
                let mut change = change("set_health").field("vip", &vip).field("reset", &reset);
                if let Some(probe) = &probe {
                    change = change.field("probe", &serde_json::to_string(probe).unwrap_or_default());
                }
                if let Some(probe_path) = &probe_path {
                    change = change.field("probe_path", probe_path);
                }
                for (name, value) in &policy {
                    change = change.field(name, value);
                }
                let health = self.health_settings(&vip, probe, probe_path, policy, reset)?;
                self.mutate(change, |s| s.set_health(&vip, health))
            }
            Request::Ports { host } => Ok(Reply::Ports(Box::new(self.ports(host)))),
            Request::RemoveBackend { vip, backend } => {
                self.mutate(change("remove_backend").field("vip", &vip).field("backend", &backend), |s| s.remove_backend(&vip, backend))
            }
            Request::DrainBackend { vip, backend, deadline_s, force } => {
                let deadline = match deadline_s {
                    Some(0) | Some(MAX_DRAIN_DEADLINE_S..) => return Err(CoreError::BadDrainDeadline { seconds: deadline_s.unwrap_or(0) }),
                    Some(s) => Some(unix_ms() + s * 1000),
                    None => None,
                };
                let backends = &self.state.vip(&vip)?.backends;
                let active = backends.get(&backend).ok_or(ModelError::UnknownBackend { vip, backend })?.weight > 0;
                let others_active = backends.iter().any(|(address, b)| *address != backend && b.weight > 0);
                if active && !others_active && !force {
                    return Err(CoreError::LastActiveBackend { vip, backend });
                }
                let change = change("drain_backend")
                    .field("vip", &vip)
                    .field("backend", &backend)
                    .field("deadline_s", &or_dash(deadline_s))
                    .field("force", &force);
                self.mutate(change, |s| s.drain_backend(&vip, backend, deadline))
            }
            Request::SetWeight { vip, backend, weight } => {
                let weight = check_serving_weight(weight)?;
                let change = change("set_weight").field("vip", &vip).field("backend", &backend).field("weight", &weight);
                self.mutate(change, |s| s.set_weight(&vip, backend, weight))
            }
            Request::SetRateLimit { scope, per_s, burst, source_prefix_v4, source_prefix_v6, observe } => {
                let rate = RateSpec::new(per_s, burst);
                let change = change("set_rate_limit")
                    .field("scope", &scope)
                    .field("per_s", &rate.per_s)
                    .field("burst", &rate.burst)
                    .field("source_prefix_v4", &source_prefix_v4.unwrap_or(DEFAULT_SOURCE_PREFIX_V4))
                    .field("source_prefix_v6", &source_prefix_v6.unwrap_or(DEFAULT_SOURCE_PREFIX_V6))
                    .field("observe", &observe);
                self.mutate(change, |s| s.set_per_source(scope.vip(), rate, source_prefix_v4, source_prefix_v6, observe))
            }
            Request::SetBudget { scope, per_s, burst, observe } => {
                let rate = RateSpec::new(per_s, burst);
                let change = change("set_budget")
                    .field("scope", &scope)
                    .field("per_s", &rate.per_s)
                    .field("burst", &rate.burst)
                    .field("observe", &observe);
                self.mutate(change, |s| s.set_budget(scope.vip(), rate, observe))
            }
            Request::ClearRateLimit { scope, part } => {
                let (per_source, budget, label) = match part {
                    LimitPart::All => (true, true, "all"),
                    LimitPart::PerSource => (true, false, "per_source"),
                    LimitPart::Budget => (false, true, "budget"),
                };
                self.mutate(change("clear_rate_limit").field("scope", &scope).field("part", &label), |s| {
                    s.clear_limit_parts(scope.vip(), per_source, budget)
                })
            }
            Request::ListRateLimits => Ok(Reply::RateLimits(self.rate_limits())),
            Request::SetRule { cidr, vip, action, per_s, burst, observe } => {
                let rule = RuleMatch { cidr, vip };
                let config = RuleConfig::from_parts(&rule, action, per_s, burst, observe)?;
                let change = change("set_rule")
                    .field("cidr", &cidr)
                    .field("vip", &or_dash(vip))
                    .field("action", &action.label())
                    .field("per_s", &or_dash(per_s))
                    .field("burst", &or_dash(burst))
                    .field("observe", &observe);
                self.mutate(change, |s| s.set_rule(rule, config))
            }
            Request::RemoveRule { cidr, vip } => {
                let rule = RuleMatch { cidr, vip };
                self.mutate(change("remove_rule").field("cidr", &cidr).field("vip", &or_dash(vip)), |s| s.remove_rule(&rule))
            }
            Request::ListRules => self.rules().map(Reply::Rules).map_err(CoreError::Counters),
            Request::TopSources { vip, limit } => self.top_sources(&vip, limit).map(Reply::TopSources),
            Request::Sample => self.sample().map(|s| Reply::Sample(Box::new(s))),
            Request::FlowGet { vip, client, port } => self.flow_get(&vip, client, port).map(Reply::Flow),
            Request::FlowList { vip, backend, limit } => self.flow_list(&vip, backend, limit).map(Reply::Flows),
            Request::FlowPurge { backend } => self.flow_purge(backend).map(Reply::Purged),
            Request::Apply { config, source, dry_run, allow_vip_removal, allow_backend_removal } => {
                let doc = Document::parse(&source, config).map_err(CoreError::Config)?;
                let mark_as = if dry_run { None } else { self.own_config_declaring(&doc) };
                self.apply_file(&doc, ApplyOptions { dry_run, allow_vip_removal, allow_backend_removal, mark_as }).map(Reply::Applied)
            }
            Request::Export => Ok(Reply::Exported(self.export())),
            Request::Status => self.status().map(|status| Reply::Status(Box::new(status))),
        }
    }

    fn mutate(&mut self, change: Change, edit: impl FnOnce(&mut DesiredState) -> Result<(), ModelError>) -> Result<Reply, CoreError> {
        let mut next = self.state.clone();
        edit(&mut next)?;
        // A backend that starts serving gets its wall-clock start: its slow start runs from it.
        next.stamp_starts(&self.state, unix_ms());
        next.validate()?;
        self.info.host.check(&self.state, &next)?;
        if next == self.state {
            log::info!("{}", change.line.field("changed", &false));
            return Ok(Reply::Done { slots_written: 0, tables_flipped: 0 });
        }
        // With health checks, the trackers follow `next` and the maps get its effective weights.
        let target = match &mut self.health {
            Some(checks) => {
                let now_ms = checks.now_ms();
                checks.sync(&next, now_ms).map_err(CoreError::Health)?;
                checks.effective(&next, now_ms)
            }
            None => next.clone(),
        };
        let started = Instant::now();
        let applied = self.reconciler.apply(&mut self.maps, &target);
        self.telemetry.reconciled(change.op, applied.is_ok(), started.elapsed());
        let report = match applied {
            Ok(report) => {
                warn_second_chance_lacking(&report);
                report
            }
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
        let line = change
            .line
            .field("slots_written", &report.slots_written)
            .field("tables_flipped", &report.tables_flipped)
            .field("limits_written", &report.limits_written)
            .field("rules_written", &report.rules_written);
        log::info!("{line}");
        Ok(Reply::Done { slots_written: report.slots_written, tables_flipped: report.tables_flipped })
    }

    /// Puts the maps back to the current state. The reconciler's view may be stale after a
    /// failed apply, so it is rebuilt from the maps first.
    fn roll_back(&mut self) {
        let programmed = self.programmed().clone();
        let started = Instant::now();
        let settle = self.second_chance_settle;
        let result = Reconciler::adopt(&self.maps).and_then(|mut r| {
            if let Some(settle) = settle {
                r.set_second_chance_settle(settle);
            }
            r.apply(&mut self.maps, &programmed)?;
            Ok(r)
        });
        self.telemetry.reconciled("rollback", result.is_ok(), started.elapsed());
        match result {
            Ok(reconciler) => self.reconciler = reconciler,
            Err(e) => event!(error, "rollback_failed", message = "restart lbd to resync the maps", error = error_chain(&e)),
        }
    }

    /// After a failed change: the trackers follow the current state again.
    fn resync_health(&mut self) {
        if let Some(checks) = &mut self.health {
            let now_ms = checks.now_ms();
            if let Err(e) = checks.sync(&self.state, now_ms) {
                event!(error, "health_resync_failed", error = error_chain(&e));
            }
        }
    }
}

/// `addr:old->new` for every backend whose programmed weight changed, for the log.
/// A change that found no room in the ring pool for a VIP's second-chance table is applied
/// without it; the operator hears of it once per change.
fn warn_second_chance_lacking(report: &ApplyReport) {
    if report.second_chance_lacking > 0 {
        event!(
            warn,
            "second_chance_no_room",
            vips = report.second_chance_lacking,
            effect = "their moved flows get one candidate",
            fix = "lbd --ring-slots with room for three tables a VIP"
        );
    }
}

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

/// The options given, as log fields (those set only).
fn backend_options(mut change: Change, options: &spillway_model::BackendOptions) -> Change {
    if let Some(zone) = &options.zone {
        change = change.field("zone", zone);
    }
    if let Some(capacity) = options.capacity_per_s {
        change = change.field("capacity_per_s", &capacity);
    }
    if let Some(spare) = options.spare_per_s {
        change = change.field("spare_per_s", &spare);
    }
    if let Some(target) = options.probe_target {
        change = change.field("probe_target", &target);
    }
    if let Some(path) = options.probe_path {
        change = change.field("probe_path", &path);
    }
    if let Some(encap) = options.encap {
        change = change.field("encap", &encap);
    }
    change
}

mod apply;
mod flows;
mod sample;
mod status;
#[cfg(test)]
mod tests;
mod uplinks;
mod views;
