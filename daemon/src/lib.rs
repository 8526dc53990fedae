//! `lbd`: loads the balancer, attaches it (or takes the pinned link over), restores the
//! desired state and serves the control API until signalled. Exiting detaches nothing:
//! the pinned link and maps keep forwarding until the next `lbd` takes them over. `lbd
//! agent` (`agent`) runs on backends; `lbd check` checks a configuration file.
//!
//! The binary (`src/main.rs`) only parses and dispatches; everything is here. What the
//! daemon keeps (`core`), persists (`store`), exports (`metrics`, `scrape`), schedules
//! (`health_checks`, `probing`, `announce`, `pressure`) and serves (`server`) are
//! its modules; the kernel, the probes, the watcher, BIRD and the wire types are the
//! crates below it.

pub mod agent;
pub mod announce;
pub mod args;
pub mod beside;
pub mod core;
pub mod file_check;
pub mod health_checks;
pub mod metrics;
pub mod notify;
pub mod outer_src;
pub mod ports_book;
pub mod pressure;
pub mod probing;
pub mod resolve;
pub mod scrape;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod tx_drops;
pub mod uplink_watch;
pub mod wall_clock;

#[cfg(test)]
mod testing;

use spillway_logging::error_chain;
use std::{
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use nix::sys::stat::{Mode, umask};
use spillway_common::{
    hash::FLOW_SEED,
    types::{CFG_F_PASS_TO, LbConfig},
};
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::Notify,
};

