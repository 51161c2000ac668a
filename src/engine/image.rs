//! Images: whether the engine has one, its id, and building one from a
//! Dockerfile held in memory, so a fresh install can make its runtime
//! image on first use without a checkout of this repo.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::BuildImageOptions;
use futures_util::StreamExt;

use super::{Engine, EngineError, EngineResult};

impl Engine {
    /// The id of a local image (`sha256:…`), `None` when the engine does not
    /// have it.
    pub async fn image_id(&self, image: &str) -> EngineResult<Option<String>> {
        let docker = self.docker()?;
        match docker.inspect_image(image).await {
            Ok(info) => Ok(info.id),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    /// True when the engine has the image locally.
    pub async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        let docker = self.docker()?;
        match docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(false),
                other => Err(other),
            },
        }
    }

    /// Builds `tag` from a Dockerfile held in memory (a context of one file).
    pub async fn build_image(
        &self,
        tag: &str,
        dockerfile: &str,
        build_args: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        build(&docker, tag, dockerfile, build_args).await
    }
}

/// Builds `tag` from `dockerfile` as the whole build context, logging each
/// build step as it goes.
pub(super) async fn build(
    docker: &Docker,
    tag: &str,
    dockerfile: &str,
    build_args: HashMap<String, String>,
) -> EngineResult<()> {
    let context = single_file_tar("Dockerfile", dockerfile.as_bytes())
        .map_err(|e| EngineError::Failed(format!("cannot pack the build context: {e}")))?;
    let options = BuildImageOptions {
        dockerfile: "Dockerfile".into(),
        t: Some(tag.to_string()),
        rm: true,
        forcerm: true,
        buildargs: Some(build_args),
        ..Default::default()
    };
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    while let Some(item) = stream.next().await {
        let info = item.map_err(EngineError::from)?;
        if let Some(detail) = info.error_detail {
            let msg = detail
                .message
                .unwrap_or_else(|| "unknown build error".into());
            return Err(EngineError::Failed(format!("building {tag} failed: {msg}")));
        }
        if let Some(line) = info.stream {
            let line = line.trim();
            if line.starts_with("Step ") {
                tracing::info!(image = tag, "{line}");
            }
        }
    }
    Ok(())
}

fn single_file_tar(name: &str, content: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, name, content)?;
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_holds_the_dockerfile() {
        let tar_bytes = single_file_tar("Dockerfile", b"FROM scratch\n").expect("tar");
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut entries = archive.entries().expect("entries");
        let mut entry = entries.next().expect("one entry").expect("readable");
        assert_eq!(entry.path().expect("path").to_str(), Some("Dockerfile"));
        let mut s = String::new();
        std::io::Read::read_to_string(&mut entry, &mut s).expect("read");
        assert_eq!(s, "FROM scratch\n");
        assert!(entries.next().is_none());
    }
}
