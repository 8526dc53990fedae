//! The balancer's metrics, from one [`Sample`].

use prometheus_client::registry::Unit;

use super::family::{Families, Labels};
use spillway_policy::announce::State as AnnounceState;

use spillway_api::{
    ReasonCount,
    announce::Announcements,
    sample::{HistogramSample, Sample},
};
use spillway_model::ports_report::PortsReport;
use spillway_policy::health::{Pressure, State as BackendState};

/// OpenMetrics text of `sample`, with the balancer host's own port figures (its watcher's
/// report, or why there is none; the same families as an agent's, see [`super::ports`]).
pub fn balancer(sample: &Sample, local_ports: Result<&PortsReport, &str>) -> super::Exposition {
    let mut f = Families::default();
    traffic(&mut f, sample);
    health(&mut f, sample);
    verdicts(&mut f, sample);
    rules(&mut f, sample);
    own(&mut f, sample);
    if let Some(a) = &sample.announcements {
        announcements(&mut f, a);
    }
    super::ports::add(&mut f, local_ports);
    f.encode("spillway")
}

fn vip_label(vip: &impl ToString) -> Labels {
    vec![("vip", vip.to_string())]
}

fn backend_labels(vip: &impl ToString, backend: &impl ToString) -> Labels {
    vec![("vip", vip.to_string()), ("backend", backend.to_string())]
}

fn traffic(f: &mut Families, s: &Sample) {
    let each_vip = |f: &mut Families, name, help, unit, value: fn(&spillway_api::sample::VipSample) -> u64| {
        let mut family = f.counter(name, help, unit);
        for v in &s.vips {
            family.counter(vip_label(&v.vip), value(v));
        }
    };
    each_vip(f, "vip_packets", "Packets of the VIP's flows, dropped ones included.", None, |v| v.packets);
    each_vip(f, "vip", "Bytes of the VIP's flows (frames as received), dropped ones included.", Some(Unit::Bytes), |v| v.bytes);
    each_vip(f, "vip_new_flows", "New flows admitted and placed on a backend (connection-table entries created).", None, |v| v.new_flows);
    let each_backend = |f: &mut Families, name, help, unit, value: fn(&spillway_api::sample::BackendSample) -> u64| {
        let mut family = f.counter(name, help, unit);
        for v in &s.vips {
            for b in &v.backends {
                family.counter(backend_labels(&v.vip, &b.address), value(b));
            }
        }
    };
    each_backend(f, "backend_packets", "Packets forwarded to the backend.", None, |b| b.packets);
    each_backend(f, "backend", "Bytes forwarded to the backend (frames as received).", Some(Unit::Bytes), |b| b.bytes);
    each_backend(f, "backend_new_flows", "New flows placed on the backend.", None, |b| b.new_flows);
    let mut entries = f.gauge("vip_flow_entries", "The VIP's connection-table entries in force at the last count (every 15 s).", None);
    for v in &s.vips {
        if let Some(n) = v.flow_entries {
            entries.gauge(vip_label(&v.vip), n as f64);
        }
    }
}

fn health(f: &mut Families, s: &Sample) {
    let backends = || s.vips.iter().flat_map(|v| v.backends.iter().map(move |b| (v, b)));
    let mut weight = f.gauge("backend_weight", "The operator's weight of the backend.", None);
    for (v, b) in backends() {
        weight.gauge(backend_labels(&v.vip, &b.address), f64::from(b.weight));
    }
    let mut weight = f.gauge("backend_effective_weight", "The weight programmed after health, zones and port pressure.", None);
    for (v, b) in backends() {
        weight.gauge(backend_labels(&v.vip, &b.address), f64::from(b.effective_weight));
    }
    let mut states = f.gauge("backend_health_state", "1 for the backend's health state, 0 for the others (probed backends only).", None);
    for (v, b) in backends() {
        let Some(current) = &b.health else { continue };
        for state in BackendState::ALL {
            let mut labels = backend_labels(&v.vip, &b.address);
            labels.push(("state", state.as_str().to_owned()));
            states.gauge(labels, f64::from(u8::from(state.as_str() == current)));
        }
    }
    let mut latency = f.gauge("backend_probe_latency", "Smoothed health-probe latency of the backend.", Some(Unit::Seconds));
    for (v, b) in backends() {
        if let Some(ms) = b.latency_ms {
            latency.gauge(backend_labels(&v.vip, &b.address), ms / 1000.0);
        }
    }
    let mut pressure =
        f.gauge("backend_port_pressure", "1 for the port pressure its agent reports (none, critical, exhausted), 0 for the others.", None);
    for (v, b) in backends() {
        let Some(current) = &b.pressure else { continue };
        for level in Pressure::ALL {
            let mut labels = backend_labels(&v.vip, &b.address);
            labels.push(("level", level.as_str().to_owned()));
            pressure.gauge(labels, f64::from(u8::from(level.as_str() == current)));
        }
    }
    let checked = || s.vips.iter().filter_map(|v| Some((v, v.health.as_ref()?)));
    let mut ratio = f.gauge("vip_healthy_weight_ratio", "Healthy share of the VIP's configured weight (health-checked VIPs).", None);
    for (v, h) in checked() {
        let share = if h.total_weight == 0 { 0.0 } else { h.healthy_weight as f64 / h.total_weight as f64 };
        ratio.gauge(vip_label(&v.vip), share);
    }
    let mut panic = f.gauge("vip_panic", "1 while the VIP is in panic (too little healthy weight: spread over all backends).", None);
    for (v, h) in checked() {
        panic.gauge(vip_label(&v.vip), f64::from(u8::from(h.panic)));
    }
    let mut panics = f.counter("vip_panics", "Times the VIP entered panic since lbd started.", None);
    for (v, h) in checked() {
        panics.counter(vip_label(&v.vip), h.panics_entered);
    }
    let mut budget =
        f.gauge("vip_budget_new_flows_per_second", "The new-flow budget in force (the operator's, or lower from declared capacity).", None);
    for v in &s.vips {
        if let Some(rate) = &v.budget {
            budget.gauge(vip_label(&v.vip), f64::from(rate.per_s));
        }
    }
    let mut spill = f.gauge("vip_spill_new_flows_per_second", "New flows per second placed in other zones than the balancer's.", None);
    for v in &s.vips {
        spill.gauge(vip_label(&v.vip), f64::from(v.spill_per_s));
    }
}

