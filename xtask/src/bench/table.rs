//! The connection table full: the hit and new-flow paths with the table at 90% of the
//! flows it is sized for, then a flood of spoofed SYNs (a new source each, over twice the
//! table's entries), how many of them one core absorbs, and that every established flow
//! kept its entry through it. The established flows keep sending meanwhile, as live
//! connections do: a confirmed entry idle past the hold (`FLOW_HOLD_TICKS`, ~4.3 s) gives
//! its way to a new flow by design.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use spillway_common::limits::{FLOW_HOLD_TICKS, FLOW_TICK_SHIFT, FLOW_WAYS};

use super::{
    Section, median,
    packets::{CHUNK, Case, Flows, Frames, Lab, Program, XDP_TX, allowed_cpus, spoofed_source, write_source},
};

/// Share of the table's flow capacity filled with established flows before timing.
const FILL: f64 = 0.9;

/// How often the established flows each send a packet while the flood runs: well inside
/// the hold, with room for a pass over all of them. A pass runs on every CPU: on one core of
/// a slow VM it once took 4.8 s, past the hold (1.8 s on its two).
const SEND_EVERY: Duration = Duration::from_secs(1);

/// Spoofed SYNs between two looks at the clock during the untimed flood.
const FLOOD_BATCH: u32 = 4096;

