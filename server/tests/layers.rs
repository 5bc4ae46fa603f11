//! The layers of `server/src` hold: no two top-level modules import each other, through
//! any chain (the store imports nothing of the domain above it, the send pipeline
//! renders its own answers, the configuration builds no store types). The one circle
//! allowed is the shared `AppState`, which holds the dashboard's state while the
//! dashboard's handlers read the `AppState` (docs/architecture.md).
//!
//! A module's imports are the `crate::NAME` paths in its files (and in `crate::{..}`
//! groups), outside comments and its `#[cfg(test)] mod tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles that may stay, each as its sorted members.
const ALLOWED: &[&[&str]] = &[&["dashboard", "state"]];

fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            files.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files
}

/// The source without comments and without its unit tests.
fn code(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(at) => &source[..at],
        None => source,
    };
    source.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules a source names through `crate::`.
fn imports(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(|c: char| !is_ident(c))
                .filter(|w| !w.is_empty())
                .collect(),
            None => vec![&rest[..rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len())]],
        };
        found.extend(names.into_iter().filter(|n| modules.contains(*n)).map(str::to_string));
    }
    found
}

/// The import graph of the top-level modules of `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name == "lib" || name == "main" || name == "bin" {
            continue;
        }
        if p.is_dir() || p.extension().is_some_and(|e| e == "rs") {
            modules.insert(name, p);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, path)| {
            let mut out = BTreeSet::new();
            for file in rust_files(path) {
                out.extend(imports(&code(&std::fs::read_to_string(file).unwrap()), &names));
            }
            out.remove(name);
            (name.clone(), out)
        })
        .collect()
}

/// The strongly connected components with more than one member (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in &self.graph[v] {
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
                let mut members = Vec::new();
                while let Some(w) = self.stack.pop() {
                    members.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if members.len() > 1 {
                    members.sort();
                    self.found.push(members);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_circle_among_the_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.len() > 15, "the modules of server/src were not found: {graph:?}");
    let found: Vec<Vec<String>> =
        circles(&graph).into_iter().filter(|c| !ALLOWED.iter().any(|a| a.iter().eq(c.iter()))).collect();
    let edges: Vec<String> = found
        .iter()
        .flatten()
        .map(|m| {
            format!(
                "{m} -> {:?}",
                graph[m].iter().filter(|t| found.iter().flatten().any(|x| x == *t)).collect::<Vec<_>>()
            )
        })
        .collect();
    assert!(found.is_empty(), "modules that import each other: {found:?}\n{}", edges.join("\n"));
}

/// The check itself finds a circle, through a chain and through a `crate::{..}` group,
/// and ignores comments and unit tests.
#[test]
fn the_check_finds_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("store")).unwrap();
    std::fs::write(src.join("store/mod.rs"), "use crate::config::Config;\n// crate::http\n").unwrap();
    std::fs::write(src.join("config.rs"), "use crate::{net, send::Sender};\n").unwrap();
    std::fs::write(src.join("send.rs"), "fn f() { crate::store::open(); }\n").unwrap();
    std::fs::write(src.join("net.rs"), "#[cfg(test)]\nmod tests { use crate::send; }\n").unwrap();
    std::fs::write(src.join("http.rs"), "use crate::send;\n").unwrap();
    let g = graph(src);
    assert_eq!(circles(&g), vec![vec!["config".to_string(), "send".into(), "store".into()]]);
    assert!(g["net"].is_empty() && g["store"].len() == 1);
}
