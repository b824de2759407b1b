//! Import cycles between a crate's modules, found from its sources.
//!
//! A module is a file or a directory under `src/` (`command` for
//! `command.rs` or `command/mod.rs`, `command/nodes` for
//! `command/nodes.rs`); inline modules (`mod tests { .. }`) count as part
//! of their file. Module `a` depends on module `b` when code in `a` names
//! something in `b`: in a `use` line or in a path in code
//! (`crate::b::f()`, `super::b::T`, `b::T` for a child `b`), with `self::`
//! and `super::` resolved and names that a module re-exports
//! (`pub use x::T`) followed to where they come from.
//!
//! Cycles are looked for among siblings: a dependency of `a/x` on `b/y`
//! counts as one of `a` on `b` (two directories that use each other are
//! tangled, whichever files do it), and one of `a/x` on `a/y` as one of
//! `x` on `y` inside `a`. A module and its own submodules may use each
//! other (a parent re-exports its children's items, a child uses its
//! parent's): that is how a module is split into files, not a cycle.
//!
//! Test code (items under `#[cfg(test)]`, and files of modules declared
//! so) is left out: a test may use what it tests from anywhere.
//!
//! What it does not see: calls of methods (`self.restore()` names no
//! module), paths inside macro invocations, and glob re-exports (a name
//! reached through `pub use x::*` counts as the re-exporting module's).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};

/// A module by its path from the crate root (`["command", "nodes"]`); the
/// root is empty.
pub type ModulePath = Vec<String>;

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path} (line {line}): {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// Where a dependency shows: the file (from the crate's directory, e.g.
/// `src/a.rs`), its line and that line's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub file: PathBuf,
    pub line: usize,
    pub text: String,
}

/// One dependency between two sibling modules, with the first `use` line
/// that makes it (or the first path in code, when no `use` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub from: String,
    pub to: String,
    pub site: Site,
}

/// Sibling modules that depend on each other, directly or around.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The modules, by path (`command/nodes`), sorted.
    pub modules: Vec<String>,
    /// Every dependency among them.
    pub dependencies: Vec<Dependency>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "modules {} use each other:", self.modules.join(", "))?;
        for dependency in &self.dependencies {
            writeln!(
                f,
                "  {} -> {}: {}:{}: {}",
                dependency.from,
                dependency.to,
                dependency.site.file.display(),
                dependency.site.line,
                dependency.site.text
            )?;
        }
        Ok(())
    }
}

/// The module cycles of the crate whose sources are in `src` (`src/bin/`
/// left out: each binary there is a crate of its own).
pub fn crate_cycles(src: &Path) -> Result<Vec<Cycle>, CheckError> {
    let files = module_files(src)?;
    let mut parsed = Vec::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).map_err(|source| CheckError::Read {
            path: path.clone(),
            source,
        })?;
        let file = syn::parse_file(&text).map_err(|error| CheckError::Parse {
            path: path.clone(),
            line: error.span().start().line,
            message: error.to_string(),
        })?;
        let mut collector = Collector {
            stack: module.clone(),
            references: Vec::new(),
            aliases: Vec::new(),
            inline: Vec::new(),
            test_modules: Vec::new(),
        };
        collector.visit_file(&file);
        parsed.push((module.clone(), path.clone(), text, collector));
    }
    let test_modules: Vec<ModulePath> = parsed
        .iter()
        .flat_map(|(_, _, _, collector)| collector.test_modules.iter().cloned())
        .collect();
    parsed.retain(|(module, _, _, _)| !test_modules.iter().any(|test| module.starts_with(test)));
    let files: BTreeMap<ModulePath, PathBuf> = files
        .into_iter()
        .filter(|(module, _)| !test_modules.iter().any(|test| module.starts_with(test)))
        .collect();
    let mut modules: BTreeSet<ModulePath> = files.keys().cloned().collect();
    let file_modules = modules.clone();
    let mut aliases: BTreeMap<(ModulePath, String), (ModulePath, Vec<String>)> = BTreeMap::new();
    for (_, _, _, collector) in &parsed {
        modules.extend(collector.inline.iter().cloned());
        for (module, name, target) in &collector.aliases {
            aliases
                .entry((module.clone(), name.clone()))
                .or_insert_with(|| (module.clone(), target.clone()));
        }
    }
    let resolver = Resolver {
        modules: &modules,
        file_modules: &file_modules,
        aliases: &aliases,
    };
    // (parent, from, to) -> the first site, a `use` line preferred.
    let mut edges: BTreeMap<(ModulePath, String, String), (bool, Site)> = BTreeMap::new();
    for (_, path, text, collector) in &parsed {
        for reference in &collector.references {
            let from = resolver.file_module(&reference.from);
            let Some(to) = resolver.target(&reference.from, &reference.segments) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                // The same module, or a parent and its descendant.
                continue;
            }
            let parent = from[..common].to_vec();
            let key = (parent, from[common].clone(), to[common].clone());
            let site = Site {
                file: path
                    .strip_prefix(src.parent().unwrap_or(src))
                    .unwrap_or(path)
                    .to_path_buf(),
                line: reference.line,
                text: text
                    .lines()
                    .nth(reference.line.saturating_sub(1))
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            };
            match edges.get(&key) {
                Some((true, _)) => {}
                Some((false, _)) if !reference.is_use => {}
                _ => {
                    edges.insert(key, (reference.is_use, site));
                }
            }
        }
    }
    let mut by_parent: BTreeMap<ModulePath, Vec<(String, String, Site)>> = BTreeMap::new();
    for ((parent, from, to), (_, site)) in edges {
        by_parent.entry(parent).or_default().push((from, to, site));
    }
    let mut cycles = Vec::new();
    for (parent, edges) in by_parent {
        let name = |child: &str| {
            let mut path = parent.clone();
            path.push(child.to_string());
            path.join("/")
        };
        for component in strongly_connected(&edges) {
            let dependencies = edges
                .iter()
                .filter(|(from, to, _)| component.contains(from) && component.contains(to))
                .map(|(from, to, site)| Dependency {
                    from: name(from),
                    to: name(to),
                    site: site.clone(),
                })
                .collect();
            cycles.push(Cycle {
                modules: component.iter().map(|child| name(child)).collect(),
                dependencies,
            });
        }
    }
    Ok(cycles)
}

