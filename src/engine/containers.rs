//! Containers: creating sandbox, proxy and egress containers from their
//! hardened specs (`container_spec`), starting, restarting, pausing and
//! unpausing (the cgroup freezer), renaming, removing, inspecting and
//! listing them, changing their limits, and telling
//! whether the memory limit ended one.

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{
    EventsOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    RenameContainerOptions, RestartContainerOptions, StartContainerOptions,
};
use futures_util::StreamExt;

use super::container_spec::{self, EgressContainer, ProxyContainer, SandboxContainer};
use super::{Engine, EngineError, EngineResult, label_filter};
use crate::clock::unix_seconds;

/// How long an `oom` event may come after its container's exit (it
/// came 36 ms after the exit when it was late on this machine).
const LATE_OOM_EVENT: Duration = Duration::from_secs(1);

/// How long a started proxy may take to listen (it takes milliseconds).
const PROXY_START: Duration = Duration::from_secs(10);

/// A container as listed: enough to adopt or clean it up.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub running: bool,
    /// Its processes are frozen (`pause`); it is not `running` then.
    pub paused: bool,
    /// (container port, host port) of published TCP ports.
    pub published: Vec<(u16, u16)>,
}

/// A proxy container as found (see [`Engine::proxy_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyState {
    /// The host port it publishes, while it runs (a stopped one lost it).
    pub host_port: Option<u16>,
    pub labels: HashMap<String, String>,
}

/// A container's state as far as the domain cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    /// Running, paused or not.
    pub running: bool,
    /// Its processes are frozen (`pause`).
    pub paused: bool,
    /// The engine's flag that the kernel's OOM killer acted in its last
    /// life. It can miss (see [`Engine::stopped_by_memory`]).
    pub oom_killed: bool,
    /// The exit code of its last life (0 while it runs).
    pub exit_code: i64,
    /// When its last life started, as the engine wrote it (RFC 3339).
    pub started_at: String,
    pub labels: HashMap<String, String>,
    /// The id of the image it was made from.
    pub image_id: String,
}

impl Engine {
    /// Creates (does not start) a hardened sandbox container.
    pub async fn create_container(&self, spec: &SandboxContainer) -> EngineResult<()> {
        let under_gvisor = self.is_gvisor(spec.oci_runtime.as_deref()).await;
        self.create_named(
            &spec.name,
            container_spec::sandbox_container_body(spec, under_gvisor),
        )
        .await
    }

    /// Creates a container called `name` from `body`.
    async fn create_named(
        &self,
        name: &str,
        body: bollard::models::ContainerCreateBody,
    ) -> EngineResult<()> {
        let options = bollard::query_parameters::CreateContainerOptions {
            name: Some(name.to_string()),
            platform: String::new(),
        };
        let docker = self.docker()?;
        self.making(async move { docker.create_container(Some(options), body).await })
            .await?;
        Ok(())
    }

    /// Whether the OCI runtime of that name is gVisor's runsc: by name, or
    /// by the program the engine registered for it. Unknown until the
    /// engine answers (then false, and asked again next time).
    pub async fn is_gvisor(&self, oci_runtime: Option<&str>) -> bool {
        let Some(name) = oci_runtime else {
            return false;
        };
        if name.starts_with("runsc") {
            return true;
        }
        if let Some(known) = self
            .inner
            .gvisor_runtimes
            .read()
            .ok()
            .and_then(|m| m.get(name).copied())
        {
            return known;
        }
        let Ok(docker) = self.docker() else {
            return false;
        };
        let Ok(info) = docker.info().await else {
            return false;
        };
        let runtimes = info.runtimes.unwrap_or_default();
        let gvisor = runtimes
            .get(name)
            .and_then(|r| r.path.as_deref())
            .is_some_and(|p| {
                std::path::Path::new(p)
                    .file_name()
                    .is_some_and(|f| f == "runsc")
            });
        if let Ok(mut m) = self.inner.gvisor_runtimes.write() {
            m.insert(name.to_string(), gvisor);
        }
        gvisor
    }