use self::{
    args::{DaemonArgs, XdpAttach},
    core::{ApplyOptions, Core, CoreError, Counters, DaemonInfo},
    health_checks::ChecksConfig,
    outer_src::{OuterSrc4, OuterSrc6},
    server::{ServerError, SharedCore},
    settings::{RunningSettings, Section, Settings},
    uplink_watch::UplinkWatch,
};
use crate::store::{ConfigMark, StateFile, Store, StoreError};
use spillway_announce::{AnnounceConfig, AnnounceError};
use spillway_api::ConfigStatus;
use spillway_api::sample::BuildInfo;
use spillway_dataplane::forwarding::{self, ForwardingError};
use spillway_dataplane::neighbours;
use spillway_dataplane::netif::{self, NetifError};
use spillway_dataplane::pins::{self, PinError, PinLayout};
use spillway_dataplane::uplinks::UplinkError;
use spillway_dataplane::vip_path::{VipPath, VipPathError};
use spillway_dataplane::{Balancer, DataplaneError, LoadOptions, PinnedShape};
use spillway_logging::event;
use spillway_model::config::{ConfigError, Document};
use spillway_model::{DesiredState, HealthConfig, host::Host};
use spillway_ports::{Scope, SockWatch, WatchOptions};
use spillway_reconcile::Maps;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "--flow-hash-seed (flow_hash_seed in the file) is the public default, and this balancer announces through BIRD: a fleet \
         needs a secret seed, the same on every balancer (`./x install` writes a random one into spillway.toml; or \
         printf '0x%08x\\n' $(od -An -N4 -tu4 /dev/urandom))"
    )]
    PublicFlowSeed,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Pins(#[from] PinError),
    #[error(transparent)]
    Netif(#[from] NetifError),
    #[error(
        "{iface} is driven by another XDP program: {holder}. Stop it first (another lbd: stop it, or run \
         `lbd --cleanup --pin-dir` with its directory), or choose another --iface"
    )]
    InterfaceTaken { iface: String, holder: String },
    #[error(
        "the pinned map {name} at {} does not fit this lbd ({property} is {actual}, expected {expected}); \
         stop lbd and run `lbd --cleanup --pin-dir {}` (this drops the connection table)",
        path.display(),
        pin_dir.display()
    )]
    PinnedMapShape { name: String, path: PathBuf, pin_dir: PathBuf, property: &'static str, expected: u64, actual: u64 },
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("restoring the desired state into the maps")]
    Start(#[source] CoreError),
    #[error("installing signal handlers")]
    Signals(#[source] io::Error),
    // Boxed: it would make every daemon result larger for one rare error.
    #[error(transparent)]
    VipPath(Box<VipPathError>),
    #[error(transparent)]
    Forwarding(#[from] ForwardingError),
    #[error("withdrawing the announcements")]
    Announce(#[from] AnnounceError),
    #[error(
        "forwarding is disabled on {iface} ({sysctls}): the kernel's route lookup refuses every packet arriving there, so \
         no VIP packet could be forwarded; set it to 1 (sysctl -w ...=1) or start lbd with --enable-forwarding"
    )]
    ForwardingDisabled { iface: String, sysctls: String },
    #[error("{iface} is named twice in --iface (iface in [lbd])")]
    InterfaceTwice { iface: String },
    #[error("the configuration file is refused and there is no persisted state to start from")]
    Config(#[source] ConfigError),
    #[error("applying the configuration file at start")]
    ApplyConfig(#[source] CoreError),
    #[error(transparent)]
    ReportKey(#[from] spillway_ports::auth::KeyError),
    // Boxed: it would make every daemon result larger for one rare error.
    #[error(transparent)]
    Beside(Box<beside::BesideError>),
}

impl From<beside::BesideError> for DaemonError {
    fn from(error: beside::BesideError) -> Self {
        DaemonError::Beside(Box::new(error))
    }
}

/// Checks the interfaces the balancer is to run on as a start needs them: none twice, and
/// the first present (its addresses are the default outer sources, and health probes are
/// routed as if they arrived there). Any other may be missing: an ALERT until it appears.
/// Returns the first.
pub fn check_uplinks(ifaces: &[String]) -> Result<&str, DaemonError> {
    for (n, iface) in ifaces.iter().enumerate() {
        if ifaces[..n].contains(iface) {
            return Err(DaemonError::InterfaceTwice { iface: iface.clone() });
        }
    }
    let first = ifaces.first().map(String::as_str).unwrap_or_default();
    netif::ifindex(first)?;
    Ok(first)
}

/// The interfaces of `ifaces` that exist now.
pub(crate) fn present(ifaces: &[String]) -> impl Iterator<Item = &str> {
    ifaces.iter().map(String::as_str).filter(|iface| netif::ifindex(iface).is_ok())
}

/// Runs the balancer on the interfaces `--iface` names until SIGTERM or SIGINT; with
/// `config` (the `--config` file, already read), starts from it as [`plan_start`] says and
/// re-applies it on SIGHUP.
pub async fn run(args: &DaemonArgs, config: Option<Document>, settings: RunningSettings) -> Result<(), DaemonError> {
    // Everything lbd creates (socket, state file, pin directories) is root's alone.
    umask(Mode::from_bits_truncate(0o077));
    // First, as `lbd check` does: every later step would fail on a missing interface with a
    // message about something else (its sysctls, its addresses).
    let iface = check_uplinks(&args.iface)?;
    check_fleet_seed(args)?;
    beside::check_args(args)?;
    let mut signals = Signals::install()?;
    // Read the state before touching the dataplane: a bad file must change nothing.
    let store = StateFile::open(&args.state_dir)?;
    let persisted = store.load()?;
    if persisted.is_none() && config.is_none() {
        event!(info, "no_state", path = store.path().display(), message = "starting with no VIPs");
    }
    let config_path = args.config.clone();
    let host = host_facts(args, iface)?;
    let mark = store.load_config_mark();
    let start = plan_start(config, config_path.as_deref(), persisted, mark.clone(), &host)?;
    let report_key = args.report_key.as_deref().map(spillway_ports::auth::ReportKey::load).transpose()?.map(Arc::new);
    if report_key.is_none() && args.agent_port != 0 {
        event!(
            warn,
            "report_key_missing",
            message = "the agents' port reports cannot be authenticated and are ignored (lbd --report-key, the agents' file)"
        );
    }
    for iface in present(&args.iface) {
        check_forwarding(iface, args.enable_forwarding)?;
    }
    pins::ensure_bpffs()?;
    let layout = PinLayout::new(&args.pin_dir);
    let probe_names = args.vip_path.names(&args.pin_dir);
    let _lock = pins::create_and_lock(&layout.balancer_dir())?;
    // Declared after the lock, so it runs while the lock is still held.
    let mut undo = UndoFirstStart::new(&layout, probe_names.clone());
    let durability = pins::durability(&layout.balancer_dir());
    durability.log_at_start(&layout.balancer_dir(), "forwarding");
    // Bound before the dataplane is touched, so a socket problem changes nothing; clients
    // connecting during startup wait in the backlog until the state is restored.
    let (listener, _socket) = server::bind(&args.api)?;
    let config = lb_config(args, iface)?;
    let mut balancer = Balancer::load(&LoadOptions { map_pin_dir: Some(layout.balancer_maps()), capacity: args.capacity() })
        .map_err(|e| explain_load_error(e, &layout))?;
    // Said once: encrypted QUIC-LB config ids are then refused (naming why), plaintext ones
    // work as before.
    if let Some(Err(e)) = &balancer.maps.quic_keys {
        event!(
            warn,
            "quic_decryption_unavailable",
            error = error_chain(e),
            message = "encrypted QUIC-LB config ids (key_file) are refused"
        );
    }
    // The second-chance program's rare events (`dataplane::logs`) become log lines.
    let ebpf_logs = spillway_dataplane::logs::forward(balancer.ebpf_mut())
        .inspect_err(|e| event!(warn, "ebpf_logs_unavailable", error = error_chain(e)))
        .ok();
    // Before the balancer goes live, so that its first frames find the operator's program.
    let pass_to = beside::start_pass_to(&mut balancer, args.pass_to.as_deref())?;
    // Probes through the tunnel need the probe path; without it they count as unknown (and
    // say why, loudly), and forwarding is unaffected.
    let vip_path = (!args.no_health_checks).then(|| {
        undo.probe_path_touched = true;
        VipPath::install(&mut balancer, &layout, iface, &probe_names, probe_sources(args, &host.addresses)).map_err(|e| {
            let message = error_chain(&e);
            event!(error, "probe_path_unavailable", error = message, message = "ALERT: probes through the tunnel count as unknown");
            message
        })
    });
    let (mut uplinks, mut maps) = balancer.into_uplinks(&layout, args.xdp_mode.into()).map_err(|e| explain_uplink_error(e, iface))?;
    if let Some(moved) = pins::adopt_single_link(&layout)? {
        event!(info, "link_moved", iface = moved, link = layout.balancer_link(&moved).display());
    }
    // Attach before writing anything: if this fails (wrong interface, another program on
    // it), the maps a running balancer may share are left untouched.
    let mode = args.xdp_mode.label();
    let started = std::time::Instant::now();
    let unattached = args.xdp_attach == XdpAttach::None;
    if unattached {
        beside::go_live_unattached(&mut uplinks, args, &layout, iface)?;
    }
    let vip_path = vip_path.map(Arc::new);
    let mut uplink_watch = UplinkWatch::new(uplinks, args.tx_ifaces.clone(), mode, vip_path.clone());
    let program_tag = uplink_watch.program_tag();
    if unattached {
        uplink_watch.leave_unattached();
    }
    for iface in present(&args.iface).filter(|_| !unattached) {
        warn_of_veth_tx(iface, args.xdp_mode);
        uplink_watch.attach_at_start(iface).map_err(|e| explain_uplink_error(e, iface))?;
    }
    // The first round detaches the interfaces a previous lbd ran on that this one does not,
    // and fills the redirect map.
    let uplink_states = uplink_watch.check(&args.iface);
    log_memory(&maps);
    maps.set_config_keeping_table_seed(&config)?;
    maps.set_echo_config(&args.echo_config())?;
    let checks = (!args.no_health_checks).then(|| {
        let defaults = HealthConfig { slow_start_ms: args.health_slow_start_ms, ..HealthConfig::default() };
        (ChecksConfig { defaults, local_zone: args.zone.clone() }, store.load_health().unwrap_or_default())
    });
    let (mut core, report) = Core::start(maps, store, start.state, checks).map_err(DaemonError::Start)?;
    if let Some(mark) = &start.first {
        core.save_started_state(mark).map_err(DaemonError::ApplyConfig)?;
    }
    core.set_build_info(BuildInfo { version: env!("CARGO_PKG_VERSION").to_owned(), program_tag, xdp_mode: mode.to_owned() });
    core.set_second_chance_settle(std::time::Duration::from_secs(args.second_chance_settle_s));
    let vips = &core.state().vips;
    // A first start from a file restores nothing: it starts from the file.
    event!(
        info,
        if start.first.is_some() { "state_from_file" } else { "state_restored" },
        vips = vips.len(),
        backends = vips.values().map(|c| c.backends.len()).sum::<usize>(),
        rules = core.state().rules.len(),
        health_checks = !args.no_health_checks,
        zone = args.zone.as_deref().unwrap_or("-"),
        slots_written = report.slots_written,
        tables_flipped = report.tables_flipped,
        limits_written = report.limits_written,
        rules_written = report.rules_written
    );
    // The balancer's own port watcher: `lbctl ports --host lb`, and loud alerts when the
    // balancer itself runs short of ports. Not fatal: forwarding does not need it.
    let watch = SockWatch::load(WatchOptions { mode: args.watcher_mode, scope: Scope::Own }).map_err(|e| {
        let message = error_chain(&e);
        event!(warn, "socket_watcher_not_loaded", error = message, message = "lbctl ports --host lb has no data");
        message
    });
    core.set_wanted_uplinks(args.iface.clone());
    core.set_uplinks(uplink_states);
    core.set_info(DaemonInfo {
        started,
        xdp_mode: args.xdp_mode.label(),
        pin_dir: args.pin_dir.clone(),
        state_dir: args.state_dir.clone(),
        zone: args.zone.clone(),
        settings,
        config: None,
        watcher: watch.as_ref().map(|w| w.status().clone()).map_err(Clone::clone),
        host,
        entry_program: (args.xdp_attach == XdpAttach::None).then(|| layout.entry_program()),
        pass_to: args.pass_to.clone(),
    });
    if let Some(path) = &config_path
        && start.first.is_none()
    {
        core.set_own_config(path.clone(), mark);
    }
    if let Some((doc, path)) = start.apply.as_ref().zip(config_path.as_deref()) {
        apply_config(&mut core, doc, path, "start");
    } else if let Some(status) = start.status {
        core.set_config_status(status);
    }
    let core = Arc::new(Mutex::new(core));
    let _metrics = scrape::start(args.metrics_listen, core.clone()).await;
    let answered = Arc::new(Notify::new());
    let upkeep = tokio::spawn(neighbour_upkeep(core.clone(), answered.clone()));
    let uplink_watch = tokio::spawn(uplink_watch::watch(core.clone(), uplink_watch));
    let pass_to = tokio::spawn(beside::follow_pass_to(core.clone(), pass_to));
    let path_upkeep = vip_path.clone().map(|path| tokio::spawn(probing::path_upkeep(core.clone(), path)));
    let prober = vip_path.map(|path| tokio::spawn(probing::health_task(core.clone(), probing::schedule_seed(), path)));
    let pressure = tokio::spawn(pressure::pressure_task(core.clone(), watch, args.agent_port, report_key));
    let announcer = announce_config(args).map(|config| {
        let data_path = announce::DataPath { layout: layout.clone(), unattached };
        tokio::spawn(announce::announce_task(core.clone(), config, data_path))
    });
    let reloader = tokio::spawn(reload_on_hup(core.clone(), config_path, signals.take_hup()));
    // The API is bound, the state restored and the program attached: systemd may go on.
    undo.disarm();
    event!(info, "ready", api = args.api.display());
    notify::ready(&serving(&server::lock(&core)));
    server::serve(listener, core.clone(), answered, async {
        let name = signals.recv().await;
        notify::stopping();
        event!(info, "exiting", signal = name);
    })
    .await;
    upkeep.abort();
    uplink_watch.abort();
    pass_to.abort();
    if let Some(logs) = ebpf_logs {
        logs.abort();
    }
    pressure.abort();
    reloader.abort();
    for task in [prober, path_upkeep].into_iter().flatten() {
        task.abort();
    }
    // Announcements stay as they are: BIRD keeps them, the next lbd takes them over.
    if let Some(announcer) = announcer {
        announcer.abort();
    }
    // A killed lbd restores the last state change; a clean exit saves the present.
    server::lock(&core).persist_health();
    event!(info, "exited", links = layout.balancer_links().display(), message = durability.after_exit("forwarding"));
    Ok(())
}

/// The probes' source per family: the outer source when it is one address of this host
/// (the balancer's own address, which the network routes back to it over every interface);
/// else `None`, and the probe path takes its interface's first address.
fn probe_sources(args: &DaemonArgs, addresses: &[(String, std::net::IpAddr)]) -> (Option<std::net::IpAddr>, Option<std::net::IpAddr>) {
    let local = |addr: std::net::IpAddr| addresses.iter().any(|(_, a)| *a == addr).then_some(addr);
    let v4 = args.outer_src.filter(|s| s.prefix == 32).and_then(|s| local(s.addr.into()));
    let v6 = args.outer_src6.filter(|s| s.prefix == 128).and_then(|s| local(s.addr.into()));
    (v4, v6)
}

/// One line per map with the memory the kernel charges for it, and the total.
fn log_memory(maps: &spillway_dataplane::BalancerMaps) {
    let c = maps.capacity();
    for m in maps.memory() {
        if m.name == spillway_common::limits::map_names::FLOWS {
            // Its kernel entries are buckets of ways; the operator set flows.
            let (buckets, ways) = (m.entries, spillway_common::limits::FLOW_WAYS);
            event!(info, "map_memory", map = m.name, kind = m.kind, max_flows = c.flows, buckets = buckets, ways = ways, bytes = m.bytes);
        } else {
            event!(info, "map_memory", map = m.name, kind = m.kind, entries = m.entries, bytes = m.bytes);
        }
    }
    let total: u64 = maps.memory().iter().map(|m| m.bytes).sum();
    event!(
        info,
        "map_memory_total",
        bytes = total,
        max_vips = c.vips,
        max_backends = c.backends,
        max_flows = c.flows,
        ring_slots = c.ring_slots
    );
}

/// Refuses to start on an interface that does not forward, unless `enable` lets it set the
/// sysctls (logged).
fn check_forwarding(iface: &str, enable: bool) -> Result<(), DaemonError> {
    let off = forwarding::disabled(iface)?;
    if off.is_empty() {
        return Ok(());
    }
    let sysctls = forwarding::describe(&off);
    if !enable {
        return Err(DaemonError::ForwardingDisabled { iface: iface.to_owned(), sysctls });
    }
    forwarding::enable(&off)?;
    event!(info, "forwarding_enabled", iface = iface, was = sysctls, reason = "--enable-forwarding");
    Ok(())
}

/// Native XDP on a veth sends nothing unless the peer runs an XDP program, which this side
/// cannot see: said at start (the TX-drop alert says it again if frames are lost).
fn warn_of_veth_tx(iface: &str, mode: pins::XdpModeArg) {
    let kind = spillway_dataplane::rtnl::Rtnl::open().and_then(|mut r| r.link(iface)).ok().flatten().and_then(|l| l.kind);
    if mode == pins::XdpModeArg::Native && kind.as_deref() == Some("veth") {
        event!(warn, "xdp_tx_on_veth", iface = iface, message = crate::tx_drops::advice(Some("veth")));
    }
}

/// The announcer's settings, when `lbd` announces (`--bird-socket`).
fn announce_config(args: &DaemonArgs) -> Option<AnnounceConfig> {
    let a = &args.announce;
    Some(AnnounceConfig {
        socket: a.bird_socket.clone()?,
        include: a.bird_include.clone(),
        floor: a.announce_floor,
        hold_ms: a.announce_hold_s * 1000,
    })
}

/// `lbd --cleanup`: withdraws every announcement (with `--bird-socket`), detaches the
/// balancer and the agent and removes every pin.
pub fn cleanup(args: &DaemonArgs) -> Result<(), DaemonError> {
    let (pin_dir, probe_names) = (&args.pin_dir, args.vip_path.names(&args.pin_dir));
    if let Some(config) = announce_config(args) {
        let withdrawn = spillway_announce::withdraw_all(&config)?;
        event!(warn, "withdraw", prefixes = withdrawn, reason = "cleanup", include = config.include.display());
    }
    if let Some(array) = &args.root_array {
        spillway_dataplane::entry::clear_root_slot(array, args.root_index).map_err(beside::BesideError::from)?;
        event!(info, "detached", root_array = array.display(), root_index = args.root_index);
    }
    for link in pins::cleanup(&PinLayout::new(pin_dir))? {
        event!(info, "detached", link = link.display());
    }
    event!(info, "removed", pin_dir = pin_dir.display());
    VipPath::remove(&probe_names).map_err(|e| DaemonError::VipPath(Box::new(e)))?;
    Ok(())
}

/// The outer sources: the options', else the interface's first addresses.
fn outer_sources(args: &DaemonArgs, iface: &str, addrs: &[(String, std::net::IpAddr)]) -> (Option<OuterSrc4>, Option<OuterSrc6>) {
    let v4 = args.outer_src.or_else(|| netif::first_ipv4(addrs, iface).map(OuterSrc4::host));
    let v6 = args.outer_src6.or_else(|| netif::first_global_ipv6(addrs, iface).map(OuterSrc6::host));
    (v4, v6)
}

/// What this host allows a change to add: its own addresses, the outer source families.
pub fn host_facts(args: &DaemonArgs, iface: &str) -> Result<Host, DaemonError> {
    let addresses = netif::addresses()?;
    let (v4, v6) = outer_sources(args, iface, &addresses);
    Ok(Host { addresses, outer_v4: v4.is_some(), outer_v6: v6.is_some(), iface: iface.to_owned() })
}

/// A balancer that announces is one of a fleet: with the public default seed, anyone could
/// compute which backend each flow gets (and aim at one).
fn check_fleet_seed(args: &DaemonArgs) -> Result<(), DaemonError> {
    if args.announce.bird_socket.is_some() && args.flow_hash_seed == FLOW_SEED {
        return Err(DaemonError::PublicFlowSeed);
    }
    Ok(())
}

fn lb_config(args: &DaemonArgs, iface: &str) -> Result<LbConfig, DaemonError> {
    let (v4, v6) = outer_sources(args, iface, &netif::addresses()?);
    match v4 {
        Some(src) => event!(info, "outer_src", family = 4, src = src),
        None => event!(
            warn,
            "no_outer_src",
            family = 4,
            iface = iface,
            message = "no IPv4 address and no --outer-src: IPv4 backends are unreachable"
        ),
    }
    match v6 {
        Some(src) => event!(info, "outer_src", family = 6, src = src),
        None => {
            event!(
                warn,
                "no_outer_src",
                family = 6,
                iface = iface,
                message = "no global IPv6 address and no --outer-src6: IPv6 backends are unreachable"
            )
        }
    }
    let (outer_src_v4, outer_src_v4_hostmask) = v4.map(|s| s.words()).unwrap_or_default();
    let (outer_src_v6, outer_src_v6_hostmask) = v6.map(|s| s.words()).unwrap_or_default();
    Ok(LbConfig {
        outer_src_v4,
        outer_src_v4_hostmask,
        outer_src_v6,
        outer_src_v6_hostmask,
        tcp_idle_timeout_s: args.tcp_idle_timeout_s,
        udp_idle_timeout_s: args.udp_idle_timeout_s,
        flow_seed: args.flow_hash_seed,
        gue_port: args.gue_port.to_be(),
        flags: if args.pass_to.is_some() { CFG_F_PASS_TO } else { 0 },
        ..LbConfig::default()
    })
}

fn explain_uplink_error(error: UplinkError, iface: &str) -> DaemonError {
    match error {
        UplinkError::Pin(e) => explain_attach_error(e, iface),
        UplinkError::Dataplane(e) => e.into(),
    }
}

/// An attach refused because another XDP program drives the interface says which one (and
/// which `lbd`, when it is one), not the kernel's bare EBUSY.
fn explain_attach_error(error: PinError, iface: &str) -> DaemonError {
    if let PinError::Attach { .. } = &error
        && let Some(holder) = pins::xdp_holder(iface)
    {
        return DaemonError::InterfaceTaken { iface: iface.to_owned(), holder };
    }
    error.into()
}

/// Removes what a first start (no maps pinned before it) created when it fails before it
/// is ready: pins, maps and the probe path. A restart's failure leaves the pins alone: they
/// are the running balancer's, and keep forwarding.
struct UndoFirstStart {
    layout: PinLayout,
    probe_names: spillway_dataplane::vip_path::ProbeNames,
    armed: bool,
    /// Set once the probe path's setup began (the device may exist from then on).
    probe_path_touched: bool,
}

impl UndoFirstStart {
    fn new(layout: &PinLayout, probe_names: spillway_dataplane::vip_path::ProbeNames) -> Self {
        Self { layout: layout.clone(), probe_names, armed: !layout.balancer_maps().exists(), probe_path_touched: false }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for UndoFirstStart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let pin_dir = self.layout.root().display();
        match pins::remove_balancer(&self.layout) {
            Ok(links) => {
                event!(info, "start_undone", pin_dir = pin_dir, links_detached = links.len(), message = "removed what this start pinned")
            }
            Err(e) => event!(error, "start_undo_failed", pin_dir = pin_dir, error = error_chain(&e)),
        }
        if self.probe_path_touched
            && let Err(e) = VipPath::remove(&self.probe_names)
        {
            event!(error, "start_undo_failed", device = self.probe_names.device, error = error_chain(&e));
        }
    }
}

/// Names the map and its pin path when a pinned map has another shape than this build's.
fn explain_load_error(error: DataplaneError, layout: &PinLayout) -> DaemonError {
    match error.pinned_shape() {
        Some(PinnedShape { name, property, expected, actual }) => DaemonError::PinnedMapShape {
            path: layout.balancer_maps().join(&name),
            name,
            pin_dir: layout.root().to_owned(),
            property,
            expected,
            actual,
        },
        None => error.into(),
    }
}

/// Every `neighbours::INTERVAL`, and right after each accepted API request, so a backend
/// just added is resolved before its first flows arrive.
async fn neighbour_upkeep<M, S>(core: SharedCore<M, S>, answered: Arc<Notify>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let mut tick = tokio::time::interval(neighbours::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = answered.notified() => {}
        }
        // The lock may be held by a change being applied: wait for it off the async workers.
        let core = core.clone();
        let round = move || {
            let backends = {
                let mut core = server::lock(&core);
                if let Err(e) = core.expire_drains(crate::wall_clock::unix_ms()) {
                    event!(warn, "drain_deadline_failed", error = error_chain(&e));
                }
                core.backend_addrs()
            };
            neighbours::upkeep(&backends)
        };
        match tokio::task::spawn_blocking(round).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => event!(debug, "neighbours_nudged", backends = n),
            Ok(Err(e)) => event!(warn, "neighbour_upkeep_failed", error = error_chain(&e)),
            Err(e) => event!(warn, "neighbour_upkeep_failed", error = e),
        }
    }
}

/// SIGTERM and SIGINT (and SIGHUP, whose default would kill the daemon), installed early so
/// none kills the process mid-change.
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Option<Signal>,
}

impl Signals {
    pub fn install() -> Result<Self, DaemonError> {
        let install = |kind| signal(kind).map_err(DaemonError::Signals);
        Ok(Self {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
            hup: Some(install(SignalKind::hangup())?),
        })
    }

    /// SIGHUP, for whoever reloads (a SIGHUP nobody takes is ignored).
    pub fn take_hup(&mut self) -> Option<Signal> {
        self.hup.take()
    }

    /// Waits for SIGTERM or SIGINT and returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// What `lbd` starts from, and what it does with its `--config` file.
struct Start {
    state: DesiredState,
    /// The file to apply once started (its declared state changed since it was applied).
    apply: Option<Document>,
    /// Set on a first start from the file: the state is the file's, to persist with its mark.
    first: Option<ConfigMark>,
    status: Option<ConfigStatus>,
}

/// Decides, before the dataplane is touched, what to start from: without a file, the
/// persisted state; with one, the file's state on a first start (none persisted), else the
/// persisted one, and the file is applied over it (like `lbctl apply`) only if what it
/// declares changed since `lbd` last applied it. A refused file keeps the persisted state;
/// with nothing persisted there is nothing to run, and `lbd` exits. A first start's state is
/// checked against `host` like any change (an apply over the persisted state is, later).
fn plan_start(
    config: Option<Document>,
    path: Option<&Path>,
    persisted: Option<DesiredState>,
    mark: Option<ConfigMark>,
    host: &Host,
) -> Result<Start, DaemonError> {
    let (Some(doc), Some(path)) = (config, path) else {
        return Ok(Start { state: persisted.unwrap_or_default(), apply: None, first: None, status: None });
    };
    let file = path.display();
    let status = |last: &str, error: Option<String>| Some(ConfigStatus { file: file.to_string(), last: last.to_owned(), error });
    let declared = match (doc.desired_state(), persisted) {
        (Ok(declared), None) => {
            host.check(&DesiredState::default(), &declared).map_err(|e| DaemonError::Config(core::host_refusal(&doc, e)))?;
            (declared, None)
        }
        (Ok(declared), persisted) => (declared, persisted),
        (Err(e), None) => return Err(DaemonError::Config(e)),
        (Err(e), Some(state)) => {
            event!(error, "config_refused", file = file, trigger = "start", error = e, kept = "persisted_state");
            return Ok(Start {
                state,
                apply: None,
                first: None,
                status: status("refused at start; kept the persisted state", Some(e.to_string())),
            });
        }
    };
    Ok(match declared {
        (declared, None) => {
            event!(info, "config_used", source = "file", file = file, reason = "no_persisted_state", vips = declared.vips.len());
            let first = Some(ConfigMark::of(path, &declared));
            Start { state: declared, apply: None, first, status: status("applied at start (no persisted state)", None) }
        }
        (declared, Some(state)) if mark.as_ref().is_some_and(|mark| mark.matches(path, &declared)) => {
            event!(info, "config_used", source = "state", file = file, reason = "file_unchanged", vips = state.vips.len());
            let last = "kept the persisted state at start (what the file declares is unchanged since lbd took it in)";
            Start { state, apply: None, first: None, status: status(last, None) }
        }
        (_, Some(state)) => {
            // Not silent: each change the file makes over the persisted state is logged
            // (`config_change`) and counted in `lbctl status`.
            event!(info, "config_used", source = "file", file = file, reason = "file_changed");
            Start { state, apply: Some(doc), first: None, status: None }
        }
    })
}

/// Applies `lbd`'s own configuration file; a refusal keeps the running state (logged, and
/// shown by `lbctl status`).
fn apply_config<M: Maps + Counters, S: Store>(core: &mut Core<M, S>, doc: &Document, path: &Path, trigger: &str) -> bool {
    let file = path.display();
    let options = ApplyOptions { mark_as: Some(path.to_owned()), ..ApplyOptions::default() };
    match core.apply_file(doc, options) {
        Ok(applied) => {
            event!(
                info,
                "config_applied",
                file = file,
                trigger = trigger,
                changes = applied.changes.len(),
                slots_written = applied.slots_written,
                tables_flipped = applied.tables_flipped
            );
            for note in &applied.notes {
                event!(warn, "config_setting_not_applied", file = file, note = note);
            }
            core.set_config_status(ConfigStatus { file: file.to_string(), last: format!("applied on {trigger}"), error: None });
            true
        }
        Err(e) => {
            let error = error_chain(&e);
            event!(error, "config_refused", file = file, trigger = trigger, error = error, kept = "running_state");
            core.set_config_status(ConfigStatus {
                file: file.to_string(),
                last: format!("refused on {trigger}; kept the running state"),
                error: Some(error),
            });
            false
        }
    }
}

/// Re-reads and applies the `--config` file on each SIGHUP (`systemctl reload`), telling
/// systemd it is reloading meanwhile.
async fn reload_on_hup<M, S>(core: SharedCore<M, S>, path: Option<PathBuf>, hup: Option<Signal>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let Some(mut hup) = hup else { return };
    while hup.recv().await.is_some() {
        let Some(path) = path.clone() else {
            event!(warn, "reload_ignored", signal = "SIGHUP", message = "lbd runs without --config: nothing to reload");
            continue;
        };
        notify::reloading();
        let core = core.clone();
        let reload = move || {
            let mut core = server::lock(&core);
            match Document::read(&path) {
                // The rule of every path in: the file wins only once it changed; lbctl edits
                // made since lbd last took it in are newer, and stay.
                Ok(doc) if core.own_config_unchanged(&doc) => {
                    // The interface list is the one setting taken while running.
                    if let Ok(settings) = Settings::from_file(&doc, Section::Lbd) {
                        core.take_uplinks(&settings);
                    }
                    event!(info, "config_unchanged", file = path.display(), trigger = "SIGHUP", kept = "running_state");
                    let last = "unchanged on SIGHUP since lbd took it in; kept the running state (lbctl apply -f applies it anyway)";
                    core.set_config_status(ConfigStatus { file: path.display().to_string(), last: last.to_owned(), error: None });
                }
                Ok(doc) => {
                    apply_config(&mut core, &doc, &path, "SIGHUP");
                }
                Err(e) => {
                    event!(error, "config_refused", file = path.display(), trigger = "SIGHUP", error = e, kept = "running_state");
                    let last = "refused on SIGHUP; kept the running state".to_owned();
                    core.set_config_status(ConfigStatus { file: path.display().to_string(), last, error: Some(e.to_string()) });
                }
            }
            serving(&core)
        };
        match tokio::task::spawn_blocking(reload).await {
            Ok(status) => notify::ready(&status),
            Err(e) => event!(error, "config_reload_failed", error = e),
        }
    }
}

/// The one-line status systemd shows.
fn serving<M: Maps + Counters, S: Store>(core: &Core<M, S>) -> String {
    let state = core.state();
    format!("serving vips={} backends={}", state.vips.len(), state.vips.values().map(|c| c.backends.len()).sum::<usize>())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nring_size = 13\n[[vips.backends]]\naddress = \"10.0.1.1\"\n";

    fn doc(text: &str) -> Document {
        Document::parse("spillway.toml", text.to_owned()).unwrap()
    }

    fn path() -> &'static Path {
        Path::new("/etc/spillway/spillway.toml")
    }

    #[test]
    fn an_announcing_balancer_refuses_the_public_flow_seed() {
        use clap::Parser;
        let args = |extra: &[&str]| {
            let argv = ["lbd", "--iface", "eth0"].into_iter().chain(extra.iter().copied());
            super::args::LbdArgs::try_parse_from(argv).unwrap().daemon
        };
        let refused = check_fleet_seed(&args(&["--bird-socket", "/run/bird/bird.ctl"])).unwrap_err();
        assert!(refused.to_string().contains("--flow-hash-seed (flow_hash_seed"), "{refused}");
        check_fleet_seed(&args(&["--bird-socket", "/run/bird/bird.ctl", "--flow-hash-seed", "0x1234abcd"])).unwrap();
        // Alone, a balancer's seed is nobody else's business.
        check_fleet_seed(&args(&[])).unwrap();
    }

    #[test]
    fn the_file_is_the_state_on_a_first_start() {
        let start = plan_start(Some(doc(FILE)), Some(path()), None, None, &Host::default()).unwrap();
        assert_eq!(start.state, doc(FILE).desired_state().unwrap());
        assert_eq!(start.first, Some(ConfigMark::of(path(), &start.state)));
        assert!(start.apply.is_none());
        assert_eq!(start.status.unwrap().last, "applied at start (no persisted state)");
    }

    #[test]
    fn later_starts_keep_the_persisted_state_unless_the_file_changed() {
        let declared = doc(FILE).desired_state().unwrap();
        let mut edited = declared.clone();
        edited.set_weight(&"10.0.0.1:80/tcp".parse().unwrap(), "10.0.1.1".parse().unwrap(), 7).unwrap();
        let mark = ConfigMark::of(path(), &declared);
        // Unchanged (comments do not count): the persisted state, lbctl edits included.
        let commented = doc(&format!("# a comment\n{FILE}"));
        let start = plan_start(Some(commented), Some(path()), Some(edited.clone()), Some(mark.clone()), &Host::default()).unwrap();
        assert_eq!(start.state, edited);
        assert!(start.apply.is_none() && start.first.is_none());
        assert!(start.status.unwrap().last.starts_with("kept the persisted state"));
        // Changed: start from the persisted state, then apply the file over it.
        let changed = FILE.replace("ring_size = 13", "ring_size = 17");
        let start = plan_start(Some(doc(&changed)), Some(path()), Some(edited.clone()), Some(mark.clone()), &Host::default()).unwrap();
        assert_eq!(start.state, edited);
        assert!(start.apply.is_some() && start.first.is_none());
        // Another file, or no mark at all, is a change too.
        let other =
            plan_start(Some(doc(FILE)), Some(Path::new("/etc/other.toml")), Some(edited.clone()), Some(mark), &Host::default()).unwrap();
        assert!(other.apply.is_some());
        assert!(plan_start(Some(doc(FILE)), Some(path()), Some(edited), None, &Host::default()).unwrap().apply.is_some());
    }

    #[test]
    fn a_refused_file_keeps_the_persisted_state_or_stops_a_first_start() {
        let bad = doc("[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nring_size = 100\n");
        let persisted = doc(FILE).desired_state().unwrap();
        let start = plan_start(Some(bad.clone()), Some(path()), Some(persisted.clone()), None, &Host::default()).unwrap();
        assert_eq!(start.state, persisted);
        assert!(start.apply.is_none() && start.first.is_none());
        let status = start.status.unwrap();
        assert_eq!(status.last, "refused at start; kept the persisted state");
        assert!(status.error.unwrap().contains("spillway.toml:3:13: vips[0].ring_size: ring size 100"));
        let err = plan_start(Some(bad), Some(path()), None, None, &Host::default()).err().unwrap();
        assert!(matches!(err, DaemonError::Config(_)), "{err}");
        // Without a file: the persisted state, as before.
        assert_eq!(plan_start(None, None, Some(persisted.clone()), None, &Host::default()).unwrap().state, persisted);
    }
}
