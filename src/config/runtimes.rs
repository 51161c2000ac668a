//! Runtimes: the built-in names, the `[runtimes.NAME]` tables on top, and
//! what a name maps to (image, OCI runtime, warm pool size).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Config, ConfigError};

/// Runtime names that exist without any configuration; RemcoChat sends the
/// last two.
pub const BUILTIN_RUNTIMES: [&str; 3] = ["default", "node24", "python3.13"];

/// Where one runtime's sandboxes come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Image to start; `None` means the top-level `image`.
    #[serde(default)]
    pub image: Option<String>,
    /// OCI runtime registered with the engine, e.g. `runsc` for gVisor.
    #[serde(default)]
    pub oci_runtime: Option<String>,
    /// Warm sandboxes kept for this runtime; `None`: the top-level
    /// `pool_size` for `default`, 0 for the others.
    #[serde(default)]
    pub pool_size: Option<usize>,
}

/// Most warm sandboxes one runtime's pool may keep.
pub(super) const MAX_POOL_SIZE: usize = 64;

/// The built-in runtimes, with the file's tables on top.
pub(super) fn with_builtins(
    from_file: BTreeMap<String, RuntimeConfig>,
) -> BTreeMap<String, RuntimeConfig> {
    let mut runtimes: BTreeMap<String, RuntimeConfig> = BUILTIN_RUNTIMES
        .iter()
        .map(|name| {
            (
                name.to_string(),
                RuntimeConfig {
                    image: None,
                    oci_runtime: None,
                    pool_size: None,
                },
            )
        })
        .collect();
    runtimes.extend(from_file);
    runtimes
}

impl Config {
    /// How many warm sandboxes the pool keeps for a runtime: its table's
    /// `pool_size`, else the top-level `pool_size` for `default` and none
    /// for the others.
    pub fn pool_size(&self, runtime: &str) -> usize {
        match self.runtimes.get(runtime) {
            Some(RuntimeConfig {
                pool_size: Some(n), ..
            }) => *n,
            Some(_) if runtime == "default" => self.pool_size,
            _ => 0,
        }
    }

    /// The image and OCI runtime a runtime name maps to, if it is known.
    pub fn runtime(&self, name: &str) -> Option<(String, Option<String>)> {
        self.runtimes.get(name).map(|rt| {
            (
                rt.image.clone().unwrap_or_else(|| self.image.clone()),
                rt.oci_runtime.clone().or_else(|| self.oci_runtime.clone()),
            )
        })
    }

    /// Each runtime's name and table.
    pub(super) fn validate_runtimes(&self) -> Result<(), ConfigError> {
        for (name, rt) in &self.runtimes {
            if name.is_empty() || name.len() > 64 {
                return Err(ConfigError::invalid(
                    "runtimes",
                    format!("runtime name {name:?} must be 1-64 characters"),
                ));
            }
            if rt.image.as_deref() == Some("") || rt.oci_runtime.as_deref() == Some("") {
                return Err(ConfigError::invalid(
                    &format!("runtimes.{name}"),
                    "image and oci_runtime must not be empty strings",
                ));
            }
            if rt.pool_size.is_some_and(|n| n > MAX_POOL_SIZE) {
                return Err(ConfigError::invalid(
                    &format!("runtimes.{name}.pool_size"),
                    format!("must be between 0 and {MAX_POOL_SIZE}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::config::tests::{env_of, err_of};

    #[test]
    fn runtimes_from_file_add_to_builtins() {
        let cfg = Config::from_toml_and_env(
            "[runtimes.gvisor]\noci_runtime = \"runsc\"\n[runtimes.node24]\nimage = \"node:24\"\n",
            env_of(&[]),
        )
        .expect("valid");
        assert_eq!(
            cfg.runtime("gvisor"),
            Some(("sandboxd-runtime:latest".into(), Some("runsc".into())))
        );
        assert_eq!(cfg.runtime("node24"), Some(("node:24".into(), None)));
        assert!(cfg.runtime("default").is_some());
        assert!(cfg.runtime("ruby").is_none());
    }

    #[test]
    fn pool_sizes_come_from_the_runtime_table_then_the_top_level_key_for_default() {
        let cfg = Config::from_toml_and_env(
            "[runtimes.gvisor]\noci_runtime = \"runsc\"\npool_size = 1\n",
            env_of(&[]),
        )
        .expect("valid");
        assert_eq!(cfg.pool_size("default"), 2);
        assert_eq!(cfg.pool_size("gvisor"), 1);
        assert_eq!(cfg.pool_size("node24"), 0);
        assert_eq!(cfg.pool_size("ruby"), 0);
        let cfg = Config::from_toml_and_env(
            "[runtimes.default]\npool_size = 5\n",
            env_of(&[("SANDBOXD_POOL_SIZE", "3")]),
        )
        .expect("valid");
        assert_eq!(cfg.pool_size("default"), 5, "the table wins");
        let cfg =
            Config::from_toml_and_env("", env_of(&[("SANDBOXD_POOL_SIZE", "0")])).expect("valid");
        assert_eq!(cfg.pool_size("default"), 0);
        let e = err_of("[runtimes.x]\npool_size = 65", &[]);
        assert!(e.to_string().starts_with("runtimes.x.pool_size:"), "{e}");
    }

    #[test]
    fn a_default_oci_runtime_covers_runtimes_that_name_none() {
        let cfg = Config::from_toml_and_env(
            "[runtimes.fast]\noci_runtime = \"runc\"\n",
            env_of(&[("SANDBOXD_OCI_RUNTIME", "runsc")]),
        )
        .expect("valid");
        assert_eq!(
            cfg.runtime("default"),
            Some(("sandboxd-runtime:latest".into(), Some("runsc".into())))
        );
        assert_eq!(
            cfg.runtime("fast"),
            Some(("sandboxd-runtime:latest".into(), Some("runc".into())))
        );
    }
}
