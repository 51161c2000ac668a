//! The module import graph of a crate, read from its source, for the
//! layering tests of sandboxd, the agent and the protocol crate.
//!
//! Each `.rs` file under `src/` is one module (`api/commands.rs` is
//! `api::commands`, `api/mod.rs` is `api`). An edge runs from a module to
//! every module a `crate::`, `super::` or `self::` path in its non-test code
//! names, resolved to the deepest module that exists. Edges between a module
//! and its own ancestor are left out: a parent declares and re-exports its
//! children, so that pair is the module system, not a dependency. Everything
//! else must form no cycle, and imports between top-level modules must run
//! down the caller's layer table.
//!
//! It reads text, not a parsed syntax tree: comments are skipped, and so is
//! every item marked `#[cfg(test)]` (up to its `;` or the end of its block).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One crate's modules, their non-test source and the imports between them.
#[derive(Debug)]
pub struct ModuleGraph {
    /// Module path to (file relative to `src/`, code without comments and tests).
    modules: BTreeMap<String, (String, String)>,
    /// Module path to the modules it names (ancestors left out).
    edges: BTreeMap<String, BTreeSet<String>>,
}

/// A layer table: rank (higher is nearer the caller) and the top-level modules
/// in it. Rank 1 is the leaves, which alone may use each other.
pub type Layers<'a> = &'a [(u8, &'a [&'a str])];

