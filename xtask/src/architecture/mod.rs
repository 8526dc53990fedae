//! `cargo xtask architecture`: the walls of the workspace, checked. Crates sit on floors and
//! depend only downward (`crates.rs`); inside a crate, the file-level import graph has no
//! circle (`imports.rs` reads it, `graph.rs` resolves it and finds the circles).
//!
//! A second pass looks at each crate target's top-level modules (the children of its root file:
//! `config`, `dataplane`, `health`, ...; a file and everything below it is one node), with an
//! edge A -> B when a file in A names a file in B. The file pass leaves out a file's edges into
//! its own descendants (its face), so a circle that closes through a face, such as `reconcile.rs`
//! -> `dataplane/mod.rs` -> `dataplane/maps.rs` -> `reconcile.rs`, is seen only here. These are
//! the circles that would become circles between crates if the crate were split along its
//! top-level modules. The root file is the node `crate` (`graph::ROOT_NODE`), not a module:
//! names defined in it are edges into `crate`; its own edges go to its descendants, so they are
//! its face and `crate` never sits in a circle.
//!
//! Every circle, of files or of top-level modules, is a violation: a circle is broken by moving
//! a type to where it belongs, never listed as an exception.

mod crates;
mod graph;
mod imports;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crates::{Crate, DepKind, FLOORS, KEPT_APART};
use graph::{Edges, ROOT_NODE};
use imports::Tree;

#[derive(Debug)]
pub struct Circle {
    pub krate: String,
    /// Sorted, relative to the workspace root.
    pub files: Vec<String>,
    /// (from, to, names) for the edges inside the circle.
    pub edges: Vec<(String, String, Vec<String>)>,
}

/// A circle between top-level modules of one crate target.
#[derive(Debug)]
pub struct ModuleCircle {
    pub krate: String,
    /// The target's root file, relative to the workspace root.
    pub root: String,
    /// Sorted top-level module names.
    pub modules: Vec<String>,
    /// (from, to, names) for the file edges between different modules of the circle.
    pub edges: Vec<(String, String, Vec<String>)>,
}

/// One target's file graph, and each of its files' top-level module.
pub struct TargetGraph {
    pub root: PathBuf,
    pub top: BTreeMap<PathBuf, String>,
    pub edges: Edges,
}

/// The graphs of the given target roots, paths made relative to `base`.
pub fn target_graphs(roots: &[PathBuf], base: &Path) -> Result<Vec<TargetGraph>> {
    let rel = |p: &Path| p.strip_prefix(base).unwrap_or(p).to_path_buf();
    let mut graphs = Vec::new();
    for root in roots {
        let tree = Tree::load(root)?;
        let edges = tree.edges().into_iter().map(|((from, to), names)| ((rel(&from), rel(&to)), names)).collect();
        let top = tree.top_level().into_iter().map(|(f, m)| (rel(&f), m)).collect();
        graphs.push(TargetGraph { root: rel(root), top, edges });
    }
    Ok(graphs)
}

/// The targets' file graphs as one (a file two targets share via `#[path]` is one node).
fn merged(graphs: &[TargetGraph]) -> Edges {
    let mut edges = Edges::new();
    for g in graphs {
        for (key, names) in &g.edges {
            edges.entry(key.clone()).or_default().extend(names.iter().cloned());
        }
    }
    edges
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

/// The circles of one crate's file graph, with the edges that make them.
fn file_circles(krate: &str, edges: &Edges) -> Vec<Circle> {
    graph::circles(edges)
        .into_iter()
        .map(|files| {
            let inside = edges
                .iter()
                .filter(|((f, t), _)| files.contains(f) && files.contains(t))
                .map(|((f, t), names)| (show(f), show(t), names.iter().cloned().collect()))
                .collect();
            Circle { krate: krate.to_string(), files: files.iter().map(|f| show(f)).collect(), edges: inside }
        })
        .collect()
}

/// The module graph of one target: (from module, to module) -> the file edges that make it.
/// Edges inside one top-level module are left out: they are the file pass's business.
pub fn module_graph(g: &TargetGraph) -> BTreeMap<(String, String), Vec<(PathBuf, PathBuf)>> {
    let mut modules: BTreeMap<(String, String), Vec<(PathBuf, PathBuf)>> = BTreeMap::new();
    for (from, to) in g.edges.keys() {
        let (Some(a), Some(b)) = (g.top.get(from), g.top.get(to)) else { continue };
        if a != b {
            modules.entry((a.clone(), b.clone())).or_default().push((from.clone(), to.clone()));
        }
    }
    modules
}

/// The circles between the top-level modules of one target. Each target is its own crate for
/// rustc, so targets are not merged here (a file two targets share via `#[path]` can make the
/// same circle in both).
fn target_module_circles(krate: &str, g: &TargetGraph) -> Vec<ModuleCircle> {
    let modules = module_graph(g);
    graph::circles(&modules)
        .into_iter()
        .map(|circle| {
            let edges = modules
                .iter()
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .flat_map(|(_, files)| files)
                .map(|(f, t)| (show(f), show(t), g.edges[&(f.clone(), t.clone())].iter().cloned().collect()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            ModuleCircle { krate: krate.to_string(), root: show(&g.root), modules: circle, edges }
        })
        .collect()
}

/// Each circle as a violation.
pub fn circle_problems(circles: &[Circle], module_circles: &[ModuleCircle]) -> Vec<String> {
    let files = circles.iter().map(|c| format!("circle in {}: {}", c.krate, c.files.join(", ")));
    let modules = module_circles.iter().map(|c| format!("module circle in {} ({}): {}", c.krate, c.root, c.modules.join(", ")));
    files.chain(modules).collect()
}

pub struct Findings {
    pub crates: Vec<Crate>,
    pub circles: Vec<Circle>,
    pub module_circles: Vec<ModuleCircle>,
    /// Floor breaches and circles; empty when the check passes.
    pub problems: Vec<String>,
}

pub fn check(root: &Path) -> Result<Findings> {
    let crates = crates::workspace(root)?;
    let mut problems = crates::check_floors(FLOORS, &crates);
    problems.extend(crates::check_kept_apart(KEPT_APART, &crates));
    let mut circles = Vec::new();
    let mut module_circles = Vec::new();
    for c in &crates {
        let graphs = target_graphs(&c.roots, root)?;
        circles.extend(file_circles(&c.name, &merged(&graphs)));
        module_circles.extend(graphs.iter().flat_map(|g| target_module_circles(&c.name, g)));
    }
    problems.extend(circle_problems(&circles, &module_circles));
    Ok(Findings { crates, circles, module_circles, problems })
}

fn print_edges(edges: &[(String, String, Vec<String>)]) {
    for (from, to, names) in edges {
        println!("      {from} -> {to}: {}", names.join(", "));
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

pub fn run() -> Result<()> {
    let f = check(&workspace_root())?;
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
    println!("\nFile circles ({}):", f.circles.len());
    for c in &f.circles {
        println!("  {}: {}", c.krate, c.files.join(", "));
        print_edges(&c.edges);
    }
    println!(
        "\nModule circles ({}) (a target's top-level modules, each with all files below it; `{ROOT_NODE}` is the root file):",
        f.module_circles.len()
    );
    for c in &f.module_circles {
        println!("  {} {}: {}", c.krate, c.root, c.modules.join(", "));
        print_edges(&c.edges);
    }
    let problems = f.problems;
    if problems.is_empty() {
        println!("\nNo violation.");
        return Ok(());
    }
    println!("\nViolations:");
    problems.iter().for_each(|p| println!("  {p}"));
    bail!("{} architecture violation(s)", problems.len())
}
