//! The module structure of the workspace's library code: the import graph of every library
//! crate's modules has no cycle, no library file is over 800 lines, and no function is over
//! 120 lines without a comment saying why (see `docs/design.md`, "Layers").
//!
//! The graph is read with `syn` from the sources: an edge goes from a module to every other
//! module of its crate that its code names, through `use crate::…`, `super::…`, `self::…`,
//! a child module's name, or a `crate::x::…` path in an expression or a type (a name the
//! crate root re-exports, `crate::Error`, counts as the module it comes from). A parent's
//! `pub use` of its own child's items is the parent publishing the child, not a use of it,
//! and makes no edge; doc comments and `#[cfg(test)]` items are not code. `cargo test --test
//! modules -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The library crates of the workspace: their `src/` folders, from the workspace root.
const CRATES: &[&str] = &[
    "src",
    "loops-core/src",
    "loops-derive/src",
    "loops-postgres/src",
];

/// Longest library file, in lines.
const MAX_FILE_LINES: usize = 800;

/// Longest function, in lines, unless a comment just above it says why it is long (a line
/// with "long because").
const MAX_FN_LINES: usize = 120;

/// One crate's modules: path (`store::redb`, `""` for the crate root) to file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || is_test_file(&path) {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// Unit-test files (`tests.rs`, files under `tests/`): not library code, and not checked.
fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// The modules that a file's code names.
struct Uses<'a> {
    module: &'a str,
    known: &'a BTreeMap<String, PathBuf>,
    found: BTreeSet<String>,
    /// Inside a `pub use`: paths into the module's own children make no edge.
    in_reexport: bool,
    /// The names the crate root re-exports, each with the module it comes from.
    root_names: &'a BTreeMap<String, String>,
}

impl Uses<'_> {
    /// The module a path (its segments, from the start) names, if any: the longest known
    /// module it starts with, resolved from `crate`, `super`, `self` or a child's name.
    fn resolve(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let here: Vec<&str> = if self.module.is_empty() {
            Vec::new()
        } else {
            self.module.split("::").collect()
        };
        let (mut base, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (here.iter().map(|s| s.to_string()).collect(), &segments[1..]),
            "super" => {
                let mut base: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            _ => {
                let mut child: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                child.push(first.clone());
                if !self.known.contains_key(&child.join("::")) {
                    return;
                }
                (here.iter().map(|s| s.to_string()).collect(), segments)
            }
        };
        let mut target = base.join("::");
        for segment in rest {
            base.push(segment.clone());
            let longer = base.join("::");
            if self.known.contains_key(&longer) {
                target = longer;
            } else {
                break;
            }
        }
        let own_child = self.module.is_empty() || target.starts_with(&format!("{}::", self.module));
        if target == self.module || (self.in_reexport && own_child) {
            return;
        }
        if target.is_empty() {
            // A name the crate root re-exports (`crate::Error`): the module it comes from.
            match rest.first().and_then(|name| self.root_names.get(name)) {
                Some(module) if module != self.module => target = module.clone(),
                _ => return,
            }
        }
        if self.known.contains_key(&target) {
            self.found.insert(target);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.resolve(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.in_reexport = !matches!(item.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &item.tree);
        self.in_reexport = false;
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.resolve(&segments);
        }
        syn::visit::visit_path(self, path);
    }
}

/// The names a crate root re-exports with `pub use`, each with the module it comes from.
fn root_names(known: &BTreeMap<String, PathBuf>) -> BTreeMap<String, String> {
    fn walk(
        known: &BTreeMap<String, PathBuf>,
        prefix: &mut Vec<String>,
        tree: &syn::UseTree,
        out: &mut BTreeMap<String, String>,
    ) {
        let mut add = |name: String, prefix: &[String]| {
            let mut module = String::new();
            let start = usize::from(prefix.first().is_some_and(|s| s == "crate"));
            for end in start + 1..=prefix.len() {
                let candidate = prefix[start..end].join("::");
                if known.contains_key(&candidate) {
                    module = candidate;
                }
            }
            if !module.is_empty() {
                out.insert(name, module);
            }
        };
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(known, prefix, &p.tree, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => add(n.ident.to_string(), prefix),
            syn::UseTree::Rename(r) => add(r.rename.to_string(), prefix),
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    walk(known, prefix, tree, out);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    let Some(path) = known.get("") else {
        return out;
    };
    let text = std::fs::read_to_string(path).expect("read crate root");
    let file = syn::parse_file(&text).expect("parse crate root");
    for item in &file.items {
        if let syn::Item::Use(u) = item
            && !matches!(u.vis, syn::Visibility::Inherited)
        {
            walk(known, &mut Vec::new(), &u.tree, &mut out);
        }
    }
    out
}

/// Functions over [`MAX_FN_LINES`] lines with no comment above saying why.
struct LongFns<'a> {
    lines: &'a [&'a str],
    found: Vec<(String, usize)>,
}

impl LongFns<'_> {
    fn check(&mut self, name: &syn::Ident, block: &syn::Block) {
        let start = name.span().start().line;
        let end = syn::spanned::Spanned::span(block).end().line;
        let length = end.saturating_sub(start) + 1;
        if length <= MAX_FN_LINES {
            return;
        }
        // The comment and attribute lines just above the `fn` line.
        let explained = self.lines[..start.saturating_sub(1)]
            .iter()
            .rev()
            .take_while(|l| {
                let l = l.trim_start();
                l.starts_with("//") || l.starts_with("#[")
            })
            .any(|l| l.contains("long because"));
        if !explained {
            self.found.push((name.to_string(), length));
        }
    }
}

impl<'ast> Visit<'ast> for LongFns<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_cfg_test(&item.attrs) {
            self.check(&item.sig.ident, &item.block);
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&item.attrs) {
            self.check(&item.sig.ident, &item.block);
            syn::visit::visit_impl_item_fn(self, item);
        }
    }
}

/// The cycles of `graph`: its strongly connected components of more than one module
/// (Tarjan's algorithm), each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn library_modules_form_layers_and_stay_small() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for krate in CRATES {
        let known = modules(&root.join(krate));
        let root_names = root_names(&known);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, path) in &known {
            let text = std::fs::read_to_string(path).expect("read source");
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mut uses = Uses {
                module,
                known: &known,
                found: BTreeSet::new(),
                in_reexport: false,
                root_names: &root_names,
            };
            uses.visit_file(&file);
            graph.insert(module.clone(), uses.found);

            let shown = path.strip_prefix(root).expect("in the workspace");
            let shown = shown.to_string_lossy();
            let lines: Vec<&str> = text.lines().collect();
            if lines.len() > MAX_FILE_LINES {
                problems.push(format!(
                    "{shown}: {} lines (at most {MAX_FILE_LINES})",
                    lines.len()
                ));
            }
            let mut long = LongFns {
                lines: &lines,
                found: Vec::new(),
            };
            long.visit_file(&file);
            for (name, length) in long.found {
                problems.push(format!(
                    "{shown}: fn {name} is {length} lines (at most {MAX_FN_LINES} without a comment saying it is long because ...)"
                ));
            }
        }
        println!("{krate}:");
        for (module, uses) in &graph {
            let name = if module.is_empty() { "(root)" } else { module };
            let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
            println!("  {name} -> {}", uses.join(", "));
        }
        for cycle in cycles(&graph) {
            problems.push(format!("{krate}: import cycle among {}", cycle.join(", ")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
