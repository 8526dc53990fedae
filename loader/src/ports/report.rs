//! Turns the sockwatch counts into a per-destination utilisation report. Field names are a
//! public interface (JSON): add, never rename.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::leaks::{Holder, LeakSuspect, leak_suspects};
use super::maps::{IPPROTO_UDP, PortKey};
use super::mode::WatcherStatus;
use super::range::NetnsPorts;
use super::snapshot::{Counts, Snapshot};

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

/// Builds the report; `ports(netns)` gives a namespace's range, `owners` the processes
/// holding socket inodes (see [`leak_suspects`]). Destinations holding no port and with no
/// failure are left out.
pub fn build_report(
    snapshot: &Snapshot,
    mut ports: impl FnMut(u32) -> Option<NetnsPorts>,
    owners: impl FnOnce(&HashSet<u64>) -> HashMap<u64, Vec<Holder>>,
    thresholds: Thresholds,
) -> PortsReport {
    let mut udp_per_netns: HashMap<u32, u64> = HashMap::new();
    for (key, count) in &snapshot.udp {
        *udp_per_netns.entry(key.netns).or_default() += count;
    }
    let udp_sums: HashMap<PortKey, u64> = snapshot.udp.iter().copied().filter(|(_, count)| *count > 0).collect();
    // UDP keys in the kernel's destination map only carry failures: one row with the sum.
    let mut udp_done = HashSet::new();
    let mut destinations: Vec<DestinationUsage> = snapshot
        .destinations
        .iter()
        .filter_map(|(key, counts)| {
            if key.proto == IPPROTO_UDP {
                let active = udp_sums.get(key).copied().unwrap_or(0);
                udp_done.insert(*key);
                let counts = Counts { failures: counts.failures, ..Counts::default() };
                let competing = udp_per_netns.get(&key.netns).copied().unwrap_or(0);
                return (active > 0 || counts.failures > 0).then(|| usage(key, &counts, active, 0, competing, &mut ports, &thresholds));
            }
            // A negative count would mean a missed open: show it as zero, never wrap.
            let active = counts.active.max(0) as u64;
            let held = active + counts.time_wait;
            (held > 0 || counts.failures > 0).then(|| usage(key, counts, active, counts.time_wait, held, &mut ports, &thresholds))
        })
        .collect();
    let udp = snapshot.udp.iter().filter(|(key, count)| *count > 0 && !udp_done.contains(key));
    destinations
        .extend(udp.map(|(key, count)| usage(key, &Counts::default(), *count, 0, udp_per_netns[&key.netns], &mut ports, &thresholds)));
    destinations.sort_by(|a, b| b.utilisation.unwrap_or(0.0).total_cmp(&a.utilisation.unwrap_or(0.0)).then(b.in_use.cmp(&a.in_use)));
    let mut failures: Vec<ProcessFailures> = snapshot
        .failures
        .iter()
        .map(|&(fail, count)| ProcessFailures {
            netns: fail.key.netns,
            local: fail.key.local(),
            remote: fail.key.remote(),
            remote_port: fail.key.rport,
            pid: fail.tgid,
            comm: fail.comm(),
            cgroup_id: fail.cgroup,
            failures: count,
            protocol: fail.key.protocol().to_owned(),
            call: fail.call_name().to_owned(),
            errno: fail.errno_name(),
        })
        .collect();
    failures.sort_by_key(|f| std::cmp::Reverse(f.failures));
    let [
        sock_table_full,
        key_table_full,
        fail_table_full,
        close_wait_table_full,
        udp_sock_table_full,
        udp_key_table_full,
        pending_table_full,
    ] = snapshot.stats;
    let dropped = Dropped {
        sock_table_full,
        key_table_full,
        fail_table_full,
        close_wait_table_full,
        udp_sock_table_full,
        udp_key_table_full,
        pending_table_full,
    };
    let leak_suspects = leak_suspects(&snapshot.close_wait, snapshot.now, thresholds.close_wait_secs, owners);
    PortsReport { thresholds, destinations, failures, dropped, leak_suspects, watcher: None }
}

