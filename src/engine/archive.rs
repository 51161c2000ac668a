//! Files into and out of containers through the engine's archive API:
//! making a workspace volume's root belong to the sandbox user, filling
//! the volume that carries the agent, reading a file of a volume or the
//! owner of a directory of an image. Only sandboxd's own data goes this
//! way, through scratch containers made for it and never started; what
//! the sandbox reads and writes goes through the agent, as the sandbox
//! user.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;

use super::{Engine, EngineError, EngineResult, container_spec};

/// One entry of an archive to upload.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// A directory (created, or changed if it exists) with this owner.
    Dir { path: &'a str, uid: u32, gid: u32 },
    /// A file with this mode, owned by root.
    File {
        path: &'a str,
        content: &'a [u8],
        mode: u32,
    },
}

/// A tar of `entries`, paths relative to where it is unpacked.
pub(super) fn tar_of(entries: &[Entry<'_>]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let mut header = tar::Header::new_gnu();
        match *e {
            Entry::Dir { path, uid, gid } => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                header.set_mode(0o755);
                header.set_uid(u64::from(uid));
                header.set_gid(u64::from(gid));
                header.set_cksum();
                builder.append_data(
                    &mut header,
                    format!("{}/", path.trim_matches('/')),
                    &[][..],
                )?;
            }
            Entry::File {
                path,
                content,
                mode,
            } => {
                header.set_size(content.len() as u64);
                header.set_mode(mode);
                header.set_uid(0);
                header.set_gid(0);
                header.set_cksum();
                builder.append_data(&mut header, path.trim_start_matches('/'), content)?;
            }
        }
    }
    builder.into_inner()
}

/// Unpacks `entries` at `/` of `container` (created, not necessarily
/// started); volumes mounted in it are written through.
pub(super) async fn upload(
    docker: &Docker,
    container: &str,
    entries: &[Entry<'_>],
) -> EngineResult<()> {
    let tar =
        tar_of(entries).map_err(|e| EngineError::Failed(format!("cannot pack an archive: {e}")))?;
    docker
        .upload_to_container(
            container,
            Some(UploadToContainerOptions {
                path: "/".into(),
                ..Default::default()
            }),
            bollard::body_full(tar.into()),
        )
        .await?;
    Ok(())
}

/// The content of the file at `path` in `container`, at most `max` bytes
/// of archive; `None` when there is no such file.
pub(super) async fn download(
    docker: &Docker,
    container: &str,
    path: &str,
    max: usize,
) -> EngineResult<Option<Vec<u8>>> {
    let mut stream = docker.download_from_container(
        container,
        Some(DownloadFromContainerOptions {
            path: path.to_string(),
        }),
    );
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                if tar.len() + bytes.len() > max {
                    return Err(EngineError::Failed(format!(
                        "{path} in {container} is larger than {max} bytes"
                    )));
                }
                tar.extend_from_slice(&bytes);
            }
            Err(e) => {
                return match EngineError::from(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                };
            }
        }
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let entries = archive
        .entries()
        .map_err(|e| EngineError::Failed(format!("an unreadable archive: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| EngineError::Failed(format!("an unreadable archive: {e}")))?;
        if entry.header().entry_type().is_file() {
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content)
                .map_err(|e| EngineError::Failed(format!("an unreadable archive: {e}")))?;
            return Ok(Some(content));
        }
    }
    Ok(None)
}

/// The owner of directory `path` in `container`, from the header of the
/// archive's first entry; `None` when there is no such directory. Only the
/// first bytes of the archive are read.
pub(super) async fn dir_owner(
    docker: &Docker,
    container: &str,
    path: &str,
) -> EngineResult<Option<(u32, u32)>> {
    let mut stream = docker.download_from_container(
        container,
        Some(DownloadFromContainerOptions {
            path: path.to_string(),
        }),
    );
    let mut head = Vec::new();
    while head.len() < 512 {
        match stream.next().await {
            Some(Ok(bytes)) => head.extend_from_slice(&bytes),
            Some(Err(e)) => {
                return match EngineError::from(e) {
                    EngineError::NotFound(_) => Ok(None),
                    other => Err(other),
                };
            }
            None => break,
        }
    }
    let Some(block) = head.get(..512) else {
        return Ok(None);
    };
    let mut header = tar::Header::new_old();
    header.as_mut_bytes().copy_from_slice(block);
    if !header.entry_type().is_dir() {
        return Ok(None);
    }
    let uid = header.uid().ok().and_then(|u| u32::try_from(u).ok());
    let gid = header.gid().ok().and_then(|g| u32::try_from(g).ok());
    Ok(uid.zip(gid))
}

