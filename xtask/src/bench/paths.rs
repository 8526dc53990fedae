//! The paths that matter, whole, as multiples of the floor measured in the same run, next to
//! Katran's figures taken the same way (`katran.rs`: the reference's, or this machine's).

use std::fmt::Write as _;

use anyhow::Result;
use spillway_common::{limits::DEFAULT_RING_SIZE, types::Reason};
use spillway_harness::packet_lab;

use super::{
    Section,
    katran::{GOAL_FACTOR, Katran},
    packets::{CHUNK, CLIENT, Case, Flows, Frames, Lab, VIP, XDP_DROP, XDP_PASS, XDP_TX},
};

/// GUE's table hit against IPIP's: at most 5% slower.
const GUE_GOAL: f64 = 1.05;

/// A case, and a goal of its own as a multiple of the floor (`None`: only Katran's share,
/// where Katran has a counterpart).
pub(super) struct Path {
    pub(super) case: Case,
    goal: Option<f64>,
}

/// The table hit's own goal: at most this multiple of the floor.
const TABLE_HIT_GOAL: f64 = 1.9;

pub(super) fn paths(flows: Flows) -> Vec<Path> {
    let balancer = Case::balancer;
    vec![
        Path { case: Case::floor(&flows.syn), goal: Some(1.0) },
        Path {
            case: balancer("table_hit", Frames::Established { syn: flows.syn.clone(), frame: flows.ack }, XDP_TX, Reason::Tx, false),
            goal: Some(TABLE_HIT_GOAL),
        },
        // The same hit in GUE; its goal is a ratio to `table_hit` (below).
        Path {
            case: balancer("table_hit_gue", Frames::Established { syn: flows.gue_syn, frame: flows.gue_ack }, XDP_TX, Reason::Tx, false),
            goal: None,
        },
        Path { case: balancer("new_flow", Frames::NewFlows(flows.syn), XDP_TX, Reason::Tx, true), goal: None },
        Path { case: balancer("syn_same_tuple", Frames::Fixed(flows.same_syn), XDP_TX, Reason::Tx, false), goal: None },
        Path { case: balancer("non_vip_pass", Frames::Fixed(flows.non_vip), XDP_PASS, Reason::PassNotVip, false), goal: None },
        Path {
            // Katran's counterpart: its SYN flood limiter, tripped.
            case: balancer("rate_limited_drop", Frames::NewPorts(flows.limited), XDP_DROP, Reason::DropRuleLimit, false),
            goal: None,
        },
        Path {
            // The same, refused by the VIP's budget (no rule).
            case: balancer("budget_drop", Frames::NewPorts(flows.over_budget), XDP_DROP, Reason::DropVipBudget, false),
            goal: None,
        },
        Path { case: balancer("admitted_through_limit", Frames::NewFlows(flows.through_limit), XDP_TX, Reason::Tx, true), goal: None },
    ]
}

pub fn part(calls: usize, reps: usize, katran: &Katran) -> Result<Section> {
    let (cases, goals): (Vec<Case>, Vec<_>) = paths(Flows::new()?).into_iter().map(|p| (p.case, p.goal)).unzip();
    let (cpu, medians) = Lab::with(|lab| Ok((lab.cpu, lab.measure(&cases, calls, reps)?)))?;
    let floor = medians[0];
    let mut text = String::new();
    let backends = packet_lab::RESOLVED_BACKENDS.count();
    writeln!(
        text,
        "Method: BPF_PROG_TEST_RUN with repeat=1 in a loop, kernel-measured time per call; {calls} calls per case per \
         repetition, cases alternating in chunks of {CHUNK}; thread pinned to CPU {cpu}; median of {reps} repetitions."
    )?;
    writeln!(
        text,
        "Setup: VIP {VIP}, {backends} backends, Maglev table {DEFAULT_RING_SIZE}; 54-byte Ethernet/IPv4/TCP frames from \
         {CLIENT} (new_flow: a new source address and port on every call)."
    )?;
    if katran.here {
        writeln!(
            text,
            "Katran: its ratios to its own floor, measured on this machine back to back with this run (--katran); \
             goal: at most {GOAL_FACTOR} of Katran's ratio, the table hit at most {TABLE_HIT_GOAL} x floor."
        )?;
    } else {
        writeln!(
            text,
            "Katran: the reference's ratios, from another machine (shared/bench-reference.md): ratios move with the CPU, \
             so the last column is indicative; --katran FILE gives this machine's. Goal: at most {GOAL_FACTOR} of \
             Katran's ratio, the table hit at most {TABLE_HIT_GOAL} x floor."
        )?;
    }
    text.push('\n');
    writeln!(text, "{:<22} | {:>9} | {:>7} | {:>6} | {:>6} | {:>8}", "case", "ns/packet", "x floor", "goal", "Katran", "/ Katran")?;
    writeln!(text, "{:-<22}-|-{:->9}-|-{:->7}-|-{:->6}-|-{:->6}-|-{:->8}", "", "", "", "", "", "")?;
    let mut rows = Vec::new();
    for ((case, own), ns) in cases.iter().zip(goals).zip(&medians) {
        let ratio = ns / floor;
        let name = &case.name;
        let theirs = katran.ratio(name);
        let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        let share = theirs.map(|k| ratio / k);
        writeln!(
            text,
            "{name:<22} | {ns:>9.1} | {ratio:>7.2} | {:>6} | {:>6} | {:>8}",
            show(katran.goal(name, own)),
            show(theirs),
            show(share)
        )?;
        rows.push((name.clone(), *ns));
        rows.push((format!("{name}_x_floor"), ratio));
        // Only a same-machine comparison is a figure; the reference's is another machine's.
        if let Some(share) = share.filter(|_| katran.here) {
            rows.push((format!("{name}_x_katran"), share));
        }
    }
    // GUE against IPIP, both measured in this run, alternating.
    let ns = |name: &str| cases.iter().position(|c| c.name == name).map(|i| medians[i]);
    if let (Some(gue), Some(ipip)) = (ns("table_hit_gue"), ns("table_hit")) {
        let ratio = gue / ipip;
        text.push('\n');
        writeln!(text, "table_hit_gue / table_hit (GUE against IPIP): {ratio:.3}   goal: within 5% of IPIP (<= {GUE_GOAL:.2})")?;
        rows.push(("table_hit_gue_x_ipip".to_owned(), ratio));
    }
    Ok(Section { text, rows, ..Section::default() })
}
