//! The report of ephemeral-port use that the port watcher builds (`lbd`'s own, and each
//! agent's, served over HTTP and read by `lbd`), and the watcher's status inside it. Field
//! names are a public interface (JSON): add, never rename.

mod status;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use status::{Mode, Part, Refusal, WatcherStatus, parts};

/// Utilisation levels, as fractions of the usable ephemeral ports, and the CLOSE_WAIT age
/// that makes a socket a leak suspect.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub warn: f64,
    pub critical: f64,
    /// Seconds in CLOSE_WAIT after which a socket is a leak suspect.
    #[serde(default = "default_close_wait_secs")]
    pub close_wait_secs: u64,
}

const DEFAULT_CLOSE_WAIT_SECS: u64 = 30;

fn default_close_wait_secs() -> u64 {
    DEFAULT_CLOSE_WAIT_SECS
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { warn: 0.70, critical: 0.90, close_wait_secs: DEFAULT_CLOSE_WAIT_SECS }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The namespace's port range is unknown (namespace gone or unreadable).
    Unknown,
    Ok,
    Warn,
    Critical,
}

/// Ports held towards one destination from one namespace and local address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DestinationUsage {
    pub netns: u32,
    /// `tcp` or `udp`.
    pub protocol: String,
    pub local: IpAddr,
    /// For an unconnected UDP socket, the unspecified address and port 0.
    pub remote: IpAddr,
    pub remote_port: u16,
    /// TCP: sockets from SYN_SENT until CLOSE (ESTABLISHED, FIN_WAIT*, CLOSE_WAIT, ...).
    /// UDP: sockets holding a port bind() did not name (autobound, or bound to port 0).
    pub active: u64,
    /// TIME_WAIT sockets created in the last 60 s (an upper bound: early reuse is unseen).
    pub time_wait: u64,
    /// `active + time_wait`: local ports this destination holds.
    pub in_use: u64,
    /// Cumulative calls that failed for want of a port since the watcher was loaded: TCP
    /// `connect()` (EADDRNOTAVAIL), `bind()` to port 0 (EADDRINUSE; local is the address
    /// asked for, remote unspecified), UDP `connect()` autobind
    /// (EAGAIN; local unspecified). `failures` per process tells the calls apart.
    pub failures: u64,
    /// Cumulative active opens since the watcher was loaded (TCP).
    pub opened: u64,
    /// `ip_local_port_range` of the namespace, if known.
    pub port_range: Option<NetnsPorts>,
    /// Range size minus reserved ports.
    pub usable_ports: Option<u32>,
    /// TCP: `in_use / usable_ports` (connect() may reuse a port towards another
    /// destination). UDP: all of the namespace's UDP sockets on ephemeral ports over
    /// `usable_ports`, since a UDP port is taken for every destination (autobind picks it
    /// before connect() sets any address).
    pub utilisation: Option<f64>,
    pub level: Level,
}

/// A process whose calls failed for want of a port (one row per destination, call and
/// errno; see [`DestinationUsage::failures`] for the addresses).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessFailures {
    pub netns: u32,
    pub local: IpAddr,
    pub remote: IpAddr,
    pub remote_port: u16,
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub failures: u64,
    /// `tcp` or `udp` (reports from before bind/UDP failures were counted: `tcp`).
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// `connect` or `bind`.
    #[serde(default = "default_call")]
    pub call: String,
    /// What the call returned: `EADDRNOTAVAIL` (TCP connect), `EADDRINUSE` (bind to port 0),
    /// `EAGAIN` (UDP autobind).
    #[serde(default = "default_errno")]
    pub errno: String,
}

fn default_protocol() -> String {
    "tcp".into()
}

fn default_call() -> String {
    "connect".into()
}

fn default_errno() -> String {
    "EADDRNOTAVAIL".into()
}

