//! Reading the witnesses of the flags a block set (core::mechanism): over one engine
//! life, a counter's increase (from the metrics poller's scrapes), the lines of a
//! role's log written within the life's window that match a pattern, and the rise of a
//! number an engine endpoint serves. The window starts after the restart and the
//! tool-call probe and ends when the life's sessions are done, so neither the solo
//! oracle's reference pass (its own drive) nor the probe counts as the block's. Reads
//! that fail are kept with why: core's rule never takes them for zero.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use regex::Regex;

use crate::core::mechanism::{MechanismRecord, WitnessKind};
use crate::driver::metrics::MetricsLog;

/// Where one witness of one role is read.
#[derive(Debug, Clone)]
struct Spot {
    /// Index of the record and of its witness reading.
    record: usize,
    reading: usize,
    role: String,
    how: How,
}

#[derive(Debug, Clone)]
enum How {
    Counter(String),
    /// The log, and its length when the window opened (or why it cannot be read).
    Log {
        pattern: Regex,
        start: Result<(PathBuf, u64), String>,
    },
    /// The URL, the pointer, and the value when the window opened.
    Endpoint {
        url: Result<String, String>,
        field: String,
        start: Result<f64, String>,
    },
}

/// The witnesses of one engine life, opened before its sessions ([`Window::open`]) and
/// counted after them ([`Window::close`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    records: Vec<MechanismRecord>,
    spots: Vec<Spot>,
}

/// What the witnesses of a role may read: its log (a role bisect spawned) and its
/// HTTP origin.
pub(crate) struct RoleAccess {
    pub role: String,
    pub log: Option<PathBuf>,
    pub origin: Option<String>,
}

impl Window {
    /// The counter selectors `role`'s metrics poller must read.
    pub(crate) fn counters_of(&self, role: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .spots
            .iter()
            .filter(|s| s.role == role)
            .filter_map(|s| match &s.how {
                How::Counter(sel) => Some(sel.clone()),
                _ => None,
            })
            .collect();
        out.dedup();
        out
    }

    /// Opens the window: the records of `flags` (flag, value) on an engine of preset
    /// `engine`, each witness placed on the roles it reads (its own, else the flag's
    /// roles the target has), logs measured and endpoints read now.
    pub(crate) async fn open(
        flags: &[(crate::config::FlagSpec, String)],
        engine: &str,
        roles: &[RoleAccess],
        http: &reqwest::Client,
    ) -> Window {
        let mut watch = Window::default();
        for (flag, value) in flags {
            let record = flag.mechanism_record(value, engine);
            let index = watch.records.len();
            let witnesses = flag
                .mechanism
                .as_ref()
                .map_or_else(Vec::new, |m| m.witnesses_for(engine));
            for (reading, w) in witnesses.iter().enumerate() {
                let on: Vec<&RoleAccess> = roles
                    .iter()
                    .filter(|r| w.reads(&r.role, &flag.roles))
                    .collect();
                for access in on {
                    let how = match &w.kind {
                        WitnessKind::Counter { selector } => How::Counter(selector.clone()),
                        WitnessKind::Log { pattern, .. } => How::Log {
                            pattern: Regex::new(pattern).expect("checked when the flag was read"),
                            start: log_start(access),
                        },
                        WitnessKind::Endpoint { path, field } => {
                            let url = access
                                .origin
                                .as_ref()
                                .map(|o| format!("{o}{path}"))
                                .ok_or_else(|| {
                                    format!(
                                        "role {} has no http:// origin to read {path} at",
                                        access.role
                                    )
                                });
                            let start = match &url {
                                Ok(u) => read_field(http, u, field).await,
                                Err(e) => Err(e.clone()),
                            };
                            How::Endpoint {
                                url,
                                field: field.clone(),
                                start,
                            }
                        }
                    };
                    watch.spots.push(Spot {
                        record: index,
                        reading,
                        role: access.role.clone(),
                        how,
                    });
                }
            }
            watch.records.push(record);
        }
        watch
    }