impl ModuleGraph {
    /// Reads every `.rs` file under `src`. The crate root (`lib.rs`,
    /// `main.rs`) is only the module list and is left out.
    ///
    /// # Panics
    /// When `src` cannot be read: this runs in tests, where that is a failure.
    #[must_use]
    pub fn read(src: &Path) -> Self {
        let mut modules = BTreeMap::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let entries =
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
            for entry in entries {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel = path
                    .strip_prefix(src)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                let module = module_of(&rel);
                if module.is_empty() {
                    continue;
                }
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                modules.insert(module, (rel, code_of(&text)));
            }
        }
        let mut graph = Self {
            modules,
            edges: BTreeMap::new(),
        };
        for (module, (_, code)) in &graph.modules {
            let mut targets = BTreeSet::new();
            for path in paths_in(code) {
                if let Some(target) = graph.resolve(module, &path)
                    && !is_ancestor_or_self(&target, module)
                    && !is_ancestor_or_self(module, &target)
                {
                    targets.insert(target);
                }
            }
            graph.edges.insert(module.clone(), targets);
        }
        graph
    }

    /// The graph of the crate whose manifest is in `manifest_dir` (pass
    /// `env!("CARGO_MANIFEST_DIR")`).
    #[must_use]
    pub fn of_crate(manifest_dir: &str) -> Self {
        Self::read(&Path::new(manifest_dir).join("src"))
    }

    /// Fails, naming each, on an import that runs up `layers` and on an
    /// import cycle.
    ///
    /// # Panics
    /// That is the point: this is a test's assertion.
    pub fn assert_layered(&self, layers: Layers<'_>) {
        let upward = self.upward_imports(layers);
        assert!(upward.is_empty(), "{}", upward.join("\n"));
        if let Some(cycle) = self.cycle() {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }

    /// Every module with its file and non-test code, for checks on the text
    /// (which names may appear where).
    pub fn sources(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.modules
            .iter()
            .map(|(m, (file, code))| (m.as_str(), file.as_str(), code.as_str()))
    }

    /// The modules `module` imports, ancestors left out.
    pub fn imports(&self, module: &str) -> impl Iterator<Item = &str> {
        self.edges
            .get(module)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// One import cycle, as the modules along it, or `None`.
    #[must_use]
    pub fn cycle(&self) -> Option<Vec<String>> {
        fn visit(
            m: &str,
            graph: &ModuleGraph,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
        ) -> Option<Vec<String>> {
            if done.contains(m) {
                return None;
            }
            if let Some(start) = path.iter().position(|p| p == m) {
                let mut cycle = path[start..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            path.push(m.to_string());
            for next in graph.imports(m) {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            done.insert(m.to_string());
            None
        }
        let mut done = BTreeSet::new();
        self.modules
            .keys()
            .find_map(|m| visit(m, self, &mut Vec::new(), &mut done))
    }

    /// Imports between top-level modules that do not run down `layers`, one
    /// sentence each. A top-level module missing from the table is reported too.
    #[must_use]
    pub fn upward_imports(&self, layers: Layers<'_>) -> Vec<String> {
        let rank = |m: &str| {
            let top = m.split("::").next().unwrap_or_default();
            layers
                .iter()
                .find(|(_, ms)| ms.contains(&top))
                .map(|(r, _)| (*r, top.to_string()))
        };
        let mut out = Vec::new();
        for (module, (file, _)) in &self.modules {
            let Some((from, from_top)) = rank(module) else {
                out.push(format!("{file}: module {module} is in no layer"));
                continue;
            };
            for target in self.imports(module) {
                let Some((to, to_top)) = rank(target) else {
                    continue; // reported for its own file
                };
                if from_top != to_top && !(from > to || (from == 1 && to == 1)) {
                    out.push(format!(
                        "{file} ({from_top}, layer {from}) imports {target} (layer {to}): imports must run downward"
                    ));
                }
            }
        }
        out
    }

    /// The deepest existing module a path from `from` names, if any.
    fn resolve(&self, from: &str, path: &RefPath) -> Option<String> {
        let mut segments: Vec<&str> = match path.base {
            Base::Crate => Vec::new(),
            Base::SelfModule => from.split("::").collect(),
            Base::Super(n) => {
                let mut s: Vec<&str> = from.split("::").collect();
                for _ in 0..n {
                    s.pop()?;
                }
                s
            }
        };
        segments.extend(path.segments.iter().map(String::as_str));
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|m| self.modules.contains_key(m))
    }
}

/// `api/commands.rs` → `api::commands`, `api/mod.rs` → `api`, `lib.rs` → ``.
fn module_of(rel: &str) -> String {
    let trimmed = rel.trim_end_matches(".rs");
    let mut parts: Vec<&str> = trimmed.split('/').collect();
    if matches!(parts.last(), Some(&"mod")) {
        parts.pop();
    }
    if parts.len() == 1 && matches!(parts[0], "lib" | "main") {
        return String::new();
    }
    parts.join("::")
}

fn is_ancestor_or_self(ancestor: &str, module: &str) -> bool {
    module == ancestor || module.starts_with(&format!("{ancestor}::"))
}

/// The text without `//` comments and without the items marked
/// `#[cfg(test)]` (a test module, or a test-only item between real ones).
fn code_of(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal (a URL) keeps the line.
            Some(i) if line[..i].matches('"').count() % 2 == 0 => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        rest = &rest[i + "#[cfg(test)]".len()..];
        rest = &rest[item_len(rest)..];
    }
    out.push_str(rest);
    out
}

/// The length of the item at the start of `s`: up to its first `;` outside
/// braces, or to the end of its first braced block, whichever comes first.
fn item_len(s: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            ';' if depth == 0 => return i + 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Base {
    Crate,
    SelfModule,
    Super(usize),
}

/// A path as written: where it starts and the names after that.
#[derive(Debug, PartialEq)]
struct RefPath {
    base: Base,
    segments: Vec<String>,
}

/// Every `crate::`, `super::` and `self::` path in `code`, use-trees expanded.
fn paths_in(code: &str) -> Vec<RefPath> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at_word_start = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        let rest = &code[i..];
        let base = if !at_word_start {
            None
        } else if rest.starts_with("crate::") {
            Some((Base::Crate, "crate::".len()))
        } else if rest.starts_with("self::") {
            Some((Base::SelfModule, "self::".len()))
        } else if rest.starts_with("super::") {
            let mut n = 0;
            let mut len = 0;
            while rest[len..].starts_with("super::") {
                n += 1;
                len += "super::".len();
            }
            Some((Base::Super(n), len))
        } else {
            None
        };
        match base {
            Some((base, len)) => {
                let (trees, used) = use_tree(&rest[len..]);
                for segments in trees {
                    out.push(RefPath { base, segments });
                }
                i += len + used.max(1);
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Expands the use-tree at the start of `s` (`a::b`, `a::{b, c::d}`, `a::*`)
/// into name lists, and says how many bytes it took. `self` in a group names
/// the group's prefix; `as` renames and `*` add nothing.
fn use_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = 0;
    loop {
        let rest = &s[i..];
        let trimmed = rest.trim_start();
        i += rest.len() - trimmed.len();
        if let Some(inner) = trimmed.strip_prefix('{') {
            let mut depth = 1;
            let mut end = None;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(k);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(end) = end else {
                return (vec![prefix], i);
            };
            let mut out = Vec::new();
            for item in split_top_level(&inner[..end]) {
                let (trees, _) = use_tree(item);
                for tree in trees {
                    let mut full = prefix.clone();
                    full.extend(tree.into_iter().filter(|s| s != "self"));
                    out.push(full);
                }
            }
            return (out, i + 1 + end + 1);
        }
        let len = trimmed.bytes().take_while(|&b| is_ident(b)).count();
        if len == 0 {
            return (vec![prefix], i);
        }
        prefix.push(trimmed[..len].to_string());
        i += len;
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// Splits a group's items on the commas that are not inside a nested group.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(code: &str) -> Vec<(Base, String)> {
        paths_in(code)
            .into_iter()
            .map(|p| (p.base, p.segments.join("::")))
            .collect()
    }

    #[test]
    fn use_trees_expand_to_every_named_path() {
        assert_eq!(
            names("use crate::{a::{b, c::D}, e as f, g::*, self};"),
            vec![
                (Base::Crate, "a::b".into()),
                (Base::Crate, "a::c::D".into()),
                (Base::Crate, "e".into()),
                (Base::Crate, "g".into()),
                (Base::Crate, "".into()),
            ]
        );
        assert_eq!(
            names("let x = super::super::log::Ring::new(crate::id::random());"),
            vec![
                (Base::Super(2), "log::Ring::new".into()),
                (Base::Crate, "id::random".into()),
            ]
        );
        assert_eq!(
            names("use self::parts::{self, Part};"),
            vec![
                (Base::SelfModule, "parts".into()),
                (Base::SelfModule, "parts::Part".into())
            ]
        );
        // `my_crate::x` and `a::super_x` are not paths from here.
        assert!(names("use my_crate::x; b::supercrate::y;").is_empty());
    }

    #[test]
    fn comments_and_tests_are_not_code() {
        let code = code_of(
            "//! see crate::api\nuse crate::a; // crate::b\nlet u = \"http://x\"; crate::c::f();\n#[cfg(test)]\nuse crate::d;\n#[cfg(test)]\nfn hook() -> u8 { crate::e::f(); 1 }\nuse crate::g;\n#[cfg(test)]\nmod tests { use crate::h; fn t() { crate::i(); } }",
        );
        let found: Vec<String> = names(&code).into_iter().map(|(_, s)| s).collect();
        assert_eq!(found, ["a", "c::f", "g"]);
    }

    fn graph(files: &[(&str, &str)]) -> ModuleGraph {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("layering-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, code) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, code).expect("write");
        }
        let graph = ModuleGraph::read(&dir);
        std::fs::remove_dir_all(&dir).expect("clean up");
        graph
    }

    #[test]
    fn a_cycle_between_siblings_is_found_and_a_parent_is_not_one() {
        let g = graph(&[
            ("lib.rs", "mod api;"),
            ("api/mod.rs", "mod dto; mod error; pub use error::ApiError;"),
            (
                "api/dto.rs",
                "use super::error::ErrorBody; use super::ApiError;",
            ),
            ("api/error.rs", "use crate::api::dto::FailedFile;"),
        ]);
        let cycle = g.cycle().expect("dto <-> error is a cycle");
        assert!(
            cycle.contains(&"api::dto".to_string()) && cycle.contains(&"api::error".to_string())
        );
        let g = graph(&[
            ("api/mod.rs", "mod dto; mod error; fn f() { dto::x(); }"),
            (
                "api/dto.rs",
                "use super::error::ErrorBody; use super::ApiError;",
            ),
            ("api/error.rs", "pub struct ErrorBody;"),
        ]);
        assert_eq!(g.cycle(), None);
        assert_eq!(g.imports("api::dto").collect::<Vec<_>>(), ["api::error"]);
    }

    #[test]
    fn imports_up_the_table_and_unlisted_modules_are_reported() {
        let g = graph(&[
            ("api.rs", "use crate::engine::Engine;"),
            ("engine.rs", "use crate::api::Router; use crate::config::X;"),
            ("config.rs", "use crate::id::random;"),
            ("id.rs", ""),
            ("stray.rs", ""),
        ]);
        let layers: Layers<'_> = &[(3, &["api"]), (2, &["engine"]), (1, &["config", "id"])];
        let found = g.upward_imports(layers);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("engine.rs (engine, layer 2) imports api"));
        assert!(found[1].contains("stray is in no layer"));
    }
}
