//! Pausing and resuming a sandbox: the engine's pause (the cgroup freezer)
//! freezes every process in it, which keeps its memory and gets no CPU,
//! and unpause thaws them where they were. A paused sandbox is never
//! idle-expired or evicted (it counts as busy), and every command, file,
//! terminal and port call on it is refused as paused (409
//! `sandbox_paused`) rather than resuming it: a resume is asked for. The
//! engine keeps the paused state, so a restart of sandboxd finds it
//! (rehydration reads it from the container list).

use std::sync::Arc;

use super::registry::Sandbox;
use super::{Event, SandboxError, SandboxResult, Sandboxes};
use crate::engine::EngineError;

impl Sandboxes {
    /// Freezes every process of the sandbox. A paused one is
    /// [`SandboxError::Paused`]. Calls to its agent under way when it
    /// freezes fail (they get no answer).
    pub async fn pause(&self, id: &str) -> SandboxResult<()> {
        let s = self.lookup(id).await?;
        let paused = {
            let _key = self.registry.lock_key(&s.session_key).await;
            self.pause_locked(&s).await
        };
        if matches!(paused, Err(SandboxError::NotFound(_))) {
            self.forget_gone(&s).await;
        }
        paused
    }

    /// [`pause`](Sandboxes::pause) with the key lock held; a container
    /// found gone is [`SandboxError::NotFound`], left for the caller to
    /// forget once the lock is released.
    pub(super) async fn pause_locked(&self, s: &Arc<Sandbox>) -> SandboxResult<()> {
        if self.registry.get(&s.id).is_none() {
            return Err(SandboxError::NotFound(s.id.clone()));
        }
        if s.is_paused() {
            return Err(SandboxError::Paused(s.id.clone()));
        }
        // Marked first: no new call reaches the agent while it freezes
        // (one would wait for an answer that cannot come).
        s.set_paused(true);
        match self.engine.pause_container(&s.container).await {
            Ok(()) => {
                Event::Paused.record(&s.id, &s.session_key);
                Ok(())
            }
            Err(e) => {
                s.set_paused(false);
                match e {
                    EngineError::NotFound(_) => Err(SandboxError::NotFound(s.id.clone())),
                    e => Err(e.into()),
                }
            }
        }
    }

    /// Thaws a paused sandbox; its idle clock starts again from now, and
    /// its lifetime's for the lifetime's whole length. One that is not
    /// paused is [`SandboxError::NotPaused`].
    pub async fn resume(&self, id: &str) -> SandboxResult<()> {
        let s = self.lookup_any(id).await?;
        {
            let _key = self.registry.lock_key(&s.session_key).await;
            if !s.is_paused() {
                return Err(SandboxError::NotPaused(s.id.clone()));
            }
            match self.engine.unpause_container(&s.container).await {
                Ok(()) => {
                    s.set_paused(false);
                    self.registry.touch(&s);
                    self.restart_lifetime(&s).await;
                    Event::Resumed.record(&s.id, &s.session_key);
                    return Ok(());
                }
                Err(EngineError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.forget_gone(&s).await;
        Err(SandboxError::NotFound(s.id.clone()))
    }

    /// Before a paused sandbox's container is removed: thawed, so that its
    /// processes take the engine's kill (an engine may refuse to kill a
    /// paused container). A failure is left to the removal to report.
    pub(super) async fn thaw_for_removal(&self, s: &Arc<Sandbox>) {
        if !s.is_paused() {
            return;
        }
        if let Err(e) = self.engine.unpause_container(&s.container).await {
            tracing::debug!(sandbox_id = %s.id, error = %e, "unpause before removal");
        }
        s.set_paused(false);
    }
}
