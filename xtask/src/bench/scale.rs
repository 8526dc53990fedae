//! Scale: 1,000 VIPs of 10 backends each (10,000 backend ids), Maglev tables of 1,009 slots
//! (M >= 100 N) taken from the ring pool, and a connection table sized for 8M flows, filled
//! with 8M of them; every VIP forwards to its Maglev choice, the hit and new-flow paths are
//! timed on the full table, and the memory each map takes is reported.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;
use std::time::Instant;

use anyhow::{Result, ensure};
use spillway_common::limits::Capacity;
use spillway_harness::{frames, packet_lab};
use spillway_model::{DEFAULT_WEIGHT, DesiredState, Vip};

use super::{
    Section,
    packets::{CHUNK, Case, Frames, Lab, Program, XDP_TX, write_source},
};

const VIPS: u32 = 1000;
const BACKENDS_PER_VIP: u32 = 10;
const FLOWS: u32 = 8_000_000;
/// The smallest accepted prime of at least 100 slots per backend.
const RING: u32 = 1009;
const CAPACITY: Capacity = Capacity {
    vips: VIPS,
    backends: VIPS * BACKENDS_PER_VIP,
    flows: FLOWS,
    ring_slots: Capacity::ring_slots_for(VIPS, RING),
    ..Capacity::DEFAULT
};

fn vip(i: u32) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 210, (i >> 8) as u8, i as u8), 80))
}

/// The `n`-th filling flow: a client of 100.64.0.0/10 (then new ports) to VIP `n % VIPS`.
fn filler(n: u32) -> (SocketAddr, SocketAddr) {
    let low = n % (1 << 22);
    let client = SocketAddr::from((Ipv4Addr::new(100, 64 | (low >> 16) as u8, (low >> 8) as u8, low as u8), (1024 + (n >> 22)) as u16));
    (client, vip(n % VIPS))
}

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    Lab::sized(CAPACITY, |lab| {
        let mut state = DesiredState::default();
        for i in 0..VIPS {
            let v: Vip = format!("{}/tcp", vip(i)).parse()?;
            state.add_vip(v, RING)?;
            for n in packet_lab::RESOLVED_BACKENDS.take(BACKENDS_PER_VIP as usize) {
                state.add_backend(&v, packet_lab::backend4(n).into(), DEFAULT_WEIGHT)?;
            }
        }
        let started = Instant::now();
        lab.reconciler.apply(&mut lab.balancer.maps, &state)?;
        let configure_ms = started.elapsed().as_secs_f64() * 1e3;

        // Every VIP forwards, a new flow and its next packet.
        let client: SocketAddr = "192.168.10.20:40000".parse()?;
        for i in 0..VIPS {
            lab.check_forwarded(&frames::tcp(client, vip(i), true, &[]))?;
            lab.check_forwarded(&frames::tcp(client, vip(i), false, &[]))?;
        }

        let started = Instant::now();
        let mut syn = frames::tcp(client, vip(0), true, &[]);
        let mut out = vec![0; syn.len() + spillway_dataplane::test_run::HEADROOM_BYTES];
        for n in 0..FLOWS {
            let (src, dst) = filler(n);
            write_source(&mut syn, src);
            syn[30..34].copy_from_slice(&match dst.ip() {
                IpAddr::V4(a) => a.octets(),
                IpAddr::V6(_) => unreachable!("the VIPs are IPv4"),
            });
            let (action, ..) = lab.run(Program::Balancer, &syn, &mut out)?;
            ensure!(action == XDP_TX, "filling flow {n}: action {action}");
        }
        let fill_s = started.elapsed().as_secs_f64();
        let entries = lab.balancer.maps.flows.each(|_| ControlFlow::Continue(()));
        ensure!(entries as f64 >= f64::from(FLOWS) * 0.999, "{entries} of {FLOWS} flows in the table");

        let hit = (frames::tcp(client, vip(0), true, &[]), frames::tcp(client, vip(0), false, &[]));
        let whole = Case::forwarded;
        let cases = vec![
            Case::floor(&hit.0),
            whole("scale_table_hit", Frames::Established { syn: hit.0.clone(), frame: hit.1 }, false),
            whole("scale_new_flow", Frames::NewFlows(frames::tcp(client, vip(VIPS / 2), true, &[])), true),
        ];
        lab.may_overflow = 0.01;
        let medians = lab.measure(&cases, calls, reps)?;

        let memory = lab.balancer.maps.memory();
        let total: u64 = memory.iter().map(|m| m.bytes).sum();
        let mut text = String::new();
        writeln!(
            text,
            "Scale: {VIPS} VIPs of {BACKENDS_PER_VIP} backends ({} backend ids), Maglev tables of {RING} slots, a table sized for \
             {FLOWS} flows: configured in {configure_ms:.0} ms; every VIP forwarded; {entries} flows in the table after {FLOWS} new \
             ones ({fill_s:.1} s); maps take {:.1} MiB in all.",
            CAPACITY.backends,
            total as f64 / f64::from(1 << 20)
        )?;
        writeln!(text, "Timed on the full table ({calls} calls per case per repetition in chunks of {CHUNK}, median of {reps}):")?;
        let mut rows = vec![
            ("scale_configure_ms".to_owned(), configure_ms),
            ("scale_flows_in_table".to_owned(), entries as f64),
            ("scale_total_map_bytes".to_owned(), total as f64),
        ];
        for (case, ns) in cases.iter().zip(&medians).skip(1) {
            writeln!(text, "  {:<16} {ns:>7.1} ns  {:>5.2}x floor", case.name, ns / medians[0])?;
            rows.push((case.name.clone(), *ns));
            rows.push((format!("{}_x_floor", case.name), ns / medians[0]));
        }
        writeln!(text, "{:<16} | {:<11} | {:>9} | {:>10}", "map", "kind", "entries", "MiB")?;
        for m in memory {
            writeln!(text, "{:<16} | {:<11} | {:>9} | {:>10.1}", m.name, m.kind, m.entries, m.bytes as f64 / f64::from(1 << 20))?;
            rows.push((format!("scale_{}_bytes", m.name), m.bytes as f64));
        }
        Ok(Section { text, rows, ..Section::default() })
    })
}
