//! The engine floor: the same work as sandboxd's, done with direct Engine
//! API calls. A container made the way sandboxd makes a sandbox's (volume,
//! then container create and start, with the same mounts and `sleep` as
//! its process), its removal, and `docker exec` (create, attached start
//! read to the end, inspect) into any container, the sandbox's own
//! included; and a whole session of mode `internet`'s engine work (its
//! own internal network, which a running container joins as the shared
//! egress proxy joins a sandbox's).

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, RemoveVolumeOptions,
};
use futures_util::StreamExt;
use sandboxd::engine::{SandboxContainer, sandbox_container_body};
use sandboxd::sandbox::agent_delivery;

use crate::support::{Res, ms};

/// The engine floor: the same work through direct Engine API calls.
pub(crate) struct Floor {
    pub(crate) docker: Docker,
    pub(crate) instance: String,
    pub(crate) network: String,
}

/// One exec of the floor: until the end of its attached stream, until its
/// inspect answered (the exit code: what `wait` gives), the output bytes,
/// and the exit code.
pub(crate) struct FloorExec {
    pub(crate) stream: Duration,
    pub(crate) total: Duration,
    pub(crate) bytes: u64,
    pub(crate) output: Vec<u8>,
    pub(crate) exit: Option<i64>,
}

impl Floor {
    fn spec(&self, name: &str) -> SandboxContainer {
        SandboxContainer {
            name: name.to_string(),
            image: "sandboxd-runtime:latest".into(),
            oci_runtime: None,
            user: "1000:1000".into(),
            workspace_dir: "/workspace".into(),
            workspace_aliases: vec!["/vercel/sandbox/workspace".into()],
            workspace_nocopy: false,
            // The same mounts as a sandbox (the agent volume sandboxd made
            // exists by now); the floor's process is `sleep`.
            agent_volume: agent_delivery::agent_volume(&self.instance),
            agent_dir: agent_delivery::AGENT_DIR.into(),
            command: vec!["sleep".into(), "infinity".into()],
            volume: format!("{name}-workspace"),
            network: Some(self.network.clone()),
            network_aliases: Vec::new(),
            env: Vec::new(),
            vcpus: 1,
            memory_mb: 1024,
            pids_limit: 512,
            tmp_size_mb: 512,
            file_size_limit_mb: 1024,
            labels: [("sandboxd.instance".to_string(), self.instance.clone())].into(),
        }
    }

    /// volume + container create + start; returns the time.
    pub(crate) async fn create(&self, name: &str) -> Res<Duration> {
        self.create_on(name, &self.network).await
    }

    /// [`Floor::create`] with the container on `network`.
    async fn create_on(&self, name: &str, network: &str) -> Res<Duration> {
        let mut spec = self.spec(name);
        spec.network = Some(network.to_string());
        let t = Instant::now();
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(spec.volume.clone()),
                labels: Some(spec.labels.clone()),
                ..Default::default()
            })
            .await?;
        self.docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    platform: String::new(),
                }),
                sandbox_container_body(&spec, false),
            )
            .await?;
        self.docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await?;
        Ok(t.elapsed())
    }

    /// container + volume removal.
    pub(crate) async fn remove(&self, name: &str) -> Res<Duration> {
        let t = Instant::now();
        self.docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
        self.docker
            .remove_volume(
                &format!("{name}-workspace"),
                Some(RemoveVolumeOptions { force: true }),
            )
            .await?;
        Ok(t.elapsed())
    }

    /// exec create, start (attached, read to the end), inspect. `keep`
    /// keeps the output (small outputs only).
    pub(crate) async fn exec(&self, container: &str, cmd: &[&str], keep: bool) -> Res<FloorExec> {
        let t = Instant::now();
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        let mut bytes = 0u64;
        let mut output = Vec::new();
        if let StartExecResults::Attached { output: mut o, .. } = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(256 * 1024),
                }),
            )
            .await?
        {
            while let Some(chunk) = o.next().await {
                let chunk = chunk?.into_bytes();
                bytes += chunk.len() as u64;
                if keep {
                    output.extend_from_slice(&chunk);
                }
            }
        }
        let stream = t.elapsed();
        let inspect = self.docker.inspect_exec(&exec.id).await?;
        Ok(FloorExec {
            stream,
            total: t.elapsed(),
            bytes,
            output,
            exit: inspect.exit_code,
        })
    }

    /// One session of mode `internet`'s engine work: an internal network
    /// of its own, then volume, container create and start on it,
    /// `joiner` (a running container, as the shared egress proxy) joining
    /// it and `true` by exec; then the container, `joiner`'s endpoint, the
    /// network and the volume removed. The time to the exec's end.
    pub(crate) async fn linked_session(&self, name: &str, joiner: &str) -> Res<Duration> {
        let t = Instant::now();
        self.docker
            .create_network(NetworkCreateRequest {
                name: name.to_string(),
                driver: Some("bridge".into()),
                internal: Some(true),
                labels: Some([("sandboxd.instance".to_string(), self.instance.clone())].into()),
                ..Default::default()
            })
            .await?;
        self.create_on(name, name).await?;
        self.docker
            .connect_network(
                name,
                NetworkConnectRequest {
                    container: joiner.to_string(),
                    endpoint_config: None,
                },
            )
            .await?;
        self.round_trip(name, &["true"]).await?;
        let first = t.elapsed();
        self.remove(name).await?;
        self.docker
            .disconnect_network(
                name,
                NetworkDisconnectRequest {
                    container: joiner.to_string(),
                    force: Some(true),
                },
            )
            .await?;
        self.docker.remove_network(name).await?;
        Ok(first)
    }

    /// A round trip that must exit 0; returns its time in ms.
    pub(crate) async fn round_trip(&self, container: &str, cmd: &[&str]) -> Res<f64> {
        let e = self.exec(container, cmd, false).await?;
        if e.exit != Some(0) {
            return Err(format!("floor exec {cmd:?}: exit {:?}", e.exit).into());
        }
        Ok(ms(e.total))
    }
}
