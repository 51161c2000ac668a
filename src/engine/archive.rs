//! Files into and out of containers through the engine's archive API:
//! making a workspace volume's root belong to the sandbox user, and
//! filling the volume that carries the agent. Only sandboxd's own data
//! goes this way, into containers that are not running; what the sandbox
//! reads and writes goes through the agent, as the sandbox user.

use bollard::Docker;
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;

use super::{EngineError, EngineResult};

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