/// The crate's modules that are files, with their file.
fn module_files(src: &Path) -> Result<BTreeMap<ModulePath, PathBuf>, CheckError> {
    let mut files = BTreeMap::new();
    let root = if src.join("lib.rs").exists() {
        src.join("lib.rs")
    } else {
        src.join("main.rs")
    };
    files.insert(Vec::new(), root);
    walk(src, &mut Vec::new(), &mut files)?;
    Ok(files)
}

fn walk(
    dir: &Path,
    module: &mut ModulePath,
    files: &mut BTreeMap<ModulePath, PathBuf>,
) -> Result<(), CheckError> {
    let read_error = |source| CheckError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_error)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()
        .map_err(read_error)?;
    entries.sort();
    for path in entries {
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if path.is_dir() {
            if module.is_empty() && name == "bin" {
                continue;
            }
            module.push(name.to_string());
            walk(&path, module, files)?;
            module.pop();
            continue;
        }
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if module.is_empty() && (stem == "lib" || stem == "main") {
            continue;
        }
        let mut path_of = module.clone();
        if stem != "mod" {
            path_of.push(stem.to_string());
        }
        files.insert(path_of, path);
    }
    Ok(())
}

/// A path named in a module: by a `use` line or in code.
struct Reference {
    /// The module it is in, inline modules included.
    from: ModulePath,
    segments: Vec<String>,
    line: usize,
    is_use: bool,
}

struct Collector {
    /// The module being read, inline modules included.
    stack: ModulePath,
    references: Vec<Reference>,
    /// (module, name it binds, path it imports).
    aliases: Vec<(ModulePath, String, Vec<String>)>,
    inline: Vec<ModulePath>,
    /// File modules declared under `#[cfg(test)]`.
    test_modules: Vec<ModulePath>,
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| match &attr.meta {
        syn::Meta::List(list) => list.path.is_ident("cfg") && list.tokens.to_string() == "test",
        _ => false,
    })
}