/// One destination's row; `competing`: the ports counted against the range (see
/// [`DestinationUsage::utilisation`]).
fn usage(
    key: &PortKey,
    counts: &Counts,
    active: u64,
    time_wait: u64,
    competing: u64,
    ports: &mut impl FnMut(u32) -> Option<NetnsPorts>,
    thresholds: &Thresholds,
) -> DestinationUsage {
    let port_range = ports(key.netns);
    let usable_ports = port_range.map(|p| p.usable());
    let utilisation = usable_ports.map(|u| if u == 0 { 1.0 } else { competing as f64 / f64::from(u) });
    let level = match utilisation {
        None => Level::Unknown,
        Some(u) if u >= thresholds.critical => Level::Critical,
        Some(u) if u >= thresholds.warn => Level::Warn,
        Some(_) => Level::Ok,
    };
    DestinationUsage {
        netns: key.netns,
        protocol: key.protocol().to_owned(),
        local: key.local(),
        remote: key.remote(),
        remote_port: key.rport,
        active,
        time_wait,
        in_use: active + time_wait,
        failures: counts.failures,
        opened: counts.opened,
        port_range,
        usable_ports,
        utilisation,
        level,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::{Counts, FailKey, PortKey};

    fn key(port: u16) -> PortKey {
        PortKey::tcp(42, "10.0.0.11".parse().unwrap(), "10.0.0.101".parse().unwrap(), port)
    }

    #[test]
    fn levels_follow_thresholds_and_worst_comes_first() {
        let counts = |active, time_wait| Counts { active, time_wait, ..Counts::default() };
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"curl");
        let snapshot = Snapshot {
            destinations: vec![
                (key(1), counts(10, 0)),
                (key(2), counts(50, 20)),
                (key(3), counts(60, 35)),
                (key(4), counts(0, 0)),
                (key(5), counts(-1, 0)),
            ],
            failures: vec![(FailKey { key: key(3), tgid: 9, call: 0, err: 99, cgroup: 1, comm }, 4)],
            stats: [0, 1, 0, 0, 0, 0, 0],
            now: 1010,
            ..Snapshot::default()
        };
        let ports = NetnsPorts { low: 40000, high: 40099, reserved: 0 };
        let report = build_report(&snapshot, |ns| (ns == 42).then_some(ports), no_owners, Thresholds::default());
        let got: Vec<_> = report.destinations.iter().map(|d| (d.remote_port, d.level, d.in_use)).collect();
        assert_eq!(got, [(3, Level::Critical, 95), (2, Level::Warn, 70), (1, Level::Ok, 10)]);
        assert_eq!(report.level(), Level::Critical);
        assert_eq!(report.failures[0].comm, "curl");
        assert_eq!((report.failures[0].call.as_str(), report.failures[0].errno.as_str()), ("connect", "EADDRNOTAVAIL"));
        assert_eq!(report.dropped.key_table_full, 1);

        let json = serde_json::to_value(&report).unwrap();
        let first = &json["destinations"][0];
        assert_eq!(first["remote"], "10.0.0.101");
        assert_eq!(first["level"], "critical");
        assert_eq!(first["port_range"]["low"], 40000);
        assert_eq!(first["utilisation"], 0.95);
        assert_eq!(json["failures"][0]["pid"], 9);

        let unknown = build_report(&snapshot, |_| None, no_owners, Thresholds::default());
        assert!(unknown.destinations.iter().all(|d| d.level == Level::Unknown && d.utilisation.is_none()));
        assert_eq!(unknown.level(), Level::Ok);
    }

    fn no_owners(_: &HashSet<u64>) -> HashMap<u64, Vec<Holder>> {
        HashMap::new()
    }

    #[test]
    fn udp_utilisation_counts_every_udp_socket_of_the_namespace() {
        let local = "10.0.0.11".parse().unwrap();
        let udp = |remote: &str, port| PortKey::udp(42, local, remote.parse().unwrap(), port);
        let snapshot = Snapshot {
            udp: vec![
                (udp("10.0.0.53", 53), 60),
                (udp("0.0.0.0", 0), 15),
                (PortKey::udp(7, local, local, 9), 99),
                (udp("10.0.0.54", 53), 0),
            ],
            ..Snapshot::default()
        };
        let ports = NetnsPorts { low: 40000, high: 40099, reserved: 0 };
        let report = build_report(&snapshot, |ns| (ns == 42).then_some(ports), no_owners, Thresholds::default());
        let got: Vec<_> =
            report.destinations.iter().map(|d| (d.protocol.as_str(), d.remote_port, d.in_use, d.utilisation, d.level)).collect();
        assert_eq!(
            got,
            [("udp", 53, 60, Some(0.75), Level::Warn), ("udp", 0, 15, Some(0.75), Level::Warn), ("udp", 9, 99, None, Level::Unknown)]
        );
    }

    #[test]
    fn udp_failures_share_the_row_of_their_destination() {
        let any = "0.0.0.0".parse().unwrap();
        let unconnected = PortKey::udp(42, any, any, 0);
        let dns = PortKey::udp(42, any, "10.0.0.53".parse().unwrap(), 53);
        let failed = |failures| Counts { failures, ..Counts::default() };
        let mut comm = [0u8; 16];
        comm[..3].copy_from_slice(b"app");
        let bind = FailKey { key: unconnected, tgid: 7, call: crate::ports::CALL_BIND, err: 98, cgroup: 1, comm };
        let snapshot = Snapshot {
            destinations: vec![(unconnected, failed(3)), (dns, failed(2))],
            udp: vec![(unconnected, 100)],
            failures: vec![(bind, 3)],
            ..Snapshot::default()
        };
        let ports = NetnsPorts { low: 40000, high: 40099, reserved: 0 };
        let report = build_report(&snapshot, |_| Some(ports), no_owners, Thresholds::default());
        let got: Vec<_> = report.destinations.iter().map(|d| (d.remote_port, d.in_use, d.failures, d.level)).collect();
        assert_eq!(got, [(0, 100, 3, Level::Critical), (53, 0, 2, Level::Critical)], "one row per key; the namespace's range is full");
        let fail = &report.failures[0];
        assert_eq!((fail.protocol.as_str(), fail.call.as_str(), fail.errno.as_str(), fail.pid), ("udp", "bind", "EADDRINUSE", 7));
    }

    #[test]
    fn reports_round_trip_and_older_json_still_parses() {
        let mut record = crate::ports::CloseWaitRecord { since: 100, inode: 5, lport: 80, ..Default::default() };
        record.key = key(40000);
        let snapshot = Snapshot { close_wait: vec![record], now: 131, ..Snapshot::default() };
        let owners = |_: &HashSet<u64>| HashMap::from([(5, vec![Holder { pid: 3, comm: "app".into() }])]);
        let report = build_report(&snapshot, |_| None, owners, Thresholds::default());
        assert_eq!(report.leak_suspects.len(), 1);
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<PortsReport>(&json).unwrap(), report);

        // Written before leak suspects, UDP drops and the CLOSE_WAIT threshold existed.
        let old = r#"{"thresholds":{"warn":0.7,"critical":0.9},"destinations":[],"failures":[],
            "dropped":{"sock_table_full":0,"key_table_full":0,"fail_table_full":0}}"#;
        let old: PortsReport = serde_json::from_str(old).unwrap();
        // A failure row from before bind/UDP failures were counted: a TCP connect.
        let row = r#"{"netns":1,"local":"10.0.0.1","remote":"10.0.0.2","remote_port":80,"pid":3,"comm":"a","cgroup_id":1,"failures":2}"#;
        let row: ProcessFailures = serde_json::from_str(row).unwrap();
        assert_eq!((row.protocol.as_str(), row.call.as_str(), row.errno.as_str()), ("tcp", "connect", "EADDRNOTAVAIL"));
        assert_eq!(old.thresholds, Thresholds::default());
        assert!(old.leak_suspects.is_empty());
    }
}