/// Events the kernel side dropped because a map was full (non-zero: counts may be low).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    pub sock_table_full: u64,
    pub key_table_full: u64,
    pub fail_table_full: u64,
    /// Sockets entering CLOSE_WAIT that could not be tracked (leak suspects may be missed).
    #[serde(default)]
    pub close_wait_table_full: u64,
    /// New UDP sockets that could not be tracked (UDP counts may be low).
    #[serde(default)]
    pub udp_sock_table_full: u64,
    /// UDP sockets left out of this report because the destination table was full.
    #[serde(default)]
    pub udp_key_table_full: u64,
    /// bind/connect calls that could not be followed to their return (a
    /// failure among them is not counted).
    #[serde(default)]
    pub pending_table_full: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PortsReport {
    pub thresholds: Thresholds,
    /// Worst first: by utilisation, then by ports in use.
    pub destinations: Vec<DestinationUsage>,
    pub failures: Vec<ProcessFailures>,
    pub dropped: Dropped,
    /// Processes holding sockets in CLOSE_WAIT longer than `thresholds.close_wait_secs`,
    /// most sockets first.
    #[serde(default)]
    pub leak_suspects: Vec<LeakSuspect>,
    /// The watcher's mode and what it does and does not watch (absent in reports of
    /// agents from before the modes existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watcher: Option<WatcherStatus>,
}

impl PortsReport {
    /// The worst level over all destinations (`Ok` when there are none).
    pub fn level(&self) -> Level {
        self.destinations.iter().map(|d| d.level).filter(|l| *l != Level::Unknown).max().unwrap_or(Level::Ok)
    }
}

/// One process (or, with no `pid`, no process) holding sockets in CLOSE_WAIT for longer
/// than the threshold, in one network namespace. Field names are a public interface (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakSuspect {
    pub netns: u32,
    /// The holding process. `None`: no process holds the sockets: never accepted (still in
    /// a listener's queue), or the holder exited between the read and the lookup.
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// cgroup2 id of the oldest socket (an accepted socket carries its listener's).
    pub cgroup_id: u64,
    /// Its sockets in CLOSE_WAIT for at least the threshold.
    pub count: u64,
    /// Seconds the oldest of them has been in CLOSE_WAIT.
    pub oldest_age_secs: u64,
    /// Their distinct local ports (the service), lowest first, at most 16.
    pub local_ports: Vec<u16>,
}

/// The ports `connect()` may pick from in one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsPorts {
    pub low: u16,
    pub high: u16,
    /// Reserved ports inside `low..=high`.
    pub reserved: u32,
}

impl NetnsPorts {
    /// Ports connect() can use: the range minus the reserved ones.
    pub fn usable(&self) -> u32 {
        (u32::from(self.high) + 1).saturating_sub(u32::from(self.low)).saturating_sub(self.reserved)
    }

    /// Parses the two sysctl files' contents (`ip_local_port_range`, `ip_local_reserved_ports`).
    pub fn parse(range: &str, reserved: &str) -> Option<NetnsPorts> {
        let mut fields = range.split_whitespace().map(str::parse::<u16>);
        let (low, high) = (fields.next()?.ok()?, fields.next()?.ok()?);
        if low > high {
            return None;
        }
        let reserved = parse_port_list(reserved)?
            .into_iter()
            .map(|(a, b)| {
                let (a, b) = (a.max(low), b.min(high));
                if a > b { 0 } else { u32::from(b) - u32::from(a) + 1 }
            })
            .sum();
        Some(NetnsPorts { low, high, reserved })
    }
}

/// Parses a port list like `ip_local_reserved_ports`: `"1000,2000-2005"` (empty: none).
/// Overlapping entries are not merged.
pub fn parse_port_list(list: &str) -> Option<Vec<(u16, u16)>> {
    list.trim()
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let item = item.trim();
            match item.split_once('-') {
                Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
                None => item.parse().ok().map(|p| (p, p)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_range_and_counts_reserved_inside_it() {
        let ports = NetnsPorts::parse("32768\t60999\n", "100,32768-32777,60999,61000-62000\n").unwrap();
        assert_eq!((ports.low, ports.high), (32768, 60999));
        assert_eq!(ports.reserved, 11);
        assert_eq!(ports.usable(), 28232 - 11);
        assert_eq!(NetnsPorts::parse("40000 40099", "").unwrap().usable(), 100);
        assert!(NetnsPorts::parse("5 4", "").is_none());
        assert!(NetnsPorts::parse("40000 40099", "x").is_none());
        assert_eq!(parse_port_list(" \n"), Some(vec![]));
    }
}
