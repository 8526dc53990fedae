//! Tables for VIPs and backends with their health, and for port pressure.

use super::table::{Align, Table, printable};
use spillway_api::{BackendEntry, BackendList, PortsView, VipHealthView, VipList, announce::AnnouncementView};
use spillway_model::ports_report::PortsReport;

/// `lbctl vips list`.
pub(super) const VIPS_COLUMNS: &[(&str, Align)] = &[
    ("VIP", Align::Left),
    ("RING_SIZE", Align::Right),
    ("ENCAP", Align::Left),
    ("HASH", Align::Left),
    ("BACKENDS", Align::Right),
    ("PROBE", Align::Left),
    ("HEALTHY_WEIGHT", Align::Right),
    ("PANIC", Align::Left),
    ("BUDGET/S", Align::Right),
    ("SPILL/S", Align::Right),
    ("ANNOUNCED", Align::Left),
];

/// `lbctl backends list`.
pub(super) const BACKENDS_COLUMNS: &[(&str, Align)] = &[
    ("BACKEND", Align::Left),
    ("WEIGHT", Align::Right),
    ("STATE", Align::Left),
    ("HEALTH", Align::Left),
    ("EFFECTIVE", Align::Right),
    ("ZONE", Align::Left),
    ("ENCAP", Align::Left),
    ("LATENCY_MS", Align::Right),
    ("PORTS", Align::Left),
    ("FOR_S", Align::Right),
    ("REASON", Align::Left),
];

/// `lbctl ports`: ports held per destination.
pub(super) const DESTINATION_COLUMNS: &[(&str, Align)] = &[
    ("PROTO", Align::Left),
    ("LOCAL", Align::Left),
    ("REMOTE", Align::Left),
    ("IN_USE", Align::Right),
    ("TIME_WAIT", Align::Right),
    ("USABLE", Align::Right),
    ("UTIL", Align::Right),
    ("LEVEL", Align::Left),
    ("FAILURES", Align::Right),
];

/// `lbctl ports`: processes whose calls found no free port.
pub(super) const FAILURE_COLUMNS: &[(&str, Align)] =
    &[("PID", Align::Right), ("COMM", Align::Left), ("REMOTE", Align::Left), ("FAILURES", Align::Right)];

/// `lbctl ports`: processes leaving sockets in CLOSE_WAIT.
pub(super) const LEAK_COLUMNS: &[(&str, Align)] =
    &[("PID", Align::Right), ("COMM", Align::Left), ("CLOSE_WAIT", Align::Right), ("OLDEST_S", Align::Right), ("LOCAL_PORTS", Align::Left)];

/// Milliseconds with the digits that mean something: 0.214, 3.05, 12.3, 250.
fn latency(ms: f64) -> String {
    match ms {
        ..1.0 => format!("{ms:.3}"),
        ..10.0 => format!("{ms:.2}"),
        ..100.0 => format!("{ms:.1}"),
        _ => format!("{ms:.0}"),
    }
}

fn dash() -> String {
    "-".to_owned()
}

/// Alerts first, loud, so they are not lost above a long table.
fn with_alerts(alerts: &[String], table: String) -> String {
    let mut out: String = alerts.iter().map(|a| format!("{}\n", printable(a))).collect();
    out.push_str(&table);
    out
}

pub fn vips_table(list: &VipList) -> String {
    let mut t = Table::new(VIPS_COLUMNS);
    for v in &list.vips {
        let (probe, healthy, panic, spill) = match &v.health {
            Some(h) => (
                serde_json::to_value(&h.probe)
                    .ok()
                    .and_then(|p| p["kind"].as_str().map(|kind| format!("{kind}/{}", h.probe_path)))
                    .unwrap_or_else(dash),
                format!("{}/{}", h.healthy_weight, h.total_weight),
                panic_cell(h),
                h.spill_per_s.to_string(),
            ),
            None => (dash(), dash(), dash(), dash()),
        };
        let budget = v.effective_budget.map_or_else(dash, |b| b.per_s.to_string());
        let announced = v.announcement.as_ref().map_or_else(dash, announced);
        t.row(vec![
            v.vip.to_string(),
            v.ring_size.to_string(),
            v.encap.to_string(),
            match v.source_prefix {
                Some(len) => format!("{}/{len}", v.hash),
                None => v.hash.to_string(),
            },
            v.backends.to_string(),
            probe,
            healthy,
            panic,
            budget,
            spill,
            announced,
        ]);
    }
    with_alerts(&list.alerts, t.render())
}

/// Panic, the ejection cap, and how many backends fail only through the VIP path (the VIP
/// path, not the hosts, is broken: VIP missing from their `lo`, decapsulation detached).
fn panic_cell(h: &VipHealthView) -> String {
    let mut notes = Vec::new();
    let state = match (h.panic, h.fail_closed) {
        (false, _) => "no",
        (true, false) => {
            notes.push("fail open".to_owned());
            "PANIC"
        }
        (true, true) => {
            notes.push("fail closed".to_owned());
            "PANIC"
        }
    };
    if h.ejection_capped && !h.panic {
        notes.push("ejection capped".to_owned());
    }
    if h.vip_path_failed > 0 {
        notes.push(format!("{} vip_path_failed", h.vip_path_failed));
    }
    if notes.is_empty() { state.to_owned() } else { format!("{state} ({})", notes.join("; ")) }
}

