//! `lbd agent`: runs on a backend and strips the balancer's tunnel header from packets
//! addressed to this host. The decap program only decapsulates for addresses in its map,
//! which the agent keeps equal to the host's addresses (lo included, where DSR backends
//! keep the VIPs; loopback addresses never: no balancer tunnels to them), and only from the
//! balancers (`--allow-from`, required). Like the balancer, its link is pinned and taken
//! over on restart.
//!
//! It also serves the host's port pressure (`spillway_ports`) on a read-only endpoint that
//! `lbd` polls, to the balancers only, signed with `--report-key`. Decapsulation never
//! depends on the watcher: if it cannot load, the endpoint answers 503 saying why. Its
//! listeners are bound before anything is attached, and failing to bind one is fatal: a
//! user who took the port first would otherwise be the one `lbd` hears.

use spillway_logging::error_chain;
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use nix::sys::stat::{Mode, umask};
use spillway_common::{
    addr::{from_words, to_words},
    types::AddrKey,
};

use crate::metrics;
use crate::{
    DaemonError, Signals,
    args::{AgentArgs, AllowFromError},
    notify,
};
use spillway_dataplane::netif::{self, NetifError};
use spillway_dataplane::pins::{self, Attachment, PinError, PinLayout};
use spillway_dataplane::{
    DataplaneError,
    decap::{Decap, DecapCounts},
};
use spillway_logging::event;
use spillway_model::Cidr;
use spillway_model::ports_report::{PortsReport, Thresholds};
use spillway_ports::{
    Scope, SockWatch, WatchOptions,
    auth::{KeyError, ReportKey},
    endpoint::{self, Access, Limits, Listen},
};

