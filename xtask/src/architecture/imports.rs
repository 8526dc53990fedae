//! The module tree of one crate target, read from its own source with `syn`: which module each
//! file holds, what each module defines, what its `use` declarations bring in and which paths
//! its code names. Parsing, not resolution: `graph.rs` resolves paths against this tree.
//!
//! `syn` rather than lines: `use` groups span lines and nest, inline `mod tests { .. }` blocks
//! end where their braces say, and `crate::` can sit in strings and comments. `syn` is already
//! in the lock file (the derive macros use it), so it adds no download.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use syn::visit::{self, Visit};

/// One module: a file, or an inline `mod x { }` (which counts as the file it sits in).
#[derive(Debug, Default)]
pub struct Module {
    pub name: String,
    pub parent: Option<usize>,
    /// Index into `Tree::files`.
    pub file: usize,
    pub children: BTreeMap<String, usize>,
    /// Names of the non-module items defined here (types, functions, traits, consts, macros).
    pub defs: Vec<String>,
    /// Names brought in by `use` (after `as`), with the path as written.
    pub imports: BTreeMap<String, Vec<String>>,
    /// `use path::*`.
    pub globs: Vec<Vec<String>>,
    /// What this module's code names: every `use` leaf (a glob ends in `*`) and every path of two
    /// or more segments in its items (types, expressions, patterns, macro names). `graph.rs`
    /// resolves them.
    pub refs: Vec<Vec<String>>,
}

#[derive(Debug, Default)]
pub struct Tree {
    pub files: Vec<PathBuf>,
    /// The outermost module each file holds (its "file module").
    pub file_module: Vec<usize>,
    pub modules: Vec<Module>,
}

impl Tree {
    /// Reads the tree of the target whose root file (`lib.rs`, `main.rs`, a `bin/x.rs`) is `root`.
    /// `#[cfg(test)]` modules and items are skipped, so files only they reach are never read.
    pub fn load(root: &Path) -> Result<Tree> {
        let mut tree = Tree::default();
        // A crate root's children sit beside it, like a `mod.rs`'s.
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        tree.load_file(root, String::from("crate"), None, &dir)?;
        Ok(tree)
    }

    fn load_file(&mut self, path: &Path, name: String, parent: Option<usize>, child_dir: &Path) -> Result<usize> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        let file_index = self.files.len();
        self.files.push(path.to_path_buf());
        let module = self.new_module(name, parent, file_index);
        self.file_module.push(module);
        self.load_items(module, &file.items, path, child_dir)?;
        Ok(module)
    }

    fn new_module(&mut self, name: String, parent: Option<usize>, file: usize) -> usize {
        let id = self.modules.len();
        self.modules.push(Module { name: name.clone(), parent, file, ..Module::default() });
        if let Some(p) = parent {
            self.modules[p].children.insert(name, id);
        }
        id
    }

    fn load_items(&mut self, module: usize, items: &[syn::Item], path: &Path, child_dir: &Path) -> Result<()> {
        for item in items {
            match item {
                syn::Item::Mod(m) if !is_cfg_test(&m.attrs) => {
                    let name = m.ident.to_string();
                    match &m.content {
                        // Inline: same file; its own children go one folder down.
                        Some((_, inner)) => {
                            let id = self.new_module(name.clone(), Some(module), self.modules[module].file);
                            self.load_items(id, inner, path, &child_dir.join(&name))?;
                        }
                        None => {
                            let file = module_file(&m.attrs, path, child_dir, &name)?;
                            // `x/mod.rs` keeps its children in `x/`; `x.rs` keeps them in `x/` too.
                            let dir = child_dir.join(&name);
                            self.load_file(&file, name, Some(module), &dir)?;
                        }
                    }
                }
                syn::Item::Mod(_) => {}
                syn::Item::Use(u) if !is_cfg_test(&u.attrs) => self.add_use(module, &u.tree),
                item if !is_cfg_test(item_attrs(item)) => {
                    if let Some(name) = item_name(item) {
                        self.modules[module].defs.push(name);
                    }
                    let mut paths = Paths { tree: self, module };
                    paths.visit_item(item);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn add_use(&mut self, module: usize, tree: &syn::UseTree) {
        let mut leaves = Vec::new();
        use_leaves(tree, &mut Vec::new(), &mut leaves);
        let m = &mut self.modules[module];
        for (mut path, name) in leaves {
            match name {
                None => {
                    m.globs.push(path.clone());
                    // Marks the ref as a glob: it depends on the whole module it names.
                    path.push("*".into());
                }
                // `use std::fmt::Write as _` names nothing.
                Some(name) if name != "_" => {
                    m.imports.insert(name, path.clone());
                }
                Some(_) => {}
            }
            m.refs.push(path);
        }
    }
}

/// The file `mod name;` loads: `#[path]` (relative to the declaring file's folder), else
/// `dir/name.rs`, else `dir/name/mod.rs`.
fn module_file(attrs: &[syn::Attribute], declaring: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    for attr in attrs {
        if let syn::Meta::NameValue(nv) = &attr.meta
            && nv.path.is_ident("path")
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value
        {
            return Ok(declaring.parent().unwrap_or(Path::new(".")).join(s.value()));
        }
    }
    let flat = dir.join(format!("{name}.rs"));
    let nested = dir.join(name).join("mod.rs");
    if flat.exists() {
        Ok(flat)
    } else if nested.exists() {
        Ok(nested)
    } else {
        anyhow::bail!("{}: `mod {name};` has no file ({} or {})", declaring.display(), flat.display(), nested.display())
    }
}

/// Flattens a `use` tree into (full path, bound name) leaves; a glob binds `None`.
/// `a::{self, b::C as D}` gives (`a`, a) and (`a::b::C`, D).
fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => out.push((prefix.clone(), prefix.last().cloned())),
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((path, Some(n.ident.to_string())));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, prefix, out)),
    }
}

/// Collects the paths inside one item into its module's `refs`, skipping `#[cfg(test)]` parts.
struct Paths<'a> {
    tree: &'a mut Tree,
    module: usize,
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            // A `use` inside a function body counts for its module (scopes are not tracked).
            syn::Item::Use(u) if !is_cfg_test(&u.attrs) => self.tree.add_use(self.module, &u.tree),
            // Items nested in bodies (rare `mod`s included) are walked for paths only.
            item if !is_cfg_test(item_attrs(item)) => visit::visit_item(self, item),
            _ => {}
        }
    }
    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_cfg_test(attrs) {
            visit::visit_impl_item(self, item);
        }
    }
    fn visit_path(&mut self, path: &'ast syn::Path) {
        // One segment is a local name or something a `use` already counted; `::x` is extern.
        if path.segments.len() >= 2 && path.leading_colon.is_none() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.tree.modules[self.module].refs.push(segments);
        }
        visit::visit_path(self, path);
    }
}

/// `#[cfg(test)]` or `#[cfg(all(test, ..))]`: code that only tests build. (`cfg(any(test, ..))`
/// and `cfg(not(test))` are not test-only.)
pub fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let syn::Meta::List(list) = &a.meta else { return false };
        if !list.path.is_ident("cfg") {
            return false;
        }
        let tokens = list.tokens.to_string().replace(' ', "");
        tokens == "test" || tokens.strip_prefix("all(").is_some_and(|rest| rest.trim_end_matches(')').split(',').any(|t| t == "test"))
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}
