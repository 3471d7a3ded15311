//! The layering of lib.rs, checked over the source: which top-level module of the
//! harness names which (`crate::X` in non-test code), with no cycle between them and
//! the innermost layers importing nothing outward. Test code is left out: a test may
//! build its fixtures from any layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Files that are test code as a whole.
fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    matches!(
        name,
        "tests.rs" | "proptests.rs" | "proptest_config.rs" | "test_http.rs" | "layering.rs"
    ) || rel.components().any(|c| c.as_os_str() == "tests")
}

/// The non-test text of a source file: up to its `#[cfg(test)]` module, without
/// line comments (a doc link is not an import).
fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..cut]
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level module -> the top-level modules its non-test code names.
fn graph(src: &Path) -> Graph {
    let named = regex::Regex::new(r"crate::([a-z_]+)").unwrap();
    let mut graph = Graph::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            if path.extension() != Some(std::ffi::OsStr::new("rs"))
                || is_test_file(rel)
                || rel == Path::new("lib.rs")
            {
                continue;
            }
            let first = rel.components().next().unwrap().as_os_str();
            let top = first.to_string_lossy().trim_end_matches(".rs").to_string();
            let code = code_of(&std::fs::read_to_string(&path).unwrap());
            let deps = graph.entry(top.clone()).or_default();
            for m in named.captures_iter(&code) {
                if m[1] != top {
                    deps.insert(m[1].to_string());
                }
            }
        }
    }
    graph
}

/// A cycle through `from`, as the modules on it, if any.
fn cycle_through(graph: &Graph, from: &str) -> Option<Vec<String>> {
    fn walk(graph: &Graph, at: &str, goal: &str, path: &mut Vec<String>) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == goal {
                return true;
            }
            if path.contains(next) {
                continue;
            }
            path.push(next.clone());
            if walk(graph, next, goal, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = vec![from.to_string()];
    walk(graph, from, from, &mut path).then_some(path)
}

#[test]
fn the_top_level_modules_form_no_cycle_and_the_inner_layers_look_only_inward() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() >= 10, "walked too little: {graph:?}");
    let cycles: Vec<Vec<String>> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:?}");
    let none = BTreeSet::new();
    // `core` is a crate of its own (bisect-core): the compiler keeps it from naming the
    // harness, and `the_core_crate_depends_on_nothing_that_does_io` checks its manifest.
    let inward: [(&str, &[&str]); 2] = [("exit", &[]), ("config", &["core"])];
    for (module, allowed) in inward {
        let outward: Vec<&String> = graph
            .get(module)
            .unwrap_or(&none)
            .iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(outward.is_empty(), "{module} imports {outward:?}");
    }
}

#[test]
fn the_check_sees_a_cycle_where_there_is_one() {
    let mut graph = Graph::new();
    graph.insert("a".into(), ["b".to_string()].into());
    graph.insert("b".into(), ["c".to_string()].into());
    graph.insert("c".into(), ["a".to_string()].into());
    graph.insert("d".into(), ["a".to_string()].into());
    assert_eq!(cycle_through(&graph, "a").unwrap(), ["a", "b", "c"]);
    assert!(cycle_through(&graph, "d").is_none());
    let code = code_of("use crate::x; // crate::y\n#[cfg(test)]\nmod tests { use crate::z; }");
    assert!(code.contains("crate::x") && !code.contains("crate::y") && !code.contains("crate::z"));
}

/// The core crate's manifest names only pure libraries: no async runtime, HTTP client,
/// process or error-context crate can reach its code (its clippy.toml keeps std's file,
/// process, network, environment and clock calls out of it).
#[test]
fn the_core_crate_depends_on_nothing_that_does_io() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let pure = [
        "thiserror",
        "serde",
        "serde_json",
        "regex",
        "statrs",
        "rand",
        "rand_chacha",
        "jsonschema",
        "strum",
        "proptest",
    ];
    let deps = manifest["dependencies"].as_table().unwrap();
    let other: Vec<&String> = deps
        .keys()
        .filter(|d| !pure.contains(&d.as_str()))
        .collect();
    assert!(other.is_empty(), "bisect-core depends on {other:?}");
    assert!(
        deps.len() >= 5,
        "read too little of {}: {deps:?}",
        path.display()
    );
    // Only the test-support feature brings proptest in.
    assert_eq!(deps["proptest"]["optional"].as_bool(), Some(true));
    assert!(clippy_forbids(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/clippy.toml")
    ));
}

/// The core's clippy.toml forbids the std calls a newcomer would reach for first.
fn clippy_forbids(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).unwrap();
    [
        "std::fs::read_to_string",
        "std::fs::File",
        "std::process::Command",
        "std::net::TcpStream",
        "std::time::Instant::now",
    ]
    .iter()
    .all(|p| text.contains(&format!("path = \"{p}\"")))
}
