//! Configuration: built-in defaults, an optional TOML file, then environment
//! variables on top. Loaded and validated once at start; every later reader
//! gets a `Config` that cannot be invalid.
//!
//! The environment names are the ones existing RemcoChat sandboxd deployments
//! already set, so an operator can swap the binary without editing env files.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

/// Address the API binds to when nothing else is configured.
pub const DEFAULT_BIND_HOST: &str = "127.0.0.1";
/// API port when nothing else is configured.
pub const DEFAULT_PORT: u16 = 8080;
/// Name prefix and `sandboxd.instance` label of every engine object we own.
pub const DEFAULT_INSTANCE: &str = "sandboxd";
/// Workspace directory inside every sandbox.
pub const DEFAULT_WORKSPACE_DIR: &str = "/workspace";
/// Runtime image used by the built-in runtimes.
pub const DEFAULT_IMAGE: &str = "sandboxd-runtime:latest";
/// Base image the embedded runtime Dockerfile builds on.
pub const DEFAULT_BASE_IMAGE: &str = "debian:bookworm-slim";
/// Most sandboxes alive at once before the least recently used idle one goes.
pub const DEFAULT_MAX_CONCURRENT: usize = 20;
/// Idle time after which a sandbox without running work is stopped.
pub const DEFAULT_IDLE_TTL_MS: u64 = 15 * 60 * 1000;
/// Largest request body, checked before it is buffered.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Most ports one sandbox may allowlist.
pub const DEFAULT_MAX_PORTS: usize = 4;
/// Host address proxy containers bind published ports to.
pub const DEFAULT_PUBLISH_HOST_IP: &str = "127.0.0.1";
/// Scheme of the URLs handed out for published ports.
pub const DEFAULT_PUBLIC_PROTO: &str = "http";
/// Process limit of a sandbox container.
pub const DEFAULT_PIDS_LIMIT: i64 = 512;
/// Size of the /tmp tmpfs in a sandbox.
pub const DEFAULT_TMP_SIZE_MB: u64 = 512;
/// Size limit of a sandbox's workspace volume; 0 means none. Enforced by
/// the engine (Docker's local driver: xfs project quotas), so off unless set.
pub const DEFAULT_WORKSPACE_SIZE_MB: u64 = 0;
/// Largest file any sandbox process may write (RLIMIT_FSIZE); 0 means none.
pub const DEFAULT_FILE_SIZE_LIMIT_MB: u64 = 1024;
/// vCPUs of a sandbox whose create request names none.
pub const DEFAULT_VCPUS: u32 = 1;
/// Memory of a sandbox whose create request names none.
pub const DEFAULT_MEMORY_MB: u32 = 1024;
/// User (uid:gid) every sandbox process runs as: the image's `sandbox` user.
pub const DEFAULT_SANDBOX_USER: &str = "1000:1000";
/// Timeout of a command whose request names none.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Longest timeout a command may ask for.
pub const DEFAULT_MAX_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// Output one command retains for its readers (a ring; older output drops).
pub const DEFAULT_OUTPUT_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// Time between SIGTERM and SIGKILL when a command is killed or times out.
pub const DEFAULT_KILL_GRACE_MS: u64 = 2_000;
/// How long a finished command stays listed (and its output readable).
pub const DEFAULT_COMMAND_RETENTION_MS: u64 = 10 * 60 * 1000;
/// Most finished commands kept per sandbox.
pub const DEFAULT_MAX_FINISHED_COMMANDS: usize = 100;
/// Most commands running at once in one sandbox.
pub const DEFAULT_MAX_RUNNING_COMMANDS: usize = 64;
/// Output all commands together may hold; past it the oldest finished
/// logs are dropped, then running ones are trimmed.
pub const DEFAULT_OUTPUT_MEMORY_BYTES: usize = 256 * 1024 * 1024;
/// Where link networks (sandbox <-> its port proxies) get their /29s.
pub const DEFAULT_LINK_SUBNET_POOL: &str = "10.213.0.0/16";
/// Largest file `files:read` returns.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// A silent log stream sends a heartbeat line this often.
pub const DEFAULT_LOG_HEARTBEAT_MS: u64 = 15_000;
/// Runtime names that exist without any configuration; RemcoChat sends the
/// last two.
pub const BUILTIN_RUNTIMES: [&str; 3] = ["default", "node24", "python3.13"];

