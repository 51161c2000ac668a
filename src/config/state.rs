//! What sandboxd keeps across restarts: where (`state_dir`, with a default
//! that follows systemd and the XDG base directories) and the session
//! tokens' lifetimes, and where checkpoints are kept.

use std::path::Path;

use super::{Config, ConfigError};

/// The longest any session token may live: a year.
pub(super) const MAX_TOKEN_TTL_MS: u64 = 365 * 86_400_000;

/// An explicit `state_dir` is an absolute path: a relative one would move
/// with the working directory, and the tokens with it.
pub(super) fn validate_state_dir(d: &str) -> Result<(), String> {
    if Path::new(d).is_absolute() {
        Ok(())
    } else {
        Err(format!("{d:?} must be an absolute path"))
    }
}

/// The default state directory: `$STATE_DIRECTORY` (systemd's
/// `StateDirectory=`, its first entry), else `/var/lib/sandboxd` for root,
/// else `$XDG_STATE_HOME/sandboxd`, else `$HOME/.local/state/sandboxd`.
/// Relative values are ignored, as the XDG specification says.
fn default_state_dir(env: &dyn Fn(&str) -> Option<String>, is_root: bool) -> Option<String> {
    let absolute = |name: &str| env(name).filter(|v| Path::new(v).is_absolute());
    if let Some(dirs) = env("STATE_DIRECTORY") {
        if let Some(first) = dirs.split(':').find(|d| Path::new(d).is_absolute()) {
            return Some(first.to_string());
        }
    }
    if is_root {
        return Some("/var/lib/sandboxd".into());
    }
    if let Some(xdg) = absolute("XDG_STATE_HOME") {
        return Some(format!("{}/sandboxd", xdg.trim_end_matches('/')));
    }
    absolute("HOME").map(|home| format!("{}/.local/state/sandboxd", home.trim_end_matches('/')))
}

impl Config {
    /// Fills in the default `state_dir` when none was given (there may be
    /// none: sandboxd then refuses to start when it opens the state, which
    /// says what to set).
    pub(super) fn resolve_state_dir(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        is_root: bool,
    ) {
        if self.state_dir.is_none() {
            self.state_dir = default_state_dir(env, is_root);
        }
    }

    /// The directory of the state kept across restarts; `None` when none
    /// was given and there is no default.
    pub fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_deref().map(Path::new)
    }

    /// Where sandbox `sandbox_id`'s checkpoints are kept: under the state
    /// directory, beside nothing a container mounts. `None` without one.
    pub fn checkpoint_dir(&self, sandbox_id: &str) -> Option<std::path::PathBuf> {
        self.state_dir()
            .map(|d| d.join("checkpoints").join(&self.instance).join(sandbox_id))
    }

    /// A token's default lifetime is one it may have.
    pub(super) fn validate_session_tokens(&self) -> Result<(), ConfigError> {
        if self.session_token_ttl > self.session_token_max_ttl {
            return Err(ConfigError::invalid(
                "session_token_ttl_ms",
                "must be at most session_token_max_ttl_ms",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::default_state_dir;
    use crate::config::Config;
    use crate::config::tests::{env_of, err_of};

    fn default_of(pairs: &[(&str, &str)], is_root: bool) -> Option<String> {
        default_state_dir(&env_of(pairs), is_root)
    }

    #[test]
    fn the_default_follows_systemd_then_root_then_xdg_then_home() {
        let all = [
            ("STATE_DIRECTORY", "/var/lib/sbx:/var/lib/other"),
            ("XDG_STATE_HOME", "/home/u/.st/"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(default_of(&all, false).as_deref(), Some("/var/lib/sbx"));
        assert_eq!(
            default_of(&all[1..], true).as_deref(),
            Some("/var/lib/sandboxd")
        );
        assert_eq!(
            default_of(&all[1..], false).as_deref(),
            Some("/home/u/.st/sandboxd")
        );
        assert_eq!(
            default_of(&[("XDG_STATE_HOME", "rel"), ("HOME", "/home/u")], false).as_deref(),
            Some("/home/u/.local/state/sandboxd"),
            "a relative XDG_STATE_HOME is ignored"
        );
        assert_eq!(default_of(&[], false), None);
    }

    #[test]
    fn an_explicit_dir_wins_and_must_be_absolute() {
        let cfg = Config::from_toml_and_env(
            "",
            env_of(&[("SANDBOXD_STATE_DIR", "/srv/sbx"), ("HOME", "/home/u")]),
        )
        .expect("valid");
        assert_eq!(cfg.state_dir(), Some(std::path::Path::new("/srv/sbx")));
        let e = err_of("state_dir = \"state\"", &[]);
        assert!(e.starts_with("state_dir:"), "{e}");
    }

    #[test]
    fn the_default_ttl_may_not_pass_the_max() {
        let e = err_of(
            "session_token_ttl_ms = 7200000\nsession_token_max_ttl_ms = 3600000",
            &[],
        );
        assert!(e.starts_with("session_token_ttl_ms:"), "{e}");
        let e = err_of("", &[("SANDBOXD_SESSION_TOKEN_MAX_TTL_MS", "999")]);
        assert!(
            e.starts_with("SANDBOXD_SESSION_TOKEN_MAX_TTL_MS (session_token_max_ttl_ms):"),
            "{e}"
        );
    }
}
