//! `lbd`'s command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use spillway_common::limits::{
    Capacity, DEFAULT_ECHO_PER_SOURCE, DEFAULT_ECHO_TOTAL, DEFAULT_GUE_PORT, DEFAULT_LOCAL_ADDRS, DEFAULT_RING_SIZE,
    DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S, MAX_ALLOW_FROM, MAX_LOCAL_ADDRS, SECOND_CHANCE_SETTLE_MS,
};

use super::outer_src::{OuterSrc4, OuterSrc6};
use crate::metrics::MetricsListen;
use spillway_api::DEFAULT_SOCKET;
use spillway_common::types::EchoConfig;
use spillway_dataplane::pins::{DEFAULT_PIN_DIR, XdpModeArg};
use spillway_dataplane::vip_path::VipPathArgs;
use spillway_logging::LogFormat;
use spillway_model::HealthConfig;
use spillway_ports::WatcherMode;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/spillway";

const LBD_EXAMPLES: &str = "\
Examples:
  lbd --iface eth0
  lbd --iface eth0 --outer-src 10.0.0.0/24 --outer-src6 fd00::/112
  lbd --config /etc/spillway/spillway.toml
  lbd --cleanup                  # detach and remove every pin (stop lbd first)
  lbd --cleanup --config /etc/spillway/spillway.toml   # its [lbd] pin_dir, bird_socket, ...
  lbd check -f /etc/spillway/spillway.toml    # a file checked as a start would

With --config, the file's [lbd] settings are options too (a command-line option wins),
and its VIPs, backends, limits and rules are the desired state: on the first start, and
later, at a start or on SIGHUP, whenever what the file declares changed since lbd last
took it in (else the persisted state, lbctl edits included, is kept: the newest
declaration wins). Every field is described in the example spillway.toml.

lbd keeps forwarding after it exits: the XDP link and the maps stay pinned under
--pin-dir, and the next lbd takes them over without a gap. Control it with lbctl.";

const CHECK_HELP: &str = "\
Examples:
  lbd check -f /etc/spillway/spillway.toml
  lbd check -f spillway.toml && systemctl reload spillway