/// The admin token. Its `Debug` is redacted so it cannot reach a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// The token itself, for the constant-time comparison only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

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
}

/// The validated configuration. Field docs live in `config.example.toml`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Config {
    pub bind_host: IpAddr,
    pub port: u16,
    pub admin_token: Option<AdminToken>,
    pub allow_insecure_no_token: bool,
    pub instance: String,
    pub docker_socket: Option<String>,
    pub workspace_dir: String,
    pub image: String,
    pub base_image: String,
    pub oci_runtime: Option<String>,
    pub disable_autobuild: bool,
    pub network_name: String,
    pub publish_host_ip: IpAddr,
    pub public_host: Option<String>,
    pub public_proto: String,
    pub max_concurrent: usize,
    pub default_idle_ttl_ms: u64,
    pub max_body_bytes: usize,
    pub max_ports: usize,
    pub pids_limit: i64,
    pub tmp_size_mb: u64,
    pub workspace_size_mb: u64,
    pub file_size_limit_mb: u64,
    pub default_vcpus: u32,
    pub default_memory_mb: u32,
    pub sandbox_user: String,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub output_buffer_bytes: usize,
    pub kill_grace_ms: u64,
    pub command_retention_ms: u64,
    pub max_finished_commands: usize,
    pub max_running_commands: usize,
    pub log_heartbeat_ms: u64,
    pub max_file_bytes: u64,
    pub output_memory_bytes: usize,
    pub proxy_image: Option<String>,
    pub link_subnet_pool: String,
    pub runtimes: BTreeMap<String, RuntimeConfig>,
}

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

/// The file's shape: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    bind_host: Option<String>,
    port: Option<u16>,
    admin_token: Option<String>,
    allow_insecure_no_token: Option<bool>,
    instance: Option<String>,
    docker_socket: Option<String>,
    workspace_dir: Option<String>,
    image: Option<String>,
    base_image: Option<String>,
    oci_runtime: Option<String>,
    disable_autobuild: Option<bool>,
    network_name: Option<String>,
    publish_host_ip: Option<String>,
    public_host: Option<String>,
    public_proto: Option<String>,
    max_concurrent: Option<usize>,
    default_idle_ttl_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    max_ports: Option<usize>,
    pids_limit: Option<i64>,
    tmp_size_mb: Option<u64>,
    workspace_size_mb: Option<u64>,
    file_size_limit_mb: Option<u64>,
    default_vcpus: Option<u32>,
    default_memory_mb: Option<u32>,
    sandbox_user: Option<String>,
    default_timeout_ms: Option<u64>,
    max_timeout_ms: Option<u64>,
    output_buffer_bytes: Option<usize>,
    kill_grace_ms: Option<u64>,
    command_retention_ms: Option<u64>,
    max_finished_commands: Option<usize>,
    max_running_commands: Option<usize>,
    log_heartbeat_ms: Option<u64>,
    max_file_bytes: Option<u64>,
    output_memory_bytes: Option<usize>,
    proxy_image: Option<String>,
    link_subnet_pool: Option<String>,
    #[serde(default)]
    runtimes: BTreeMap<String, RuntimeConfig>,
}

