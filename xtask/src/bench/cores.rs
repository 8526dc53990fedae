//! Every core at once: each case on one CPU alone, then on every CPU the bench may use at
//! the same time against the same maps (the connection table and the limits' buckets are
//! shared by all CPUs; Katran's table is per CPU). Scaling is the aggregate rate over N times
//! one CPU's rate: the mean over CPUs of (one CPU's ns per packet alone ÷ that CPU's ns per
//! packet with all of them busy), kernel-measured time as everywhere in the bench.

use std::fmt::Write as _;

use anyhow::{Result, ensure};

use super::{
    Section, median,
    packets::{Case, Flows, Frames, Lab, XDP_PASS, allowed_cpus},
};
use spillway_common::types::Reason;

/// Scaling the table hit and the new flow must reach.
const GOAL: f64 = 0.95;

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    // Read before the lab pins its thread to one of them.
    let cpus = allowed_cpus()?;
    ensure!(cpus.len() > 1, "one CPU only: nothing to scale to");
    let flows = Flows::new()?;
    let cases = [
        (Case::floor(&flows.syn), None),
        (Case::forwarded("table_hit", Frames::Established { syn: flows.syn.clone(), frame: flows.ack.clone() }, false), Some(GOAL)),
        (Case::forwarded("new_flow", Frames::NewFlows(flows.syn.clone()), true), Some(GOAL)),
        (Case::balancer("non_vip_pass", Frames::Fixed(flows.non_vip.clone()), XDP_PASS, Reason::PassNotVip, false), None),
        (Case::forwarded("spoofed_syn", Frames::Spoofed(flows.syn.clone()), false), None),
    ];
    let measured = Lab::with(|lab| {
        let alone_on = lab.cpu;
        let mut measured = Vec::new();
        for (case, goal) in &cases {
            let (mut alone, mut scaling, mut together) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..reps {
                let one = lab.measure_concurrently(case, &[alone_on], calls)?[0];
                let all = lab.measure_concurrently(case, &cpus, calls)?;
                scaling.push(all.iter().map(|ns| one / ns).sum::<f64>() / all.len() as f64);
                alone.push(one);
                together.push(all.iter().sum::<f64>() / all.len() as f64);
            }
            measured.push((case.name.clone(), *goal, median(alone), median(together), median(scaling)));
        }
        Ok((alone_on, measured))
    })?;
    let (alone_on, measured) = measured;

    let mut text = String::new();
    writeln!(
        text,
        "Every core at once: each case alone on CPU {alone_on}, then on CPUs {cpus:?} together (same maps, flows of each CPU's \
         own); {calls} calls per CPU, median of {reps} repetitions."
    )?;
    writeln!(text, "{:<14} | {:>8} | {:>8} | {:>7} | {:>5}", "case", "ns alone", "ns all", "scaling", "goal")?;
    writeln!(text, "{:-<14}-|-{:->8}-|-{:->8}-|-{:->7}-|-{:->5}", "", "", "", "", "")?;
    let mut rows = Vec::new();
    for (name, goal, alone, together, scaling) in &measured {
        let goal = goal.map_or("-".to_owned(), |g| format!("{g:.2}"));
        writeln!(text, "{name:<14} | {alone:>8.1} | {together:>8.1} | {scaling:>7.3} | {goal:>5}")?;
        rows.push((format!("cores_{name}_scaling"), *scaling));
        rows.push((format!("cores_{name}_ns_all"), *together));
    }
    if let Some((_, _, _, together, _)) = measured.iter().find(|m| m.0 == "spoofed_syn") {
        let per_s = cpus.len() as f64 * 1e9 / together;
        writeln!(text, "Spoofed SYNs all {} CPUs absorb together: {:.2} M/s", cpus.len(), per_s / 1e6)?;
        rows.push(("cores_spoofed_syn_per_s_all".to_owned(), per_s));
    }
    rows.push(("cores".to_owned(), cpus.len() as f64));
    Ok(Section { text, rows, ..Section::default() })
}