/// `tx`, `redirect`, `pass` or `drop`: what the data path did with a packet of `reason`
/// (`tx_packet_too_big`: an answer sent back with XDP_TX).
fn action(reason: &str) -> &'static str {
    match reason {
        r if r == "tx" || r.starts_with("tx_") => "tx",
        "redirect" => "redirect",
        r if r.starts_with("drop_") => "drop",
        _ => "pass",
    }
}

fn verdicts(f: &mut Families, s: &Sample) {
    let mut packets = f.counter("packets", "Packets by the data path's verdict: every packet is counted under one reason.", None);
    for ReasonCount { reason, packets: n } in &s.reasons {
        packets.counter(vec![("reason", reason.clone()), ("action", action(reason).to_owned())], *n);
    }
    f.counter(
        "second_chance_packets",
        "Packets of connections without a table entry sent to their backend with the backend of before the VIP's last change as a second candidate.",
        None,
    )
    .counter(Labels::new(), s.second_chance_packets);
    f.counter(
        "pass_to_missing",
        "Frames the balancer does not serve that found no lbd --pass-to program in its place and passed to the kernel.",
        None,
    )
    .counter(Labels::new(), s.pass_to_missing);
    let mut quic = f.counter(
        "quic_short_headers",
        "QUIC VIPs' short-header packets, by placement: by_connection_id (the backend their id names) or fallback (the id named no backend: by the 5-tuple); of encrypted ids also decrypted (a miss of the cache of decoded ids), cached (a hit), miss_over_budget (a miss over the CPU's decryption budget: by the 5-tuple).",
        None,
    );
    for ReasonCount { reason, packets: n } in &s.quic {
        quic.counter(vec![("placed", reason.trim_start_matches("quic_").to_owned())], *n);
    }
    let mut observed =
        f.counter("observed_would_drop", "Packets observe-mode limits let through that enforcing would drop, by the drop reason.", None);
    for ReasonCount { reason, packets: n } in &s.observed {
        observed.counter(vec![("reason", reason.trim_start_matches("would_").to_owned())], *n);
    }
}

fn rules(f: &mut Families, s: &Sample) {
    let labels = |r: &spillway_api::sample::RuleSample| {
        vec![
            ("cidr", r.cidr.to_string()),
            ("vip", r.vip.map_or_else(|| "*".to_owned(), |v| v.to_string())),
            ("action", r.action.label().to_owned()),
            ("observe", r.observe.to_string()),
        ]
    };
    let mut hits = f.counter("rule_hits", "New flows an operator rule matched.", None);
    for r in &s.rules {
        hits.counter(labels(r), r.hits);
    }
    let mut drops = f.counter("rule_drops", "New flows an operator rule dropped (enforced).", None);
    for r in &s.rules {
        drops.counter(labels(r), r.dropped);
    }
    let mut would = f.counter("rule_observed_drops", "New flows an operator rule would have dropped while in observe mode.", None);
    for r in &s.rules {
        would.counter(labels(r), r.would_drop);
    }
}

