//! The workspace: where it is mounted (the canonical directory and its
//! aliases, RemcoChat's and E2B's spellings by default) and whether it is a
//! volume on disk or a tmpfs.

use super::{Config, ConfigError};

/// The spellings of the workspace: ours, the one RemcoChat hard-codes, and
/// E2B's home (its SDKs' examples write under `/home/user`). With no
/// configuration each aliases the others.
const WORKSPACE_SPELLINGS: [&str; 3] = ["/workspace", "/vercel/sandbox/workspace", "/home/user"];

impl Config {
    /// Trims the workspace directories, and fills in the aliases when the
    /// configuration named none: the spelling `workspace_dir` is not.
    pub(super) fn resolve_workspace_dirs(&mut self) {
        self.workspace_dir = trim_dir(&self.workspace_dir);
        let aliases = match self.workspace_aliases.take() {
            Some(list) => list.iter().map(|d| trim_dir(d)).collect(),
            None => WORKSPACE_SPELLINGS
                .iter()
                .filter(|d| **d != self.workspace_dir)
                .map(|d| d.to_string())
                .collect(),
        };
        self.workspace_aliases = Some(aliases);
    }

    /// Aliases are mount points of the workspace volume: none may hold or
    /// be held by another spelling (the volume would appear inside
    /// itself), nor shadow what every sandbox needs.
    pub(super) fn validate_workspace_aliases(&self) -> Result<(), ConfigError> {
        let all: Vec<&str> = self.workspace_dirs().collect();
        for (i, a) in all.iter().enumerate() {
            if ["/tmp", "/proc", "/sys", "/dev", "/etc", "/usr"]
                .iter()
                .any(|sys| nested(a, sys))
            {
                return Err(ConfigError::invalid(
                    "workspace_aliases",
                    format!("{a:?} would shadow a directory the sandbox needs"),
                ));
            }
            if let Some(b) = all[i + 1..].iter().find(|b| nested(a, b)) {
                return Err(ConfigError::invalid(
                    "workspace_aliases",
                    format!("{a:?} and {b:?} overlap; each spelling needs a place of its own"),
                ));
            }
        }
        Ok(())
    }

    /// A workspace is a tmpfs or a volume on disk with a quota, not both:
    /// the engine's local driver cannot put a quota on a tmpfs, and the
    /// tmpfs has its own size.
    pub(super) fn validate_workspace_volume(&self) -> Result<(), ConfigError> {
        if self.workspace_tmpfs_mb > 0 && self.workspace_size_mb > 0 {
            return Err(ConfigError::invalid(
                "workspace_tmpfs_mb",
                format!(
                    "a tmpfs workspace of {} MiB has its own size; set workspace_size_mb = 0 \
                     (it is {}) or workspace_tmpfs_mb = 0",
                    self.workspace_tmpfs_mb, self.workspace_size_mb
                ),
            ));
        }
        Ok(())
    }

    /// Every path the workspace volume is mounted at, canonical first.
    pub fn workspace_dirs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.workspace_dir.as_str())
            .chain(self.workspace_aliases.iter().flatten().map(String::as_str))
    }

    /// The sandbox user's uid and gid (the gid is the uid when not given),
    /// which own the workspace.
    pub fn sandbox_uid_gid(&self) -> (u32, u32) {
        let user = &self.sandbox_user;
        let (u, g) = user.split_once(':').unwrap_or((user, user));
        // Validated numeric at load.
        (u.parse().unwrap_or(1000), g.parse().unwrap_or(1000))
    }
}

/// Whether one of two absolute paths lies in (or is) the other.
fn nested(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
    under(a, b) || under(b, a)
}

fn trim_dir(v: &str) -> String {
    if v.len() > 1 {
        v.trim_end_matches('/').to_string()
    } else {
        v.to_string()
    }
}

pub(super) fn validate_dir(v: &String) -> Result<(), String> {
    let trimmed = trim_dir(v);
    if !trimmed.starts_with('/') {
        return Err(format!("{v:?} must be an absolute path"));
    }
    if trimmed == "/" {
        return Err("must not be the root directory".into());
    }
    if trimmed
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "{v:?} must be a normalised path (no '.', '..' or '//')"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::config::tests::{env_of, err_of};

    #[test]
    fn by_default_remcochats_and_e2bs_spellings_alias_the_workspace() {
        let cfg = Config::from_toml_and_env("", env_of(&[])).expect("valid");
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/workspace", "/vercel/sandbox/workspace", "/home/user"]
        );
        let cfg = Config::from_toml_and_env("workspace_dir = \"/home/user\"", env_of(&[]))
            .expect("valid");
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/home/user", "/workspace", "/vercel/sandbox/workspace"]
        );
    }

    #[test]
    fn aliases_can_be_set_or_turned_off() {
        let cfg = Config::from_toml_and_env("workspace_aliases = []", env_of(&[])).expect("valid");
        assert_eq!(cfg.workspace_dirs().collect::<Vec<_>>(), ["/workspace"]);
        let cfg = Config::from_toml_and_env(
            "",
            env_of(&[("SANDBOXD_WORKSPACE_ALIASES", "/home/user/ws, /code/")]),
        )
        .expect("valid");
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/workspace", "/home/user/ws", "/code"]
        );
    }

    #[test]
    fn a_tmpfs_workspace_has_its_own_size_and_no_quota() {
        let cfg = Config::from_toml_and_env("workspace_tmpfs_mb = 32", env_of(&[]))
            .expect("a tmpfs workspace alone is valid");
        assert_eq!((cfg.workspace_tmpfs_mb, cfg.workspace_size_mb), (32, 0));
        let both = err_of(
            "workspace_tmpfs_mb = 32",
            &[("SANDBOXD_WORKSPACE_SIZE_MB", "64")],
        );
        assert!(
            both.starts_with("workspace_tmpfs_mb:") && both.contains("workspace_size_mb = 0"),
            "{both}"
        );
        assert!(
            err_of("", &[("SANDBOXD_WORKSPACE_TMPFS_MB", "70000")])
                .starts_with("SANDBOXD_WORKSPACE_TMPFS_MB (workspace_tmpfs_mb):")
        );
    }
}