impl Collector {
    fn flatten(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>, line: usize) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.flatten(&path.tree, prefix, line);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let ident = name.ident.to_string();
                let (segments, bound) = if ident == "self" {
                    (prefix.clone(), prefix.last().cloned())
                } else {
                    let mut segments = prefix.clone();
                    segments.push(ident.clone());
                    (segments, Some(ident))
                };
                self.import(segments, bound, line);
            }
            syn::UseTree::Rename(rename) => {
                let mut segments = prefix.clone();
                if rename.ident != "self" {
                    segments.push(rename.ident.to_string());
                }
                self.import(segments, Some(rename.rename.to_string()), line);
            }
            syn::UseTree::Glob(_) => self.import(prefix.clone(), None, line),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.flatten(tree, prefix, line);
                }
            }
        }
    }

    fn import(&mut self, segments: Vec<String>, bound: Option<String>, line: usize) {
        if let Some(bound) = bound.filter(|bound| bound != "_") {
            self.aliases
                .push((self.stack.clone(), bound, segments.clone()));
        }
        self.references.push(Reference {
            from: self.stack.clone(),
            segments,
            line,
            is_use: true,
        });
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if test_only(&item.attrs) {
            if item.content.is_none() {
                let mut module = self.stack.clone();
                module.push(item.ident.to_string());
                self.test_modules.push(module);
            }
            return;
        }
        if item.content.is_some() {
            self.stack.push(item.ident.to_string());
            self.inline.push(self.stack.clone());
            visit::visit_item_mod(self, item);
            self.stack.pop();
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !test_only(&item.attrs) {
            visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !test_only(&item.attrs) {
            visit::visit_item_impl(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_some() || test_only(&item.attrs) {
            return;
        }
        let line = item.use_token.span.start().line;
        self.flatten(&item.tree, &mut Vec::new(), line);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() >= 2 {
            self.references.push(Reference {
                from: self.stack.clone(),
                segments: path
                    .segments
                    .iter()
                    .map(|segment| segment.ident.to_string())
                    .collect(),
                line: path.segments[0].ident.span().start().line,
                is_use: false,
            });
        }
        visit::visit_path(self, path);
    }
}

struct Resolver<'a> {
    /// Every module, inline ones included.
    modules: &'a BTreeSet<ModulePath>,
    file_modules: &'a BTreeSet<ModulePath>,
    /// (module, bound name) -> (that module, the path imported).
    aliases: &'a BTreeMap<(ModulePath, String), (ModulePath, Vec<String>)>,
}

impl Resolver<'_> {
    /// The path `segments`, named in module `from`, from the crate root;
    /// `None` when it leaves the crate (std, other crates) or names an
    /// item of `from` itself (`Self::X`, `Enum::Variant`).
    fn absolute(&self, from: &ModulePath, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "self" => Some(from.iter().chain(&segments[1..]).cloned().collect()),
            "super" => {
                let mut base = from.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|segment| segment == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                Some(base.into_iter().chain(rest.iter().cloned()).collect())
            }
            _ => {
                let mut child = from.clone();
                child.push(first.clone());
                self.modules
                    .contains(&child)
                    .then(|| from.iter().chain(segments).cloned().collect())
            }
        }
    }

    /// The longest prefix of `path` that is a file module.
    fn file_module(&self, path: &[String]) -> ModulePath {
        (0..=path.len())
            .rev()
            .map(|length| path[..length].to_vec())
            .find(|prefix| self.file_modules.contains(prefix))
            .unwrap_or_default()
    }

    /// The longest prefix of `path` that is a module (inline included).
    fn module(&self, path: &[String]) -> ModulePath {
        (0..=path.len())
            .rev()
            .map(|length| path[..length].to_vec())
            .find(|prefix| prefix.is_empty() || self.modules.contains(prefix))
            .unwrap_or_default()
    }

    /// The file module that the path `segments`, named in `from`, points
    /// into, re-exports followed.
    fn target(&self, from: &ModulePath, segments: &[String]) -> Option<ModulePath> {
        let mut path = self.absolute(from, segments)?;
        // A few hops at most; a chain longer than this is a loop of
        // imports, which the compiler refuses anyway.
        for _ in 0..8 {
            let module = self.module(&path);
            let Some(name) = path.get(module.len()) else {
                break;
            };
            let Some((alias_module, imported)) = self.aliases.get(&(module.clone(), name.clone()))
            else {
                break;
            };
            let Some(resolved) = self.absolute(alias_module, imported) else {
                // Re-exported from another crate.
                break;
            };
            if resolved == path[..=module.len()] {
                break;
            }
            path = resolved
                .into_iter()
                .chain(path[module.len() + 1..].iter().cloned())
                .collect();
        }
        Some(self.file_module(&path))
    }
}

