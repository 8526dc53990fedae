//! `cargo xtask architecture`: the walls of the workspace, checked. Crates sit on floors and
//! depend only downward (`crates.rs`); inside a crate, the file-level import graph has no
//! circle (`imports.rs` reads it, `graph.rs` resolves it and finds the circles).
//!
//! Circles that exist today are listed in `KNOWN_CIRCLES`, a ratchet: the check fails on a circle
//! not in the list and on a listed circle that is gone, so the list only shrinks.

mod crates;
mod graph;
mod imports;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crates::{Crate, DepKind, FLOORS};
use graph::Edges;
use imports::Tree;

/// Today's circles (files relative to the workspace root). Remove an entry when its
/// circle is broken; the check fails until you do. Never add one.
pub const KNOWN_CIRCLES: &[&[&str]] = &[
    &["xdp-ebpf/src/bin/lb/maps.rs", "xdp-ebpf/src/bin/lb/ptb.rs", "xdp-ebpf/src/bin/lb/second_chance.rs", "xdp-ebpf/src/bin/lb/select.rs"],
    &["xdp-ebpf/src/bin/lb/path.rs", "xdp-ebpf/src/bin/lb/stats.rs"],
];

#[derive(clap::Args)]
pub struct Args {
    /// Count the known circles as violations too (what the check becomes once the list is empty).
    #[arg(long)]
    strict: bool,
}

#[derive(Debug)]
pub struct Circle {
    pub krate: String,
    /// Sorted, relative to the workspace root.
    pub files: Vec<String>,
    /// (from, to, names) for the edges inside the circle.
    pub edges: Vec<(String, String, Vec<String>)>,
}

/// The file graph of the given target roots, paths made relative to `base`.
pub fn file_graph(roots: &[PathBuf], base: &Path) -> Result<Edges> {
    let mut edges = Edges::new();
    for root in roots {
        for ((from, to), names) in Tree::load(root)?.edges() {
            let rel = |p: &Path| p.strip_prefix(base).unwrap_or(p).to_path_buf();
            edges.entry((rel(&from), rel(&to))).or_default().extend(names);
        }
    }
    Ok(edges)
}

/// The circles of one crate's file graph, with the edges that make them.
pub fn crate_circles(krate: &str, roots: &[PathBuf], base: &Path) -> Result<Vec<Circle>> {
    let edges = file_graph(roots, base)?;
    let show = |p: &PathBuf| p.display().to_string();
    Ok(graph::circles(&edges)
        .into_iter()
        .map(|files| {
            let inside = edges
                .iter()
                .filter(|((f, t), _)| files.contains(f) && files.contains(t))
                .map(|((f, t), names)| (show(f), show(t), names.iter().cloned().collect()))
                .collect();
            Circle { krate: krate.to_string(), files: files.iter().map(show).collect(), edges: inside }
        })
        .collect())
}

/// Does a `KNOWN_CIRCLES` entry name exactly this circle's files (in any order)?
fn is(known: &[&str], c: &Circle) -> bool {
    known.len() == c.files.len() && known.iter().all(|f| c.files.iter().any(|g| g == f))
}

/// The ratchet: circles not in `known`, and entries of `known` that no longer exist.
pub fn ratchet(circles: &[Circle], known: &[&[&str]]) -> Vec<String> {
    let mut problems = Vec::new();
    for c in circles.iter().filter(|c| !known.iter().any(|k| is(k, c))) {
        problems.push(format!("new circle in {}: {}", c.krate, c.files.join(", ")));
    }
    for k in known.iter().filter(|k| !circles.iter().any(|c| is(k, c))) {
        problems.push(format!("known circle is gone (remove it from KNOWN_CIRCLES): {}", k.join(", ")));
    }
    problems
}

pub struct Findings {
    pub crates: Vec<Crate>,
    pub circles: Vec<Circle>,
    /// Floor breaches and ratchet failures; empty when the check passes.
    pub problems: Vec<String>,
}

pub fn check(root: &Path, known: &[&[&str]]) -> Result<Findings> {
    let crates = crates::workspace(root)?;
    let mut problems = crates::check_floors(FLOORS, &crates);
    let mut circles = Vec::new();
    for c in &crates {
        circles.extend(crate_circles(&c.name, &c.roots, root)?);
    }
    problems.extend(ratchet(&circles, known));
    Ok(Findings { crates, circles, problems })
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

pub fn run(args: &Args) -> Result<()> {
    let f = check(&workspace_root(), KNOWN_CIRCLES)?;
    println!("Floors (a crate depends only on lower floors; dev-dependencies are not checked):");
    for (i, (what, names)) in FLOORS.iter().enumerate().rev() {
        println!("  {i} {what}");
        for name in *names {
            let deps: Vec<String> = f
                .crates
                .iter()
                .filter(|c| c.name == *name)
                .flat_map(|c| &c.deps)
                .map(|(d, k)| if *k == DepKind::Normal { d.clone() } else { format!("{d} ({k:?})") })
                .collect();
            println!("      {name} -> {}", if deps.is_empty() { "-".to_string() } else { deps.join(", ") });
        }
    }
    println!("\nModule circles ({}):", f.circles.len());
    for c in &f.circles {
        let known = KNOWN_CIRCLES.iter().any(|k| is(k, c));
        println!("  {}{}: {}", c.krate, if known { " (known)" } else { "" }, c.files.join(", "));
        for (from, to, names) in &c.edges {
            println!("      {from} -> {to}: {}", names.join(", "));
        }
    }
    let mut problems = f.problems;
    if args.strict {
        problems.extend(f.circles.iter().map(|c| format!("circle in {}: {}", c.krate, c.files.join(", "))));
        problems.dedup();
    }
    if problems.is_empty() {
        println!("\nNo violation.");
        return Ok(());
    }
    println!("\nViolations:");
    problems.iter().for_each(|p| println!("  {p}"));
    bail!("{} architecture violation(s)", problems.len())
}