    /// Closes the window: every witness counted, with `metrics`, the poller's log of
    /// the same life. A witness whose role the target lacks is a read that failed.
    /// `lost`: per role, why its followed log stopped being followed (its log
    /// witnesses then count what came before, and say they could not read the rest).
    pub(crate) async fn close(
        mut self,
        metrics: &MetricsLog,
        http: &reqwest::Client,
        lost: &[(String, String)],
    ) -> Vec<MechanismRecord> {
        let spots = std::mem::take(&mut self.spots);
        for (ri, record) in self.records.iter_mut().enumerate() {
            for (wi, reading) in record.witnesses.iter_mut().enumerate() {
                if !spots.iter().any(|s| s.record == ri && s.reading == wi) {
                    reading
                        .unread
                        .push("none of its roles is a role of this target".into());
                }
            }
        }
        for spot in spots {
            let counted = match &spot.how {
                How::Counter(selector) => metrics.witness_count(&spot.role, selector),
                How::Log { pattern, start } => match start {
                    Ok((path, from)) => count_lines(path, *from, pattern),
                    Err(e) => Err(e.clone()),
                },
                How::Endpoint { url, field, start } => match (url, start) {
                    (Ok(url), Ok(before)) => read_field(http, url, field).await.map(|after| {
                        // An engine restarted within the window counts from zero again.
                        let rise = if after >= *before {
                            after - before
                        } else {
                            after
                        };
                        rise.round() as u64
                    }),
                    (Err(e), _) | (_, Err(e)) => Err(e.clone()),
                },
            };
            let reading = &mut self.records[spot.record].witnesses[spot.reading];
            match counted {
                Ok(n) => reading.count += n,
                Err(why) => reading.unread.push(why),
            }
            if matches!(spot.how, How::Log { .. }) {
                for (_, why) in lost.iter().filter(|(role, _)| *role == spot.role) {
                    reading.unread.push(why.clone());
                }
            }
        }
        self.records
    }
}

fn log_start(access: &RoleAccess) -> Result<(PathBuf, u64), String> {
    let Some(path) = &access.log else {
        return Err(format!(
            "role {}'s log is not bisect's to read (its restart command starts it): give \
             the role a `log` command that follows it (e.g. log = \"journalctl -u UNIT -f \
             -n 0 -o cat\"), or a counter or endpoint witness reads it",
            access.role
        ));
    };
    let len = std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path.clone(), len))
}

/// Lines of `path` from byte `from` on that match `pattern` (a line cut at the end is
/// counted once it is whole: the window ends at the last newline).
fn count_lines(path: &std::path::Path, from: u64, pattern: &Regex) -> Result<u64, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    // A log that shrank was rewritten: the window is the whole new file.
    let from = if len < from { 0 } else { from };
    file.seek(SeekFrom::Start(from))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(count_matches(&bytes, pattern))
}

/// Whole lines of `bytes` (up to its last newline) that match `pattern`; bytes that are
/// not UTF-8 are read lossily (engines print what their models wrote).
pub(crate) fn count_matches(bytes: &[u8], pattern: &Regex) -> u64 {
    let whole = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(i) => &bytes[..=i],
        None => &[][..],
    };
    String::from_utf8_lossy(whole)
        .lines()
        .filter(|line| pattern.is_match(line))
        .count() as u64
}

async fn read_field(http: &reqwest::Client, url: &str, field: &str) -> Result<f64, String> {
    let doc = super::capacity::get_json(http, url).await?;
    sum_at(&doc, field).ok_or_else(|| format!("GET {url}: no number at {field}"))
}

