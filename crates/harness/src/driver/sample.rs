//! A small ops-agent workload (three tools, three steps per task) built in code, for
//! the driver's tests and benchmarks against the zero-work mock engine
//! (`bisect_engine::mock`, a dev-dependency only) and for integration tests.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{drive, DrivePlan, DriveStats, InFlight};
use crate::core::classify::Classifier;
use crate::core::session::SessionResult;

pub use crate::core::workload::sample_workload;

/// Drives `plan` outside the arm lifecycle (the driver's own tests, the plain-server
/// tests) with every markup family counted, and collects every session's result in
/// session order.
pub async fn drive_collected(
    plan: &DrivePlan,
    cancel: CancellationToken,
) -> anyhow::Result<(DriveStats, Vec<SessionResult>)> {
    let classifier = Arc::new(Classifier::with_defaults(&plan.workload.tools)?);
    let (tx, mut rx) = mpsc::channel(64);
    let collector = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(r) = rx.recv().await {
            all.push(r);
        }
        all
    });
    let stats = drive(plan, classifier, tx, Arc::new(InFlight::new()), cancel).await?;
    let mut results = collector.await?;
    results.sort_by_key(|r| r.index);
    Ok((stats, results))
}
