//! Configuration: built-in defaults, an optional TOML file, then environment
//! variables on top. Loaded and validated once at start; every later reader
//! gets a `Config` that cannot be invalid.
//!
//! Every key is declared once, in the `settings!` table (`keys.rs`): its
//! field, type, default, range check and doc line. The environment variable
//! of key `k` is always `SANDBOXD_` + `k` in capitals, which are the names
//! existing RemcoChat sandboxd deployments already set, so an operator can
//! swap the binary without editing env files. Durations are `_ms` integers
//! in the file and the environment and [`Duration`]s here.
//! `config.example.toml` documents every key; a test holds it to this table.
//!
//! This file loads and validates; `sources` reads one value from the
//! environment or the file; `auth`, `e2b`, `network`, `runtimes`, `state` and
//! `workspace` hold what is particular to each (types, defaults worked out after
//! reading, and the checks that span keys).

mod auth;
mod e2b;
mod keys;
mod network;
mod runtimes;
mod sources;
mod state;
mod workspace;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

pub use auth::AdminToken;
use keys::read_settings;
pub use keys::{Config, KeyInfo, keys};
pub use network::NETWORK_MODES;
pub use runtimes::{BUILTIN_RUNTIMES, RuntimeConfig};
use sources::Sources;
pub use sources::env_var;

