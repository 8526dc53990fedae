//! The verifier's processed instructions per program (`verified_insns`), beside each
//! program's budget (the `verifier` test holds them to it) and the balancer's goal: not a
//! time, but the headroom a change to the path has left before the kernel's 1M limit.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use spillway_common::limits::program_names;
use spillway_dataplane::verifier::{BALANCER_GOAL, BUDGETS, verified_insns};

use super::Section;

pub fn part() -> Result<Section> {
    let counts = verified_insns().context("loading the programs")?;
    let mut section = Section::default();
    writeln!(section.text, "{:<20} | {:>14} | {:>8} | {:>8}", "program", "verified insns", "budget", "goal")?;
    writeln!(section.text, "{:-<20}-|-{:->14}-|-{:->8}-|-{:->8}", "", "", "", "")?;
    for ((name, count), (_, budget)) in counts.into_iter().zip(BUDGETS) {
        let goal = if name == program_names::BALANCER { BALANCER_GOAL.to_string() } else { "-".to_owned() };
        let Some(count) = count else {
            section.skipped.push((format!("verified_insns_{name}"), "the kernel does not report it (before 5.16)".to_owned()));
            continue;
        };
        writeln!(section.text, "{name:<20} | {count:>14} | {budget:>8} | {goal:>8}")?;
        section.rows.push((format!("verified_insns_{name}"), f64::from(count)));
    }
    Ok(section)
}
