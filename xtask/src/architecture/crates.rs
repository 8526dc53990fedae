//! Crate floors: each workspace crate sits on a floor and may depend only on crates on lower
//! floors, so the crate graph is the wall between layers.
//!
//! The table is a `const` here rather than a TOML file at the root: it is read only by this
//! check, lives beside the code that enforces it, and a typo is a compile error or a failed
//! test instead of a parse error at run time. `cargo xtask architecture` prints it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// Floors from the bottom up: (what the floor is for, its crates). A new crate must be placed.
pub const FLOORS: &[(&str, &[&str])] = &[
    ("shared wire and map types", &["spillway-common"]),
    (
        "the data path and its protocols, and its reference model; the declared state; log lines; man pages",
        &["xdp-ebpf", "spillway-quic-lb", "spillway-model", "spillway-pathmodel", "spillway-logging", "spillway-manual"],
    ),
    ("pure decisions: health and announce policy; the reconciler", &["spillway-policy", "spillway-reconcile"]),
    ("the kernel side: objects, maps, pins, links and routes", &["spillway-dataplane"]),
    ("the host's other watchers and senders: the port watcher, health probes", &["spillway-ports", "spillway-probe"]),
    ("the control API: wire types and client", &["spillway-api"]),
    ("announcing through BIRD; lbctl", &["spillway-announce", "spillway-cli"]),
    ("lbd: the daemon and the agent", &["spillway-daemon"]),
    ("the test harness", &["spillway-harness"]),
    ("developer tasks", &["xtask"]),
];

/// Crates kept apart from the kernel and from an async runtime: none of their normal
/// dependencies, nor those of the workspace crates they use, may name these (a feature as
/// `crate/feature`). `lbctl` is a client of a Unix socket and must build and run anywhere.
pub const KEPT_APART: &[(&str, &[&str])] =
    &[("spillway-cli", KERNEL_AND_RUNTIME), ("spillway-api", KERNEL_AND_RUNTIME), ("spillway-model", KERNEL_AND_RUNTIME)];

/// aya, tokio, and the feature of `spillway-common` that implements aya's traits.
const KERNEL_AND_RUNTIME: &[&str] = &["aya", "tokio", "spillway-common/maps"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DepKind {
    Normal,
    Build,
    /// Dev-dependencies build only tests and may reach any floor: a crate's tests sit above the
    /// crate (as `#[cfg(test)]` modules may reach anywhere below them), and cargo allows such a
    /// test-only cycle (`spillway-daemon`'s tests use `spillway-harness`). They are printed, not
    /// checked.
    Dev,
}

#[derive(Clone, Debug)]
pub struct Crate {
    pub name: String,
    /// Root files of the targets whose module trees are checked: libraries and binaries.
    /// Integration tests, examples, benches and build scripts are test or build code.
    pub roots: Vec<PathBuf>,
    /// Dependencies on other workspace crates.
    pub deps: BTreeSet<(String, DepKind)>,
    /// Normal (not dev, not build) dependencies by name, and each feature asked of them as
    /// `name/feature`.
    pub normal: BTreeSet<String>,
}

/// The workspace's crates from `cargo metadata` (no dependency resolution, so no network).
pub fn workspace(root: &Path) -> Result<Vec<Crate>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    ensure!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let packages = meta["packages"].as_array().context("no packages")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut crates = Vec::new();
    for p in packages {
        let kinds_wanted = ["lib", "bin", "proc-macro"];
        let roots = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["kind"].as_array().into_iter().flatten().any(|k| kinds_wanted.contains(&k.as_str().unwrap_or(""))))
            .filter_map(|t| t["src_path"].as_str().map(PathBuf::from))
            .collect();
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["name"].as_str().is_some_and(|n| names.contains(n)) && d["path"].is_string())
            .map(|d| {
                let kind = match d["kind"].as_str() {
                    Some("dev") => DepKind::Dev,
                    Some("build") => DepKind::Build,
                    _ => DepKind::Normal,
                };
                (d["name"].as_str().unwrap_or_default().to_string(), kind)
            })
            .collect();
        let normal = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            // An optional dependency counts through the feature that turns it on.
            .filter(|d| d["kind"].is_null() && d["optional"] != true)
            .flat_map(|d| {
                let name = d["name"].as_str().unwrap_or_default().to_string();
                let features = d["features"].as_array().into_iter().flatten().filter_map(|f| f.as_str());
                let asked: Vec<String> = features.map(|f| format!("{name}/{f}")).collect();
                std::iter::once(name).chain(asked)
            })
            .collect();
        crates.push(Crate { name: p["name"].as_str().unwrap_or_default().to_string(), roots, deps, normal });
    }
    crates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(crates)
}

/// Every crate of `kept_apart` that reaches what it must not, with the crate that names it.
pub fn check_kept_apart(kept_apart: &[(&str, &[&str])], crates: &[Crate]) -> Vec<String> {
    let by_name: BTreeMap<&str, &Crate> = crates.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut problems = Vec::new();
    for (start, banned) in kept_apart {
        let mut seen = BTreeSet::new();
        let mut todo = vec![*start];
        while let Some(name) = todo.pop() {
            let Some(krate) = by_name.get(name) else { continue };
            if !seen.insert(name) {
                continue;
            }
            for dep in krate.normal.iter().filter(|d| banned.contains(&d.as_str())) {
                problems
                    .push(format!("crate {start} reaches {dep} (through {name}): it must stay apart from the kernel and async runtimes"));
            }
            todo.extend(krate.deps.iter().filter(|(_, k)| *k == DepKind::Normal).map(|(d, _)| d.as_str()));
        }
    }
    problems
}

/// Every breach of the floors: an unplaced crate, a crate placed twice or not in the workspace,
/// and a normal or build dependency on the same or a higher floor.
pub fn check_floors(floors: &[(&str, &[&str])], crates: &[Crate]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut floor_of = BTreeMap::new();
    for (i, (_, names)) in floors.iter().enumerate() {
        for name in *names {
            if floor_of.insert(*name, i).is_some() {
                problems.push(format!("crate {name} is placed on two floors"));
            }
        }
    }
    let present: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    for name in floor_of.keys().filter(|n| !present.contains(*n)) {
        problems.push(format!("crate {name} is on a floor but not in the workspace"));
    }
    for c in crates {
        let Some(&floor) = floor_of.get(c.name.as_str()) else {
            problems.push(format!("crate {} is on no floor: place it in architecture::crates::FLOORS", c.name));
            continue;
        };
        for (dep, kind) in c.deps.iter().filter(|(_, k)| *k != DepKind::Dev) {
            match floor_of.get(dep.as_str()) {
                Some(&f) if f < floor => {}
                Some(&f) => problems.push(format!(
                    "crate {} (floor {floor}) depends ({kind:?}) on {dep} (floor {f}): only lower floors are allowed",
                    c.name
                )),
                None => {} // reported as unplaced on its own
            }
        }
    }
    problems
}
