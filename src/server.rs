//! Running the service: load the session tokens, bind, start the background
//! tasks (engine connector, rehydration, idle reaper, teardown of removed
//! sandboxes, the session tokens' pruner), serve, and on
//! SIGTERM/SIGINT stop accepting, cancel the tasks and wait for them, and
//! for the engine calls under way that make something. Containers are left
//! running: labels and rehydration bring them back on the next start.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio_util::task::TaskTracker;

use crate::app::App;
use crate::config::Config;
use crate::{command, sandbox, session_tokens};

/// The longest a stop waits for engine calls under way that make
/// something: they take well under a second, and whoever stops sandboxd
/// (compose, a test) gives it 10 s before SIGKILL.
const MAKING_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves until a shutdown signal. Errors only when the address cannot be
/// bound, the session tokens cannot be loaded, or the server fails.
pub async fn run(config: Config) -> std::io::Result<()> {
    let addr = SocketAddr::new(config.bind_host, config.port);
    let app = App::with_metrics(config, crate::telemetry::install());
    // Tokens lost to an unreadable file would lock clients out unseen:
    // refuse to start instead, naming the file.
    let tokens = app
        .session_tokens
        .load()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    tracing::info!(
        path = %app.session_tokens.path().unwrap_or_default().display(),
        live = tokens,
        "session tokens loaded"
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let shutdown = app.shutdown.clone();
    let tasks = TaskTracker::new();

    {
        let engine = app.engine.clone();
        let socket = app.config.docker_socket.clone();
        let token = shutdown.clone();
        tasks.spawn(async move { engine.run_connector(socket, token).await });
    }
    {
        // Rebuild sandboxes from labels, find commands that outlived us,
        // and only then let requests in; then watch for the end of the
        // terminal sessions that outlived us.
        let sandboxes = Arc::clone(&app.sandboxes);
        let commands = Arc::clone(&app.commands);
        let ptys = Arc::clone(&app.ptys);
        let token = shutdown.clone();
        tasks.spawn(async move {
            if Arc::clone(&sandboxes).rehydrate_when_connected(token).await {
                commands.discover().await;
                sandboxes.mark_ready();
                ptys.discover().await;
            }
        });
    }
    tasks.spawn(sandbox::run_reaper(
        Arc::clone(&app.sandboxes),
        shutdown.clone(),
    ));
    tasks.spawn(sandbox::run_pool(
        Arc::clone(&app.sandboxes),
        shutdown.clone(),
    ));
    tasks.spawn(sandbox::run_next_link(
        Arc::clone(&app.sandboxes),
        shutdown.clone(),
    ));
    tasks.spawn(sandbox::run_teardown(
        Arc::clone(&app.sandboxes),
        shutdown.clone(),
    ));
    tasks.spawn(command::run_pruner(
        Arc::clone(&app.commands),
        shutdown.clone(),
    ));
    tasks.spawn(Arc::clone(&app.sandboxes).watch_egress(shutdown.clone()));
    tasks.spawn(session_tokens::run_pruner(
        Arc::clone(&app.session_tokens),
        shutdown.clone(),
    ));

    let auth = match (&app.config.admin_token, addr.ip().is_loopback()) {
        (Some(_), _) => "admin token required",
        (None, true) => "no token (loopback only)",
        (None, false) => "NO TOKEN on a non-loopback address (allow_insecure_no_token)",
    };
    tracing::info!(%addr, instance = %app.config.instance, auth, "sandboxd listening");
    let router = crate::api::router(Arc::clone(&app));
    let signal_token = shutdown.clone();
    // Streamed answers (NDJSON logs, MCP's event streams) are written in
    // pieces: without TCP_NODELAY a piece waits for the client's delayed
    // ACK of the one before (40 ms on Linux), which an MCP tool call paid
    // on most calls.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a connection");
        }
    });
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            tracing::info!("shutdown signal received; draining");
            signal_token.cancel();
        })
        .await;
    shutdown.cancel();
    tasks.close();
    app.tasks.close();
    tasks.wait().await;
    app.tasks.wait().await;
    // Once nothing starts new ones: what the engine has been asked to
    // make exists before we exit, for the next start or a cleanup by
    // label to find.
    app.engine.finish_making(MAKING_AT_SHUTDOWN).await;
    tracing::info!("sandboxd stopped");
    served
}

async fn wait_for_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
