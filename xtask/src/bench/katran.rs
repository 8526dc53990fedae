//! Katran's ratios to its own floor, which the paths' goals are stated against (at most
//! [`GOAL_FACTOR`] of Katran's): the reference's, taken on another machine
//! (`shared/bench-reference.md`), or Katran measured on this machine back to back with the
//! bench (`--katran FILE`), which is the comparison the goals mean: ratios move with the CPU.
//!
//! The file holds one `case ratio` pair a line (`#` starts a comment), cases named as the
//! bench names its own: `table_hit`, `new_flow`, `syn_same_tuple`, `non_vip_pass`,
//! `rate_limited_drop` (Katran's flood limiter tripped; the budget refusal is compared with
//! it too).

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result, bail, ensure};

/// Spillway's goal on a path: at most this share of Katran's ratio.
pub const GOAL_FACTOR: f64 = 0.65;

/// Katran's cases, named as the bench's counterparts of them.
const CASES: [&str; 5] = ["table_hit", "new_flow", "syn_same_tuple", "non_vip_pass", "rate_limited_drop"];

/// Katran's case that the bench's `case` is compared with.
fn counterpart(case: &str) -> Option<&'static str> {
    let theirs = if case == "budget_drop" { "rate_limited_drop" } else { case };
    CASES.into_iter().find(|c| *c == theirs)
}

/// Katran's ratios by its case, and where they come from.
pub struct Katran {
    ratios: BTreeMap<String, f64>,
    /// Measured on this machine (`--katran`), rather than the reference's machine.
    pub here: bool,
}

impl Katran {
    /// The reference's figures: the means of its two runs on a machine of this kind
    /// (`shared/bench-reference.md`).
    pub fn reference() -> Katran {
        let ratios =
            [("table_hit", 2.965), ("new_flow", 8.695), ("syn_same_tuple", 5.865), ("non_vip_pass", 1.745), ("rate_limited_drop", 3.365)];
        Katran { ratios: ratios.into_iter().map(|(case, r)| (case.to_owned(), r)).collect(), here: false }
    }

    /// `--katran FILE`, or the reference without one.
    pub fn from_arg(file: Option<&Path>) -> Result<Katran> {
        let Some(file) = file else {
            return Ok(Katran::reference());
        };
        let text = std::fs::read_to_string(file).with_context(|| format!("reading Katran's ratios from {}", file.display()))?;
        parse(&text).with_context(|| format!("Katran's ratios in {}", file.display()))
    }

    /// Katran's ratio for the bench's `case`, if it has a counterpart there.
    pub fn ratio(&self, case: &str) -> Option<f64> {
        self.ratios.get(counterpart(case)?).copied()
    }

    /// The goal of the bench's `case`: [`GOAL_FACTOR`] of Katran's ratio, or `cap` if that is
    /// lower (a goal of the path's own).
    pub fn goal(&self, case: &str, cap: Option<f64>) -> Option<f64> {
        match (self.ratio(case).map(|r| r * GOAL_FACTOR), cap) {
            (Some(share), Some(cap)) => Some(share.min(cap)),
            (share, cap) => share.or(cap),
        }
    }
}

fn parse(text: &str) -> Result<Katran> {
    let mut ratios = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("line {}", n + 1);
        let mut words = line.split_whitespace();
        let (Some(case), Some(ratio), None) = (words.next(), words.next(), words.next()) else {
            bail!("{}: expected `case ratio`, got `{line}`", at());
        };
        ensure!(CASES.contains(&case), "{}: case `{case}` is none of Katran's ({})", at(), CASES.join(", "));
        let ratio: f64 = ratio.parse().map_err(|_| anyhow::anyhow!("{}: ratio `{ratio}` of `{case}` is not a number", at()))?;
        ensure!(ratio.is_finite() && ratio >= 1.0, "{}: ratio {ratio} of `{case}` is below the floor's 1.0", at());
        ensure!(ratios.insert(case.to_owned(), ratio).is_none(), "{}: `{case}` given twice", at());
    }
    ensure!(!ratios.is_empty(), "no `case ratio` line");
    Ok(Katran { ratios, here: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_ratios_sets_the_goals_at_their_share() {
        let k = parse("# Katran, this VM\ntable_hit 3.70\nrate_limited_drop 5.2 # its limiter\n\n").unwrap();
        assert_eq!(k.ratio("table_hit"), Some(3.70));
        assert!((k.goal("table_hit", None).unwrap() - 3.70 * GOAL_FACTOR).abs() < 1e-9);
        assert_eq!(k.goal("table_hit", Some(1.9)), Some(1.9), "the path's own goal when lower");
        assert_eq!(k.ratio("budget_drop"), Some(5.2), "the budget refusal is compared with the limiter");
        assert_eq!(k.goal("new_flow", None), None, "not measured: no goal against it");
        assert_eq!(k.goal("floor", Some(1.0)), Some(1.0));
        assert_eq!(k.ratio("floor"), None);
    }

    #[test]
    fn without_a_file_the_goals_are_the_share_of_the_reference() {
        let k = Katran::reference();
        assert!((k.goal("new_flow", None).unwrap() - 8.695 * GOAL_FACTOR).abs() < 1e-9);
        assert_eq!(k.goal("table_hit", Some(1.9)), Some(1.9));
        assert_eq!(k.ratio("non_vip_pass"), Some(1.745));
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, says) in [
            ("table_hit", "line 1: expected `case ratio`"),
            ("table_hit 3 4", "line 1: expected `case ratio`"),
            ("\nbudget_drop 3", "line 2: case `budget_drop` is none of Katran's (table_hit, "),
            ("new_flow fast", "line 1: ratio `fast` of `new_flow` is not a number"),
            ("new_flow 0.5", "line 1: ratio 0.5 of `new_flow` is below the floor's 1.0"),
            ("new_flow 9\nnew_flow 9", "line 2: `new_flow` given twice"),
            ("# nothing", "no `case ratio` line"),
        ] {
            let error = parse(text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.starts_with(says), "{text:?}: {error}");
        }
    }
}