Checks what a start of lbd --config FILE checks: the syntax and every field name, the
[lbd] and [agent] settings, the desired state, and what this host allows (the interface
exists and forwards, no VIP on an address of the host without allow_local_address, an
outer source for every backend's family), with every VIP and backend checked as on a
first start. A file with only [agent] (a backend's agent.toml) is checked as lbd agent
--config starts from it: its settings, iface (on this host) and allow_from; a file with
both tables is checked as both. The LBD_* variables lbd --help lists win over the file,
as they do at a start. Touches nothing and needs no running lbd; the systemd unit runs
it before each start and reload.

Exit status: 0 when the file is valid (it prints what it declares), 1 when it is not
(the error names the file, line, column and field).";

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The configuration file.
    #[arg(short = 'f', long = "file", visible_alias = "config", value_name = "FILE")]
    pub file: PathBuf,
}

const AGENT_EXAMPLES: &str = "\
Examples:
  lbd agent --iface eth0 --allow-from 10.0.0.2/32 --report-key /etc/spillway/report.key
  lbd agent --iface eth0 --allow-from 10.0.0.0/29 --xdp-mode generic --pin-dir /sys/fs/bpf/spillway
  lbd agent --config /etc/spillway/agent.toml      # its [agent] table";

#[derive(Debug, Parser)]
#[command(
    name = "lbd",
    version,
    about = "Spillway's XDP L4 load balancer daemon",
    after_help = LBD_EXAMPLES,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    // A file's settings come first as arguments: the command line's repeat wins.
    args_override_self = true
)]
pub struct LbdArgs {
    #[command(subcommand)]
    pub command: Option<LbdCommand>,
    /// How log lines are written to stderr: logfmt `key=value` text, or JSON objects.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

#[derive(Debug, Subcommand)]
pub enum LbdCommand {
    /// Run on a backend: decapsulate the balancer's tunnel packets addressed to this host.
    #[command(after_help = AGENT_EXAMPLES, args_override_self = true)]
    Agent(AgentArgs),
    /// Check a configuration file as a start would, without starting or changing anything.
    #[command(after_help = CHECK_HELP)]
    Check(CheckArgs),
    /// Print a shell completion script for lbd.
    #[command(after_help = "Example:\n  lbd completions bash > /usr/local/share/bash-completion/completions/lbd")]
    Completions(spillway_manual::CompletionsArgs),
    /// Write the man pages of lbd and its subcommands (section 8).
    #[command(after_help = "Example:\n  lbd man --dir /usr/local/share/man/man8    # lbd.8, lbd-agent.8, ...")]
    Man(spillway_manual::ManArgs),
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Interface the balancer receives VIP traffic on; repeat it for each uplink (`iface =
    /// ["eth0", "eth1"]` in [lbd]). All share one connection table, so a flow keeps its
    /// backend whichever one its packets arrive on, and each packet leaves by the interface
    /// the route lookup picks. The first gives the default outer sources and carries the
    /// health probes. Changing the file's list and reloading (SIGHUP, `lbctl apply -f`)
    /// attaches and detaches the difference while running.
    #[arg(long, value_name = "IF", required_unless_present_any = ["cleanup", "config"])]
    pub iface: Vec<String>,
    /// Detach the balancer and the agent and remove everything under --pin-dir, then exit.
    /// With --config, the file's [lbd] table gives --pin-dir, the BIRD paths and the probe
    /// path's options (the command line still wins); its iface and VIPs are not needed. With
    /// --root-array, that slot is emptied too (your root program calls the balancer no more).
    #[arg(long, conflicts_with = "iface")]
    pub cleanup: bool,
    /// Configuration file: [lbd] settings and the desired state (see the example
    /// spillway.toml); applied again at a start or on SIGHUP once what it declares changed.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// XDP attach mode (a taken-over link keeps the mode it was created with).
    #[arg(long, value_enum, default_value_t = XdpModeArg::Native)]
    pub xdp_mode: XdpModeArg,
    /// Where the balancer's entry program goes live: attached to --iface, or nowhere, pinned
    /// at <pin-dir>/v<N>/prog (logged, and shown by lbctl status) for your own root XDP
    /// program to tail-call from its program array; see --root-array. --iface still names
    /// the interface the balancer's traffic arrives and leaves on.
    #[arg(long, value_enum, value_name = "WHERE", default_value_t = XdpAttach::Interface)]
    pub xdp_attach: XdpAttach,
    /// With --xdp-attach none: the program array your root program tail-calls the balancer
    /// from (pinned on bpffs). lbd puts its entry program in slot --root-index at every start,
    /// one map update, so a restart swaps the new program in without a gap.
    #[arg(long, value_name = "PIN")]
    pub root_array: Option<PathBuf>,
    /// The slot of --root-array that holds the balancer's entry program.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub root_index: u32,
    /// A pinned XDP program to hand the frames the balancer does not serve (not IP, not to a
    /// VIP, malformed) by tail call instead of passing them to the kernel: your filter after
    /// the balancer. lbd follows the pin: a program pinned there in its place takes over, and
    /// while none is pinned the frames pass as before, counted (pass_to_missing). Refused at
    /// start unless an XDP program is pinned there.
    #[arg(long, value_name = "PIN")]
    pub pass_to: Option<PathBuf>,
    /// Control socket for lbctl (mode 0600, root only).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub api: PathBuf,
    /// Where the desired state (state.json) is kept.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Outer IPv4 source of the encapsulation; with /PREFIX the host bits come from the
    /// flow hash [default: the interface's first IPv4 address]. The environment variable
    /// (a systemd drop-in's Environment=) wins over the file, as the option does.
    #[arg(long, value_name = "ADDR[/PREFIX]", env = "LBD_OUTER_SRC")]
    pub outer_src: Option<OuterSrc4>,
    /// Outer IPv6 source; a prefix may leave at most 32 host bits (/96 or longer)
    /// [default: the interface's first global IPv6 address].
    #[arg(long, value_name = "ADDR[/PREFIX]", env = "LBD_OUTER_SRC6")]
    pub outer_src6: Option<OuterSrc6>,
    /// bpffs directory for the pinned maps and links.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Seconds after which an idle TCP connection is treated as new.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_TCP_IDLE_TIMEOUT_S, value_parser = clap::value_parser!(u32).range(1..))]
    pub tcp_idle_timeout_s: u32,
    /// Seconds after which an idle UDP flow is treated as new.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_UDP_IDLE_TIMEOUT_S, value_parser = clap::value_parser!(u32).range(1..))]
    pub udp_idle_timeout_s: u32,
    /// Another interface the balancer may redirect encapsulated packets to (repeatable).
    #[arg(long = "tx-iface", value_name = "IF")]
    pub tx_ifaces: Vec<String>,
    /// Do not probe backends: program the configured weights as they are.
    #[arg(long)]
    pub no_health_checks: bool,
    /// Length of the slow-start ramp of a new or recovered backend, in ms (0: none).
    #[arg(long, value_name = "MS", default_value_t = HealthConfig::default().slow_start_ms)]
    pub health_slow_start_ms: u64,
    /// This balancer's zone: new flows prefer backends of this zone (and those without one)
    /// and spill to others only up to their spare capacity [default: no zones].
    #[arg(long, value_name = "ZONE", value_parser = parse_zone, env = "LBD_ZONE")]
    pub zone: Option<String>,
    /// Root-only file (mode 0600) holding the key the agents sign their port reports with
    /// (`lbd agent --report-key`): a report without a valid signature is ignored with an ALERT.
    #[arg(long, value_name = "FILE")]
    pub report_key: Option<PathBuf>,
    /// Port of the backends' `lbd agent` endpoint, polled for port pressure (0: do not poll).
    #[arg(long, value_name = "PORT", default_value_t = spillway_ports::endpoint::DEFAULT_PORT)]
    pub agent_port: u16,
    /// Set the interface's forwarding sysctls (net.ipv4.conf.<IF>.forwarding and its IPv6
    /// twin) to 1 if they are 0, instead of refusing to start: the kernel's route lookup
    /// refuses to route packets that arrive on an interface that does not forward.
    #[arg(long)]
    pub enable_forwarding: bool,
    /// How this balancer's own port watcher hooks the kernel (`lbctl ports --host lb`):
    /// the best mode the kernel allows, or one forced.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = WatcherMode::Auto)]
    pub watcher_mode: WatcherMode,
    /// Where to serve Prometheus metrics (GET /metrics, OpenMetrics text), or `off`.
    /// Read-only and bounded; counters are read from the maps at most once a second.
    #[arg(long, value_name = "ADDR:PORT|off", default_value = crate::metrics::DEFAULT_LISTEN)]
    pub metrics_listen: MetricsListen,
    /// Seed of the flow hash that picks a new flow's backend (decimal or 0x hex). A fleet
    /// setting: every balancer behind the same ECMP routes must use the same seed, so a flow
    /// that moves between them keeps its backend.
    #[arg(long, value_name = "SEED", default_value = FLOW_SEED_HEX, value_parser = parse_seed)]
    pub flow_hash_seed: u32,
    /// UDP destination port of GUE tunnels (to backends whose encap is gue). A fleet setting:
    /// every agent's --gue-port must be the same.
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_GUE_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub gue_port: u16,
    /// Seconds a VIP's Maglev table must stay unchanged before its next change replaces its
    /// second-chance table (the table packets of connections this balancer has no entry for
    /// may also belong to); changes closer together, such as a slow-start ramp, are one.
    #[arg(long, value_name = "S", default_value_t = SECOND_CHANCE_SETTLE_MS / 1000, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub second_chance_settle_s: u64,
    /// Echo requests (ping) to a VIP address answered a second per source (an IPv4 address,
    /// an IPv6 /64), and as many at once after a quiet second; 0: no ping is answered. An
    /// address answers only while one of its VIPs has a backend taking new flows.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ECHO_PER_SOURCE, value_parser = clap::value_parser!(u32).range(0..=MAX_ECHO_RATE))]
    pub echo_per_source: u32,
    /// Echo requests to VIP addresses answered a second from all sources together (the same
    /// burst); 0: none. It bounds what a flood of requests with spoofed sources makes the
    /// balancer send; over it, requests are dropped (`drop_echo_limited`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ECHO_TOTAL, value_parser = clap::value_parser!(u32).range(0..=MAX_ECHO_RATE))]
    pub echo_total: u32,
    #[command(flatten)]
    pub announce: AnnounceArgs,
    #[command(flatten)]
    pub vip_path: VipPathArgs,
    /// VIPs the maps hold at once. Like every size option, fixed when the maps are created:
    /// changing it needs `lbd --cleanup` (which drops the connection table).
    #[arg(long, value_name = "N", default_value_t = Capacity::DEFAULT.vips, value_parser = count(Capacity::MAX.vips))]
    pub max_vips: u32,
    /// Backends over all VIPs (a backend in two VIPs counts twice).
    #[arg(long, value_name = "N", default_value_t = Capacity::DEFAULT.backends, value_parser = count(Capacity::MAX.backends))]
    pub max_backends: u32,
    /// Connections the table holds (k and M suffixes: thousands, millions); it takes about
    /// 64 bytes each, with slots for twice as many so a full table's buckets rarely
    /// overflow. `lbctl status`, the metrics and the dashboard show this number.
    #[arg(long, value_name = "N", default_value_t = Capacity::DEFAULT.flows, value_parser = count(Capacity::MAX.flows))]
    pub max_flows: u32,
    /// Maglev slots over all VIPs; a VIP with a table of M slots (`lbctl vips add
    /// --ring-size`) takes 3 M: its table, the next one and, once it changed, its
    /// second-chance table (each rounded up to a multiple of 4), 2 bytes a slot [default:
    /// room for every VIP at the default size, 3 x 65540 x --max-vips].
    #[arg(long, value_name = "N", value_parser = count(Capacity::MAX.ring_slots))]
    pub ring_slots: Option<u32>,
    /// Fragmented datagrams to UDP VIPs whose later fragments the balancer can follow at
    /// once (k and M suffixes): the record each first fragment leaves of its backend, about
    /// 100 bytes each, least recently used first out. A datagram whose record is gone before
    /// its last fragment is lost (`drop_fragment_unmatched`).
    #[arg(long, value_name = "N", default_value_t = Capacity::DEFAULT.fragments, value_parser = count(Capacity::MAX.fragments))]
    pub max_fragments: u32,
}

/// The most echo answers a second an option may allow (a GCRA interval of 1 µs).
const MAX_ECHO_RATE: i64 = 1_000_000;

impl DaemonArgs {
    /// The echo answers' rate limits.
    pub fn echo_config(&self) -> EchoConfig {
        EchoConfig::new(self.echo_per_source, self.echo_total)
    }

