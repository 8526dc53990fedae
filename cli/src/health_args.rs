//! The options of `lbctl` that describe backends beyond their weight, health checks and
//! port pressure.

use std::{collections::BTreeMap, net::SocketAddr};

use clap::Args;

use super::CliError;
use spillway_model::{BackendOptions, Encap, MAX_RATE_PER_S, ProbePath, ProbeSpec};

pub const BACKENDS_OPTIONS_HELP: &str = "\
Examples:
  lbctl backends options --vip 10.0.0.1:80/tcp 10.0.1.1 --zone b --capacity 500 --spare 100
  lbctl backends options --vip 10.0.0.1:0/tcp 10.0.1.1 --probe-target 10.0.1.1:8080
  lbctl backends options --vip 10.0.0.1:80/tcp 10.0.1.9 --probe-path direct

Replaces the backend's options: those not given are cleared. --capacity is the
new flows per second the backend sustains; when every backend of a VIP declares
one, the VIP admits no more than its backends in service can take and sheds the
rest at the edge. --spare is what it can take for other zones (default: the
VIP's spare_fraction of its capacity). --probe-path overrides the VIP's for this
backend (direct: for a backend that does not serve the VIP by direct server
return).";

pub const VIPS_HEALTH_HELP: &str = "\
Examples:
  lbctl vips health 10.0.0.1:80/tcp --probe http --path /healthz --expect-status 200
  lbctl vips health 10.0.0.1:443/tcp --probe https --path /ping --host api.example.com
  lbctl vips health 10.0.0.2:53/udp --probe udp --payload 0001 --expect 0001
  lbctl vips health 10.0.0.1:80/tcp --set max_ejection_fraction=0.3 --set fail_closed=true
  lbctl vips health 10.0.0.1:80/tcp --probe-path direct
  lbctl vips health 10.0.0.1:80/tcp --reset

Changes the VIP's health checks over its current settings (or lbd's defaults).
--probe-path tunnel (the default) sends each probe to the VIP, encapsulated to
the backend as the VIP's traffic is, with a direct probe beside it: a backend
that answers only directly fails with vip_path_failed. direct probes each
backend's own address only (backends that are not set up for direct server
return).
--set takes any policy field by name (see ARCHITECTURE.md, health defaults):
interval_ms, timeout_ms, rise, fall, jitter, max_ejection_fraction,
panic_threshold, fail_closed, slow_start_ms, slow_start_floor, hold_down_base_ms,
hold_down_max_ms, flap_window_ms, slow_factor, slow_margin_ms, slow_min_peers,
slow_step, slow_floor, spare_fraction. --reset goes back to lbd's defaults
(TCP connect for TCP VIPs; UDP VIPs are then not probed).";

pub const PORTS_HELP: &str = "\
Examples:
  lbctl ports                      # the balancer host itself
  lbctl ports --host 10.0.1.1      # a backend host, from its lbd agent
  lbctl ports -o json

Ephemeral-port use per destination (local address, remote address and port,
protocol) against the host's ip_local_port_range, connect() failures for want
of a port by process, and processes leaving sockets in CLOSE_WAIT (leak
suspects). Agents are polled every 2 s; age_s says how old the report is; stale
says why a backend's report is older than the last poll (its answers since were
ignored, e.g. for a report key mismatch). Exit status 1 when there is no report
for the host (the reason is printed).

Destinations (first table):
  PROTO      tcp or udp
  LOCAL      the local address the ports are taken on
  REMOTE     the destination address:port
  IN_USE     sockets holding a local port towards it
  TIME_WAIT  of the closed ones, those whose port is still held in TIME_WAIT
  USABLE     ports of ip_local_port_range usable towards it; - if unknown
  UTIL       (IN_USE + TIME_WAIT) / USABLE
  LEVEL      ok, warn or critical against the thresholds; unknown when the
             namespace's port range cannot be read
  FAILURES   connects and binds that failed for want of a free port (refused,
             reset, timed-out and unreachable connects are not counted)
