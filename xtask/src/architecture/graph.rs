//! From a module tree to a file graph: every path a module names is resolved to the file that
//! defines what it names, following `use` and `pub use` re-exports; then the circles are the
//! strongly connected components of more than one file. The same files, each mapped to its
//! crate's top-level module, give the module graph and its circles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::imports::Tree;

/// What a path names: a module (and so its file), or an item defined in a file.
#[derive(Clone, Copy, Debug)]
enum Target {
    Module(usize),
    Item(usize),
}

/// Re-export chains are short; the bound only stops a pathological `use self::a as b; use self::b as a`.
const MAX_DEPTH: usize = 16;

impl Tree {
    fn root_of(&self, mut m: usize) -> usize {
        while let Some(p) = self.modules[m].parent {
            m = p;
        }
        m
    }

    /// Resolves `path` as written in module `from`. `None`: it leaves the crate (std, a dependency),
    /// or names a local that is not an item (`Self::X`, a generic `T::new`).
    fn resolve(&self, from: usize, path: &[String], depth: usize) -> Option<(Target, String)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut target = Target::Module(from);
        let mut name = self.modules[from].name.clone();
        for (i, seg) in path.iter().enumerate() {
            let Target::Module(m) = target else { break };
            target = match seg.as_str() {
                "crate" if i == 0 => Target::Module(self.root_of(m)),
                "self" => Target::Module(m),
                "super" => Target::Module(self.modules[m].parent?),
                "Self" => return None,
                "*" => target,
                _ => match self.lookup(m, seg, depth) {
                    Some(t) => t,
                    // The first segment unknown: not ours. A later one unknown: a name the module
                    // holds in a way not parsed (a macro's output, a glob from outside): its file.
                    None if i == 0 => return None,
                    None => Target::Item(self.modules[m].file),
                },
            };
            name = seg.clone();
        }
        Some((target, name))
    }

    /// A name in a module's scope: a child module, a `use` (followed to what it names), an item
    /// defined here, or something a glob import brings.
    fn lookup(&self, m: usize, name: &str, depth: usize) -> Option<Target> {
        let module = &self.modules[m];
        if let Some(&child) = module.children.get(name) {
            return Some(Target::Module(child));
        }
        if let Some(path) = module.imports.get(name) {
            return self.resolve(m, path, depth + 1).map(|(t, _)| t);
        }
        if module.defs.iter().any(|d| d == name) {
            return Some(Target::Item(module.file));
        }
        module.globs.iter().find_map(|g| match self.resolve(m, g, depth + 1)? {
            (Target::Module(gm), _) if gm != m => self.lookup(gm, name, depth + 1),
            _ => None,
        })
    }

    fn file_of(&self, t: Target) -> usize {
        match t {
            Target::Module(m) => self.modules[m].file,
            Target::Item(f) => f,
        }
    }

    /// Is module `m` inside module `ancestor` (or the same)?
    fn within(&self, mut m: usize, ancestor: usize) -> bool {
        loop {
            if m == ancestor {
                return true;
            }
            match self.modules[m].parent {
                Some(p) => m = p,
                None => return false,
            }
        }
    }

    /// File edges with the names that tie them. A file's edges into its own descendants are its
    /// face (declaring children, re-exporting them) and are left out.
    pub fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (m, module) in self.modules.iter().enumerate() {
            let from = module.file;
            for path in &module.refs {
                let Some((target, name)) = self.resolve(m, path, 0) else { continue };
                // A path that ends on a module (`use crate::health;`) only names a namespace: what
                // is used through it is counted by the paths that go on (`health::HealthConfig`).
                // A glob depends on the whole module.
                if matches!(target, Target::Module(_)) && name != "*" {
                    continue;
                }
                let to = self.file_of(target);
                if to == from || self.within(self.file_module[to], self.file_module[from]) {
                    continue;
                }
                edges.entry((self.files[from].clone(), self.files[to].clone())).or_default().insert(name);
            }
        }
        edges
    }
}

/// (from file, to file) -> the names that tie them.
pub type Edges = BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>;

/// The node a crate root's own file stands for in the module graph. `crate` is a keyword, so
/// no module can be named so.
pub const ROOT_NODE: &str = "crate";

impl Tree {
    /// Each file's top-level module: the child of the crate root that holds it (a file and
    /// everything below it is one node). The root file maps to `ROOT_NODE`, and so do inline
    /// `mod x { }` blocks in it: they count as the file they sit in, as in the file pass.
    pub fn top_level(&self) -> BTreeMap<PathBuf, String> {
        let mut top = BTreeMap::new();
        for (f, &m) in self.file_module.iter().enumerate() {
            let mut node = m;
            while let Some(p) = self.modules[node].parent
                && self.modules[p].parent.is_some()
            {
                node = p;
            }
            let name = if self.modules[node].parent.is_none() { ROOT_NODE.to_string() } else { self.modules[node].name.clone() };
            top.insert(self.files[f].clone(), name);
        }
        top
    }
}

/// The strongly connected components of more than one node (files, or top-level modules), each
/// sorted, in sorted order (Tarjan's algorithm; a crate has a few hundred files at most, so
/// recursion is fine).
pub fn circles<N: Ord + Clone, V>(edges: &BTreeMap<(N, N), V>) -> Vec<Vec<N>> {
    let mut next: BTreeMap<&N, Vec<&N>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    struct State<'a, N> {
        next: BTreeMap<&'a N, Vec<&'a N>>,
        index: BTreeMap<&'a N, (usize, usize)>,
        stack: Vec<&'a N>,
        on_stack: BTreeSet<&'a N>,
        found: Vec<Vec<N>>,
    }
    fn connect<'a, N: Ord + Clone>(s: &mut State<'a, N>, v: &'a N) {
        let i = s.index.len();
        s.index.insert(v, (i, i));
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.next[v].clone() {
            if !s.index.contains_key(w) {
                connect(s, w);
                let low = s.index[v].1.min(s.index[w].1);
                s.index.get_mut(v).unwrap().1 = low;
            } else if s.on_stack.contains(w) {
                let low = s.index[v].1.min(s.index[w].0);
                s.index.get_mut(v).unwrap().1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let nodes: Vec<&N> = next.keys().copied().collect();
    let mut s = State { next, index: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), found: Vec::new() };
    for v in nodes {
        if !s.index.contains_key(v) {
            connect(&mut s, v);
        }
    }
    s.found.sort();
    s.found
}