    /// The sizes of the maps.
    pub fn capacity(&self) -> Capacity {
        let per_vip = u64::from(Capacity::ring_slots_for(1, DEFAULT_RING_SIZE));
        let every_vip_at_default = u64::from(self.max_vips) * per_vip;
        let ring_slots = self.ring_slots.unwrap_or(every_vip_at_default.min(u64::from(Capacity::MAX.ring_slots)) as u32);
        Capacity { vips: self.max_vips, backends: self.max_backends, flows: self.max_flows, ring_slots, fragments: self.max_fragments }
    }
}

/// `--xdp-attach`: where the balancer's entry program goes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpAttach {
    /// Attached to --iface through a pinned link (taken over at a restart).
    Interface,
    /// Attached nowhere: pinned for the operator's root program to tail-call.
    None,
}

/// A count of at least 1 and at most `max`, with an optional k (1,000) or M (1,000,000) suffix.
fn count(max: u32) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync + 'static {
    move |input: &str| {
        let (digits, unit) = match input.strip_suffix(['k', 'K']) {
            Some(d) => (d, 1_000),
            None => match input.strip_suffix('M') {
                Some(d) => (d, 1_000_000),
                None => (input, 1),
            },
        };
        let n: u64 = digits.parse().map_err(|_| format!("{input:?} is not a count (digits, optionally k or M)"))?;
        let n = n.checked_mul(unit).filter(|n| (1..=u64::from(max)).contains(n)).ok_or(format!("{input} is out of range (1..={max})"))?;
        Ok(n as u32)
    }
}