    /// Starts a created or stopped container.
    pub async fn start_container(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        docker
            .start_container(name, None::<StartContainerOptions>)
            .await?;
        Ok(())
    }

    /// Removes a container and kills what runs in it; a missing one is fine.
    pub async fn remove_container(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        let options = RemoveContainerOptions {
            force: true,
            v: false,
            link: false,
        };
        match docker.remove_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                // "removal already in progress": someone else is doing it;
                // done means gone, so wait for that (bounded).
                EngineError::Conflict(m) if m.contains("in progress") => {
                    for _ in 0..40 {
                        if self.container_running(name).await?.is_none() {
                            return Ok(());
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(EngineError::Conflict(format!(
                        "{name} is still being removed"
                    )))
                }
                other => Err(other),
            },
        }
    }

    /// Restarts a container: SIGTERM to its process (under init, the init
    /// passes it on), SIGKILL to everything if it has not stopped after
    /// `grace`.
    pub async fn restart_container(&self, name: &str, grace: Duration) -> EngineResult<()> {
        let docker = self.docker()?;
        let options = RestartContainerOptions {
            signal: None,
            t: Some(i32::try_from(grace.as_secs()).unwrap_or(i32::MAX)),
        };
        docker.restart_container(name, Some(options)).await?;
        Ok(())
    }

    /// Freezes every process of a running container (the cgroup freezer):
    /// they keep their memory and get no CPU until [`Self::unpause_container`].
    pub async fn pause_container(&self, name: &str) -> EngineResult<()> {
        self.docker()?.pause_container(name).await?;
        Ok(())
    }

    /// Thaws a container [`Self::pause_container`] froze.
    pub async fn unpause_container(&self, name: &str) -> EngineResult<()> {
        self.docker()?.unpause_container(name).await?;
        Ok(())
    }

    /// Whether a container runs: `Some(true)` running, `Some(false)` exists
    /// but stopped, `None` gone.
    pub async fn container_running(&self, name: &str) -> EngineResult<Option<bool>> {
        Ok(self.container_status(name).await?.map(|s| s.running))
    }

    /// A container's state, `None` when it is gone.
    pub async fn container_status(&self, name: &str) -> EngineResult<Option<ContainerStatus>> {
        let docker = self.docker()?;
        match docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                Ok(Some(ContainerStatus {
                    running: state.running.unwrap_or(false),
                    paused: state.paused.unwrap_or(false),
                    oom_killed: state.oom_killed.unwrap_or(false),
                    exit_code: state.exit_code.unwrap_or(0),
                    started_at: state.started_at.unwrap_or_default(),
                    labels: info.config.and_then(|c| c.labels).unwrap_or_default(),
                    image_id: info.image.unwrap_or_default(),
                }))
            }
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// Whether the memory limit ended a stopped container's last life.
    /// The engine's flag is set only when its `oom` event came before the
    /// container's exit; on a loaded host it sometimes comes after (seen
    /// with gVisor, whose whole kernel goes), and the flag stays false.
    /// So a container killed by SIGKILL (137) without the flag is looked
    /// up in the engine's events of that life: an `oom` there, or arriving
    /// within [`LATE_OOM_EVENT`], means memory.
    pub async fn stopped_by_memory(&self, name: &str, status: &ContainerStatus) -> bool {
        if status.running {
            return false;
        }
        if status.oom_killed {
            return true;
        }
        if status.exit_code != 137 {
            return false;
        }
        let (Ok(docker), Some(started)) = (self.docker(), unix_seconds(&status.started_at)) else {
            return false;
        };
        let options = EventsOptions {
            since: Some(started.to_string()),
            until: None,
            filters: Some(HashMap::from([
                ("type".to_string(), vec!["container".to_string()]),
                ("container".to_string(), vec![name.to_string()]),
                ("event".to_string(), vec!["oom".to_string()]),
            ])),
        };
        let mut events = docker.events(Some(options));
        let found = matches!(
            tokio::time::timeout(LATE_OOM_EVENT, events.next()).await,
            Ok(Some(Ok(_)))
        );
        if found {
            tracing::info!(
                container = name,
                "stopped by its memory limit (the engine's flag missed it; its oom event says so)"
            );
        }
        found
    }

