//! Small synthetic trees written to a temporary folder, then the real workspace.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::crates::{Crate, DepKind, check_floors, check_kept_apart};
use super::graph::{Edges, ROOT_NODE};
use super::{
    Circle, ModuleCircle, check, circle_problems, file_circles, merged, module_graph, target_graphs, target_module_circles, workspace_root,
};

fn file_graph(roots: &[PathBuf], base: &Path) -> Result<Edges> {
    Ok(merged(&target_graphs(roots, base)?))
}

fn crate_circles(krate: &str, roots: &[PathBuf], base: &Path) -> Result<Vec<Circle>> {
    Ok(file_circles(krate, &file_graph(roots, base)?))
}

fn module_circles(dir: &Path) -> Vec<ModuleCircle> {
    let graphs = target_graphs(&[dir.join("lib.rs")], dir).unwrap();
    graphs.iter().flat_map(|g| target_module_circles("t", g)).collect()
}

/// (from module, to module) pairs of the module graph.
fn module_edges(dir: &Path) -> Vec<(String, String)> {
    let graphs = target_graphs(&[dir.join("lib.rs")], dir).unwrap();
    module_graph(&graphs[0]).into_keys().collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

/// Writes `files` (path, text) under a fresh folder named after the test; returns the folder.
fn tree(test: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-architecture-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn circles(dir: &Path) -> Vec<Vec<String>> {
    let found = crate_circles("t", &[dir.join("lib.rs")], dir).unwrap();
    found.into_iter().map(|c| c.files).collect()
}

fn edge_names(dir: &Path, from: &str, to: &str) -> Option<BTreeSet<String>> {
    file_graph(&[dir.join("lib.rs")], dir).unwrap().get(&(PathBuf::from(from), PathBuf::from(to))).cloned()
}

#[test]
fn sibling_circle_is_found_with_its_names() {
    let dir = tree(
        "sibling",
        &[
            ("lib.rs", "mod a; mod b;"),
            ("a.rs", "use crate::{b::{B, helper}, a::A as Same}; pub struct A;"),
            ("b.rs", "pub struct B; pub fn helper() -> crate::a::A { crate::a::A }"),
        ],
    );
    assert_eq!(circles(&dir), vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
    let c = &crate_circles("t", &[dir.join("lib.rs")], &dir).unwrap()[0];
    assert_eq!(c.edges[0], ("a.rs".into(), "b.rs".into(), vec!["B".into(), "helper".into()]));
    assert_eq!(c.edges[1], ("b.rs".into(), "a.rs".into(), vec!["A".into()]));
}

#[test]
fn a_face_re_exporting_its_child_is_not_a_circle() {
    let dir = tree(
        "face",
        &[
            ("lib.rs", "pub mod health;"),
            ("health/mod.rs", "mod tracker; pub use tracker::Tracker; pub struct Outcome; fn f(_: tracker::Tracker) {}"),
            ("health/tracker.rs", "use super::Outcome; pub struct Tracker(Outcome);"),
        ],
    );
    assert!(circles(&dir).is_empty());
    // The child's edge up to its parent stays; the parent's edges down are its face.
    assert!(edge_names(&dir, "health/tracker.rs", "health/mod.rs").is_some());
    assert!(edge_names(&dir, "health/mod.rs", "health/tracker.rs").is_none());
}

#[test]
fn a_re_export_is_followed_to_the_defining_file() {
    let dir = tree(
        "reexport",
        &[
            ("lib.rs", "mod health; mod model;"),
            ("health.rs", "mod config; pub use self::config::HealthConfig;"),
            ("health/config.rs", "pub struct HealthConfig;"),
            ("model/mod.rs", "mod backend;"),
            ("model/backend.rs", "use crate::health; pub struct Backend(health::HealthConfig);"),
        ],
    );
    assert_eq!(edge_names(&dir, "model/backend.rs", "health/config.rs"), Some(BTreeSet::from(["HealthConfig".to_string()])));
    assert!(edge_names(&dir, "model/backend.rs", "health.rs").is_none());
}

#[test]
fn super_is_resolved() {
    let dir = tree(
        "super",
        &[
            ("lib.rs", "mod net;"),
            ("net/mod.rs", "mod tcp; mod udp;"),
            ("net/tcp.rs", "use super::udp::Port; pub struct Tcp(Port);"),
            ("net/udp.rs", "pub struct Port; fn f(_: super::tcp::Tcp) {}"),
        ],
    );
    assert_eq!(circles(&dir), vec![vec!["net/tcp.rs".to_string(), "net/udp.rs".to_string()]]);
}

#[test]
fn cfg_test_code_is_left_out() {
    // `testing.rs` does not exist: a cfg(test) module's file is never read.
    let dir = tree(
        "cfgtest",
        &[
            ("lib.rs", "mod a; mod b; #[cfg(test)] mod testing;"),
            ("a.rs", "use crate::b::B; pub struct A(B);"),
            (
                "b.rs",
                "pub struct B; #[cfg(test)] use crate::a::A; #[cfg(all(test, unix))] fn t() -> crate::a::A { todo!() }
                 #[cfg(test)] mod tests { use crate::a::A; fn t(_: A) {} }",
            ),
        ],
    );
    assert!(circles(&dir).is_empty());
}

/// `reconcile.rs -> dataplane/mod.rs -> dataplane/maps.rs -> reconcile.rs`: the middle edge is
/// the face of `dataplane`, so the file pass sees no circle; the module pass does.
#[test]
fn a_circle_through_a_face_is_found_at_module_level() {
    let dir = tree(
        "modface",
        &[
            ("lib.rs", "mod dataplane; mod reconcile;"),
            ("dataplane/mod.rs", "mod maps; pub use maps::BpfMaps; pub struct DataplaneError;"),
            ("dataplane/maps.rs", "use crate::reconcile::Maps; pub struct BpfMaps; impl Maps for BpfMaps {}"),
            ("reconcile.rs", "use crate::dataplane::DataplaneError; pub trait Maps { fn f() -> Result<(), DataplaneError>; }"),
        ],
    );
    assert!(circles(&dir).is_empty());
    let found = module_circles(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].root.as_str(), found[0].modules.clone()), ("lib.rs", vec!["dataplane".into(), "reconcile".into()]));
    assert_eq!(
        found[0].edges,
        vec![
            ("dataplane/maps.rs".into(), "reconcile.rs".into(), vec!["Maps".into()]),
            ("reconcile.rs".into(), "dataplane/mod.rs".into(), vec!["DataplaneError".into()]),
        ]
    );
}

/// A circle between files of one top-level module is the file pass's: the module graph has no
/// edge from a module to itself, and reports nothing again.
#[test]
fn a_file_circle_inside_one_module_is_not_a_module_circle() {
    let dir = tree(
        "modinside",
        &[
            ("lib.rs", "mod app; mod net;"),
            ("net/mod.rs", "mod tcp; mod udp; pub use tcp::Tcp;"),
            ("net/tcp.rs", "use super::udp::Port; pub struct Tcp(Port);"),
            ("net/udp.rs", "pub struct Port; fn f(_: super::tcp::Tcp) {}"),
            ("app.rs", "use crate::net::Tcp; pub struct App(Tcp);"),
        ],
    );
    assert_eq!(circles(&dir), vec![vec!["net/tcp.rs".to_string(), "net/udp.rs".to_string()]]);
    assert_eq!(module_edges(&dir), vec![pair("app", "net")]);
    assert!(module_circles(&dir).is_empty());
}

/// The crate root is not a module: its file (inline modules in it included) is the node
/// `crate`. Names defined there are edges into `crate`; its own paths into its descendants are
/// its face, left out as in the file pass, so `crate` has no edge out and no circle.
#[test]
fn the_crate_root_is_a_node_with_no_edge_out() {
    let dir = tree(
        "modroot",
        &[
            (
                "lib.rs",
                "mod a; mod b; pub use a::A; pub struct Shared; fn f() -> b::B { todo!() }
                 mod inline { pub fn g() -> crate::a::A { todo!() } }",
            ),
            ("a.rs", "use crate::{Shared, inline::g}; pub struct A(Shared);"),
            ("b.rs", "pub struct B(crate::Shared, crate::A);"),
        ],
    );
    assert_eq!(module_edges(&dir), vec![pair("a", ROOT_NODE), pair("b", "a"), pair("b", ROOT_NODE)]);
    assert!(module_circles(&dir).is_empty());
    assert!(circles(&dir).is_empty());
}

#[test]
fn every_circle_is_a_violation() {
    let dir = tree(
        "violations",
        &[
            ("lib.rs", "mod a; mod b; mod c; mod d;"),
            ("a/mod.rs", "mod inner; pub struct A;"),
            ("a/inner.rs", "use crate::b::B; pub struct Inner(B);"),
            ("b.rs", "pub struct B; fn f(_: crate::a::A) {}"),
            ("c.rs", "use crate::d::D; pub struct C;"),
            ("d.rs", "use crate::c::C; pub struct D;"),
        ],
    );
    let files = crate_circles("t", &[dir.join("lib.rs")], &dir).unwrap();
    let modules = module_circles(&dir);
    let problems = circle_problems(&files, &modules);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems.contains(&"circle in t: c.rs, d.rs".to_owned()), "{problems:?}");
    assert!(problems.contains(&"module circle in t (lib.rs): a, b".to_owned()), "{problems:?}");
}