/// The groups of two or more modules that reach each other (Tarjan's
/// strongly connected components), each sorted.
fn strongly_connected(edges: &[(String, String, Site)]) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to, _) in edges {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<BTreeSet<String>>,
    }
    fn connect<'a>(node: &'a str, next: &BTreeMap<&'a str, Vec<&'a str>>, state: &mut State<'a>) {
        let index = state.index.len();
        state.index.insert(node, index);
        state.low.insert(node, index);
        state.stack.push(node);
        state.on_stack.insert(node);
        for &to in &next[node] {
            if !state.index.contains_key(to) {
                connect(to, next, state);
                let low = state.low[node].min(state.low[to]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(to) {
                let low = state.low[node].min(state.index[to]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = BTreeSet::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.insert(member.to_string());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                state.components.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for &node in next.keys() {
        if !state.index.contains_key(node) {
            connect(node, &next, &mut state);
        }
    }
    state.components
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate's `src/` made of `(path, text)` files.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_cycle_of_three_files_is_named_with_a_use_line_per_dependency() {
        let src = tree(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\nfn f() { super::c::g(); }\n"),
            ("c.rs", "pub fn g() {}\n\nuse crate::a::{A};\n"),
        ]);
        let cycles = crate_cycles(src.path()).unwrap();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].modules, ["a", "b", "c"]);
        let shown: Vec<(String, String, usize, String)> = cycles[0]
            .dependencies
            .iter()
            .map(|d| {
                (
                    d.from.clone(),
                    d.to.clone(),
                    d.site.line,
                    d.site.text.clone(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("a".into(), "b".into(), 1, "use crate::b::B;".into()),
                (
                    "b".into(),
                    "c".into(),
                    2,
                    "fn f() { super::c::g(); }".into()
                ),
                ("c".into(), "a".into(), 3, "use crate::a::{A};".into()),
            ]
        );
        let text = cycles[0].to_string();
        assert!(text.contains("modules a, b, c use each other"), "{text}");
        assert!(text.contains("a.rs:1: use crate::b::B;"), "{text}");
    }

    #[test]
    fn files_in_two_directories_that_use_each_other_tangle_the_directories() {
        let src = tree(&[
            ("lib.rs", "mod api;\nmod cluster;\n"),
            ("api/mod.rs", "mod routes;\n"),
            ("api/routes.rs", "use crate::cluster::Cluster;\n"),
            ("cluster/mod.rs", "mod peer;\npub struct Cluster;\n"),
            (
                "cluster/peer.rs",
                "fn f() { let _ = super::super::api::routes::X; }\n",
            ),
        ]);
        let cycles = crate_cycles(src.path()).unwrap();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].modules, ["api", "cluster"]);
    }

    #[test]
    fn a_module_and_its_submodules_may_use_each_other() {
        let src = tree(&[
            ("lib.rs", "pub mod command;\npub use command::Command;\n"),
            (
                "command.rs",
                "mod nodes;\nmod error;\npub use error::Error;\npub enum Command {}\nfn f() { nodes::g(); }\n",
            ),
            (
                "command/nodes.rs",
                "use super::{Command, Error};\npub fn g() {}\n",
            ),
            ("command/error.rs", "pub struct Error;\n"),
        ]);
        assert_eq!(crate_cycles(src.path()).unwrap(), []);
    }

    #[test]
    fn a_name_reached_through_a_re_export_counts_where_it_is_defined() {
        // `b` names `crate::a::Thing`, which `a` only re-exports from `c`:
        // `b` depends on `c`, so `a -> b` and `b -> a::Thing` are no cycle.
        let src = tree(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            (
                "a.rs",
                "pub use crate::c::Thing;\nfn f() { crate::b::g(); }\n",
            ),
            ("b.rs", "use crate::a::Thing;\npub fn g() {}\n"),
            ("c.rs", "pub struct Thing;\n"),
        ]);
        assert_eq!(crate_cycles(src.path()).unwrap(), []);
        // Through a re-export that stays in `a`, it is one.
        let src = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub struct Thing;\nfn f() { crate::b::g(); }\n"),
            ("b.rs", "use crate::a::Thing;\npub fn g() {}\n"),
        ]);
        assert_eq!(crate_cycles(src.path()).unwrap()[0].modules, ["a", "b"]);
    }

    #[test]
    fn test_code_and_std_paths_do_not_count() {
        let src = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "use std::collections::BTreeMap;\npub fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::super::b;\n}\n#[cfg(test)]\nmod more_tests;\n",
            ),
            ("a/more_tests.rs", "use crate::b::g;\n"),
            ("b.rs", "use crate::a::f;\npub fn g() {}\n"),
        ]);
        assert_eq!(crate_cycles(src.path()).unwrap(), []);
        // The same without `cfg(test)` is a cycle.
        let src = tree(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "pub fn f() {}\nmod tests {\n    use super::super::b;\n}\n",
            ),
            ("b.rs", "use crate::a::f;\n"),
        ]);
        let cycles = crate_cycles(src.path()).unwrap();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].dependencies[0].site.line, 3);
    }
}