    /// Every container, running or not, carrying all of `labels`.
    pub async fn list_containers(
        &self,
        labels: &[(&str, &str)],
    ) -> EngineResult<Vec<ContainerRecord>> {
        let docker = self.docker()?;
        let options = ListContainersOptions {
            all: true,
            filters: Some(label_filter(labels)),
            ..Default::default()
        };
        let list = docker.list_containers(Some(options)).await?;
        Ok(list
            .into_iter()
            .map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                ContainerRecord {
                    name: c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .map(|n| n.trim_start_matches('/').to_string())
                        .unwrap_or_default(),
                    labels: c.labels.unwrap_or_default(),
                    running: state == "running",
                    paused: state == "paused",
                    published: c
                        .ports
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|p| Some((p.private_port, p.public_port?)))
                        .collect(),
                }
            })
            .collect())
    }

    /// Changes a running sandbox container's CPU and memory limits in
    /// place; memory and memory with swap move together, so there is still
    /// no swap on top. gVisor's runsc cannot do this (the engine answers
    /// an error and the limits stay).
    pub async fn update_resources(
        &self,
        name: &str,
        vcpus: u32,
        memory_mb: u32,
    ) -> EngineResult<()> {
        let (memory, nano_cpus) = container_spec::cpu_and_memory(vcpus, memory_mb);
        self.docker()?
            .update_container(
                name,
                bollard::models::ContainerUpdateBody {
                    memory: Some(memory),
                    memory_swap: Some(memory),
                    nano_cpus: Some(nano_cpus),
                    ..Default::default()
                },
            )
            .await?;
        Ok(())
    }

    /// A proxy container found by name, `None` when there is none: the
    /// host port it publishes `port/tcp` on while it runs, and its labels.
    pub async fn proxy_state(
        &self,
        container: &str,
        port: u16,
    ) -> EngineResult<Option<ProxyState>> {
        let docker = self.docker()?;
        let info = match docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) => {
                return match EngineError::from(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                };
            }
        };
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        let host_port = if info.state.and_then(|s| s.running).unwrap_or(false) {
            info.network_settings
                .and_then(|n| n.ports)
                .and_then(|mut p| p.remove(&format!("{port}/tcp")))
                .flatten()
                .and_then(|b| b.into_iter().find_map(|b| b.host_port?.parse().ok()))
        } else {
            None
        };
        Ok(Some(ProxyState { host_port, labels }))
    }

    /// Renames a container, running or not: one engine call, atomic (of two
    /// renames of one container, one finds it gone); `NotFound` when there
    /// is no `from`, `Conflict` when `to` is taken.
    pub async fn rename_container(&self, from: &str, to: &str) -> EngineResult<()> {
        let options = RenameContainerOptions {
            name: to.to_string(),
        };
        self.docker()?.rename_container(from, options).await?;
        Ok(())
    }

    /// Creates a proxy container and starts it.
    pub async fn start_proxy(&self, spec: &ProxyContainer) -> EngineResult<()> {
        self.create_named(&spec.name, container_spec::proxy_container_body(spec))
            .await?;
        self.connect_network(&spec.link_network, &spec.name, &[], None)
            .await?;
        self.start_container(&spec.name).await?;
        if self
            .wait_for_output(&spec.name, container_spec::PROXY_LISTENING, PROXY_START)
            .await?
        {
            Ok(())
        } else {
            Err(EngineError::Failed(format!(
                "proxy {} did not start listening within {PROXY_START:?}",
                spec.name
            )))
        }
    }

    /// Creates an egress proxy (not started: it joins its link networks
    /// first, see `connect_network`).
    pub async fn create_egress(&self, spec: &EgressContainer) -> EngineResult<()> {
        self.create_named(&spec.name, container_spec::egress_container_body(spec))
            .await
    }
}