fn krate(name: &str, deps: &[(&str, DepKind)]) -> Crate {
    let normal = deps.iter().filter(|(_, k)| *k == DepKind::Normal).map(|(d, _)| d.to_string()).collect();
    Crate { name: name.into(), roots: vec![], deps: deps.iter().map(|(d, k)| (d.to_string(), *k)).collect(), normal }
}

#[test]
fn a_crate_kept_apart_may_not_reach_the_kernel_through_another() {
    let kept: &[(&str, &[&str])] = &[("cli", &["aya", "common/maps"])];
    // common names tokio, which cli does not ban: only common/maps counts.
    let mut common = krate("common", &[]);
    let _ = &mut common;
    let mut api = krate("api", &[("common", DepKind::Normal)]);
    let cli = krate("cli", &[("api", DepKind::Normal)]);
    assert_eq!(check_kept_apart(kept, &[common.clone(), api.clone(), cli.clone()]), Vec::<String>::new());
    api.normal.insert("common/maps".into());
    common.normal.insert("tokio".into());
    let problems = check_kept_apart(kept, &[common, api, cli]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("reaches common/maps (through api)"), "{problems:?}");
}

#[test]
fn an_upward_dependency_is_refused() {
    let floors: &[(&str, &[&str])] = &[("low", &["low"]), ("high", &["high", "peer"])];
    let ok = [krate("low", &[("high", DepKind::Dev)]), krate("high", &[("low", DepKind::Normal)]), krate("peer", &[])];
    assert_eq!(check_floors(floors, &ok), Vec::<String>::new());
    let up = [krate("low", &[("high", DepKind::Build)]), krate("high", &[]), krate("peer", &[])];
    assert_eq!(check_floors(floors, &up).len(), 1, "{:?}", check_floors(floors, &up));
    let same_floor = [krate("low", &[]), krate("high", &[("peer", DepKind::Normal)]), krate("peer", &[])];
    assert_eq!(check_floors(floors, &same_floor).len(), 1);
}

#[test]
fn an_unplaced_crate_is_refused() {
    let floors: &[(&str, &[&str])] = &[("low", &["low"])];
    let problems = check_floors(floors, &[krate("low", &[]), krate("new", &[("low", DepKind::Normal)])]);
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("new is on no floor"), "{problems:?}");
}

/// The check on the real workspace: floors hold, and there is no circle.
#[test]
fn the_workspace_keeps_its_walls() {
    let findings = check(&workspace_root()).unwrap();
    assert!(findings.problems.is_empty(), "run `cargo xtask architecture`:\n{}", findings.problems.join("\n"));
}
