//! Where the time goes: each path run by the balancer cut short after each of its stages
//! (the bench-only stage object, sharing the balancer's maps), all in the same run; a
//! stage's share is the difference between the cuts before and after it.

use std::fmt::Write as _;

use anyhow::Result;
use spillway_common::types::Reason;

use super::{
    Section,
    packets::{CHUNK, Case, Flows, Frames, Lab, Program, XDP_DROP, XDP_TX},
};

/// Stages in path order: (label, program cut after it).
const STAGES: [(&str, &str); 11] = [
    ("parse", "lb_to_parse"),
    ("filter", "lb_to_filter"),
    ("vip", "lb_to_vip"),
    ("table", "lb_to_table"),
    ("limits", "lb_to_limits"),
    ("slot", "lb_to_slot"),
    ("backend", "lb_to_backend"),
    ("insert", "lb_to_insert"),
    ("next_hop", "lb_to_next_hop"),
    ("encap", "lb_to_encap"),
    ("stats", "lb_all"),
];

/// A path and the stages it goes through.
struct StagedPath {
    name: &'static str,
    frames: fn(&Flows) -> Frames,
    stages: &'static [&'static str],
    /// The whole path's action and reason.
    action: u32,
    reason: Reason,
    /// The first stage whose cut inserts a new flow.
    inserts_from: Option<&'static str>,
}

const PATHS: [StagedPath; 3] = [
    StagedPath {
        name: "table_hit",
        frames: |f| Frames::Established { syn: f.syn.clone(), frame: f.ack.clone() },
        stages: &["parse", "filter", "vip", "table", "next_hop", "encap", "stats"],
        action: XDP_TX,
        reason: Reason::Tx,
        inserts_from: None,
    },
    StagedPath {
        name: "new_flow",
        frames: |f| Frames::NewFlows(f.syn.clone()),
        stages: &["parse", "filter", "vip", "table", "limits", "slot", "backend", "insert", "next_hop", "encap", "stats"],
        action: XDP_TX,
        reason: Reason::Tx,
        inserts_from: Some("insert"),
    },
    StagedPath {
        name: "rate_limited_drop",
        frames: |f| Frames::NewPorts(f.limited.clone()),
        stages: &["parse", "filter", "vip", "table", "limits", "encap", "stats"],
        action: XDP_DROP,
        reason: Reason::DropRuleLimit,
        inserts_from: None,
    },
];

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    let flows = Flows::new()?;
    let mut cases = vec![Case::floor(&flows.syn)];
    for path in &PATHS {
        let inserts_at = path.inserts_from.and_then(|s| path.stages.iter().position(|x| *x == s));
        for (i, stage) in path.stages.iter().enumerate() {
            let program = STAGES.iter().find(|(label, _)| label == stage).map(|(_, p)| *p).expect("every stage has a cut");
            // A cut returns XDP_TX, except after the last stage that decides: the whole
            // path's action then.
            let whole = matches!(*stage, "encap" | "stats");
            cases.push(Case {
                name: format!("{}/{stage}", path.name),
                program: Program::Stage(program),
                frames: (path.frames)(&flows),
                action: if whole { path.action } else { XDP_TX },
                reason: (*stage == "stats").then_some(path.reason),
                inserts: inserts_at.is_some_and(|at| i >= at),
            });
        }
    }
    let medians = Lab::with(|lab| lab.measure(&cases, calls, reps))?;
    let floor = medians[0];

    let mut text = String::new();
    writeln!(
        text,
        "Stages: each path cut short after each stage (bench-only programs built from the balancer's modules, \
         sharing its maps), {calls} calls per cut per repetition in chunks of {CHUNK}, median of {reps}; a stage's \
         share is the difference between the cuts before and after it (ns)."
    )?;
    text.push('\n');
    write!(text, "{:<10}", "stage")?;
    for path in &PATHS {
        write!(text, " | {:>17}", path.name)?;
    }
    writeln!(text)?;
    writeln!(text, "{:-<10}{}", "", "-|------------------".repeat(PATHS.len()))?;
    let mut rows = Vec::new();
    let mut shares: Vec<Vec<Option<f64>>> = Vec::new();
    let mut index = 1;
    for path in &PATHS {
        let mut previous = floor;
        let mut column = vec![None; STAGES.len()];
        for stage in path.stages {
            let ns = medians[index];
            index += 1;
            let share = ns - previous;
            previous = ns;
            let at = STAGES.iter().position(|(label, _)| label == stage).expect("known stage");
            column[at] = Some(share);
            rows.push((format!("stage_{}_{stage}", path.name), share));
        }
        shares.push(column);
    }
    for (at, (label, _)) in STAGES.iter().enumerate() {
        write!(text, "{label:<10}")?;
        for column in &shares {
            match column[at] {
                Some(ns) => write!(text, " | {ns:>17.1}")?,
                None => write!(text, " | {:>17}", "-")?,
            }
        }
        writeln!(text)?;
    }
    write!(text, "{:<10}", "above floor")?;
    for column in &shares {
        write!(text, " | {:>17.1}", column.iter().flatten().sum::<f64>())?;
    }
    writeln!(text)?;
    writeln!(text, "floor: {floor:.1} ns")?;
    Ok(Section { text, rows, ..Section::default() })
}
