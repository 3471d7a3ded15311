//! The commands that neither run an experiment nor read results: `bisect flags` (the
//! catalog), `bisect kernels` (NVRTC compile check), `bisect restore` (kill what a
//! dead bisect left running, replay its journal) and `bisect engine` (one role of the embedded engine).

use std::process::ExitCode;

use crate::cli::engine::EngineArgs;
use crate::cli::{CheckArgs, FlagsArgs, RestoreArgs};
use bisect_harness::commands::check::export::CheckTable;
use bisect_harness::commands::check::CheckPlan;
use bisect_harness::config::{Coverage, FlagCatalog};
use bisect_harness::exit::{self, Failure, Problem};
use bisect_harness::redact::scrub;
use bisect_harness::results::Exporter;

pub(crate) fn engine(args: EngineArgs) -> anyhow::Result<ExitCode> {
    let config = args
        .into_config()
        .map_err(|e| Failure::BadInput(Problem::message_only(format!("{e:#}"))))?;
    bisect_engine::run(config)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn flags(args: &FlagsArgs) -> anyhow::Result<ExitCode> {
    let catalog = crate::cli::catalog_for(args.target.as_deref(), &args.flags_dir)?;
    let (shown, not_applying) = match &args.target {
        Some(path) => {
            let target = bisect_harness::config::TargetProfile::load(path)?;
            let (yes, no) = catalog.split_for(&target);
            (yes, Some((target, no)))
        }
        None => (catalog.flags.iter().collect(), None),
    };
    for f in shown {
        println!(
            "{:<22} {} {:<36} roles={} on={} off={}",
            f.name,
            f.setting.kind(),
            f.setting.key(),
            f.roles.join(","),
            f.on,
            f.off
        );
        println!("{:<22} {}\n", "", f.doc.trim());
    }
    if let Some((target, no)) = not_applying {
        if !no.is_empty() {
            let roles: Vec<&str> = target.roles.iter().map(|r| r.name.as_str()).collect();
            // The same coverage `bisect check` reports: a flag with only some of its
            // roles in the target is named with the roles it lacks.
            println!(
                "not applying to target {} (roles {}): {}",
                target.name,
                roles.join(", "),
                no.iter()
                    .map(|f| match FlagCatalog::coverage(f, &target) {
                        Coverage::Partial { missing } => format!(
                            "{} (roles {}; partial: the target has no {})",
                            f.name,
                            f.roles.join(","),
                            missing.join(",")
                        ),
                        _ => format!("{} (roles {})", f.name, f.roles.join(",")),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `bisect check --target FILE`: the report (text or JSON) and exit 0 when every check
/// passed, [`exit::CHECK_FAILED`] when one did. A profile that does not load is an
/// error (exit 2) before anything is checked.
pub(crate) async fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let inputs = args.inputs()?;
    // Every replica set is checked as a target of its own (one set: the profile itself).
    let sets = inputs.target.replica_sets();
    let mut reports = Vec::new();
    for set in &sets {
        let report = bisect_harness::commands::check::check(&CheckPlan {
            target: set,
            catalog: &inputs.catalog,
            workload: Some(&inputs.workload),
            offline: args.offline,
            api_key: inputs.api_key.clone(),
            api_key_missing: inputs.api_key_missing.clone(),
            timeout: inputs.timeout,
            state_root: bisect_harness::launch::state_root(),
        })
        .await;
        reports.push((set.replica_name().to_string(), report));
    }
    let passed = reports.iter().all(|(_, r)| r.passed());
    match (args.json, reports.as_slice()) {
        (true, [(_, report)]) => println!("{}", scrub(&serde_json::to_string_pretty(report)?)),
        (true, _) => {
            let by_set: serde_json::Map<String, serde_json::Value> = reports
                .iter()
                .map(|(name, r)| Ok((name.clone(), serde_json::to_value(r)?)))
                .collect::<anyhow::Result<_>>()?;
            println!("{}", scrub(&serde_json::to_string_pretty(&by_set)?));
        }
        (false, _) => {
            for (name, report) in &reports {
                if sets.len() > 1 {
                    println!("replica set {name}:");
                }
                print!("{}", scrub(&CheckTable.render(report)?));
            }
        }
    }
    Ok(ExitCode::from(if passed {
        exit::OK
    } else {
        exit::CHECK_FAILED
    }))
}

pub(crate) fn kernels() -> anyhow::Result<ExitCode> {
    use bisect_engine::backend::cuda;
    match cuda::probe() {
        Some(gpu) => println!("GPU: {gpu}"),
        None => println!("GPU: none found (the engine runs on the CPU backend)"),
    }
    let compiled = cuda::compile_check_all().map_err(|e| {
        Failure::CouldNotRun(Problem::message_only(format!(
            "NVRTC compile check failed: {e:#}"
        )))
    })?;
    for (file, ptx) in compiled {
        println!("compiled {file}: {ptx} bytes of PTX");
    }
    Ok(ExitCode::SUCCESS)
}

/// Recovers every launch config a dead bisect left (its state found by the file's path,
/// under `$XDG_STATE_HOME/bisect`), plus a journal an older version left in the
/// results root.
pub(crate) fn restore(args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    use bisect_harness::launch;
    let recovery =
        launch::recover_at(&launch::state_root(), &args.results.join(".bisect-journal"))?;
    if recovery.restored.is_empty() && recovery.killed.is_empty() {
        println!("nothing to restore");
    }
    for group in recovery.killed {
        println!(
            "killed process group {} (role {}) left running by bisect pid {}",
            group.pgid, group.role, group.owner_pid
        );
    }
    for p in recovery.restored {
        println!("restored {}", p.display());
    }
    for kept in recovery.kept {
        println!("warning: {kept}");
    }
    for gone in recovery.gone {
        println!("{}", bisect_harness::launch::gone_words(&gone));
    }
    Ok(ExitCode::SUCCESS)
}
