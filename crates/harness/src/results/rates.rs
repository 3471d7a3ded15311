//! A target's measured costs (core::cost::Rates) kept in bisect's state directory
//! (`costs.json`: target name -> rates), added to by every run as it ends and read by
//! the planned cost of the next. A file that cannot be read or written costs only the
//! estimate: it is never an error of the run.

use std::collections::BTreeMap;
use std::path::Path;

use crate::core::cost::Rates;

const FILE: &str = "costs.json";

fn all(root: &Path) -> BTreeMap<String, Rates> {
    std::fs::read(root.join(FILE))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// The rates measured on `target` so far (none: zero).
pub fn read(root: &Path, target: &str) -> Rates {
    all(root).get(target).copied().unwrap_or_default()
}

/// `target`'s rates changed by `change`, written back (atomically: a temporary file
/// renamed over the old one).
pub fn update(root: &Path, target: &str, change: impl FnOnce(&mut Rates)) {
    let mut rates = all(root);
    change(rates.entry(target.to_string()).or_default());
    let Ok(text) = serde_json::to_vec_pretty(&rates) else {
        return;
    };
    if std::fs::create_dir_all(root).is_err() {
        return;
    }
    let tmp = root.join(format!("{FILE}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, root.join(FILE)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_kept_per_target_across_commands() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "vllm-cpu"), Rates::default());
        let mut phases = crate::core::phases::Phases::default();
        (phases.restart_s, phases.health_wait_s) = (1.0, 299.0);
        (phases.drive_s, phases.restarts) = (100.0, 2);
        update(dir.path(), "vllm-cpu", |r| r.observe(&phases, 8, 4));
        update(dir.path(), "vllm-cpu", |r| r.observe(&phases, 8, 4));
        update(dir.path(), "embedded-pd", |r| r.observe(&phases, 80, 80));
        let vllm = read(dir.path(), "vllm-cpu");
        assert_eq!(vllm.restarts, 4);
        assert_eq!(vllm.per_restart(), Some(150.0));
        assert_eq!(vllm.per_wave(), Some(50.0));
        assert_eq!(read(dir.path(), "embedded-pd").per_wave(), Some(100.0));
        // A file that does not parse costs the estimate, never the run.
        std::fs::write(dir.path().join(FILE), "not json").unwrap();
        assert_eq!(read(dir.path(), "vllm-cpu"), Rates::default());
    }
}