/// Announcing the VIPs over BGP through BIRD (README, "Running a fleet").
#[derive(Debug, Args)]
pub struct AnnounceArgs {
    /// BIRD's control socket: announce every VIP address through that BIRD (Debian's
    /// /run/bird/bird.ctl). Without it nothing is announced.
    #[arg(long, value_name = "PATH", env = "LBD_BIRD_SOCKET")]
    pub bird_socket: Option<PathBuf>,
    /// The BIRD configuration include lbd writes (bird.conf includes it); its directory is
    /// created (0755) if missing. On a tmpfs, so that after a reboot nothing is announced
    /// before lbd has attached.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_BIRD_INCLUDE)]
    pub bird_include: PathBuf,
    /// Other balancers that must announce a VIP address normally before this one withdraws
    /// it when its data path cannot forward (0: withdraw after the hold regardless).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub announce_floor: u32,
    /// Seconds an address stays announced degraded (GRACEFUL_SHUTDOWN) after the data path
    /// failed before it may be withdrawn: long enough for other balancers' degradations to
    /// arrive, so balancers failing together never all withdraw.
    #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub announce_hold_s: u64,
}

pub const DEFAULT_BIRD_INCLUDE: &str = "/run/spillway-bird/vips.conf";

/// [`spillway_common::hash::FLOW_SEED`] written as the example file writes it (hex), for
/// `--help`.
const FLOW_SEED_HEX: &str = "0x5370696c";