Failing processes (\"connect() failures for want of a port\"): PID, COMM,
  REMOTE and FAILURES of each process whose calls found no free port.
Leak suspects: PID, COMM, CLOSE_WAIT (its sockets in CLOSE_WAIT), OLDEST_S
  (seconds the oldest has been there) and LOCAL_PORTS.";

/// `--zone`, `--capacity`, `--spare`, `--probe-target`, `--probe-path`.
#[derive(Debug, Args)]
pub struct BackendOptionArgs {
    /// Failure domain of the backend (site, zone, rack): 1-32 of a-z 0-9 . _ -
    #[arg(long, value_name = "ZONE")]
    pub zone: Option<String>,
    /// New flows per second the backend sustains.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_RATE_PER_S)))]
    pub capacity: Option<u32>,
    /// New flows per second it can take for other zones (needs --capacity).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32))]
    pub spare: Option<u32>,
    /// Where to probe it [default: its address on the VIP's port]; through the tunnel, the
    /// VIP on this port.
    #[arg(long, value_name = "IP:PORT")]
    pub probe_target: Option<SocketAddr>,
    /// How to probe it [default: as its VIP says].
    #[arg(long, value_name = "PATH", value_enum)]
    pub probe_path: Option<ProbePath>,
    /// How to tunnel to it: ipip or gue [default: as its VIP says].
    #[arg(long, value_name = "ENCAP", value_enum)]
    pub encap: Option<Encap>,
}

impl BackendOptionArgs {
    pub fn options(&self) -> BackendOptions {
        BackendOptions {
            zone: self.zone.clone(),
            capacity_per_s: self.capacity,
            spare_per_s: self.spare,
            probe_target: self.probe_target,
            probe_path: self.probe_path,
            encap: self.encap,
        }
    }
}

/// How a VIP's backends are probed, and policy fields to change.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Probe kind: tcp, http, https or udp.
    #[arg(long, value_name = "KIND")]
    pub probe: Option<String>,
    /// HTTP(S): the path to GET [default: /].
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
    /// HTTP(S): the status that passes [default: 200].
    #[arg(long, value_name = "CODE")]
    pub expect_status: Option<u16>,
    /// HTTP(S): the Host header (and TLS server name).
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// UDP: the request datagram, in hex.
    #[arg(long, value_name = "HEX")]
    pub payload: Option<String>,
    /// UDP: the reply must start with these bytes (hex) [default: any reply].
    #[arg(long, value_name = "HEX")]
    pub expect: Option<String>,
    /// Probe through the tunnel to the VIP, or each backend's own address directly.
    #[arg(long, value_name = "PATH", value_enum)]
    pub probe_path: Option<ProbePath>,
    /// A policy field, e.g. fall=3 or fail_closed=true (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, serde_json::Value)>,
    /// Drop the VIP's own settings first (back to lbd's defaults).
    #[arg(long)]
    pub reset: bool,
}

impl HealthArgs {
    pub fn probe_spec(&self) -> Result<Option<ProbeSpec>, CliError> {
        let Self { probe, path, expect_status, host, payload, expect, .. } = self;
        match probe {
            Some(kind) => ProbeSpec::from_parts(kind, path.clone(), *expect_status, host.clone(), payload.clone(), expect.clone())
                .map(Some)
                .map_err(|e| CliError::BadOption(e.to_string())),
            None if path.is_some() || expect_status.is_some() || host.is_some() || payload.is_some() || expect.is_some() => {
                Err(CliError::BadOption("--path, --expect-status, --host, --payload and --expect need --probe".to_owned()))
            }
            None => Ok(None),
        }
    }

    pub fn policy(&self) -> BTreeMap<String, serde_json::Value> {
        self.settings.iter().cloned().collect()
    }
}

/// `field=value`; the value is read as JSON (numbers, true/false), else as a string, and
/// lbd checks the field name and the value's range.
fn parse_setting(input: &str) -> Result<(String, serde_json::Value), String> {
    let (field, value) = input.split_once('=').ok_or_else(|| format!("{input:?}: expected FIELD=VALUE, e.g. fall=3"))?;
    if field.is_empty() {
        return Err(format!("{input:?}: the field name is empty"));
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
    Ok((field.to_owned(), value))
}

/// A drain deadline: `90`, `90s`, `15m` or `2h`, in seconds.
pub fn parse_deadline(input: &str) -> Result<u64, String> {
    let (digits, unit) = match input.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => input.split_at(at),
        None => (input, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{input:?}: expected a duration such as 90s, 15m or 2h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{input:?}: unit must be s, m or h")),
    };
    match n.checked_mul(scale) {
        Some(0) | None => Err(format!("{input:?}: a deadline must be at least 1 s")),
        Some(seconds) => Ok(seconds),
    }
}
