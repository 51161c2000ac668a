//! The runtime images of sandboxes: made sure of before a container is
//! made of one (built from the embedded Dockerfile when it is the runtime
//! image, missing, and building is allowed), with the agent volume ready
//! and whether the image gives the sandbox user its workspace directory.

use std::collections::HashMap;

use super::{SandboxError, SandboxResult, Sandboxes, labels};
use crate::engine::EngineError;

/// The runtime Dockerfile, built into the binary so a fresh install can build
/// its image on first use.
const RUNTIME_DOCKERFILE: &str = include_str!("../../sandbox-images/default/Dockerfile");

impl Sandboxes {
    /// Makes sure `image` exists (built if it is the runtime image and
    /// missing), the agent volume is ready, and says whether new
    /// workspaces of this image need their root given to the sandbox user
    /// (the image has no workspace directory of that user). Asked of the
    /// engine once per image.
    pub(super) async fn prepare_image(&self, image: &str) -> SandboxResult<bool> {
        if let Some(owned) = self.workspace_owned.get(image).map(|v| *v) {
            return Ok(!owned);
        }
        let labels = labels::instance_only(&self.config.instance);
        let owner = match self
            .engine
            .image_dir_owner(image, &self.config.workspace_dir, labels.clone())
            .await
        {
            Err(EngineError::NotFound(msg)) => {
                tracing::info!(reason = %msg, "a sandbox needs a missing image");
                self.ensure_image(image).await?;
                self.engine
                    .image_dir_owner(image, &self.config.workspace_dir, labels)
                    .await?
            }
            other => other?,
        };
        self.ensure_agent_volume(image).await?;
        let owned = owner == Some(self.config.sandbox_uid_gid());
        self.workspace_owned.insert(image.to_string(), owned);
        Ok(!owned)
    }

    /// Builds the runtime image from the embedded Dockerfile if it is
    /// missing and allowed; one build at a time.
    async fn ensure_image(&self, image: &str) -> SandboxResult<()> {
        let _one_build = self.image_build.lock().await;
        if self.engine.image_exists(image).await? {
            return Ok(());
        }
        let command = format!("SANDBOXD_IMAGE={image} sandbox-images/build.sh");
        if self.config.disable_autobuild || image != self.config.image {
            return Err(SandboxError::ImageMissing {
                image: image.to_string(),
                command,
            });
        }
        tracing::info!(image, base = %self.config.base_image, "runtime image missing; building it from the embedded Dockerfile");
        let args = HashMap::from([("BASE_IMAGE".to_string(), self.config.base_image.clone())]);
        self.engine
            .build_image(image, RUNTIME_DOCKERFILE, args)
            .await
            .map_err(|e| {
                tracing::error!(image, error = %e, "building the runtime image failed");
                SandboxError::ImageMissing {
                    image: image.to_string(),
                    command: format!("{command} (building it here failed: {e})"),
                }
            })?;
        tracing::info!(image, "runtime image built");
        Ok(())
    }
}