fn parse_seed(input: &str) -> Result<u32, String> {
    let parsed = match input.strip_prefix("0x").or_else(|| input.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => input.parse(),
    };
    parsed.map_err(|_| format!("expected a 32-bit number, decimal or 0x hex, not {input:?}"))
}

fn parse_zone(input: &str) -> Result<String, String> {
    spillway_model::check_zone(input).map(|()| input.to_owned()).map_err(|e| e.to_string())
}

/// An agent's allow-list a start refuses.
#[derive(Debug, thiserror::Error)]
pub enum AllowFromError {
    #[error(
        "refusing to start without --allow-from (allow_from in [agent]): name the balancers' outer sources, e.g. --allow-from \
         10.0.0.2/32, or anyone who reaches this host could tunnel packets into it"
    )]
    Missing,
    #[error("--allow-from names {given} prefixes; at most {MAX_ALLOW_FROM}")]
    TooMany { given: usize },
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Interface the tunnel packets arrive on.
    #[arg(long, value_name = "IF", required_unless_present = "config")]
    pub iface: Option<String>,
    /// Configuration file whose [agent] table holds these options (see spillway.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How the decap program is attached: native (in the driver) or generic (in the stack).
    #[arg(long, value_enum, default_value_t = XdpModeArg::Native)]
    pub xdp_mode: XdpModeArg,
    /// bpffs directory; the agent pins under <DIR>/agent.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Where to serve this host's port pressure (GET /ports, JSON over HTTP/1.0), or `off`.
    /// Read-only: nothing sent to it changes anything; connections, request size and time,
    /// and report builds (one per second) are bounded.
    #[arg(long, value_name = "ADDR:PORT|off", default_value = spillway_ports::endpoint::DEFAULT_LISTEN)]
    pub ports_listen: spillway_ports::endpoint::Listen,
    /// Seconds a socket may sit in CLOSE_WAIT before its process is named a leak suspect.
    #[arg(long, value_name = "S", default_value_t = spillway_model::ports_report::Thresholds::default().close_wait_secs,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub leak_after_s: u64,
    /// Report every network namespace of the host, not only the agent's: for hosts whose
    /// services run in containers with their own namespaces (each row names its namespace).
    /// Joins each one, which needs CAP_SYS_ADMIN (under systemd: the drop-in
    /// spillway-agent-all-netns.conf).
    #[arg(long)]
    pub all_netns: bool,
    /// How the port watcher hooks the kernel: the best mode the kernel allows (btf, else
    /// tracepoint, else sock_diag), or one forced.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = WatcherMode::Auto)]
    pub watcher_mode: WatcherMode,
    /// Where to serve this host's port pressure as Prometheus metrics (GET /metrics), or
    /// `off`. Read-only and bounded like --ports-listen.
    #[arg(long, value_name = "ADDR:PORT|off", default_value = crate::metrics::DEFAULT_AGENT_LISTEN)]
    pub metrics_listen: MetricsListen,
    /// The balancers' outer sources (repeatable; at most 256): tunnels to this host from any
    /// other source are dropped (drop_not_allowed), and so is second chance's sending on.
    /// Required: without it anyone who can reach the host could tunnel packets into it.
    #[arg(long = "allow-from", value_name = "CIDR", required_unless_present = "config")]
    pub allow_from: Vec<spillway_model::Cidr>,
    /// Root-only file (mode 0600) holding the key that signs this host's port reports for
    /// `lbd` (the same file as `lbd --report-key`); without it `lbd` ignores the reports.
    #[arg(long, value_name = "FILE")]
    pub report_key: Option<PathBuf>,
    /// Most local addresses the agent decapsulates for (its map's size): every address of
    /// the host, VIPs on `lo` included. Beyond it, addresses are left out with an ALERT.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LOCAL_ADDRS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LOCAL_ADDRS)))]
    pub max_local_addrs: u32,
    /// UDP port GUE tunnels arrive on (the balancers' --gue-port), or 0: IPIP only. Taken
    /// only from --allow-from, as IPIP is; UDP to this port from anyone else is dropped.
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_GUE_PORT)]
    pub gue_port: u16,
}