/// How often the host's addresses are re-read.
const REFRESH: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Pins(#[from] PinError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Netif(#[from] NetifError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    AllowFrom(#[from] AllowFromError),
    #[error(transparent)]
    ReportKey(#[from] KeyError),
    #[error("binding {option} {addr} (is another process on the port?)")]
    Listen {
        option: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the decapsulator on `iface` until SIGTERM or SIGINT.
pub async fn run(args: &AgentArgs, iface: &str) -> Result<(), AgentError> {
    umask(Mode::from_bits_truncate(0o077));
    args.check_allow_from()?;
    let key = args.report_key.as_deref().map(ReportKey::load).transpose()?.map(Arc::new);
    if key.is_none() && args.ports_listen != Listen::Off {
        event!(warn, "report_key_missing", message = "port reports are not signed: lbd ignores them (--report-key)");
    }
    let listeners = Listeners::bind(args).await?;
    let mut signals = Signals::install()?;
    pins::ensure_bpffs()?;
    let layout = PinLayout::new(&args.pin_dir);
    let _lock = pins::create_and_lock(&layout.agent_dir())?;
    let durability = pins::durability(&layout.agent_dir());
    durability.log_at_start(&layout.agent_dir(), "decapsulation");
    let (mut decap, counts) = Decap::load(args.max_local_addrs)?;
    let mut local = Local { max: args.max_local_addrs as usize, left_out: Vec::new() };
    for cidr in &args.allow_from {
        decap.allow_from(cidr.addr, cidr.prefix_len)?;
    }
    let shown: Vec<String> = args.allow_from.iter().map(Cidr::to_string).collect();
    event!(info, "allow_from", prefixes = shown.join(","));
    decap.set_gue_port(args.gue_port)?;
    event!(info, "gue_port", port = args.gue_port, message = if args.gue_port == 0 { "GUE off: IPIP only" } else { "GUE on" });
    // The decapsulator's rare events (`dataplane::logs`) become log lines.
    let _logs = decap.forward_logs().inspect_err(|e| event!(warn, "ebpf_logs_unavailable", error = error_chain(e))).ok().map(LogsTask);
    // Filled before the program goes live, so a takeover never stops decapsulating.
    sync_local_addrs(&mut decap, &mut local)?;
    let link = layout.agent_link();
    let program = decap.program()?;
    match pins::attach_pinned(program, iface, args.xdp_mode.into(), &link)? {
        Attachment::TookOver { replaced_program_id } => {
            event!(info, "agent_took_over", iface = iface, link = link.display(), replaced_prog_id = replaced_program_id)
        }
        _ => event!(info, "agent_attached", iface = iface, mode = args.xdp_mode.label(), link = link.display()),
    }
    let _serving =
        start_ports_endpoint(args, listeners, Access { allow: args.allow_from.clone(), key, refused: Arc::default() }, counts).await;
    event!(info, "ready", iface = iface, link = link.display());
    notify::ready(&format!("decapsulating on {iface}"));
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            name = signals.recv() => {
                notify::stopping();
                event!(info, "exiting", signal = name, link = link.display(), message = durability.after_exit("decapsulation"));
                return Ok(());
            }
            _ = tick.tick() => {
                if let Err(e) = sync_local_addrs(&mut decap, &mut local) {
                    event!(warn, "local_addrs_failed", error = error_chain(&e));
                }
            }
        }
    }
}

/// Aborts the log reader's task when dropped (the agent exits).
struct LogsTask(tokio::task::JoinHandle<()>);

impl Drop for LogsTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Aborts a listener's task when dropped (the agent exits).
struct ServingTask(tokio::task::JoinHandle<std::convert::Infallible>);

impl Drop for ServingTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `--ports-listen` and `--metrics-listen`, bound (`None`: `off`).
struct Listeners {
    ports: Option<tokio::net::TcpListener>,
    metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(args: &AgentArgs) -> Result<Listeners, AgentError> {
        let bind = |option, addr| async move {
            tokio::net::TcpListener::bind(addr).await.map_err(|source| AgentError::Listen { option, addr, source })
        };
        let ports = match args.ports_listen {
            Listen::Off => None,
            Listen::On(addr) => Some(bind("--ports-listen", addr).await?),
        };
        let metrics = match args.metrics_listen {
            metrics::MetricsListen::Off => None,
            metrics::MetricsListen::On(addr) => Some(bind("--metrics-listen", addr).await?),
        };
        Ok(Listeners { ports, metrics })
    }
}

/// Loads the socket watcher and serves its reports on `--ports-listen` (JSON, polled by
/// `lbd`, to `access`) and `--metrics-listen` (Prometheus). The watcher failing to load
/// does not stop the agent: decapsulation matters more; it is logged once.
async fn start_ports_endpoint(args: &AgentArgs, listeners: Listeners, access: Access, counts: DecapCounts) -> Vec<ServingTask> {
    if listeners.ports.is_none() && listeners.metrics.is_none() {
        event!(info, "ports_endpoint_off");
        return Vec::new();
    }
    // The watcher sees the whole kernel; a host reports its own namespace unless told.
    let options = WatchOptions { mode: args.watcher_mode, scope: if args.all_netns { Scope::All } else { Scope::Own } };
    let watch =
        tokio::task::spawn_blocking(move || SockWatch::load(options)).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let watch = watch.map_err(|e| {
        let message = format!("the socket watcher is not loaded: {}", error_chain(&e));
        event!(error, "socket_watcher_not_loaded", error = message, message = "the ports endpoint answers 503");
        message
    });
    let thresholds = Thresholds { close_wait_secs: args.leak_after_s, ..Thresholds::default() };
    let source = std::sync::Arc::new(std::sync::Mutex::new(PortSource { watch, thresholds, last_error: None }));
    let report = move |source: &std::sync::Mutex<PortSource>| source.lock().unwrap_or_else(std::sync::PoisonError::into_inner).report();
    let mut serving = Vec::new();
    let refused = Arc::clone(&access.refused);
    if let Some(listener) = listeners.ports {
        event!(info, "ports_endpoint_listening", url = format!("http://{}{}", args.ports_listen, endpoint::PATH));
        let source = source.clone();
        serving.push(ServingTask(tokio::spawn(endpoint::serve(listener, Limits::default(), access, move || report(&source)))));
    }
    if let Some(listener) = listeners.metrics {
        event!(info, "metrics_listening", url = format!("http://{}{}", args.metrics_listen, metrics::PATH));
        let rendered = move || {
            let refused = refused.load(std::sync::atomic::Ordering::Relaxed);
            metrics::agent(report(&source).as_ref().map_err(String::as_str), &counts.counts(), refused)
        };
        serving.push(ServingTask(tokio::spawn(metrics::serve(listener, metrics::Limits::default(), rendered))));
    }
    serving
}

/// Builds the endpoint's reports (on a blocking thread, at most once per second).
struct PortSource {
    watch: Result<SockWatch, String>,
    thresholds: Thresholds,
    /// The last build error, logged when it first appears rather than on every request.
    last_error: Option<String>,
}

impl PortSource {
    fn report(&mut self) -> Result<PortsReport, String> {
        let watch = self.watch.as_mut().map_err(|message| message.clone())?;
        let report = watch.report(self.thresholds).map_err(|e| format!("building the port report: {}", error_chain(&e)));
        match &report {
            Err(message) if self.last_error.as_ref() != Some(message) => event!(warn, "ports_report_failed", error = message),
            _ => {}
        }
        self.last_error = report.as_ref().err().cloned();
        report
    }
}

/// How many of the host's addresses the decap program holds, and those that did not fit at
/// the last sync.
struct Local {
    max: usize,
    left_out: Vec<IpAddr>,
}

/// Makes the map hold exactly the host's current addresses, as many as fit; an ALERT when
/// the addresses left out change (tunnels to them are not decapsulated: the backend loses
/// that VIP's traffic), and a line when none is left out any more.
fn sync_local_addrs(decap: &mut Decap, local: &mut Local) -> Result<(), AgentError> {
    let (want, mut left_out) = local_keys(&netif::addresses()?, local.max);
    // Tunnels are never addressed to link-local addresses: leaving them out harms nothing.
    left_out.retain(|a| !matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()));
    if left_out != local.left_out {
        if left_out.is_empty() {
            event!(info, "local_addrs_fit", max = local.max);
        } else {
            let shown: Vec<String> = left_out.iter().map(IpAddr::to_string).collect();
            event!(
                error,
                "local_addrs_alert",
                left_out = shown.join(","),
                max = local.max,
                message = "ALERT: tunnels to these local addresses are not decapsulated; raise --max-local-addrs"
            );
        }
        local.left_out = left_out;
    }
    let have = decap.local_addrs()?;
    for key in have.iter().filter(|k| !want.contains(k)) {
        decap.remove_local_addr(key)?;
        event!(info, "local_addr_removed", addr = show(key));
    }
    for key in want.iter().filter(|k| !have.contains(k)) {
        decap.add_local_addr(key)?;
        event!(info, "local_addr_added", addr = show(key));
    }
    Ok(())
}