/// The number at JSON pointer `field` of `doc`, where a `*` segment sums the values of
/// every element of an array (or object) there; None when nothing numeric is there.
pub(crate) fn sum_at(doc: &serde_json::Value, field: &str) -> Option<f64> {
    fn walk(v: &serde_json::Value, segments: &[String]) -> Option<f64> {
        let Some((first, rest)) = segments.split_first() else {
            return match v {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::Bool(b) => Some(f64::from(u8::from(*b))),
                _ => None,
            };
        };
        if first == "*" {
            let items: Vec<&serde_json::Value> = match v {
                serde_json::Value::Array(a) => a.iter().collect(),
                serde_json::Value::Object(o) => o.values().collect(),
                _ => return None,
            };
            let found: Vec<f64> = items.iter().filter_map(|i| walk(i, rest)).collect();
            return (!found.is_empty()).then(|| found.iter().sum());
        }
        let next = match v {
            serde_json::Value::Array(a) => a.get(first.parse::<usize>().ok()?)?,
            serde_json::Value::Object(o) => o.get(first)?,
            _ => return None,
        };
        walk(next, rest)
    }
    let segments: Vec<String> = field
        .strip_prefix('/')?
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    walk(doc, &segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_with_stars_sum_every_element() {
        let slots = serde_json::json!([
            {"id": 0, "n_past": 120, "is_processing": true},
            {"id": 1, "n_past": 30, "is_processing": false}
        ]);
        assert_eq!(sum_at(&slots, "/*/n_past"), Some(150.0));
        assert_eq!(sum_at(&slots, "/*/is_processing"), Some(1.0));
        assert_eq!(sum_at(&slots, "/1/n_past"), Some(30.0));
        assert_eq!(sum_at(&slots, "/*/missing"), None);
        assert_eq!(sum_at(&slots, "no-slash"), None);
        let doc = serde_json::json!({"a/b": {"x": 2}});
        assert_eq!(sum_at(&doc, "/a~1b/x"), Some(2.0));
        // A real server's reply: llama.cpp 0.3.8's /props (tests/fixtures/engines/).
        let props: serde_json::Value = serde_json::from_str(&crate::core::testing::engine_fixture(
            "llamacpp/props-0.3.8.json",
        ))
        .unwrap();
        assert_eq!(sum_at(&props, "/total_slots"), Some(4.0));
        assert_eq!(
            sum_at(&props, "/default_generation_settings/n_ctx"),
            Some(2048.0)
        );
        assert_eq!(
            sum_at(&props, "/default_generation_settings/is_processing"),
            Some(0.0)
        );
    }

    /// The DEFRAG witness on the real 0.3.8 server's log (tests/fixtures/engines/README.md).
    #[test]
    fn the_defrag_witness_counts_the_real_servers_line() {
        let log = crate::core::testing::engine_fixture("llamacpp/defrag-0.3.8.log");
        let catalog =
            crate::config::FlagCatalog::load(&[std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../targets/llama-cpp-12253/flags")])
            .unwrap();
        let Some(crate::core::mechanism::Mechanism {
            watch: crate::core::mechanism::Watch::Witnesses(ws),
            ..
        }) = &catalog.get("DEFRAG").unwrap().mechanism
        else {
            panic!("DEFRAG has witnesses")
        };
        let WitnessKind::Log { pattern, .. } = &ws[0].kind else {
            panic!("a log witness")
        };
        assert_eq!(
            count_matches(log.as_bytes(), &Regex::new(pattern).unwrap()),
            1
        );
    }

    #[test]
    fn only_whole_lines_in_the_window_count() {
        let re = Regex::new("requesting defrag").unwrap();
        let text = b"a requesting defrag\nb\nc requesting defrag\nd requesting defr";
        assert_eq!(count_matches(text, &re), 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.log");
        std::fs::write(&path, "old requesting defrag\n").unwrap();
        let from = std::fs::metadata(&path).unwrap().len();
        std::fs::write(
            &path,
            "old requesting defrag\nnew requesting defrag\nnew requesting defrag\n",
        )
        .unwrap();
        assert_eq!(count_lines(&path, from, &re), Ok(2));
        // Rewritten shorter: the new file is the window.
        std::fs::write(&path, "requesting defrag\n").unwrap();
        assert_eq!(count_lines(&path, 1000, &re), Ok(1));
        assert!(count_lines(&dir.path().join("gone.log"), 0, &re).is_err());
    }
}
