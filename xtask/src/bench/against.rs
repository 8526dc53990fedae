//! `--against <object>`: the paths' balancer cases run by this build's balancer and by
//! another build's (its `spillway-lb` object), on the same maps, alternating in the same
//! chunks of the same repetitions. Two builds measured in two runs differ by more than most
//! changes do on a shared VM (the floor itself moves 10-15% between runs); measured in one,
//! the machine's drift falls on both alike, and the ratio of the two is what changed.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::{
    Section,
    packets::{Case, Flows, Lab, Program},
    paths,
};

pub fn part(object: Option<&Path>, calls: usize, reps: usize) -> Result<Section> {
    let path = object.context("needs --against <the spillway-lb object of another build>")?;
    let object = aligned(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    // Each balancer case twice, this build's then the other's; measured a second time with
    // each pair swapped, since a case runs a little differently after its neighbour in the
    // chunk (the caches it leaves): the geometric mean of the two orders' ratios cancels that.
    let mut cases: Vec<Case> = Vec::new();
    for case in paths::paths(Flows::new()?).into_iter().map(|p| p.case) {
        let theirs = (case.program == Program::Balancer).then(|| Case {
            name: format!("{}_against", case.name),
            program: Program::Against,
            ..case.clone()
        });
        cases.push(case);
        cases.extend(theirs);
    }
    let mut swapped = cases.clone();
    let pairs: Vec<usize> = (0..cases.len()).filter(|&i| cases[i].program == Program::Balancer).collect();
    for &i in &pairs {
        swapped.swap(i, i + 1);
    }
    let (first, second) = Lab::with(|lab| {
        lab.load_against(object)?;
        Ok((lab.measure(&cases, calls, reps)?, lab.measure(&swapped, calls, reps)?))
    })?;
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
    for (i, case) in pairs.into_iter().map(|i| (i, &cases[i])) {
        let (ours, theirs) = ((first[i] * second[i + 1]).sqrt(), (first[i + 1] * second[i]).sqrt());
        let orders = format!("{:.3} {:.3}", first[i] / first[i + 1], second[i + 1] / second[i]);
        let name = &case.name;
        writeln!(text, "{name:<22} | {ours:>9.1} | {theirs:>9.1} | {:>10.3} | {orders:>10}", ours / theirs)?;
        rows.push((format!("against_{name}_x_other"), ours / theirs));
    }
    Ok(Section { text, rows, ..Section::default() })
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
