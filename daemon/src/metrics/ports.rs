//! A host's ephemeral-port figures (its `PortsReport`) as metrics: served by `lbd agent` on
//! its own listener, and by `lbd` for the balancer host. Only public report fields are read.

use super::family::{Families, Labels};
use spillway_model::ports_report::{DestinationUsage, Level, PortsReport};

/// Destinations with a series of their own: the worst ones (the report lists the worst
/// first). The rest only count towards the per-protocol sums, so a host talking to
/// thousands of destinations still has a bounded number of series.
pub const WORST_DESTINATIONS: usize = 10;

/// OpenMetrics text of an agent's report, or of why there is none (`ports_watcher_up 0`:
/// the agent runs and decapsulates, only its watcher is missing).
pub fn ports(report: Result<&PortsReport, &str>) -> super::Exposition {
    let mut f = Families::default();
    add(&mut f, report);
    f.encode("spillway")
}

/// An agent's metrics: its port figures, and what its decapsulation did with each packet
/// (`reason` by `DecapReason` label; second chance shows as `second_chance_*`), and the
/// ports endpoint's connections closed unanswered.
pub fn agent(report: Result<&PortsReport, &str>, decap: &[(&'static str, u64)], refused: u64) -> super::Exposition {
    let mut f = Families::default();
    add(&mut f, report);
    let mut packets = f.counter("decap_packets", "Packets the backend's decapsulation saw, by what it did with them.", None);
    for (reason, n) in decap {
        packets.counter(vec![("reason", (*reason).to_owned())], *n);
    }
    f.counter("ports_endpoint_refused", "Connections to the ports endpoint closed unanswered: the peer is not in --allow-from.", None)
        .counter(Labels::new(), refused);
    f.encode("spillway")
}

/// Adds the port families for `report` to `f`.
pub(super) fn add(f: &mut Families, report: Result<&PortsReport, &str>) {
    f.gauge("ports_watcher_up", "1 when the socket watcher reports this host's ports, 0 when it is not loaded.", None)
        .gauge(Labels::new(), f64::from(u8::from(report.is_ok())));
    let Ok(report) = report else { return };
    if let Some(watcher) = &report.watcher {
        f.gauge("ports_watcher_mode", "1 for how the watcher hooks the kernel (btf, tracepoint, sock_diag).", None)
            .gauge(vec![("mode", watcher.mode.to_string())], 1.0);
    }
    let worst = report.level();
    let mut level = f.gauge("ports_level", "1 for the worst ephemeral-port level over the host's destinations (ok, warn, critical).", None);
    for (l, name) in [(Level::Ok, "ok"), (Level::Warn, "warn"), (Level::Critical, "critical")] {
        level.gauge(vec![("level", name.to_owned())], f64::from(u8::from(l == worst)));
    }
    let max = report.destinations.iter().filter_map(|d| d.utilisation).fold(0.0, f64::max);
    f.gauge("ports_max_utilisation_ratio", "Highest share of usable ephemeral ports held towards one destination.", None)
        .gauge(Labels::new(), max);
    f.gauge("ports_destinations", "Destinations holding ports or with failures.", None)
        .gauge(Labels::new(), report.destinations.len() as f64);
    let protocols = ["tcp", "udp"];
    let by_protocol = |value: fn(&DestinationUsage) -> u64, protocol: &str| {
        report.destinations.iter().filter(|d| d.protocol == protocol).map(value).sum::<u64>()
    };
    let mut in_use = f.gauge("ports_in_use", "Local ports held towards all destinations, by protocol (TCP includes TIME_WAIT).", None);
    for p in protocols {
        in_use.gauge(vec![("protocol", p.to_owned())], by_protocol(|d| d.in_use, p) as f64);
    }
    let mut failures = f.counter("ports_failures", "Calls that failed for want of a port since the watcher loaded, by protocol.", None);
    for p in protocols {
        failures.counter(vec![("protocol", p.to_owned())], by_protocol(|d| d.failures, p));
    }
    let labels = |d: &DestinationUsage| -> Labels {
        vec![
            ("netns", d.netns.to_string()),
            ("protocol", d.protocol.clone()),
            ("local", d.local.to_string()),
            ("remote", d.remote.to_string()),
            ("remote_port", d.remote_port.to_string()),
        ]
    };
    let worst = || report.destinations.iter().take(WORST_DESTINATIONS);
    let mut held = f.gauge("ports_destination_in_use", "Local ports held towards one of the worst destinations.", None);
    for d in worst() {
        held.gauge(labels(d), d.in_use as f64);
    }
    let mut share =
        f.gauge("ports_destination_utilisation_ratio", "Share of usable ports held towards one of the worst destinations.", None);
    for d in worst() {
        if let Some(u) = d.utilisation {
            share.gauge(labels(d), u);
        }
    }
    let suspects = report.leak_suspects.iter().map(|l| l.count).sum::<u64>();
    f.gauge("ports_close_wait_leaked_sockets", "Sockets in CLOSE_WAIT past the leak threshold.", None)
        .gauge(Labels::new(), suspects as f64);
    let d = &report.dropped;
    let mut dropped =
        f.counter("ports_dropped_events", "Events the watcher could not record because a table was full (counts may be low).", None);
    for (table, n) in [
        ("sock", d.sock_table_full),
        ("key", d.key_table_full),
        ("fail", d.fail_table_full),
        ("close_wait", d.close_wait_table_full),
        ("udp_sock", d.udp_sock_table_full),
        ("udp_key", d.udp_key_table_full),
        ("pending", d.pending_table_full),
    ] {
        dropped.counter(vec![("table", table.to_owned())], n);
    }
}
