//! `--against <object>`: the balancer cases of the paths and QUIC parts run by this build's
//! balancer and by another build's (its `spillway-lb` object), on the same maps, alternating
//! in the same chunks of the same repetitions. Two builds measured in two runs differ by more
//! than most changes do on a shared VM (the floor itself moves 10-15% between runs); measured
//! in one, the machine's drift falls on both alike, and the ratio of the two is what changed.
//! The other build's QUIC programs are its own (`dataplane::load_other_balancer`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use spillway_common::limits::Capacity;

use super::{
    Section,
    packets::{Case, Flows, Lab, Program},
    paths, quic,
};

pub fn part(object: Option<&Path>, calls: usize, reps: usize) -> Result<Section> {
    let path = object.context("needs --against <the spillway-lb object of another build>")?;
    let object = aligned(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    let paths_cases: Vec<Case> = paths::paths(Flows::new()?).into_iter().map(|p| p.case).collect();
    let paths = Lab::with(|lab| compare(lab, object, &paths_cases, calls, reps))?;
    let flows = Flows::new()?;
    // An older build may keep its QUIC state where this one does not (its QUIC programs then
    // send elsewhere, and the checks say so): its paths are still compared.
    let mut skipped = Vec::new();
    let quic = Lab::sized(Capacity::DEFAULT, |lab| {
        // Not the encrypted case: a build without encrypted ids sends it by the 5-tuple.
        let cases: Vec<Case> =
            quic::cases(lab, &flows)?.into_iter().filter(|c| c.name.starts_with("quic_") && c.name != "quic_encrypted_cached").collect();
        compare(lab, object, &cases, calls, reps)
    })
    .unwrap_or_else(|e| {
        skipped.push(("against_quic".to_string(), format!("{e:#}")));
        Vec::new()
    });
    let mut text = String::new();
    writeln!(
        text,
        "This build's balancer against {} on the same maps and frames, alternating in chunks, each pair in both orders; \
         {calls} calls per case per repetition, median of {reps} per order.",
        path.display()
    )?;
    writeln!(text, "{:<22} | {:>9} | {:>9} | {:>10} | {:>10}", "case", "this ns", "other ns", "this/other", "two orders")?;
    writeln!(text, "{:-<22}-|-{:->9}-|-{:->9}-|-{:->10}-|-{:->10}", "", "", "", "", "")?;
    let mut rows = Vec::new();
    for pair in paths.iter().chain(&quic) {
        let name = &pair.name;
        writeln!(text, "{name:<22} | {:>9.1} | {:>9.1} | {:>10.3} | {:>10}", pair.ours, pair.theirs, pair.ours / pair.theirs, pair.orders)?;
        rows.push((format!("against_{name}_x_other"), pair.ours / pair.theirs));
    }
    for (_, why) in &skipped {
        writeln!(text, "QUIC cases not compared: {why}")?;
    }
    Ok(Section { text, rows, skipped })
}

/// One case measured by both builds.
struct Pair {
    name: String,
    ours: f64,
    theirs: f64,
    /// This build's ratio to the other's in each order.
    orders: String,
}

/// Each balancer case of `cases` twice, this build's then the other's; measured a second
/// time with each pair swapped, since a case runs a little differently after its neighbour
/// in the chunk (the caches it leaves): the geometric mean of the two orders' ratios cancels
/// that.
fn compare(lab: &mut Lab, object: &'static [u8], cases: &[Case], calls: usize, reps: usize) -> Result<Vec<Pair>> {
    let mut paired: Vec<Case> = Vec::new();
    for case in cases {
        let theirs = (case.program == Program::Balancer).then(|| Case {
            name: format!("{}_against", case.name),
            program: Program::Against,
            ..case.clone()
        });
        paired.push(case.clone());
        paired.extend(theirs);
    }
    let mut swapped = paired.clone();
    let pairs: Vec<usize> = (0..paired.len()).filter(|&i| paired[i].program == Program::Balancer).collect();
    for &i in &pairs {
        swapped.swap(i, i + 1);
    }
    lab.load_against(object)?;
    let (first, second) = (lab.measure(&paired, calls, reps)?, lab.measure(&swapped, calls, reps)?);
    Ok(pairs
        .into_iter()
        .map(|i| Pair {
            name: paired[i].name.clone(),
            ours: (first[i] * second[i + 1]).sqrt(),
            theirs: (first[i + 1] * second[i]).sqrt(),
            orders: format!("{:.3} {:.3}", first[i] / first[i + 1], second[i + 1] / second[i]),
        })
        .collect())
}

/// `bytes` in memory 8-aligned, as the ELF parser wants it, for the rest of the run.
fn aligned(bytes: Vec<u8>) -> &'static [u8] {
    let words: &'static mut [u64] = Box::leak(vec![0u64; bytes.len().div_ceil(8)].into_boxed_slice());
    // SAFETY: the words are at least `bytes.len()` bytes, live for the rest of the process,
    // and any byte pattern is a valid u8.
    let out = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes.len()) };
    out.copy_from_slice(&bytes);
    out
}
