//! Process signals shared by the long-running commands (`agent`, `serve`).

use std::future::Future;

use tracing::info;

/// Installs SIGTERM and SIGINT handlers now (so a signal that arrives
/// during start-up is not fatal) and returns a future that resolves on the
/// first of them, logging which.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!("{name} received; exiting after the publish in progress");
    })
}
