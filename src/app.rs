//! `App`: what every handler shares, behind one `Arc`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::command::Commands;
use crate::config::Config;
use crate::engine::Engine;
use crate::files::Files;
use crate::ports::Ports;
use crate::sandbox::Sandboxes;

/// Shared state: configuration, the engine handle and the domain services.
#[derive(Debug)]
pub struct App {
    pub config: Arc<Config>,
    pub engine: Engine,
    pub sandboxes: Arc<Sandboxes>,
    pub commands: Arc<Commands>,
    pub files: Files,
    pub ports: Ports,
    /// Cancelled on SIGTERM: background tasks and long requests end.
    pub shutdown: CancellationToken,
    /// Renders `/metrics`; None when no recorder is installed (tests).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl App {
    /// Wires the services together; connects to nothing yet.
    pub fn new(config: Config) -> Arc<App> {
        Self::with_metrics(config, None)
    }

    /// As `new`, rendering `/metrics` from `metrics`.
    pub fn with_metrics(
        config: Config,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Arc<App> {
        let config = Arc::new(config);
        let engine = Engine::new();
        let sandboxes = Arc::new(Sandboxes::new(Arc::clone(&config), engine.clone()));
        let commands = Arc::new(Commands::new(
            Arc::clone(&config),
            engine.clone(),
            Arc::clone(&sandboxes),
        ));
        let files = Files::new(Arc::clone(&config), Arc::clone(&sandboxes));
        let ports = Ports::new(Arc::clone(&config), engine.clone(), Arc::clone(&sandboxes));
        Arc::new(App {
            config,
            engine,
            sandboxes,
            commands,
            files,
            ports,
            shutdown: CancellationToken::new(),
            metrics,
        })
    }
}
