//! Delivering the agent: sandboxd carries the `sandboxd-agent` binary it
//! was built with (see `build.rs`) and puts it into every sandbox, so any
//! image works, one with nothing but a shell included. The binary goes
//! into one volume per agent version, filled once through the engine and
//! mounted read-only at [`AGENT_DIR`] in every sandbox of this instance;
//! the sandbox's own process is the agent.
//!
//! A volume that exists already is checked byte for byte before it is
//! trusted (a sandboxd stopped mid-fill leaves a short file). Sandboxes
//! made with another agent version are recreated on rehydration (see
//! `rehydrate`), and volumes of versions no sandbox uses are removed.

use super::{SandboxResult, Sandboxes, labels};
use crate::engine::{EngineError, Entry};

/// Where the agent's volume is mounted in a sandbox.
pub const AGENT_DIR: &str = "/.sandboxd";
/// The agent binary inside a sandbox.
pub const AGENT_PATH: &str = "/.sandboxd/sandboxd-agent";
/// Which agent this sandboxd carries: derived from its bytes.
pub const AGENT_VERSION: &str = env!("SANDBOXD_AGENT_VERSION");
/// The agent itself, a static binary.
pub const AGENT_BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandboxd-agent"));
/// `sandboxd.role` of an agent volume.
const ROLE_AGENT: &str = "agent";

/// The volume holding this agent version, for `instance`.
pub fn agent_volume(instance: &str) -> String {
    format!("{instance}-agent-{}", &AGENT_VERSION[..12])
}

/// The container's command: the agent, its stdio a connection.
pub fn agent_command() -> Vec<String> {
    vec![
        AGENT_PATH.to_string(),
        "serve".to_string(),
        "--stdio".to_string(),
    ]
}

impl Sandboxes {
    /// Makes sure this agent's volume exists and holds exactly this agent;
    /// `image` is any image the engine has (only its containers' mounts
    /// are used). Once per process; concurrent creates wait for it.
    pub(super) async fn ensure_agent_volume(&self, image: &str) -> SandboxResult<()> {
        let mut ready = self.agent_volume_ready.lock().await;
        if *ready {
            return Ok(());
        }
        let name = agent_volume(&self.config.instance);
        let mut labels = labels::instance_only(&self.config.instance);
        labels.insert(labels::ROLE.into(), ROLE_AGENT.into());
        labels.insert(labels::AGENT.into(), AGENT_VERSION.into());
        if self.engine.volume_exists(&name).await? {
            let found = self
                .engine
                .volume_file(
                    &name,
                    image,
                    labels.clone(),
                    "sandboxd-agent",
                    AGENT_BINARY.len() + 64 * 1024,
                )
                .await;
            match found {
                Ok(Some(bytes)) if bytes == AGENT_BINARY => {
                    *ready = true;
                    return Ok(());
                }
                Ok(_) | Err(EngineError::Failed(_)) => {
                    tracing::warn!(volume = %name, "the agent volume does not hold this agent; filling it again");
                    self.engine.remove_volume(&name).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.engine.create_volume(&name, 0, labels.clone()).await?;
        let filled = self
            .engine
            .fill_volume(
                &name,
                image,
                labels,
                &[Entry::File {
                    path: "sandboxd-agent",
                    content: AGENT_BINARY,
                    mode: 0o755,
                }],
            )
            .await;
        if let Err(e) = filled {
            let _ = self.engine.remove_volume(&name).await;
            return Err(e.into());
        }
        tracing::info!(volume = %name, version = AGENT_VERSION, bytes = AGENT_BINARY.len(), "agent volume filled");
        *ready = true;
        Ok(())
    }

    /// Removes agent volumes of this instance that hold another version
    /// (a volume still in use by a container stays).
    pub(super) async fn remove_stale_agent_volumes(&self) {
        let inst = self.config.instance.as_str();
        let filter = [(labels::INSTANCE, inst), (labels::ROLE, ROLE_AGENT)];
        let Ok(volumes) = self.engine.list_volumes(&filter).await else {
            return;
        };
        let current = agent_volume(inst);
        for v in volumes.into_iter().filter(|v| v.name != current) {
            match self.engine.remove_volume_now(&v.name).await {
                Ok(()) => tracing::info!(volume = %v.name, "removed the volume of an older agent"),
                Err(e) => tracing::debug!(volume = %v.name, error = %e, "older agent volume kept"),
            }
        }
    }
}