/// Why the configuration was refused. Each names the key at fault, so the
/// operator sees one line that says what to fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read { path: String, reason: String },
    /// The file is not valid TOML for our keys (unknown key, wrong type...).
    #[error("config file {path}: {reason}")]
    Parse { path: String, reason: String },
    /// A key has a value we refuse.
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    fn invalid(key: &str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

impl Config {
    /// Loads the file (if any), applies the process environment, validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let (text, name) = match file {
            Some(path) => (
                std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?,
                path.display().to_string(),
            ),
            None => (String::new(), String::new()),
        };
        Config::parse(&text, &name, &|name| std::env::var(name).ok())
    }

    /// Parses a TOML document and an environment; what `load` does minus I/O.
    pub fn from_toml_and_env(
        toml_text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse(toml_text, "<inline>", &env)
    }

    fn parse(
        text: &str,
        file_name: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let parse_error = |reason: String| ConfigError::Parse {
            path: file_name.to_string(),
            reason,
        };
        // toml's Display draws a multi-line snippet; the message alone is
        // the one line the operator needs, and the key is in it.
        let mut file: toml::Table = toml::from_str(text)
            .map_err(|e: toml::de::Error| parse_error(e.message().trim().replace('\n', " ")))?;
        let runtimes: BTreeMap<String, RuntimeConfig> = match file.remove("runtimes") {
            Some(v) => v.try_into().map_err(|e: toml::de::Error| {
                parse_error(format!(
                    "runtimes: {}",
                    e.message().trim().replace('\n', " ")
                ))
            })?,
            None => BTreeMap::new(),
        };
        let known = keys();
        if let Some(unknown) = file.keys().find(|k| !known.iter().any(|i| i.key == *k)) {
            return Err(parse_error(format!("unknown key `{unknown}`")));
        }
        let sources = Sources {
            file: &file,
            file_name,
            env,
        };
        let mut cfg = read_settings(&sources)?;
        // DOCKER_HOST is only a socket path for us when it is unix://; other
        // schemes are left to discovery to report.
        if let Some(s) = cfg.docker_socket.take() {
            cfg.docker_socket = Some(s.strip_prefix("unix://").map(str::to_string).unwrap_or(s));
        }
        cfg.resolve_workspace_dirs();
        if cfg.network_name.is_none() {
            cfg.network_name = Some(format!("{}-net", cfg.instance));
        }
        cfg.resolve_state_dir(env, rustix::process::geteuid().is_root());
        cfg.runtimes = runtimes::with_builtins(runtimes);
        cfg.origin_policy = crate::origin_policy::OriginPolicy::new(
            cfg.bind_host,
            &cfg.allowed_hosts,
            &cfg.cors_origins,
        )
        .map_err(|reason| ConfigError::invalid("allowed_hosts", reason))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks that span keys.
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_exposure()?;
        if self.default_timeout < Duration::from_secs(1) || self.default_timeout > self.max_timeout
        {
            return Err(ConfigError::invalid(
                "default_timeout_ms",
                "must be between 1000 and max_timeout_ms",
            ));
        }
        if self.output_memory_bytes < self.output_buffer_bytes {
            return Err(ConfigError::invalid(
                "output_memory_bytes",
                "must be at least output_buffer_bytes",
            ));
        }
        self.validate_network()?;
        self.validate_workspace_aliases()?;
        self.validate_workspace_volume()?;
        self.validate_runtimes()?;
        self.validate_e2b_templates()?;
        self.validate_e2b_domain()?;
        self.validate_session_tokens()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    pub(super) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    pub(super) fn err_of(toml: &str, env: &[(&str, &str)]) -> String {
        match Config::from_toml_and_env(toml, env_of(env)) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_serve_loopback_8080() {
        let cfg = Config::from_toml_and_env("", env_of(&[])).expect("defaults are valid");
        assert_eq!(cfg.bind_host.to_string(), "127.0.0.1");
        assert_eq!(cfg.port, 8080);
        assert_eq!(cfg.workspace_dir, "/workspace");
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/workspace", "/vercel/sandbox/workspace", "/home/user"],
            "RemcoChat's and E2B's spellings work with no configuration"
        );
        assert_eq!(cfg.image, "sandboxd-runtime:latest");
        assert_eq!(cfg.instance, "sandboxd");
        assert_eq!(cfg.network_name(), "sandboxd-net");
        assert!(cfg.admin_token.is_none());
        assert_eq!(
            cfg.workspace_size_mb, 0,
            "only a capable engine can enforce it"
        );
        assert_eq!(cfg.file_size_limit_mb, 1024);
        assert_eq!(cfg.kill_grace, Duration::from_secs(2));
        for rt in BUILTIN_RUNTIMES {
            assert_eq!(
                cfg.runtime(rt),
                Some(("sandboxd-runtime:latest".into(), None))
            );
        }
    }

    #[test]
    fn env_overrides_file() {
        let cfg = Config::from_toml_and_env(
            "port = 9000\nworkspace_dir = \"/srv/ws\"\n",
            env_of(&[("SANDBOXD_PORT", "9100"), ("SANDBOXD_INSTANCE", "blue")]),
        )
        .expect("valid");
        assert_eq!(cfg.port, 9100);
        assert_eq!(cfg.workspace_dir, "/srv/ws");
        assert_eq!(cfg.instance, "blue");
        assert_eq!(cfg.network_name(), "blue-net");
    }

    #[test]
    fn every_compat_env_var_is_read() {
        let cfg = Config::from_toml_and_env(
            "",
            env_of(&[
                ("SANDBOXD_BIND_HOST", "0.0.0.0"),
                ("SANDBOXD_PORT", "7000"),
                ("SANDBOXD_ADMIN_TOKEN", "s3cret"),
                ("SANDBOXD_MAX_CONCURRENT", "3"),
                ("SANDBOXD_DEFAULT_IDLE_TTL_MS", "60000"),
                ("SANDBOXD_MAX_BODY_BYTES", "4096"),
                ("SANDBOXD_DOCKER_SOCKET", "unix:///tmp/d.sock"),
                ("SANDBOXD_PUBLISH_HOST_IP", "0.0.0.0"),
                ("SANDBOXD_PUBLIC_HOST", "sandbox.example"),
                ("SANDBOXD_PUBLIC_PROTO", "https"),
                ("SANDBOXD_NETWORK_NAME", "chatnet"),
                ("SANDBOXD_DISABLE_AUTOBUILD", "1"),
                ("SANDBOXD_WORKSPACE_DIR", "/vercel/sandbox/workspace/"),
                ("SANDBOXD_IMAGE", "img:1"),
            ]),
        )
        .expect("valid");
        assert_eq!(cfg.bind_host.to_string(), "0.0.0.0");
        assert_eq!(cfg.port, 7000);
        assert_eq!(
            cfg.admin_token.as_ref().map(AdminToken::expose),
            Some("s3cret")
        );
        assert!(
            !format!("{:?}", cfg.admin_token).contains("s3cret"),
            "token must not appear in Debug"
        );
        assert_eq!(cfg.max_concurrent, 3);
        assert_eq!(cfg.default_idle_ttl, Duration::from_secs(60));
        assert_eq!(cfg.max_body_bytes, 4096);
        assert_eq!(cfg.docker_socket.as_deref(), Some("/tmp/d.sock"));
        assert_eq!(cfg.publish_host_ip.to_string(), "0.0.0.0");
        assert_eq!(cfg.public_host.as_deref(), Some("sandbox.example"));
        assert_eq!(cfg.public_proto, "https");
        assert_eq!(cfg.network_name(), "chatnet");
        assert!(cfg.disable_autobuild);
        assert_eq!(cfg.workspace_dir, "/vercel/sandbox/workspace");
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/vercel/sandbox/workspace", "/workspace", "/home/user"]
        );
        assert_eq!(cfg.image, "img:1");
    }

    #[test]
    fn bad_values_name_their_key() {
        assert!(err_of("", &[("SANDBOXD_PORT", "abc")]).starts_with("SANDBOXD_PORT (port):"));
        assert!(err_of("", &[("SANDBOXD_PORT", "0")]).starts_with("SANDBOXD_PORT (port):"));
        assert!(err_of("port = 0", &[]).starts_with("port:"));
        assert!(
            err_of("", &[("SANDBOXD_WORKSPACE_DIR", "ws")])
                .starts_with("SANDBOXD_WORKSPACE_DIR (workspace_dir):")
        );
        assert!(err_of("workspace_dir = \"/a/../b\"", &[]).starts_with("workspace_dir:"));
        assert!(
            err_of("", &[("SANDBOXD_DISABLE_AUTOBUILD", "maybe")])
                .starts_with("SANDBOXD_DISABLE_AUTOBUILD (disable_autobuild):")
        );
        assert!(
            err_of("", &[("SANDBOXD_BIND_HOST", "nope")])
                .starts_with("SANDBOXD_BIND_HOST (bind_host):")
        );
        assert!(
            err_of("", &[("SANDBOXD_INSTANCE", "a b")])
                .starts_with("SANDBOXD_INSTANCE (instance):")
        );
        assert!(err_of("sandbox_user = \"0\"", &[]).starts_with("sandbox_user:"));
        assert!(err_of("workspace_size_mb = 99999999", &[]).starts_with("workspace_size_mb:"));
        assert!(
            err_of("", &[("SANDBOXD_FILE_SIZE_LIMIT_MB", "20000000")])
                .starts_with("SANDBOXD_FILE_SIZE_LIMIT_MB (file_size_limit_mb):")
        );
        assert!(
            err_of("", &[("SANDBOXD_MAX_CONCURRENT", "-1")])
                .starts_with("SANDBOXD_MAX_CONCURRENT (max_concurrent):")
        );
        assert!(err_of("port = \"x\"", &[]).contains("port"));
        assert!(
            err_of("", &[("SANDBOXD_WORKSPACE_ALIASES", "/workspace/inner")])
                .starts_with("workspace_aliases:")
        );
        assert!(err_of("workspace_aliases = [\"/tmp/ws\"]", &[]).starts_with("workspace_aliases:"));
    }

    #[test]
    fn unknown_file_key_is_refused_by_name() {
        let e = err_of("prot = 8080", &[]);
        assert!(e.contains("prot"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        let e = err_of("[runtimes.x]\nimage = \"a\"\nbogus = 1", &[]);
        assert!(e.contains("bogus"), "{e}");
    }
}