/// `yes`, `DEGRADED (reason, N/K peers)`, `no (reason)`: loud when not plainly announced.
fn announced(a: &AnnouncementView) -> String {
    let peers = a.peers.map_or_else(|| "?".to_owned(), |n| n.to_string());
    match a.state.as_str() {
        "announced" => "yes".to_owned(),
        "degraded" if a.held => format!("DEGRADED ({}, held: {peers}/{} peers)", a.reason, a.floor),
        "degraded" => format!("DEGRADED ({}, {peers}/{} peers)", a.reason, a.floor),
        _ => format!("no ({})", a.reason),
    }
}

pub fn backends_table(list: &BackendList) -> String {
    // QUIC VIPs only: the others' tables stay as they were.
    let quic = list.backends.iter().any(|b| b.server_id.is_some());
    let mut columns = BACKENDS_COLUMNS.to_vec();
    if quic {
        columns.insert(columns.len() - 1, ("SERVER_ID", Align::Left));
    }
    let mut t = Table::new(&columns);
    for b in &list.backends {
        let mut health = b.health.clone().unwrap_or_else(dash);
        if b.kept_in {
            health.push_str(" (kept in)");
        }
        if b.unknown_probes > 0 {
            health.push_str(&format!(" ({} unknown)", b.unknown_probes));
        }
        let mut reason = b.reason.clone().unwrap_or_else(dash);
        if let Some(s) = b.drain_deadline_in_s {
            reason.push_str(&format!(" (removed in {s} s)"));
        }
        let mut row = vec![
            b.address.to_string(),
            b.weight.to_string(),
            b.state.label().to_owned(),
            health,
            b.effective_weight.map_or_else(dash, |w| w.to_string()),
            b.options.zone.clone().unwrap_or_else(dash),
            b.encap.to_string(),
            b.latency_ms.map_or_else(dash, latency),
            ports_cell(b),
            b.state_for_s.map_or_else(dash, |s| s.to_string()),
        ];
        if quic {
            row.push(b.server_id.clone().unwrap_or_else(dash));
        }
        row.push(reason);
        t.row(row);
    }
    with_alerts(&list.alerts, t.render())
}

/// The agent's port pressure, or that the agent does not answer (its pressure is then
/// unknown, whatever was last reported).
fn ports_cell(b: &BackendEntry) -> String {
    match b.agent_unreachable_s {
        Some(_) => "agent unreachable".to_owned(),
        None => b.pressure.clone().unwrap_or_else(dash),
    }
}

pub fn ports_tables(view: &PortsView) -> String {
    let mut out = format!("host {} (report {} s old)\n", printable(&view.host), view.age_s);
    if let Some(error) = &view.error {
        out.push_str(&format!("no report: {}\n", printable(error)));
    }
    if let Some(stale) = &view.stale {
        out.push_str(&format!("stale: {}\n", printable(stale)));
    }
    if let Some(report) = &view.report {
        out.push_str(&report_tables(report));
    }
    out
}

fn report_tables(report: &PortsReport) -> String {
    let mut d = Table::new(DESTINATION_COLUMNS);
    for u in &report.destinations {
        d.row(vec![
            u.protocol.clone(),
            u.local.to_string(),
            format!("{}:{}", u.remote, u.remote_port),
            u.in_use.to_string(),
            u.time_wait.to_string(),
            u.usable_ports.map_or_else(dash, |p| p.to_string()),
            u.utilisation.map_or_else(dash, |f| format!("{:.0}%", f * 100.0)),
            format!("{:?}", u.level).to_lowercase(),
            u.failures.to_string(),
        ]);
    }
    let mut out = match &report.watcher {
        Some(watcher) => format!("watcher {}\n", printable(&watcher.summary())),
        None => String::new(),
    };
    out.push_str(&format!("level {}\n{}", format!("{:?}", report.level()).to_lowercase(), d.render()));
    if !report.failures.is_empty() {
        let mut f = Table::new(FAILURE_COLUMNS);
        for p in &report.failures {
            f.row(vec![p.pid.to_string(), p.comm.clone(), format!("{}:{}", p.remote, p.remote_port), p.failures.to_string()]);
        }
        out.push_str("\nconnect() failures for want of a port:\n");
        out.push_str(&f.render());
    }
    if !report.leak_suspects.is_empty() {
        let mut l = Table::new(LEAK_COLUMNS);
        for s in &report.leak_suspects {
            let ports: Vec<String> = s.local_ports.iter().map(u16::to_string).collect();
            l.row(vec![
                s.pid.map_or_else(dash, |p| p.to_string()),
                s.comm.clone().unwrap_or_else(|| "(no process: never accepted)".to_owned()),
                s.count.to_string(),
                s.oldest_age_secs.to_string(),
                ports.join(","),
            ]);
        }
        out.push_str(&format!("\nleak suspects (sockets in CLOSE_WAIT over {} s):\n", report.thresholds.close_wait_secs));
        out.push_str(&l.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::latency;

    #[test]
    fn latencies_keep_their_meaningful_digits() {
        assert_eq!([0.214, 3.05, 12.34, 250.4].map(latency), ["0.214", "3.05", "12.3", "250"]);
    }
}