fn own(f: &mut Families, s: &Sample) {
    let mut g = f.gauge("flow_table_entries", "Connection-table entries at the last count (every 15 s).", None);
    if let Some(n) = s.flow_table.entries {
        g.gauge(Labels::new(), n as f64);
    }
    f.gauge("flow_table_max_entries", "Flows the connection table is sized for (max_flows; it has slots for twice as many).", None)
        .gauge(Labels::new(), s.flow_table.capacity as f64);
    f.counter(
        "flow_table_full",
        "New flows forwarded without a connection-table entry: every way they could take was held (they keep their backend while the VIP's table is unchanged).",
        None,
    )
    .counter(Labels::new(), s.flow_table.unremembered);
    let mut memory = f.gauge("map_memory", "Memory the kernel accounts to each of the balancer's maps.", Some(Unit::Bytes));
    for m in &s.maps {
        memory.gauge(vec![("map", m.map.clone())], m.bytes as f64);
    }
    let d = &s.daemon;
    let mut ops = f.counter("reconcile_operations", "Changes applied to the maps, by operation and outcome.", None);
    for r in &d.reconciles {
        ops.counter(vec![("op", r.op.clone()), ("outcome", r.outcome.clone())], r.count);
    }
    let HistogramSample { buckets, sum, count } = &d.reconcile_seconds;
    f.histogram(
        "reconcile_duration",
        "How long applying a change to the maps took.",
        Unit::Seconds,
        per_bucket(buckets, *count),
        *sum,
        *count,
    );
    let mut probes = f.counter("probes", "Health probes by outcome (unknown: the balancer itself could not probe).", None);
    for o in &d.probes {
        probes.counter(vec![("outcome", o.outcome.clone())], o.count);
    }
    f.gauge("local_probe_alert", "1 while the balancer cannot open probe sockets (its own ports, sockets or memory are short).", None)
        .gauge(Labels::new(), f64::from(u8::from(d.local_probe_alert)));
    let mut polls = f.counter("agent_polls", "Polls of the backends' agents for port pressure, by outcome.", None);
    for o in &d.agent_polls {
        polls.counter(vec![("outcome", o.outcome.clone())], o.count);
    }
    let mut interfaces = f.gauge(
        "interface_state",
        "1 for the state of each interface the balancer runs on (up; down; gone; not_attached: the program does not drive it), 0 for the others.",
        None,
    );
    for i in &s.interfaces {
        for state in spillway_api::InterfaceStatus::STATES {
            interfaces.gauge(vec![("interface", i.name.clone()), ("state", state.to_owned())], f64::from(u8::from(i.state == state)));
        }
    }
    let info = &s.info;
    f.info(
        "build",
        "The running lbd: version, the loaded XDP program's tag, the XDP mode asked for.",
        vec![("version", info.version.clone()), ("program_tag", info.program_tag.clone()), ("xdp_mode", info.xdp_mode.clone())],
    );
}

/// BGP announcements through BIRD, per VIP address (`prefix`, a host route).
fn announcements(f: &mut Families, a: &Announcements) {
    let prefix = |address| vec![("prefix", spillway_announce::host_route(address))];
    let mut states = f.gauge(
        "announcement_state",
        "1 for the announcement state of the VIP address (announced, degraded: with GRACEFUL_SHUTDOWN, withdrawn), 0 for the others.",
        None,
    );
    for r in &a.routes {
        for state in AnnounceState::ALL {
            let mut labels = prefix(r.address);
            labels.push(("state", state.label().to_owned()));
            states.gauge(labels, f64::from(u8::from(state.label() == r.state)));
        }
    }
    let mut peers =
        f.gauge("announcement_peers", "Other balancers announcing the address normally, as this balancer's BIRD sees them.", None);
    for r in &a.routes {
        if let Some(n) = r.peers {
            peers.gauge(prefix(r.address), f64::from(n));
        }
    }
    let mut held = f.gauge("announcement_held", "1 while a withdrawal is due but held by the floor (kept announced, degraded).", None);
    for r in &a.routes {
        held.gauge(prefix(r.address), f64::from(u8::from(r.held)));
    }
    let mut changes = f.counter("announcement_changes", "Announcement state changes since lbd started, by the state entered.", None);
    for c in &a.changes {
        let mut labels = prefix(c.address);
        labels.push(("state", c.state.clone()));
        changes.counter(labels, c.count);
    }
    f.gauge("bird_up", "1 when BIRD answered and took the last configuration, 0 when it could not be asked or refused it.", None)
        .gauge(Labels::new(), f64::from(u8::from(a.bird_error.is_none())));
}

/// Cumulative bucket counts as the encoder takes them (per bucket, then +Inf).
fn per_bucket(cumulative: &[(f64, u64)], count: u64) -> Vec<(f64, u64)> {
    let mut previous = 0;
    let mut buckets: Vec<(f64, u64)> = cumulative
        .iter()
        .map(|(le, n)| {
            let own = n - previous;
            previous = *n;
            (*le, own)
        })
        .collect();
    buckets.push((f64::INFINITY, count.saturating_sub(previous)));
    buckets
}
