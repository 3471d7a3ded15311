//! What `bisect check` says of each flag's mechanism (core::mechanism): its witnesses
//! for this target's engine, what each needs, and whether it can be read now: a counter
//! the role's metrics endpoint serves (or declares), a log bisect captures (a role it
//! spawns), an endpoint field the role serves. Offline, only what the profile shows.

use crate::config::{FlagSpec, TargetProfile};
use crate::core::mechanism::{Watch, WitnessKind};

/// One line per witness (or one saying why there is none), for the check's report.
pub(super) async fn lines(
    flag: &FlagSpec,
    target: &TargetProfile,
    http: Option<&reqwest::Client>,
) -> Vec<String> {
    let engine = target.engine.name();
    let Some(m) = &flag.mechanism else {
        return vec![format!(
            "no [mechanism] in {}: a clean answer cannot say whether the path it controls ran",
            flag.source.display()
        )];
    };
    let head = format!("mechanism: {} (runs in {})", m.name, m.arms.as_str());
    if let Watch::Unobservable(why) = &m.watch {
        return vec![format!("{head}; unobservable: {why}")];
    }
    let witnesses = m.witnesses_for(engine);
    if witnesses.is_empty() {
        return vec![format!("{head}; no witness for the {engine} engine")];
    }
    let mut out = vec![head];
    for w in witnesses {
        let roles: Vec<&crate::config::RoleSpec> = target
            .roles
            .iter()
            .filter(|r| w.reads(&r.name, &flag.roles))
            .collect();
        let mut states = Vec::new();
        for role in &roles {
            states.push(format!("{}: {}", role.name, readable(w, role, http).await));
        }
        if roles.is_empty() {
            states.push("none of its roles is a role of this target: never read".into());
        }
        let needs = match &w.kind {
            WitnessKind::Log {
                level: Some(level), ..
            } => format!("; needs {level}"),
            _ => String::new(),
        };
        out.push(format!(
            "  witness {} (at least {}){needs}: {}",
            w.words(),
            w.min,
            states.join("; ")
        ));
    }
    out
}

/// Whether `w` can be read on `role` now, in words.
async fn readable(
    w: &crate::core::mechanism::Witness,
    role: &crate::config::RoleSpec,
    http: Option<&reqwest::Client>,
) -> String {
    match &w.kind {
        WitnessKind::Log { .. } => match (&role.restart, &role.log) {
            (None, _) => "readable (bisect captures the output of the role it spawns)".into(),
            (Some(_), Some(cmd)) => {
                format!(
                    "readable through the role's log command, followed after each restart: {cmd}"
                )
            }
            (Some(_), None) => "NOT readable: its restart command starts it, so its log is not \
                 bisect's; give the role a `log` command that follows it (e.g. log = \
                 \"journalctl -u UNIT -f -n 0 -o cat\")"
                .into(),
        },
        WitnessKind::Counter { selector } => {
            let Some(url) = &role.metrics else {
                return "NOT readable: the role has no metrics URL".into();
            };
            let Some(http) = http else {
                return format!("read from {url} (offline: not tried)");
            };
            match crate::arm::get_text(http, url).await {
                Ok(text) => {
                    let exposition = crate::driver::metrics::parse_exposition(&text);
                    match exposition.counter(selector) {
                        Some(v) => format!("readable, {v} now"),
                        None => format!("NOT readable now: {url} serves no {selector}"),
                    }
                }
                Err(e) => format!("not read now: {e}"),
            }
        }
        WitnessKind::Endpoint { path, field } => {
            let Some(origin) = crate::config::engine::origin(&role.health) else {
                return "NOT readable: the role's health URL has no http:// origin".into();
            };
            let url = format!("{origin}{path}");
            let Some(http) = http else {
                return format!("read from {url} (offline: not tried)");
            };
            match crate::arm::get_json(http, &url).await {
                Ok(doc) => match crate::arm::witness_sum_at(&doc, field) {
                    Some(v) => format!("readable, {v} now"),
                    None => format!("NOT readable now: {url} has no number at {field}"),
                },
                Err(e) => format!("not read now: {e}"),
            }
        }
    }
}
