//! Where the time goes: each path run by the balancer cut short after each of its stages
//! (the bench-only stage object, sharing the balancer's maps), all in the same run; a
//! stage's cost is the difference between the cuts before and after it, pair by pair
//! (within each repetition), reported with its spread and never as a negative figure.

use std::fmt::Write as _;

use anyhow::Result;
use spillway_common::types::Reason;

use super::{
    Section, median,
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
    let per_rep = Lab::with(|lab| lab.measure_each_rep(&cases, calls, reps))?;
    let floor = median(per_rep[0].clone());

    let mut text = String::new();
    writeln!(
        text,
        "Stages: each path cut short after each stage (bench-only programs built from the balancer's modules, \
         sharing its maps), {calls} calls per cut per repetition in chunks of {CHUNK}, {reps} repetitions. A stage's \
         cost is the cut after it minus the cut before it, taken within each repetition (a pair timed in the same \
         chunks): the median of the {reps} pairs [lowest, highest] in ns. A stage whose lowest pair is not above \
         zero is not told apart from the noise: shown as \"< noise\" with its highest pair as a bound; more \
         repetitions (--reps) resolve smaller stages."
    )?;
    text.push('\n');
    write!(text, "{:<11}", "stage")?;
    for path in &PATHS {
        write!(text, " | {:>26}", path.name)?;
    }
    writeln!(text)?;
    writeln!(text, "{:-<11}{}", "", "-|---------------------------".repeat(PATHS.len()))?;
    let mut rows = Vec::new();
    let mut columns: Vec<Vec<Option<Cost>>> = Vec::new();
    let mut wholes = Vec::new();
    let mut index = 1;
    for path in &PATHS {
        let mut column = vec![None; STAGES.len()];
        let mut before = &per_rep[0];
        for stage in path.stages {
            let after = &per_rep[index];
            index += 1;
            let cost = Cost::of(before.iter().zip(after).map(|(b, a)| a - b).collect());
            before = after;
            let at = STAGES.iter().position(|(label, _)| label == stage).expect("known stage");
            rows.extend(cost.rows(&format!("stage_{}_{stage}", path.name)));
            column[at] = Some(cost);
        }
        // The whole path above the floor, pair by pair: not the sum of the stages' medians.
        let whole = Cost::of(per_rep[0].iter().zip(before).map(|(floor, all)| all - floor).collect());
        rows.extend(whole.rows(&format!("stage_{}_above_floor", path.name)));
        wholes.push(whole);
        columns.push(column);
    }
    for (at, (label, _)) in STAGES.iter().enumerate() {
        write!(text, "{label:<11}")?;
        for column in &columns {
            write!(text, " | {:>26}", column[at].as_ref().map_or("-".to_owned(), Cost::shown))?;
        }
        writeln!(text)?;
    }
    write!(text, "{:<11}", "above floor")?;
    for whole in &wholes {
        write!(text, " | {:>26}", whole.shown())?;
    }
    writeln!(text)?;
    writeln!(text, "floor: {floor:.1} ns")?;
    rows.push(("stage_floor".to_owned(), floor));
    Ok(Section { text, rows, ..Section::default() })
}

/// A stage's cost from its pairs' differences (ns): the median and the range, or, when the
/// range reaches zero or below, only that it is within the noise (never a negative cost).
#[derive(Clone, Debug, PartialEq)]
enum Cost {
    Resolved {
        median: f64,
        lowest: f64,
        highest: f64,
    },
    /// At most this (the highest pair, or 0 if even that is not above zero).
    BelowNoise {
        at_most: f64,
    },
}

impl Cost {
    fn of(mut differences: Vec<f64>) -> Cost {
        differences.sort_by(f64::total_cmp);
        let (lowest, highest) = (differences[0], differences[differences.len() - 1]);
        if lowest > 0.0 {
            Cost::Resolved { median: median(differences), lowest, highest }
        } else {
            Cost::BelowNoise { at_most: highest.max(0.0) }
        }
    }

    fn shown(&self) -> String {
        match self {
            Cost::Resolved { median, lowest, highest } => format!("{median:.1} [{lowest:.1}, {highest:.1}]"),
            Cost::BelowNoise { at_most } => format!("< noise (<= {at_most:.1})"),
        }
    }

    /// The JSON figures: `<key>` (median), `<key>_lowest`, `<key>_highest`; or only
    /// `<key>_at_most` within the noise.
    fn rows(&self, key: &str) -> Vec<(String, f64)> {
        match *self {
            Cost::Resolved { median, lowest, highest } => {
                vec![(key.to_owned(), median), (format!("{key}_lowest"), lowest), (format!("{key}_highest"), highest)]
            }
            Cost::BelowNoise { at_most } => vec![(format!("{key}_at_most"), at_most)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_every_pair_shows_is_its_median_and_range() {
        assert_eq!(Cost::of(vec![3.0, 1.0, 2.0]), Cost::Resolved { median: 2.0, lowest: 1.0, highest: 3.0 });
        assert_eq!(Cost::of(vec![2.0, 1.0, 2.5]).shown(), "2.0 [1.0, 2.5]");
    }

    #[test]
    fn a_stage_some_pair_puts_at_or_below_zero_is_noise_never_a_negative_cost() {
        for pairs in [vec![-18.9, 4.0, 2.0], vec![0.0, 5.0, 6.0], vec![-2.0, -1.0, -3.0]] {
            let cost = Cost::of(pairs.clone());
            assert!(matches!(cost, Cost::BelowNoise { .. }), "{pairs:?}: {cost:?}");
            assert!(cost.shown().starts_with("< noise"), "{pairs:?}: {}", cost.shown());
            assert!(cost.rows("s").iter().all(|(key, v)| *v >= 0.0 && key == "s_at_most"), "{pairs:?}");
        }
        assert_eq!(Cost::of(vec![-2.0, 4.0]).shown(), "< noise (<= 4.0)");
        assert_eq!(Cost::of(vec![-2.0, -4.0]).rows("s"), vec![("s_at_most".to_owned(), 0.0)]);
    }
}
