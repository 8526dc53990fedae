//! Starting the `spillway-echo` test server (src/bin/spillway-echo.rs) on backends.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::addrs::{VIP4, VIP6};
use crate::host::Host;
use crate::process::{Daemon, harness_binary};

/// Overrides where the `spillway-echo` binary is looked up.
pub const ECHO_BIN_ENV: &str = "SPILLWAY_ECHO_BIN";
const ECHO_BIN: &str = "spillway-echo";
/// How long a server may take to bind its sockets and print "ready".
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts `spillway-echo` on `host`, named after it, and waits until it
/// listens: TCP `tcp_port` on `0.0.0.0` and `[::]`; UDP `udp_port` on both VIPs
/// (so DSR replies come from the VIP) and on the host's own addresses (so
/// UDP can be tested without the balancer). Only valid on backends, which
/// hold the VIPs.
pub fn start_echo(host: &Host, tcp_port: u16, udp_port: u16) -> Result<Daemon> {
    let binary = echo_binary()?;
    let mut args = vec![binary.display().to_string(), "--name".into(), host.name().into()];
    for ip in [IpAddr::from([0u8; 4]), IpAddr::from([0u16; 8])] {
        args.extend(["--tcp".into(), SocketAddr::new(ip, tcp_port).to_string()]);
    }
    let udp_ips = [VIP4.into(), VIP6.into(), host.ipv4().into(), host.ipv6().into()];
    for ip in udp_ips {
        args.extend(["--udp".into(), SocketAddr::new(ip, udp_port).to_string()]);
    }
    let daemon = host.spawn(&args)?;
    daemon.wait_for_output("ready", READY_TIMEOUT).with_context(|| format!("starting echo server on {}", host.name()))?;
    Ok(daemon)
}

/// The `spillway-echo` binary (see [`harness_binary`]).
pub fn echo_binary() -> Result<PathBuf> {
    harness_binary(ECHO_BIN, ECHO_BIN_ENV)
}
