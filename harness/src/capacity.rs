//! Starting the `spillway-capacity` server (src/bin/spillway-capacity.rs) on backends, and
//! reading its counters.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::host::Host;
use crate::process::{Daemon, harness_binary};

/// Overrides where the `spillway-capacity` binary is looked up.
pub const CAPACITY_BIN_ENV: &str = "SPILLWAY_CAPACITY_BIN";
const CAPACITY_BIN: &str = "spillway-capacity";
/// How long a server may take to bind and print "ready".
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on each step of [`http_get`] used for stats.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest response [`http_get`] reads.
const MAX_RESPONSE: u64 = 64 * 1024;

/// What a capacity server counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapacityStats {
    /// `/work` requests answered 200 after their service time.
    pub served: u64,
    /// `/work` requests answered 503 because every slot was taken.
    pub rejected: u64,
    /// `/health` requests answered 503 (the server asked to be taken out).
    pub health_busy: u64,
    /// Most `/work` requests ever in service at once; never above the concurrency.
    pub max_in_service: u64,
    /// `/work` requests in service now.
    pub in_service: u64,
}

/// Starts `spillway-capacity` on `host`, listening on `port` on `0.0.0.0` and `[::]` (so it
/// takes VIP traffic on backends, which hold the VIPs, and direct requests), serving at most
/// `concurrency` requests at once for `service_ms` each. Waits until it listens.
pub fn start_capacity_server(host: &Host, port: u16, concurrency: u32, service_ms: u64) -> Result<Daemon> {
    let binary = capacity_binary()?;
    let mut args = vec![binary.display().to_string()];
    for ip in [IpAddr::from([0u8; 4]), IpAddr::from([0u16; 8])] {
        args.extend(["--listen".into(), SocketAddr::new(ip, port).to_string()]);
    }
    args.extend(["--concurrency".into(), concurrency.to_string(), "--service-ms".into(), service_ms.to_string()]);
    let daemon = host.spawn(&args)?;
    daemon.wait_for_output("ready", READY_TIMEOUT).with_context(|| format!("starting capacity server on {}", host.name()))?;
    Ok(daemon)
}

/// [`start_capacity_server`] on each of `hosts`, e.g. `cluster.topo.backends()`.
pub fn start_capacity_servers(hosts: &[Host], port: u16, concurrency: u32, service_ms: u64) -> Result<Vec<Daemon>> {
    hosts.iter().map(|host| start_capacity_server(host, port, concurrency, service_ms)).collect()
}

/// The counters of the capacity server listening on `port` on `host`, asked from inside the
/// host's namespace (over loopback, so it works whatever the balancer does).
pub fn capacity_stats(host: &Host, port: u16) -> Result<CapacityStats> {
    let addr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
    let (status, body) = host.in_netns(|| http_get(addr, "/stats", STATS_TIMEOUT)).with_context(|| format!("stats of {}", host.name()))?;
    ensure!(status == 200, "stats of {}: status {status}: {body}", host.name());
    let json: Value = serde_json::from_str(&body).with_context(|| format!("stats of {}: not JSON: {body}", host.name()))?;
    let field = |key: &str| json[key].as_u64().with_context(|| format!("stats of {}: no {key} in {body}", host.name()));
    Ok(CapacityStats {
        served: field("served")?,
        rejected: field("rejected")?,
        health_busy: field("health_busy")?,
        max_in_service: field("max_in_service")?,
        in_service: field("in_service")?,
    })
}

/// One `GET path` over a fresh connection: the status and the body. Each of connect and
/// read is bounded by `timeout`. Call it inside a namespace ([`Host::in_netns`]).
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    conn.take(MAX_RESPONSE).read_to_string(&mut response).with_context(|| format!("reading the response to GET {path} from {addr}"))?;
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        bail!("incomplete response to GET {path} from {addr}: {response:?}");
    };
    let status = crate::load::parse_status(head.as_bytes()).with_context(|| format!("response to GET {path} from {addr}"))?;
    Ok((status, body.to_owned()))
}

/// The `spillway-capacity` binary (see [`harness_binary`]).
pub fn capacity_binary() -> Result<PathBuf> {
    harness_binary(CAPACITY_BIN, CAPACITY_BIN_ENV)
}
