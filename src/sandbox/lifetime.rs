//! Lifetimes: a sandbox given one (E2B's `timeout`) ends at its end time
//! whatever it is doing, running commands or not, instead of when it has
//! been idle for its TTL. At the end it is stopped, or paused when its
//! lifetime says so (E2B's `autoPause`). A paused sandbox's clock does not
//! run: a resume starts it again for the lifetime's whole length.
//! Lifetimes are set after a sandbox exists, so they are kept beside the
//! labels, in `sandbox-lifetimes.json` in the state directory (replaced
//! whole and durably, see `durable_file`), and applied again when
//! rehydration has adopted the sandboxes. A file that cannot be read is
//! logged and left out: its sandboxes fall back to their idle TTL, so they
//! live longer, never shorter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Event, Sandbox, SandboxError, SandboxResult, Sandboxes};
use crate::clock::now_ms;
use crate::durable_file;

/// The file's name in the state directory.
const FILE_NAME: &str = "sandbox-lifetimes.json";
/// The format's version; another one is refused, not guessed at.
const VERSION: u32 = 1;

/// What happens to a sandbox at its end time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AtEnd {
    Stop,
    Pause,
}

/// A sandbox's end time and what happens then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lifetime {
    /// Unix epoch milliseconds.
    pub ends_at: u64,
    /// The length it was last given: a resume runs it again from now.
    pub length_ms: u64,
    pub at_end: AtEnd,
}

impl Lifetime {
    /// One of `length_ms` from now.
    pub fn from_now(length_ms: u64, at_end: AtEnd) -> Lifetime {
        Lifetime {
            ends_at: now_ms().saturating_add(length_ms),
            length_ms,
            at_end,
        }
    }
}

/// A change of a sandbox's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifetimeChange {
    /// Ends `length_ms` from now, sooner or later than before; `at_end`
    /// `None` keeps what it had (stop, for one that had no lifetime).
    Set {
        length_ms: u64,
        at_end: Option<AtEnd>,
    },
    /// Ends `length_ms` from now, if it has a lifetime (E2B's connect of
    /// a paused sandbox).
    Renew { length_ms: u64 },
    /// Ends `length_ms` from now if that is later than its end time, if it
    /// has a lifetime (E2B's connect of a running sandbox).
    Lengthen { length_ms: u64 },
}