impl AgentArgs {
    /// The allow-list a start refuses: none (anyone could tunnel into the host), or more
    /// than the map holds. Also what `lbd check` checks of an `[agent]` table.
    pub fn check_allow_from(&self) -> Result<(), AllowFromError> {
        if self.allow_from.is_empty() {
            return Err(AllowFromError::Missing);
        }
        if self.allow_from.len() > MAX_ALLOW_FROM as usize {
            return Err(AllowFromError::TooMany { given: self.allow_from.len() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use spillway_common::{hash::FLOW_SEED, limits::RING_TABLES};

    use super::*;

    fn parse(args: &[&str]) -> Result<LbdArgs, clap::Error> {
        LbdArgs::try_parse_from(std::iter::once("lbd").chain(args.iter().copied()))
    }

    #[test]
    fn the_balancer_runs_on_each_interface_named() {
        assert_eq!(parse(&["--iface", "eth0", "--iface", "eth1"]).unwrap().daemon.iface, ["eth0", "eth1"]);
    }

    #[test]
    fn daemon_defaults() {
        let a = parse(&["--iface", "eth0"]).unwrap();
        assert!(a.command.is_none());
        let d = a.daemon;
        assert_eq!(d.iface, ["eth0"]);
        assert_eq!(d.xdp_mode, XdpModeArg::Native);
        assert_eq!(d.api, PathBuf::from("/run/spillway/api.sock"));
        assert_eq!(d.state_dir, PathBuf::from("/var/lib/spillway"));
        assert_eq!(d.pin_dir, PathBuf::from("/sys/fs/bpf/spillway"));
        assert_eq!((d.outer_src, d.outer_src6), (None, None));
        assert_eq!((d.tcp_idle_timeout_s, d.udp_idle_timeout_s), (DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S));
        assert!(!d.cleanup && d.tx_ifaces.is_empty());
        assert_eq!(d.capacity(), Capacity::DEFAULT);
        assert_eq!(d.flow_hash_seed, FLOW_SEED);
        assert_eq!(parse_seed(FLOW_SEED_HEX), Ok(FLOW_SEED), "the default as --help shows it");
        assert_eq!(d.announce.bird_socket, None);
        assert_eq!(d.announce.bird_include, PathBuf::from(DEFAULT_BIRD_INCLUDE));
        assert_eq!((d.announce.announce_floor, d.announce.announce_hold_s), (1, 10));
    }

    #[test]
    fn sizes() {
        let d = parse(&["--iface", "eth0", "--max-vips", "1000", "--max-backends", "10k", "--max-flows", "8M"]).unwrap().daemon;
        let c = d.capacity();
        assert_eq!((c.vips, c.backends, c.flows, c.ring_slots), (1000, 10_000, 8_000_000, 1000 * RING_TABLES * 65540));
        let d = parse(&["--iface", "eth0", "--ring-slots", "2000000"]).unwrap().daemon;
        assert_eq!(d.capacity().ring_slots, 2_000_000);
        assert_eq!(d.capacity().fragments, Capacity::DEFAULT.fragments);
        let d = parse(&["--iface", "eth0", "--max-fragments", "256k"]).unwrap().daemon;
        assert_eq!(d.capacity().fragments, 256_000);
        for bad in [
            &["--max-vips", "0"][..],
            &["--max-backends", "65536"],
            &["--max-flows", "8G"],
            &["--max-flows", "1.5M"],
            &["--max-fragments", "0"],
            &["--max-fragments", "17M"],
        ] {
            let args: Vec<&str> = ["--iface", "eth0"].iter().chain(bad).copied().collect();
            let err = parse(&args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{bad:?}");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }

    #[test]
    fn daemon_flags() {
        let d = parse(&[
            "--iface",
            "eth0",
            "--xdp-mode",
            "generic",
            "--api",
            "/tmp/a.sock",
            "--state-dir",
            "/tmp/s",
            "--outer-src",
            "10.0.0.0/24",
            "--outer-src6",
            "fd00::/112",
            "--pin-dir",
            "/sys/fs/bpf/t",
            "--tcp-idle-timeout-s",
            "60",
            "--udp-idle-timeout-s",
            "30",
            "--tx-iface",
            "eth1",
            "--tx-iface",
            "eth2",
            "--flow-hash-seed",
            "0xC0FFEE",
            "--bird-socket",
            "/run/bird/bird.ctl",
            "--announce-floor",
            "2",
            "--announce-hold-s",
            "5",
        ])
        .unwrap()
        .daemon;
        assert_eq!(d.xdp_mode, XdpModeArg::Generic);
        assert_eq!(d.outer_src, Some(OuterSrc4 { addr: "10.0.0.0".parse().unwrap(), prefix: 24 }));
        assert_eq!(d.outer_src6, Some(OuterSrc6 { addr: "fd00::".parse().unwrap(), prefix: 112 }));
        assert_eq!((d.tcp_idle_timeout_s, d.udp_idle_timeout_s), (60, 30));
        assert_eq!(d.tx_ifaces, ["eth1", "eth2"]);
        assert_eq!(d.flow_hash_seed, 0xc0ffee);
        assert_eq!(d.announce.bird_socket, Some(PathBuf::from("/run/bird/bird.ctl")));
        assert_eq!((d.announce.announce_floor, d.announce.announce_hold_s), (2, 5));
        assert_eq!(parse(&["--iface", "eth0", "--flow-hash-seed", "12"]).unwrap().daemon.flow_hash_seed, 12);
    }

    #[test]
    fn probe_path_options() {
        let names = |d: &DaemonArgs| {
            let n = d.vip_path.names(&d.pin_dir);
            (n.device, n.table, n.mark)
        };
        let d = parse(&["--iface", "eth0"]).unwrap().daemon;
        assert_eq!(names(&d), ("spw-probe".to_owned(), 5357, 0x53), "the default pin directory keeps the historic names");
        let d = parse(&["--iface", "eth0", "--probe-device", "p0", "--probe-table", "100", "--probe-mark", "0x7e"]).unwrap().daemon;
        assert_eq!(names(&d), ("p0".to_owned(), 100, 0x7e));
        // Another pin directory: names of its own, and options still win.
        let d = parse(&["--iface", "eth0", "--pin-dir", "/sys/fs/bpf/other", "--probe-table", "100"]).unwrap().daemon;
        let (device, table, mark) = names(&d);
        assert!(device.starts_with("spw-p-") && device != "spw-probe" && mark != 0x53, "{device} {mark:#x}");
        assert_eq!(table, 100);
        let d = parse(&["--cleanup", "--probe-device", "p0"]).unwrap().daemon;
        assert_eq!(names(&d).0, "p0", "--cleanup removes what lbd made with the same options");
        for (flag, value) in [("--probe-table", "254"), ("--probe-mark", "0"), ("--probe-device", "a/b")] {
            let err = parse(&["--iface", "eth0", flag, value]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{flag} {value}");
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn refusals() {
        for (args, kind) in [
            (&[][..], ErrorKind::MissingRequiredArgument),
            (&["--iface", "eth0", "--xdp-mode", "offload"], ErrorKind::InvalidValue),
            (&["--iface", "eth0", "--outer-src", "fd00::1"], ErrorKind::ValueValidation),
            (&["--iface", "eth0", "--outer-src6", "fd00::/64"], ErrorKind::ValueValidation),
            (&["--iface", "eth0", "--tcp-idle-timeout-s", "0"], ErrorKind::ValueValidation),
            (&["--iface", "eth0", "--flow-hash-seed", "0x1ffffffff"], ErrorKind::ValueValidation),
            (&["--iface", "eth0", "--announce-hold-s", "0"], ErrorKind::ValueValidation),
            (&["--iface", "eth0", "--cleanup"], ErrorKind::ArgumentConflict),
            (&["--iface", "eth0", "agent", "--iface", "eth0"], ErrorKind::ArgumentConflict),
        ] {
            assert_eq!(parse(args).map(|_| ()).unwrap_err().kind(), kind, "{args:?}");
        }
        let err = parse(&["--iface", "eth0", "--outer-src6", "fd00::/64"]).unwrap_err().to_string();
        assert!(err.contains("more than 32 host bits"), "{err}");
    }

    #[test]
    fn cleanup_and_agent() {
        let a = parse(&["--cleanup", "--pin-dir", "/sys/fs/bpf/t"]).unwrap();
        assert!(a.daemon.cleanup && a.daemon.iface.is_empty());
        assert_eq!(a.daemon.pin_dir, PathBuf::from("/sys/fs/bpf/t"));
        let agent_args = ["agent", "--iface", "eth1", "--xdp-mode", "generic", "--allow-from", "10.0.0.2", "--allow-from", "fd00::/64"];
        let Some(LbdCommand::Agent(agent)) = parse(&agent_args).unwrap().command else {
            panic!("not the agent");
        };
        assert_eq!((agent.iface.as_deref(), agent.xdp_mode), (Some("eth1"), XdpModeArg::Generic));
        assert_eq!(agent.pin_dir, PathBuf::from("/sys/fs/bpf/spillway"));
        assert_eq!(agent.allow_from, ["10.0.0.2/32".parse().unwrap(), "fd00::/64".parse().unwrap()]);
        assert_eq!(parse(&["agent"]).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        // Tunnels from anywhere are not a default: the option is named when it is missing.
        let err = parse(&["agent", "--iface", "eth1"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--allow-from"), "{err}");
        assert_eq!(parse(&["agent", "--iface", "eth1", "--allow-from", "10.0.0.1/8"]).unwrap_err().kind(), ErrorKind::ValueValidation);
    }

    #[test]
    fn beside_other_xdp_programs() {
        let d = parse(&["--iface", "eth0"]).unwrap().daemon;
        assert_eq!((d.xdp_attach, &d.root_array, d.root_index, &d.pass_to), (XdpAttach::Interface, &None, 0, &None));
        let d = parse(&[
            "--iface",
            "eth0",
            "--xdp-attach",
            "none",
            "--root-array",
            "/sys/fs/bpf/edge/root",
            "--root-index",
            "3",
            "--pass-to",
            "/sys/fs/bpf/edge/after",
        ])
        .unwrap()
        .daemon;
        assert_eq!(d.xdp_attach, XdpAttach::None);
        assert_eq!((d.root_array.as_deref(), d.root_index), (Some(std::path::Path::new("/sys/fs/bpf/edge/root")), 3));
        assert_eq!(d.pass_to, Some(PathBuf::from("/sys/fs/bpf/edge/after")));
        let err = parse(&["--iface", "eth0", "--xdp-attach", "tc"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
        assert!(err.to_string().contains("--xdp-attach") && err.to_string().contains("interface, none"), "{err}");
    }

    #[test]
    fn help_shows_examples() {
        for args in [&["--help"][..], &["agent", "--help"]] {
            let help = parse(args).unwrap_err().to_string();
            assert!(help.contains("Examples:"), "{args:?}: {help}");
        }
    }
}