/// Where a volume is mounted in a container made only to read or fill it.
const VOLUME_USER_DIR: &str = "/volume";

impl Engine {
    /// Puts `entries` into `volume` (paths relative to the volume), through
    /// a container of `image` that is created for it and never started.
    pub async fn fill_volume(
        &self,
        volume: &str,
        image: &str,
        labels: HashMap<String, String>,
        entries: &[Entry<'_>],
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let name = format!("{volume}-fill-{}", scratch_suffix()?);
        self.create_scratch(&docker, &name, Some(volume), image, labels)
            .await?;
        let moved: Vec<(String, Entry<'_>)> = entries
            .iter()
            .map(|e| match *e {
                Entry::Dir { path, .. } | Entry::File { path, .. } => (
                    format!("{VOLUME_USER_DIR}/{}", path.trim_start_matches('/')),
                    *e,
                ),
            })
            .collect();
        let entries: Vec<Entry<'_>> = moved
            .iter()
            .map(|(path, e)| match *e {
                Entry::Dir { uid, gid, .. } => Entry::Dir { path, uid, gid },
                Entry::File { content, mode, .. } => Entry::File {
                    path,
                    content,
                    mode,
                },
            })
            .collect();
        let uploaded = upload(&docker, &name, &entries).await;
        let removed = self.remove_container(&name).await;
        uploaded.and(removed)
    }

    /// The content of `path` in `volume` (at most `max` bytes), read
    /// through a container of `image` created for it and never started.
    pub async fn volume_file(
        &self,
        volume: &str,
        image: &str,
        labels: HashMap<String, String>,
        path: &str,
        max: usize,
    ) -> EngineResult<Option<Vec<u8>>> {
        let docker = self.docker()?;
        let name = format!("{volume}-read-{}", scratch_suffix()?);
        self.create_scratch(&docker, &name, Some(volume), image, labels)
            .await?;
        let full = format!("{VOLUME_USER_DIR}/{}", path.trim_start_matches('/'));
        let read = download(&docker, &name, &full, max).await;
        let removed = self.remove_container(&name).await;
        let content = read?;
        removed?;
        Ok(content)
    }

    /// The owner (uid, gid) of directory `path` in `image`; `None` when
    /// the image has no such directory. Read through a container created
    /// for it and never started.
    pub async fn image_dir_owner(
        &self,
        image: &str,
        path: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<Option<(u32, u32)>> {
        let docker = self.docker()?;
        let name = format!(
            "{}-probe-{}",
            labels
                .get("sandboxd.instance")
                .map(String::as_str)
                .unwrap_or("sandboxd"),
            scratch_suffix()?
        );
        self.create_scratch(&docker, &name, None, image, labels)
            .await?;
        let owner = dir_owner(&docker, &name, path).await;
        let removed = self.remove_container(&name).await;
        let owner = owner?;
        removed?;
        Ok(owner)
    }

    /// A container only for the archive API, holding `volume` (if any) at
    /// [`VOLUME_USER_DIR`]; never started.
    async fn create_scratch(
        &self,
        docker: &Docker,
        name: &str,
        volume: Option<&str>,
        image: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let body =
            container_spec::scratch_body(volume.map(|v| (v, VOLUME_USER_DIR)), image, labels);
        docker
            .create_container(
                Some(bollard::query_parameters::CreateContainerOptions {
                    name: Some(name.to_string()),
                    platform: String::new(),
                }),
                body,
            )
            .await?;
        Ok(())
    }
}

/// A random suffix that keeps a scratch container's name unique.
fn scratch_suffix() -> EngineResult<String> {
    crate::id::random_hex(4).map_err(|e| EngineError::Failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_hold_owned_dirs_and_files_with_modes() {
        let tar = tar_of(&[
            Entry::Dir {
                path: "/workspace",
                uid: 1000,
                gid: 1001,
            },
            Entry::File {
                path: "/fill/agent",
                content: b"\x7fELF",
                mode: 0o755,
            },
        ])
        .expect("tar");
        let mut archive = tar::Archive::new(&tar[..]);
        let entries: Vec<_> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let h = e.header();
                (
                    e.path().expect("path").display().to_string(),
                    h.uid().expect("uid"),
                    h.gid().expect("gid"),
                    h.mode().expect("mode"),
                    h.size().expect("size"),
                )
            })
            .collect();
        assert_eq!(
            entries,
            [
                ("workspace/".to_string(), 1000, 1001, 0o755, 0),
                ("fill/agent".to_string(), 0, 0, 0o755, 4)
            ]
        );
    }
}
