//! Volumes: workspaces on disk (with a quota when asked) or in memory, and
//! removing, finding and listing them. What goes into a volume from the
//! host goes through the archive API (`archive`).

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{ListVolumesOptions, RemoveVolumeOptions};

use super::{Engine, EngineError, EngineResult, label_filter};

/// A volume as listed.
#[derive(Debug, Clone)]
pub struct VolumeRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
}

impl Engine {
    /// Creates a named volume with labels, limited to `size_mb` MiB when
    /// that is not 0 (the local driver's `size`: an xfs project quota).
    pub async fn create_volume(
        &self,
        name: &str,
        size_mb: u64,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let driver_opts = (size_mb > 0).then(|| {
            let bytes = size_mb.saturating_mul(1024 * 1024);
            HashMap::from([("size".to_string(), bytes.to_string())])
        });
        match self.create_volume_with(name, driver_opts, labels).await {
            Ok(()) => Ok(()),
            // Docker's local driver: "quota size requested but no quota
            // support".
            Err(EngineError::Failed(m)) if size_mb > 0 && m.contains("no quota support") => {
                Err(EngineError::VolumeSizeUnsupported(format!(
                    "the engine cannot limit the workspace to {size_mb} MiB: {m}"
                )))
            }
            Err(other) => Err(other),
        }
    }

    /// Creates a named volume with labels that is a tmpfs of `size_mb` MiB
    /// (the local driver mounts it while a container holds the volume),
    /// its root owned by `owner` (uid, gid) with mode 0755. A tmpfs lives
    /// in memory: its files are gone whenever no container holds it, and
    /// the engine copies nothing of the image into it.
    pub async fn create_tmpfs_volume(
        &self,
        name: &str,
        size_mb: u64,
        owner: (u32, u32),
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let (uid, gid) = owner;
        let opts = HashMap::from([
            ("type".to_string(), "tmpfs".to_string()),
            ("device".to_string(), "tmpfs".to_string()),
            (
                "o".to_string(),
                format!("size={size_mb}m,uid={uid},gid={gid},mode=0755"),
            ),
        ]);
        self.create_volume_with(name, Some(opts), labels).await
    }

    async fn create_volume_with(
        &self,
        name: &str,
        driver_opts: Option<HashMap<String, String>>,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            driver_opts,
            ..Default::default()
        };
        self.making(async move { docker.create_volume(req).await })
            .await?;
        Ok(())
    }

    /// Removes a volume; a missing one is fine. A volume still held by a
    /// container that is being removed right now is retried briefly.
    pub async fn remove_volume(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        for _ in 0..40 {
            match docker
                .remove_volume(name, Some(RemoveVolumeOptions { force: true }))
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) => match EngineError::from(e) {
                    EngineError::NotFound(_) => return Ok(()),
                    EngineError::Conflict(m) if m.contains("in use") => {
                        tokio::time::sleep(Duration::from_millis(250)).await
                    }
                    other => return Err(other),
                },
            }
        }
        Err(EngineError::Conflict(format!("volume {name} stays in use")))
    }

    /// Removes a volume at once, or says why not (in use: a conflict).
    pub async fn remove_volume_now(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        docker
            .remove_volume(name, Some(RemoveVolumeOptions { force: false }))
            .await?;
        Ok(())
    }

    /// Whether a volume exists.
    pub async fn volume_exists(&self, name: &str) -> EngineResult<bool> {
        let docker = self.docker()?;
        match docker.inspect_volume(name).await {
            Ok(_) => Ok(true),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(false),
                other => Err(other),
            },
        }
    }

    /// The host directory holding volume `name`'s files, when a process
    /// on this host may read them there as a container run by
    /// `oci_runtime` (or the engine's default) writes them: the volume is
    /// the `local` driver's, a plain directory (no `type`, `device` or `o`
    /// option: the driver mounts such a volume in the engine's mount
    /// namespace, which a process on the host need not see), and the
    /// runtime is `runc`, which shares the host's kernel and page cache.
    /// Under another runtime (gVisor keeps its own view of a file) the
    /// answer is `None`.
    pub async fn volume_host_dir(
        &self,
        name: &str,
        oci_runtime: Option<&str>,
    ) -> EngineResult<Option<String>> {
        let docker = self.docker()?;
        let runtime = match oci_runtime {
            Some(r) => r.to_string(),
            None => {
                let known = self
                    .inner
                    .default_runtime
                    .read()
                    .ok()
                    .and_then(|d| d.clone());
                match known {
                    Some(d) => d,
                    None => {
                        let d = docker.info().await?.default_runtime.unwrap_or_default();
                        if let Ok(mut known) = self.inner.default_runtime.write() {
                            *known = Some(d.clone());
                        }
                        d
                    }
                }
            }
        };
        if runtime != "runc" {
            return Ok(None);
        }
        let volume = docker.inspect_volume(name).await?;
        let mounted = ["type", "device", "o"]
            .iter()
            .any(|k| volume.options.contains_key(*k));
        let dir = volume.mountpoint;
        Ok((volume.driver == "local" && !mounted && dir.starts_with('/')).then_some(dir))
    }

    /// Every volume carrying all of `labels`.
    pub async fn list_volumes(&self, labels: &[(&str, &str)]) -> EngineResult<Vec<VolumeRecord>> {
        let docker = self.docker()?;
        let options = ListVolumesOptions {
            filters: Some(label_filter(labels)),
        };
        let list = docker.list_volumes(Some(options)).await?;
        Ok(list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeRecord {
                name: v.name,
                labels: v.labels,
            })
            .collect())
    }
}