impl Config {
    /// Loads the file (if any), applies the process environment, validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let file_cfg = match file {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Config::from_parts(file_cfg, |name| std::env::var(name).ok())
    }

    /// Parses a TOML document and an environment; what `load` does minus I/O.
    pub fn from_toml_and_env(
        toml_text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file_cfg = parse_file(toml_text, "<inline>")?;
        Config::from_parts(file_cfg, env)
    }

    fn from_parts(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        // Env wins over the file, the file over defaults. Each value keeps the
        // name it came from so an error names what the operator actually set.
        let pick_str = |env_key: &str, file_val: Option<String>, file_key: &str| match env(env_key)
            .filter(|v| !v.is_empty())
        {
            Some(v) => Some((env_key.to_string(), v)),
            None => file_val.map(|v| (file_key.to_string(), v)),
        };
        macro_rules! num {
            ($env:literal, $field:ident, $default:expr) => {
                match env($env).filter(|v| !v.is_empty()) {
                    Some(v) => parse_num($env, &v)?,
                    None => file.$field.unwrap_or($default),
                }
            };
        }
        macro_rules! flag {
            ($env:literal, $field:ident) => {
                match env($env).filter(|v| !v.is_empty()) {
                    Some(v) => parse_bool($env, &v)?,
                    None => file.$field.unwrap_or(false),
                }
            };
        }

        let bind_host = match pick_str("SANDBOXD_BIND_HOST", file.bind_host.clone(), "bind_host") {
            Some((key, v)) => parse_ip(&key, &v)?,
            None => parse_ip("bind_host", DEFAULT_BIND_HOST)?,
        };
        let publish_host_ip = match pick_str(
            "SANDBOXD_PUBLISH_HOST_IP",
            file.publish_host_ip.clone(),
            "publish_host_ip",
        ) {
            Some((key, v)) => parse_ip(&key, &v)?,
            None => parse_ip("publish_host_ip", DEFAULT_PUBLISH_HOST_IP)?,
        };
        let port: u16 = num!("SANDBOXD_PORT", port, DEFAULT_PORT);
        let instance = pick_str("SANDBOXD_INSTANCE", file.instance.clone(), "instance")
            .unwrap_or(("instance".into(), DEFAULT_INSTANCE.into()));
        let workspace_dir = pick_str(
            "SANDBOXD_WORKSPACE_DIR",
            file.workspace_dir.clone(),
            "workspace_dir",
        )
        .unwrap_or(("workspace_dir".into(), DEFAULT_WORKSPACE_DIR.into()));
        let network_name = pick_str(
            "SANDBOXD_NETWORK_NAME",
            file.network_name.clone(),
            "network_name",
        );
        let public_proto = pick_str(
            "SANDBOXD_PUBLIC_PROTO",
            file.public_proto.clone(),
            "public_proto",
        )
        .unwrap_or(("public_proto".into(), DEFAULT_PUBLIC_PROTO.into()));
        // DOCKER_HOST is only a socket path for us when it is unix://; other
        // schemes are left to discovery to report.
        let docker_socket = pick_str(
            "SANDBOXD_DOCKER_SOCKET",
            file.docker_socket.clone(),
            "docker_socket",
        )
        .map(|(_, v)| v.strip_prefix("unix://").map(str::to_string).unwrap_or(v));

        let mut runtimes: BTreeMap<String, RuntimeConfig> = BUILTIN_RUNTIMES
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    RuntimeConfig {
                        image: None,
                        oci_runtime: None,
                    },
                )
            })
            .collect();
        runtimes.extend(file.runtimes.clone());

        let cfg = Config {
            bind_host,
            port,
            admin_token: pick_str(
                "SANDBOXD_ADMIN_TOKEN",
                file.admin_token.clone(),
                "admin_token",
            )
            .map(|(_, v)| AdminToken(v)),
            allow_insecure_no_token: flag!(
                "SANDBOXD_ALLOW_INSECURE_NO_TOKEN",
                allow_insecure_no_token
            ),
            instance: validate_instance(&instance.0, instance.1)?,
            docker_socket,
            workspace_dir: validate_workspace_dir(&workspace_dir.0, workspace_dir.1)?,
            image: pick_str("SANDBOXD_IMAGE", file.image.clone(), "image")
                .map(|(_, v)| v)
                .unwrap_or_else(|| DEFAULT_IMAGE.into()),
            base_image: pick_str("SANDBOXD_BASE_IMAGE", file.base_image.clone(), "base_image")
                .map(|(_, v)| v)
                .unwrap_or_else(|| DEFAULT_BASE_IMAGE.into()),
            oci_runtime: pick_str(
                "SANDBOXD_OCI_RUNTIME",
                file.oci_runtime.clone(),
                "oci_runtime",
            )
            .map(|(_, v)| v),
            disable_autobuild: flag!("SANDBOXD_DISABLE_AUTOBUILD", disable_autobuild),
            network_name: String::new(),
            publish_host_ip,
            public_host: pick_str(
                "SANDBOXD_PUBLIC_HOST",
                file.public_host.clone(),
                "public_host",
            )
            .map(|(_, v)| v),
            public_proto: validate_proto(&public_proto.0, public_proto.1)?,
            max_concurrent: num!(
                "SANDBOXD_MAX_CONCURRENT",
                max_concurrent,
                DEFAULT_MAX_CONCURRENT
            ),
            default_idle_ttl_ms: num!(
                "SANDBOXD_DEFAULT_IDLE_TTL_MS",
                default_idle_ttl_ms,
                DEFAULT_IDLE_TTL_MS
            ),
            max_body_bytes: num!(
                "SANDBOXD_MAX_BODY_BYTES",
                max_body_bytes,
                DEFAULT_MAX_BODY_BYTES
            ),
            max_ports: num!("SANDBOXD_MAX_PORTS", max_ports, DEFAULT_MAX_PORTS),
            pids_limit: num!("SANDBOXD_PIDS_LIMIT", pids_limit, DEFAULT_PIDS_LIMIT),
            tmp_size_mb: num!("SANDBOXD_TMP_SIZE_MB", tmp_size_mb, DEFAULT_TMP_SIZE_MB),
            workspace_size_mb: num!(
                "SANDBOXD_WORKSPACE_SIZE_MB",
                workspace_size_mb,
                DEFAULT_WORKSPACE_SIZE_MB
            ),
            file_size_limit_mb: num!(
                "SANDBOXD_FILE_SIZE_LIMIT_MB",
                file_size_limit_mb,
                DEFAULT_FILE_SIZE_LIMIT_MB
            ),
            default_vcpus: num!("SANDBOXD_DEFAULT_VCPUS", default_vcpus, DEFAULT_VCPUS),
            default_memory_mb: num!(
                "SANDBOXD_DEFAULT_MEMORY_MB",
                default_memory_mb,
                DEFAULT_MEMORY_MB
            ),
            sandbox_user: pick_str(
                "SANDBOXD_SANDBOX_USER",
                file.sandbox_user.clone(),
                "sandbox_user",
            )
            .map(|(_, v)| v)
            .unwrap_or_else(|| DEFAULT_SANDBOX_USER.into()),
            default_timeout_ms: num!(
                "SANDBOXD_DEFAULT_TIMEOUT_MS",
                default_timeout_ms,
                DEFAULT_TIMEOUT_MS
            ),
            max_timeout_ms: num!(
                "SANDBOXD_MAX_TIMEOUT_MS",
                max_timeout_ms,
                DEFAULT_MAX_TIMEOUT_MS
            ),
            output_buffer_bytes: num!(
                "SANDBOXD_OUTPUT_BUFFER_BYTES",
                output_buffer_bytes,
                DEFAULT_OUTPUT_BUFFER_BYTES
            ),
            kill_grace_ms: num!(
                "SANDBOXD_KILL_GRACE_MS",
                kill_grace_ms,
                DEFAULT_KILL_GRACE_MS
            ),
            command_retention_ms: num!(
                "SANDBOXD_COMMAND_RETENTION_MS",
                command_retention_ms,
                DEFAULT_COMMAND_RETENTION_MS
            ),
            max_finished_commands: num!(
                "SANDBOXD_MAX_FINISHED_COMMANDS",
                max_finished_commands,
                DEFAULT_MAX_FINISHED_COMMANDS
            ),
            max_running_commands: num!(
                "SANDBOXD_MAX_RUNNING_COMMANDS",
                max_running_commands,
                DEFAULT_MAX_RUNNING_COMMANDS
            ),
            log_heartbeat_ms: num!(
                "SANDBOXD_LOG_HEARTBEAT_MS",
                log_heartbeat_ms,
                DEFAULT_LOG_HEARTBEAT_MS
            ),
            max_file_bytes: num!(
                "SANDBOXD_MAX_FILE_BYTES",
                max_file_bytes,
                DEFAULT_MAX_FILE_BYTES
            ),
            output_memory_bytes: num!(
                "SANDBOXD_OUTPUT_MEMORY_BYTES",
                output_memory_bytes,
                DEFAULT_OUTPUT_MEMORY_BYTES
            ),
            proxy_image: pick_str(
                "SANDBOXD_PROXY_IMAGE",
                file.proxy_image.clone(),
                "proxy_image",
            )
            .map(|(_, v)| v),
            link_subnet_pool: pick_str(
                "SANDBOXD_LINK_SUBNET_POOL",
                file.link_subnet_pool.clone(),
                "link_subnet_pool",
            )
            .map(|(_, v)| v)
            .unwrap_or_else(|| DEFAULT_LINK_SUBNET_POOL.into()),
            runtimes,
        };
        let network_name = match network_name {
            Some((key, v)) => validate_object_name(&key, v)?,
            None => format!("{}-net", cfg.instance),
        };
        let cfg = Config {
            network_name,
            ..cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.port == 0 {
            return Err(ConfigError::invalid("port", "must be 1-65535, not 0"));
        }
        if self
            .admin_token
            .as_ref()
            .is_some_and(|t| t.0.trim().is_empty())
        {
            return Err(ConfigError::invalid("admin_token", "must not be empty"));
        }
        if !self.bind_host.is_loopback()
            && self.admin_token.is_none()
            && !self.allow_insecure_no_token
        {
            return Err(ConfigError::invalid(
                "SANDBOXD_ADMIN_TOKEN",
                format!(
                    "binding to the non-loopback address {} needs an admin token \
                     (anyone who reaches the port could run code next to the engine socket); \
                     set SANDBOXD_ADMIN_TOKEN, or allow_insecure_no_token = true to accept the risk",
                    self.bind_host
                ),
            ));
        }
        if self.max_concurrent == 0 {
            return Err(ConfigError::invalid("max_concurrent", "must be at least 1"));
        }
        if !(10_000..=21_600_000).contains(&self.default_idle_ttl_ms) {
            return Err(ConfigError::invalid(
                "default_idle_ttl_ms",
                "must be between 10000 (10 s) and 21600000 (6 h)",
            ));
        }
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::invalid(
                "max_body_bytes",
                "must be at least 1024",
            ));
        }
        if !(1..=64).contains(&self.max_ports) {
            return Err(ConfigError::invalid(
                "max_ports",
                "must be between 1 and 64",
            ));
        }
        if !(16..=1_000_000).contains(&self.pids_limit) {
            return Err(ConfigError::invalid(
                "pids_limit",
                "must be between 16 and 1000000",
            ));
        }
        if !(1..=65_536).contains(&self.tmp_size_mb) {
            return Err(ConfigError::invalid(
                "tmp_size_mb",
                "must be between 1 and 65536",
            ));
        }
        if self.workspace_size_mb > 16 * 1024 * 1024 {
            return Err(ConfigError::invalid(
                "workspace_size_mb",
                "must be between 0 (no limit) and 16777216",
            ));
        }
        if self.file_size_limit_mb > 16 * 1024 * 1024 {
            return Err(ConfigError::invalid(
                "file_size_limit_mb",
                "must be between 0 (no limit) and 16777216",
            ));
        }
        if !(1..=8).contains(&self.default_vcpus) {
            return Err(ConfigError::invalid(
                "default_vcpus",
                "must be between 1 and 8",
            ));
        }
        if !(256..=16_384).contains(&self.default_memory_mb) {
            return Err(ConfigError::invalid(
                "default_memory_mb",
                "must be between 256 and 16384",
            ));
        }
        validate_user(&self.sandbox_user)?;
        if !(1_000..=86_400_000).contains(&self.max_timeout_ms) {
            return Err(ConfigError::invalid(
                "max_timeout_ms",
                "must be between 1000 (1 s) and 86400000 (24 h)",
            ));
        }
        if !(1_000..=self.max_timeout_ms).contains(&self.default_timeout_ms) {
            return Err(ConfigError::invalid(
                "default_timeout_ms",
                "must be between 1000 and max_timeout_ms",
            ));
        }
        if !(64 * 1024..=1 << 30).contains(&self.output_buffer_bytes) {
            return Err(ConfigError::invalid(
                "output_buffer_bytes",
                "must be between 65536 and 1073741824",
            ));
        }
        if self.kill_grace_ms > 60_000 {
            return Err(ConfigError::invalid(
                "kill_grace_ms",
                "must be at most 60000",
            ));
        }
        if !(1_000..=86_400_000).contains(&self.command_retention_ms) {
            return Err(ConfigError::invalid(
                "command_retention_ms",
                "must be between 1000 and 86400000",
            ));
        }
        if !(1..=10_000).contains(&self.max_finished_commands) {
            return Err(ConfigError::invalid(
                "max_finished_commands",
                "must be between 1 and 10000",
            ));
        }
        let prefix = crate::ports::link_prefix(self.max_ports);
        if crate::ports::link_subnet_range(&self.link_subnet_pool, prefix).is_none() {
            return Err(ConfigError::invalid(
                "link_subnet_pool",
                format!(
                    "{:?} must be an IPv4 CIDR from /8 to /{prefix} (one link network is a /{prefix} with max_ports {}), e.g. 10.213.0.0/16",
                    self.link_subnet_pool, self.max_ports
                ),
            ));
        }
        if self.output_memory_bytes < self.output_buffer_bytes {
            return Err(ConfigError::invalid(
                "output_memory_bytes",
                "must be at least output_buffer_bytes",
            ));
        }
        if !(1..=1 << 32).contains(&self.max_file_bytes) {
            return Err(ConfigError::invalid(
                "max_file_bytes",
                "must be between 1 and 4294967296",
            ));
        }
        if !(100..=60_000).contains(&self.log_heartbeat_ms) {
            return Err(ConfigError::invalid(
                "log_heartbeat_ms",
                "must be between 100 and 60000",
            ));
        }
        if !(1..=10_000).contains(&self.max_running_commands) {
            return Err(ConfigError::invalid(
                "max_running_commands",
                "must be between 1 and 10000",
            ));
        }
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
        }
        Ok(())
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
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse_file(&text, &path.display().to_string())
}

fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Parse {
        path: path.to_string(),
        // toml's Display draws a multi-line snippet; the message alone is the
        // one line the operator needs, and the key is in it.
        reason: e.message().trim().replace('\n', " "),
    })
}

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| ConfigError::invalid(key, format!("{v:?} is not a valid number here")))
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::invalid(
            key,
            format!("{v:?} is not a boolean (use true/false or 1/0)"),
        )),
    }
}

fn parse_ip(key: &str, v: &str) -> Result<IpAddr, ConfigError> {
    let v = v.trim();
    if v == "localhost" {
        return Ok(IpAddr::from([127, 0, 0, 1]));
    }
    v.parse()
        .map_err(|_| ConfigError::invalid(key, format!("{v:?} is not an IP address")))
}

fn validate_instance(key: &str, v: String) -> Result<String, ConfigError> {
    if v.len() > 40 {
        return Err(ConfigError::invalid(key, "must be at most 40 characters"));
    }
    validate_object_name(key, v)
}

/// Engine object names: what Docker accepts for containers and networks.
fn validate_object_name(key: &str, v: String) -> Result<String, ConfigError> {
    let mut chars = v.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && v.len() <= 64 {
        Ok(v)
    } else {
        Err(ConfigError::invalid(
            key,
            format!(
                "{v:?} must start with a letter or digit and hold only letters, digits, '_', '.', '-' (at most 64)"
            ),
        ))
    }
}

