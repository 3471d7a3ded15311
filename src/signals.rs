//! Ctrl-C and SIGTERM become a cancellation: the running command stops its engines,
//! restores the launch configs it edited and exits 130 (`Failure::Interrupted`).

use std::future::pending;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first Ctrl-C or SIGTERM. Needs a running tokio runtime.
pub fn cancel_on_signal() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        // A signal whose handler cannot be installed never fires (instead of firing now).
        let ctrl_c = async {
            if tokio::signal::ctrl_c().await.is_err() {
                pending::<()>().await;
            }
        };
        let term = async {
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    term.recv().await;
                }
                Err(_) => pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
        eprintln!("interrupted: stopping engines and restoring launch configs");
        token.cancel();
    });
    cancel
}