fn show(key: &AddrKey) -> String {
    from_words(key.addr, key.family).map_or_else(|| format!("family-{}", key.family), |a| a.to_string())
}

/// The host's distinct addresses as map keys, at most `max`, and those left out; link-local
/// ones go last so they are the first left out (tunnels are never addressed to them).
/// Loopback addresses are never keys: a tunnel's packet to 127.0.0.1 would reach services
/// that trust it to come from this host.
fn local_keys(addrs: &[(String, IpAddr)], max: usize) -> (Vec<AddrKey>, Vec<IpAddr>) {
    let unique: BTreeSet<IpAddr> = addrs.iter().map(|(_, a)| *a).filter(|a| !a.is_loopback()).collect();
    let mut ordered: Vec<IpAddr> = unique.into_iter().collect();
    ordered.sort_by_key(|a| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local()));
    let left_out = ordered.split_off(max.min(ordered.len()));
    let keys = ordered
        .into_iter()
        .map(|a| {
            let (addr, family) = to_words(a);
            AddrKey { addr, family, _pad: [0; 3] }
        })
        .collect();
    (keys, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{LbdArgs, LbdCommand};
    use clap::Parser;

    fn agent_args(extra: &[&str]) -> Result<AgentArgs, clap::Error> {
        let args = ["lbd", "agent", "--iface", "eth0", "--allow-from", "10.0.0.2/32"].iter().chain(extra);
        match LbdArgs::try_parse_from(args)?.command {
            Some(LbdCommand::Agent(agent)) => Ok(agent),
            _ => panic!("not the agent"),
        }
    }

    #[test]
    fn ports_endpoint_flags() {
        let defaults = agent_args(&[]).unwrap();
        assert_eq!(defaults.ports_listen, Listen::On("0.0.0.0:9477".parse().unwrap()));
        assert_eq!(defaults.leak_after_s, 30);
        let set = agent_args(&["--ports-listen", "[::1]:9000", "--leak-after-s", "5"]).unwrap();
        assert_eq!((set.ports_listen, set.leak_after_s), (Listen::On("[::1]:9000".parse().unwrap()), 5));
        assert_eq!(agent_args(&["--ports-listen", "off"]).unwrap().ports_listen, Listen::Off);
        let err = agent_args(&["--ports-listen", "9477"]).unwrap_err().to_string();
        assert!(err.contains("--ports-listen") && err.contains("expected ADDR:PORT"), "{err}");
        assert!(agent_args(&["--leak-after-s", "0"]).unwrap_err().to_string().contains("--leak-after-s"));
    }

    #[test]
    fn keys_are_unique_and_link_local_goes_first_to_the_cut() {
        let mut addrs = vec![("lo".to_string(), "127.0.0.1".parse().unwrap()), ("eth0".into(), "fe80::1".parse().unwrap())];
        addrs.push(("eth1".into(), "127.0.0.1".parse().unwrap()));
        const MAX: usize = 64;
        for i in 0..MAX - 1 {
            addrs.push(("eth0".into(), IpAddr::from([10, 0, 0, i as u8])));
        }
        addrs.push(("eth0".into(), IpAddr::from([10, 0, 1, 1])));
        let (keys, left_out) = local_keys(&addrs, MAX);
        assert_eq!(keys.len(), MAX);
        assert_eq!(left_out, [IpAddr::from("fe80::1".parse::<std::net::Ipv6Addr>().unwrap())], "link-local goes first");
        let shown: Vec<String> = keys.iter().map(show).collect();
        assert!(!shown.contains(&"127.0.0.1".to_string()), "loopback is never decapsulated for");
        assert!(!shown.contains(&"fe80::1".to_string()));
        addrs.push(("lo".into(), "::1".parse().unwrap()));
        let (keys, left_out) = local_keys(&addrs[..2], MAX);
        assert_eq!(keys.iter().map(show).collect::<Vec<_>>(), ["fe80::1"]);
        assert!(left_out.is_empty());
        let (keys, left_out) = local_keys(&addrs, 10);
        assert_eq!((keys.len(), left_out.len()), (10, MAX + 1 - 10), "every other address is kept or left out");
    }
}