/// The `n`-th filling flow's client: 100.64.0.0/10, then new ports.
fn filler(n: u32) -> SocketAddr {
    let low = n % (1 << 22);
    SocketAddr::from(([100, 64 | (low >> 16) as u8, (low >> 8) as u8, low as u8], (1024 + (n >> 22)) as u16))
}

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    // Read before the lab pins its thread to one of them.
    let cpus = allowed_cpus()?;
    let flows = Flows::new()?;
    let whole = Case::forwarded;
    Lab::with(|lab| {
        let capacity = lab.balancer.maps.capacity();
        let entries = lab.balancer.maps.flows.buckets() as u64 * u64::from(FLOW_WAYS);
        let filled = (f64::from(capacity.flows) * FILL) as u32;
        let mut out = vec![0; flows.syn.len() + spillway_dataplane::test_run::HEADROOM_BYTES];
        let (mut syn, mut ack) = (flows.syn.clone(), flows.ack.clone());
        for n in 0..filled {
            write_source(&mut syn, filler(n));
            write_source(&mut ack, filler(n));
            for frame in [&syn, &ack] {
                let (action, ..) = lab.run(Program::Balancer, frame, &mut out)?;
                ensure!(action == XDP_TX, "filling flow {n}: action {action}");
            }
        }
        let established = count_confirmed(lab);
        // Two choices of four ways leave almost nothing out, even this full.
        ensure!(established as f64 >= filled as f64 * 0.999, "{established} of {filled} filling flows have an entry");

        let cases = vec![
            Case::floor(&flows.syn),
            whole("table_hit_90_full", Frames::Established { syn: flows.syn.clone(), frame: flows.ack.clone() }, false),
            whole("new_flow_90_full", Frames::NewFlows(flows.syn.clone()), true),
        ];
        lab.may_overflow = 0.001;
        let full = lab.measure(&cases, calls, reps)?;
        let unremembered = std::mem::take(&mut lab.unremembered);

        // The flood: first twice the table's entries, then timed, one repetition at a time
        // so the established flows send between them.
        let mut live = Established { ack, filled, cpus, last: Instant::now(), longest_pass: Duration::ZERO };
        for n in 0..2 * entries as u32 {
            if n % FLOOD_BATCH == 0 {
                live.keep_sending(lab)?;
            }
            write_source(&mut syn, spoofed_source(n));
            let (action, ..) = lab.run(Program::Balancer, &syn, &mut out)?;
            ensure!(action == XDP_TX, "spoofed SYN {n}: action {action}");
        }
        let flood = vec![Case::floor(&flows.syn), whole("spoofed_syn", Frames::Spoofed(flows.syn.clone()), false)];
        let mut per_rep = vec![Vec::with_capacity(reps); flood.len()];
        for _ in 0..reps {
            live.keep_sending(lab)?;
            for (times, ns) in per_rep.iter_mut().zip(lab.measure(&flood, calls, 1)?) {
                times.push(ns);
            }
        }
        let flooded: Vec<f64> = per_rep.into_iter().map(median).collect();
        let kept = count_confirmed(lab);
        let hold = Duration::from_nanos(u64::from(FLOW_HOLD_TICKS) << FLOW_TICK_SHIFT);
        ensure!(
            kept >= established,
            "the flood evicted established flows that kept sending: {kept} of {established} left (the longest pass over them took \
             {:?}, against a hold of {hold:?})",
            live.longest_pass
        );

        let mut text = String::new();
        writeln!(
            text,
            "Full table: {filled} established flows (SYN, then ACK) in a table sized for {} ({entries} entries), then \
             {calls} calls per case per repetition in chunks of {CHUNK}, median of {reps}.",
            capacity.flows
        )?;
        writeln!(text, "{:<22} | {:>9} | {:>7}", "case", "ns/packet", "x floor")?;
        writeln!(text, "{:-<22}-|-{:->9}-|-{:->7}", "", "", "")?;
        let mut rows = Vec::new();
        for (case, ns) in cases.iter().zip(&full).skip(1) {
            writeln!(text, "{:<22} | {ns:>9.1} | {:>7.2}", case.name, ns / full[0])?;
            rows.push((case.name.clone(), *ns));
            rows.push((format!("{}_x_floor", case.name), ns / full[0]));
        }
        writeln!(
            text,
            "New flows left unremembered (both buckets full of established flows; forwarded by Maglev): {unremembered} of {}.",
            calls * reps
        )?;
        rows.push(("new_flow_90_full_unremembered".into(), unremembered as f64));
        let syn_ns = flooded[1];
        writeln!(
            text,
            "Spoofed-SYN flood (a new source each, after {} of them): {syn_ns:.1} ns per SYN ({:.2}x floor), {:.2} M SYNs/s on one \
             core; {kept} established flows (each sending a packet every {SEND_EVERY:?} meanwhile, from {} CPUs: the longest \
             pass over them {:.1?}, the hold {hold:.1?}) with an entry after it, {established} before.",
            2 * entries,
            syn_ns / flooded[0],
            1e3 / syn_ns,
            live.cpus.len(),
            live.longest_pass,
        )?;
        rows.push(("spoofed_syn".into(), syn_ns));
        rows.push(("spoofed_syn_x_floor".into(), syn_ns / flooded[0]));
        rows.push(("spoofed_syns_per_s_one_core".into(), 1e9 / syn_ns));
        rows.push(("established_kept_through_flood".into(), kept as f64));
        Ok(Section { text, rows, ..Section::default() })
    })
}

/// The established flows, sending their next packet.
struct Established {
    ack: Vec<u8>,
    filled: u32,
    /// Where they send from: every CPU the bench may use.
    cpus: Vec<usize>,
    last: Instant,
    longest_pass: Duration,
}

impl Established {
    /// A packet on every established flow, if `SEND_EVERY` has passed since the last pass.
    fn keep_sending(&mut self, lab: &Lab) -> Result<()> {
        if self.last.elapsed() < SEND_EVERY {
            return Ok(());
        }
        let start = Instant::now();
        lab.send_on_cpus(&self.cpus, self.filled, &self.ack, |n, frame| write_source(frame, filler(n))).context("established flows")?;
        self.last = Instant::now();
        self.longest_pass = self.longest_pass.max(self.last - start);
        Ok(())
    }
}

/// Confirmed (established) entries in the connection table.
fn count_confirmed(lab: &Lab) -> usize {
    let mut n = 0;
    lab.balancer.maps.flows.each(|flow| {
        n += usize::from(flow.info.confirmed);
        ControlFlow::Continue(())
    });
    n
}