impl LifetimeChange {
    /// The lifetime after this change of `now`.
    fn apply(self, now: Option<Lifetime>) -> Option<Lifetime> {
        match self {
            LifetimeChange::Set { length_ms, at_end } => Some(Lifetime::from_now(
                length_ms,
                at_end.unwrap_or(now.map_or(AtEnd::Stop, |l| l.at_end)),
            )),
            LifetimeChange::Renew { length_ms } => {
                now.map(|l| Lifetime::from_now(length_ms, l.at_end))
            }
            LifetimeChange::Lengthen { length_ms } => now.map(|l| {
                let longer = Lifetime::from_now(length_ms, l.at_end);
                if longer.ends_at > l.ends_at {
                    longer
                } else {
                    l
                }
            }),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    version: u32,
    /// By sandbox id.
    sandboxes: BTreeMap<String, Lifetime>,
}

/// The lifetimes' file; `None` without a state directory (sandboxd does not
/// start without one, see `session_tokens`).
#[derive(Debug)]
pub(super) struct LifetimeFile {
    dir: Option<PathBuf>,
    /// One write at a time, each of the registry as it is when it starts,
    /// so the last one written is the newest.
    writer: tokio::sync::Mutex<()>,
}

impl LifetimeFile {
    pub(super) fn in_dir(dir: Option<&Path>) -> LifetimeFile {
        LifetimeFile {
            dir: dir.map(Path::to_path_buf),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    fn read(&self) -> Result<BTreeMap<String, Lifetime>, String> {
        let Some(dir) = &self.dir else {
            return Ok(BTreeMap::new());
        };
        let path = dir.join(FILE_NAME);
        let Some(text) = durable_file::read(&path)? else {
            return Ok(BTreeMap::new());
        };
        parse(&text).map_err(|why| format!("{} is unreadable: {why}", path.display()))
    }
}

fn parse(text: &str) -> Result<BTreeMap<String, Lifetime>, String> {
    let contents: Contents = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if contents.version != VERSION {
        return Err(format!(
            "version {} where {VERSION} is known",
            contents.version
        ));
    }
    Ok(contents.sandboxes)
}

fn render(sandboxes: BTreeMap<String, Lifetime>) -> Vec<u8> {
    let contents = Contents {
        version: VERSION,
        sandboxes,
    };
    // Serialising plain strings and numbers cannot fail.
    let mut bytes = serde_json::to_vec_pretty(&contents).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

impl Sandboxes {
    /// Changes the sandbox's lifetime; saved before it returns, and left
    /// as it was when it cannot be saved.
    pub async fn change_lifetime(&self, id: &str, change: LifetimeChange) -> SandboxResult<()> {
        let s = self.lookup_any(id).await?;
        let _key = self.registry.lock_key(&s.session_key).await;
        if self.registry.get(&s.id).is_none() {
            return Err(SandboxError::NotFound(s.id.clone()));
        }
        let before = s.lifetime();
        let after = change.apply(before);
        if after == before {
            return Ok(());
        }
        s.set_lifetime(after);
        if let Err(why) = self.save_lifetimes().await {
            s.set_lifetime(before);
            return Err(SandboxError::StateWrite(why));
        }
        Ok(())
    }

    /// A resume runs a lifetime's clock again, for its whole length.
    pub(super) async fn restart_lifetime(&self, s: &Sandbox) {
        let Some(l) = s.lifetime() else { return };
        s.set_lifetime(Some(Lifetime::from_now(l.length_ms, l.at_end)));
        if let Err(why) = self.save_lifetimes().await {
            tracing::warn!(sandbox_id = %s.id, error = %why, "the resumed sandbox's new end time was not saved; after a restart of sandboxd it ends at the old one");
        }
    }

    /// Writes every registered sandbox's lifetime.
    async fn save_lifetimes(&self) -> Result<(), String> {
        let Some(dir) = self.lifetimes.dir.clone() else {
            return Err("no state directory is configured (state_dir)".into());
        };
        let _one = self.lifetimes.writer.lock().await;
        let all: BTreeMap<String, Lifetime> = self
            .registry
            .list()
            .into_iter()
            .filter_map(|s| Some((s.id.clone(), s.lifetime()?)))
            .collect();
        let bytes = render(all);
        tokio::task::spawn_blocking(move || durable_file::replace(&dir, FILE_NAME, &bytes))
            .await
            .map_err(|e| format!("the write of {FILE_NAME} failed: {e}"))?
    }

    /// After rehydration: the saved lifetimes of the adopted sandboxes,
    /// and the file rewritten without those of sandboxes that are gone.
    pub(super) async fn restore_lifetimes(&self) {
        let saved = match self.lifetimes.read() {
            Ok(saved) => saved,
            Err(why) => {
                tracing::error!(error = %why, "sandbox lifetimes not restored: those sandboxes end by their idle TTL");
                return;
            }
        };
        let mut restored = 0;
        for (id, lifetime) in saved {
            if let Some(s) = self.registry.get(&id) {
                s.set_lifetime(Some(lifetime));
                restored += 1;
            }
        }
        if let Err(why) = self.save_lifetimes().await {
            tracing::warn!(error = %why, "the sandbox lifetimes file was not rewritten");
        }
        tracing::info!(restored, "sandbox lifetimes restored");
    }

    /// The reaper's part for a sandbox whose end time came (checked again
    /// under its key lock): stopped, busy or not, or paused.
    pub(super) async fn end_lifetime(&self, s: &Arc<Sandbox>) {
        let key = self.registry.lock_key(&s.session_key).await;
        let Some(l) = s.lifetime() else { return };
        if s.is_paused() || now_ms() < l.ends_at || self.registry.get(&s.id).is_none() {
            return;
        }
        match l.at_end {
            AtEnd::Stop => {
                self.registry.remove(&s.id);
                self.thaw_for_removal(s).await;
                self.remove_objects(&s.id, Event::Expired, Some(s)).await;
            }
            AtEnd::Pause => {
                if let Err(e) = self.pause_locked(s).await {
                    drop(key);
                    tracing::warn!(sandbox_id = %s.id, error = %e, "pausing a sandbox at its end time failed");
                    if matches!(e, SandboxError::NotFound(_)) {
                        self.forget_gone(s).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_moves_either_way_and_renew_and_lengthen_touch_only_a_lifetime() {
        let l = Lifetime::from_now(60_000, AtEnd::Pause);
        let set = LifetimeChange::Set {
            length_ms: 1_000,
            at_end: None,
        };
        let shorter = set.apply(Some(l)).expect("set");
        assert!(shorter.ends_at < l.ends_at);
        assert_eq!((shorter.length_ms, shorter.at_end), (1_000, AtEnd::Pause));
        assert_eq!(set.apply(None).map(|l| l.at_end), Some(AtEnd::Stop));
        let lengthen = |ms| LifetimeChange::Lengthen { length_ms: ms };
        assert_eq!(lengthen(1_000).apply(Some(l)), Some(l), "not shortened");
        let longer = lengthen(120_000).apply(Some(l)).expect("lengthened");
        assert!(longer.ends_at > l.ends_at && longer.length_ms == 120_000);
        assert_eq!(lengthen(120_000).apply(None), None);
        let renew = LifetimeChange::Renew { length_ms: 1_000 };
        assert_eq!(renew.apply(Some(l)).map(|r| r.length_ms), Some(1_000));
        assert_eq!(renew.apply(None), None);
    }

    #[test]
    fn the_file_round_trips_and_another_version_is_refused() {
        let l = Lifetime {
            ends_at: 5,
            length_ms: 3,
            at_end: AtEnd::Pause,
        };
        let text =
            String::from_utf8(render(BTreeMap::from([("ab".to_string(), l)]))).expect("UTF-8");
        assert!(text.contains("\"atEnd\": \"pause\""), "{text}");
        assert_eq!(parse(&text), Ok(BTreeMap::from([("ab".to_string(), l)])));
        let other = text.replace("\"version\": 1", "\"version\": 2");
        assert!(parse(&other).is_err_and(|e| e.contains("version 2")));
        assert!(parse("{").is_err());
    }
}
