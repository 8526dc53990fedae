//! Turns the sockwatch counts into a per-destination utilisation report
//! (`spillway_model::ports_report::PortsReport`).

use std::collections::{HashMap, HashSet};

use spillway_model::ports_report::{DestinationUsage, Dropped, Level, PortsReport, ProcessFailures, Thresholds};

use super::leaks::{Holder, leak_suspects};
use super::maps::{IPPROTO_UDP, PortKey};
use super::snapshot::{Counts, Snapshot};
use spillway_model::ports_report::NetnsPorts;

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
    use crate::{Counts, FailKey, PortKey};

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
        let bind = FailKey { key: unconnected, tgid: 7, call: crate::CALL_BIND, err: 98, cgroup: 1, comm };
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
        let mut record = crate::CloseWaitRecord { since: 100, inode: 5, lport: 80, ..Default::default() };
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
