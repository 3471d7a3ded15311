//! The launch configs as applied, compared: every results directory keeps a snapshot of
//! each role's launch config per arm block (`launch/<arm>-r<repeat>/<role>--<file>`, for
//! a matrix under `cells/<id>/launch/`). Two runs whose snapshots differ ran different
//! deployments even when their records agree, so each differing file is a confound
//! naming the file and its first differing line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::ConfoundDiff;
use crate::core::evidence::Severity;

/// The directory name snapshots live under.
const LAUNCH_DIR: &str = "launch";
/// How deep below a results directory snapshots are looked for: a matrix's
/// `cells/<id>/launch/cell-r0/<file>` is four levels down.
const MAX_DEPTH: usize = 4;
/// Differing files listed at most; a matrix has one snapshot per cell, block and role.
const MAX_LISTED: usize = 20;
/// Characters of a differing line shown.
const LINE_MAX_CHARS: usize = 100;

/// Snapshot files under `dir`, by their path relative to it (`/`-separated).
fn snapshots(dir: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(
        root: &Path,
        here: &Path,
        depth: usize,
        inside: bool,
        out: &mut BTreeMap<String, PathBuf>,
    ) {
        let Ok(entries) = std::fs::read_dir(here) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth > 0 {
                let launch = inside || entry.file_name() == LAUNCH_DIR;
                walk(root, &path, depth - 1, launch, out);
            } else if kind.is_file() && inside {
                if let Ok(rel) = path.strip_prefix(root) {
                    let key: Vec<String> = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect();
                    out.insert(key.join("/"), path);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, MAX_DEPTH, false, &mut out);
    out
}

/// The folder part of a snapshot's key: its arm block (`launch/on-r0`).
fn block(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(dir, _)| dir)
}

fn shorten(line: &str) -> String {
    let mut s: String = line.chars().take(LINE_MAX_CHARS).collect();
    if line.chars().count() > LINE_MAX_CHARS {
        s.push_str("...");
    }
    s
}

/// The first line (1-based) where two texts differ, with that line on each side.
fn first_difference(a: &str, b: &str) -> (usize, String, String) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut n = 1;
    loop {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => n += 1,
            (x, y) => {
                let show = |l: Option<&str>| l.map_or("(no such line)".to_string(), shorten);
                return (n, show(x), show(y));
            }
        }
    }
}

/// One confound per snapshot that differs between the two directories, for the arm
/// blocks both of them ran (more repeats on one side is not a config difference).
pub(crate) fn launch_confounds(a: &Path, b: &Path) -> Vec<ConfoundDiff> {
    let (sa, sb) = (snapshots(a), snapshots(b));
    let blocks_a: BTreeSet<&str> = sa.keys().map(|k| block(k)).collect();
    let blocks_b: BTreeSet<&str> = sb.keys().map(|k| block(k)).collect();
    let keys: BTreeSet<&String> = sa.keys().chain(sb.keys()).collect();
    let mut differing = Vec::new();
    for key in keys {
        if !(blocks_a.contains(block(key)) && blocks_b.contains(block(key))) {
            continue;
        }
        let read = |m: &BTreeMap<String, PathBuf>| m.get(key).and_then(|p| std::fs::read(p).ok());
        let (x, y) = (read(&sa), read(&sb));
        if x == y {
            continue;
        }
        let (note, ta, tb) = match (&x, &y) {
            (Some(x), Some(y)) => {
                let (line, ta, tb) =
                    first_difference(&String::from_utf8_lossy(x), &String::from_utf8_lossy(y));
                (format!("launch configs differ from line {line}"), ta, tb)
            }
            (Some(_), None) => (
                "launch config only in A".into(),
                "present".into(),
                "-".into(),
            ),
            _ => (
                "launch config only in B".into(),
                "-".into(),
                "present".into(),
            ),
        };
        differing.push(ConfoundDiff {
            scope: "launch".into(),
            name: key.clone(),
            a: json!(ta),
            b: json!(tb),
            severity: Severity::Warning,
            note,
        });
    }
    let more = differing.len().saturating_sub(MAX_LISTED);
    differing.truncate(MAX_LISTED);
    if more > 0 {
        differing.push(ConfoundDiff {
            scope: "launch".into(),
            name: "more launch configs".into(),
            a: serde_json::Value::Null,
            b: serde_json::Value::Null,
            severity: Severity::Warning,
            note: format!("{more} more differing launch configs not listed"),
        });
    }
    differing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn differing_snapshots_are_named_with_their_first_differing_line() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let script = "#!/bin/sh\nexport X=1\nexec serve --port 1\n";
        for root in [&a, &b] {
            write(root, "launch/off-r0/decode--decode.sh", script);
            write(root, "logs/decode.log", "different logs are not configs");
        }
        write(&a, "logs/decode.log", "A's log");
        write(&a, "launch/on-r0/prefill--prefill.sh", script);
        write(
            &b,
            "launch/on-r0/prefill--prefill.sh",
            &script.replace("X=1", "X=0"),
        );
        // A block only B ran is not a difference.
        write(&b, "launch/on-r1/prefill--prefill.sh", "anything");
        let c = launch_confounds(&a, &b);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].name, "launch/on-r0/prefill--prefill.sh");
        assert_eq!(c[0].note, "launch configs differ from line 2");
        assert_eq!(
            (c[0].a.clone(), c[0].b.clone()),
            (json!("export X=1"), json!("export X=0"))
        );
        assert!(launch_confounds(&a, &a).is_empty());
    }

    #[test]
    fn matrix_cells_snapshots_are_found_and_missing_files_named() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write(&a, "cells/F=1,s4/launch/cell-r0/decode--d.sh", "a\nb\n");
        write(&b, "cells/F=1,s4/launch/cell-r0/decode--d.sh", "a\n");
        write(&b, "cells/F=1,s4/launch/cell-r0/prefill--p.sh", "p\n");
        let c = launch_confounds(&a, &b);
        let names: Vec<(&str, &str)> = c
            .iter()
            .map(|c| (c.name.as_str(), c.note.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "cells/F=1,s4/launch/cell-r0/decode--d.sh",
                    "launch configs differ from line 2"
                ),
                (
                    "cells/F=1,s4/launch/cell-r0/prefill--p.sh",
                    "launch config only in B"
                ),
            ]
        );
        assert_eq!(c[0].b, json!("(no such line)"));
    }

    #[test]
    fn first_difference_of_equal_prefixes() {
        assert_eq!(
            first_difference("a\nb", "a\nc"),
            (2, "b".into(), "c".into())
        );
        assert_eq!(
            first_difference("", "x"),
            (1, "(no such line)".into(), "x".into())
        );
    }
}
