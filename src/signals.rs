//! Ctrl-C (SIGINT), SIGTERM, SIGHUP (the terminal went away) and SIGQUIT (Ctrl-\)
//! become a cancellation: the running command stops its engines, restores the launch
//! configs it edited and exits 130 (`Failure::Interrupted`).

use std::future::pending;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Resolves on the first `kind` signal; never, when its handler cannot be installed.
async fn on(kind: SignalKind) {
    match signal(kind) {
        Ok(mut stream) => {
            stream.recv().await;
        }
        Err(_) => pending::<()>().await,
    }
}

/// A token cancelled on the first SIGINT, SIGTERM, SIGHUP or SIGQUIT. Needs a running
/// tokio runtime.
pub(crate) fn cancel_on_signal() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        // A signal whose handler cannot be installed never fires (instead of firing now).
        let ctrl_c = async {
            if tokio::signal::ctrl_c().await.is_err() {
                pending::<()>().await;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = on(SignalKind::terminate()) => {}
            _ = on(SignalKind::hangup()) => {}
            _ = on(SignalKind::quit()) => {}
        }
        // Cancel first: with stderr gone (a closed pipe) the message cannot be written,
        // and `eprintln!` would have panicked this task before the token was cancelled,
        // leaving the run deaf to every signal.
        token.cancel();
        bisect_harness::fault::release();
        stderr_line!("interrupted: stopping engines and restoring launch configs");
    });
    cancel
}