fn validate_workspace_dir(key: &str, v: String) -> Result<String, ConfigError> {
    let trimmed = if v.len() > 1 {
        v.trim_end_matches('/')
    } else {
        &v
    };
    if !trimmed.starts_with('/') {
        return Err(ConfigError::invalid(
            key,
            format!("{v:?} must be an absolute path"),
        ));
    }
    if trimmed == "/" {
        return Err(ConfigError::invalid(key, "must not be the root directory"));
    }
    if trimmed
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(ConfigError::invalid(
            key,
            format!("{v:?} must be a normalised path (no '.', '..' or '//')"),
        ));
    }
    Ok(trimmed.to_string())
}

fn validate_proto(key: &str, v: String) -> Result<String, ConfigError> {
    match v.as_str() {
        "http" | "https" => Ok(v),
        _ => Err(ConfigError::invalid(
            key,
            format!("{v:?} must be http or https"),
        )),
    }
}

fn validate_user(v: &str) -> Result<(), ConfigError> {
    let ok = v
        .split_once(':')
        .map(|(u, g)| (u, Some(g)))
        .unwrap_or((v, None));
    let uid: Option<u32> = ok.0.parse().ok();
    let gid_ok = ok.1.is_none_or(|g| g.parse::<u32>().is_ok_and(|g| g != 0));
    match uid {
        Some(uid) if uid != 0 && gid_ok => Ok(()),
        _ => Err(ConfigError::invalid(
            "sandbox_user",
            format!("{v:?} must be a numeric non-root uid[:gid], e.g. 1000:1000"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn err_of(toml: &str, env: &[(&str, &str)]) -> String {
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
        assert_eq!(cfg.image, "sandboxd-runtime:latest");
        assert_eq!(cfg.instance, "sandboxd");
        assert_eq!(cfg.network_name, "sandboxd-net");
        assert!(cfg.admin_token.is_none());
        assert_eq!(
            cfg.workspace_size_mb, 0,
            "only a capable engine can enforce it"
        );
        assert_eq!(cfg.file_size_limit_mb, 1024);
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
        assert_eq!(cfg.network_name, "blue-net");
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
            !format!("{cfg:?}").contains("s3cret"),
            "token must not appear in Debug"
        );
        assert_eq!(cfg.max_concurrent, 3);
        assert_eq!(cfg.default_idle_ttl_ms, 60_000);
        assert_eq!(cfg.max_body_bytes, 4096);
        assert_eq!(cfg.docker_socket.as_deref(), Some("/tmp/d.sock"));
        assert_eq!(cfg.publish_host_ip.to_string(), "0.0.0.0");
        assert_eq!(cfg.public_host.as_deref(), Some("sandbox.example"));
        assert_eq!(cfg.public_proto, "https");
        assert_eq!(cfg.network_name, "chatnet");
        assert!(cfg.disable_autobuild);
        assert_eq!(cfg.workspace_dir, "/vercel/sandbox/workspace");
        assert_eq!(cfg.image, "img:1");
    }

    #[test]
    fn bad_values_name_their_key() {
        assert!(err_of("", &[("SANDBOXD_PORT", "abc")]).starts_with("SANDBOXD_PORT:"));
        assert!(err_of("", &[("SANDBOXD_PORT", "0")]).starts_with("port:"));
        assert!(err_of("port = 0", &[]).starts_with("port:"));
        assert!(
            err_of("", &[("SANDBOXD_WORKSPACE_DIR", "ws")]).starts_with("SANDBOXD_WORKSPACE_DIR:")
        );
        assert!(err_of("workspace_dir = \"/a/../b\"", &[]).starts_with("workspace_dir:"));
        assert!(
            err_of("", &[("SANDBOXD_DISABLE_AUTOBUILD", "maybe")])
                .starts_with("SANDBOXD_DISABLE_AUTOBUILD:")
        );
        assert!(err_of("", &[("SANDBOXD_BIND_HOST", "nope")]).starts_with("SANDBOXD_BIND_HOST:"));
        assert!(err_of("", &[("SANDBOXD_INSTANCE", "a b")]).starts_with("SANDBOXD_INSTANCE:"));
        assert!(err_of("sandbox_user = \"0\"", &[]).starts_with("sandbox_user:"));
        assert!(err_of("workspace_size_mb = 99999999", &[]).starts_with("workspace_size_mb:"));
        assert!(
            err_of("", &[("SANDBOXD_FILE_SIZE_LIMIT_MB", "20000000")])
                .starts_with("file_size_limit_mb:")
        );
        assert!(
            err_of("", &[("SANDBOXD_MAX_CONCURRENT", "-1")])
                .starts_with("SANDBOXD_MAX_CONCURRENT:")
        );
    }

    #[test]
    fn unknown_file_key_is_refused_by_name() {
        let e = err_of("prot = 8080", &[]);
        assert!(e.contains("prot"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        let e = err_of("[runtimes.x]\nimage = \"a\"\nbogus = 1", &[]);
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn non_loopback_without_token_is_refused_unless_allowed() {
        let e = err_of("", &[("SANDBOXD_BIND_HOST", "0.0.0.0")]);
        assert!(e.starts_with("SANDBOXD_ADMIN_TOKEN:"), "{e}");
        Config::from_toml_and_env(
            "allow_insecure_no_token = true",
            env_of(&[("SANDBOXD_BIND_HOST", "0.0.0.0")]),
        )
        .expect("explicitly allowed");
        Config::from_toml_and_env(
            "",
            env_of(&[
                ("SANDBOXD_BIND_HOST", "0.0.0.0"),
                ("SANDBOXD_ADMIN_TOKEN", "t"),
            ]),
        )
        .expect("token given");
    }

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
