//! Configuration: built-in defaults, an optional TOML file, then environment
//! variables on top. Loaded and validated once at start; every later reader
//! gets a `Config` that cannot be invalid.
//!
//! Every key is declared once, in the `settings!` table below: its field,
//! type, default, range check and doc line. The environment variable of key
//! `k` is always `SANDBOXD_` + `k` in capitals, which are the names existing
//! RemcoChat sandboxd deployments already set, so an operator can swap the
//! binary without editing env files. Durations are `_ms` integers in the
//! file and the environment and [`Duration`]s here. `config.example.toml`
//! documents every key; a test holds it to this table.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Runtime names that exist without any configuration; RemcoChat sends the
/// last two.
pub const BUILTIN_RUNTIMES: [&str; 3] = ["default", "node24", "python3.13"];

/// The two spellings of the workspace: ours, and the one RemcoChat
/// hard-codes. With no configuration each aliases the other.
const WORKSPACE_SPELLINGS: [&str; 2] = ["/workspace", "/vercel/sandbox/workspace"];

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
    /// Warm sandboxes kept for this runtime; `None`: the top-level
    /// `pool_size` for `default`, 0 for the others.
    #[serde(default)]
    pub pool_size: Option<usize>,
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

/// A type a key can have: read from an environment string or a TOML value,
/// and shown as TOML (for the example file's check).
trait Setting: Sized {
    fn from_env(s: &str) -> Result<Self, String>;
    fn from_toml(v: &toml::Value) -> Result<Self, String>;
    fn to_toml(&self) -> Option<toml::Value>;
}

macro_rules! integer_setting {
    ($($t:ty),*) => {$(
        impl Setting for $t {
            fn from_env(s: &str) -> Result<Self, String> {
                s.trim().parse().map_err(|_| format!("{s:?} is not a valid number here"))
            }
            fn from_toml(v: &toml::Value) -> Result<Self, String> {
                v.as_integer()
                    .and_then(|i| <$t>::try_from(i).ok())
                    .ok_or_else(|| format!("{v} is not a valid number here"))
            }
            fn to_toml(&self) -> Option<toml::Value> {
                i64::try_from(*self).ok().map(toml::Value::Integer)
            }
        }
    )*};
}
integer_setting!(u16, u32, u64, usize, i64);

impl Setting for bool {
    fn from_env(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(format!("{s:?} is not a boolean (use true/false or 1/0)")),
        }
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_bool()
            .ok_or_else(|| format!("{v} is not a boolean (use true or false)"))
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Boolean(*self))
    }
}

impl Setting for String {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(s.to_string())
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{v} is not a string"))
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::String(self.clone()))
    }
}

impl Setting for IpAddr {
    fn from_env(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "localhost" {
            return Ok(IpAddr::from([127, 0, 0, 1]));
        }
        s.parse().map_err(|_| format!("{s:?} is not an IP address"))
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        Self::from_env(&String::from_toml(v)?)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::String(self.to_string()))
    }
}

/// Milliseconds in the file and the environment.
impl Setting for Duration {
    fn from_env(s: &str) -> Result<Self, String> {
        u64::from_env(s).map(Duration::from_millis)
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        u64::from_toml(v).map(Duration::from_millis)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        u64::try_from(self.as_millis()).ok()?.to_toml()
    }
}

/// Never shown: the example file holds no token.
impl Setting for AdminToken {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(AdminToken(s.to_string()))
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        String::from_toml(v).map(AdminToken)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        None
    }
}

/// A list: comma-separated in the environment, an array in the file.
impl Setting for Vec<String> {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect())
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_array()
            .ok_or_else(|| format!("{v} is not an array of strings"))?
            .iter()
            .map(String::from_toml)
            .collect()
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Array(
            self.iter()
                .map(|s| toml::Value::String(s.clone()))
                .collect(),
        ))
    }
}

/// A key with no default: absent unless set.
impl<T: Setting> Setting for Option<T> {
    fn from_env(s: &str) -> Result<Self, String> {
        T::from_env(s).map(Some)
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        T::from_toml(v).map(Some)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        self.as_ref().and_then(T::to_toml)
    }
}

/// Where the values come from: the file's table and the environment.
struct Sources<'a> {
    file: &'a toml::Table,
    file_name: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Sources<'_> {
    /// The value of `key`: its variable (empty counts as unset), else the
    /// file, else `default`; and the name to blame for it, which is the
    /// one the operator set it by.
    fn get<T: Setting>(&self, key: &str, default: T) -> Result<(T, String), ConfigError> {
        let var = env_var(key);
        if let Some(v) = (self.env)(&var).filter(|v| !v.is_empty()) {
            let blame = format!("{var} ({key})");
            return T::from_env(&v)
                .map(|t| (t, blame.clone()))
                .map_err(|reason| ConfigError::invalid(&blame, reason));
        }
        match self.file.get(key) {
            Some(v) => T::from_toml(v)
                .map(|t| (t, key.to_string()))
                .map_err(|reason| ConfigError::Parse {
                    path: self.file_name.to_string(),
                    reason: format!("{key}: {reason}"),
                }),
            None => Ok((default, key.to_string())),
        }
    }
}

/// The environment variable of a key.
pub fn env_var(key: &str) -> String {
    format!("SANDBOXD_{}", key.to_ascii_uppercase())
}

/// One row of the key table, for documentation checks.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub key: &'static str,
    /// The default as TOML; `None` for keys without one.
    pub default: Option<toml::Value>,
}

/// Declares every key once: `field: Type = default, key "name", check |v|
/// ...;`. Generates the `Config` fields, the loader and the key table.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident : $ty:ty = $default:expr, key $key:literal $(, check $check:expr)? ;
    )*) => {
        /// The validated configuration; `config.example.toml` documents each key.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $( $(#[doc = $doc])* pub $field: $ty, )*
            /// `[runtimes.NAME]` tables, on top of the built-in runtimes.
            pub runtimes: BTreeMap<String, RuntimeConfig>,
            /// `bind_host`, `allowed_hosts` and `cors_origins`, parsed.
            pub origin_policy: crate::origin_policy::OriginPolicy,
        }

        /// Every key of the file (besides `[runtimes.*]`), with its default.
        pub fn keys() -> Vec<KeyInfo> {
            vec![$( KeyInfo { key: $key, default: Setting::to_toml(&{ let d: $ty = $default; d }) }, )*]
        }

        fn read_settings(src: &Sources<'_>) -> Result<Config, ConfigError> {
            Ok(Config {
                $( $field: {
                    let (value, _blame): ($ty, String) = src.get($key, $default)?;
                    $( let check: fn(&$ty) -> Result<(), String> = $check;
                       check(&value).map_err(|reason| ConfigError::invalid(&_blame, reason))?; )?
                    value
                }, )*
                runtimes: BTreeMap::new(),
                origin_policy: Default::default(),
            })
        }
    };
}

/// `lo..=hi` as a check, saying the range when refused.
fn within<T: PartialOrd + std::fmt::Display + Copy>(
    lo: T,
    hi: T,
) -> impl Fn(&T) -> Result<(), String> {
    move |v| {
        if *v >= lo && *v <= hi {
            Ok(())
        } else {
            Err(format!("must be between {lo} and {hi}"))
        }
    }
}

fn at_least(lo: usize) -> impl Fn(&usize) -> Result<(), String> {
    move |v| {
        if *v >= lo {
            Ok(())
        } else {
            Err(format!("must be at least {lo}"))
        }
    }
}

fn ms_within(lo: u64, hi: u64) -> impl Fn(&Duration) -> Result<(), String> {
    move |d| {
        let ms = d.as_millis();
        if ms >= u128::from(lo) && ms <= u128::from(hi) {
            Ok(())
        } else {
            Err(format!("must be between {lo} and {hi} (milliseconds)"))
        }
    }
}

const MIB: usize = 1024 * 1024;

/// Most warm sandboxes one runtime's pool may keep.
const MAX_POOL_SIZE: usize = 64;

settings! {
    // --- Listening and authentication ---
    /// Address the API binds to.
    bind_host: IpAddr = IpAddr::from([127, 0, 0, 1]), key "bind_host";
    /// API port.
    port: u16 = 8080, key "port", check |p| if *p == 0 { Err("must be 1-65535, not 0".into()) } else { Ok(()) };
    /// Required on every route but health when set.
    admin_token: Option<AdminToken> = None, key "admin_token",
        check |t| if t.as_ref().is_some_and(|t| t.0.trim().is_empty()) { Err("must not be empty".into()) } else { Ok(()) };
    /// Accept a non-loopback `bind_host` without a token.
    allow_insecure_no_token: bool = false, key "allow_insecure_no_token";
    /// Names a request's `Host` may carry besides loopback and a specific
    /// `bind_host`: `sandboxd`, `*.example.com`, or `*` (with a token only).
    allowed_hosts: Vec<String> = Vec::new(), key "allowed_hosts",
        check |v| v.iter().try_for_each(|h| crate::origin_policy::HostPattern::parse(h).map(|_| ()));
    /// Origins whose pages may call the API from a browser (CORS).
    cors_origins: Vec<String> = Vec::new(), key "cors_origins",
        check |v| v.iter().try_for_each(|o| crate::origin_policy::WebOrigin::parse(o).map(|_| ()));
    /// Largest request body, checked before it is buffered.
    max_body_bytes: usize = 64 * MIB, key "max_body_bytes", check |v| at_least(1024)(v);

    // --- Engine and instance ---
    /// Name prefix and `sandboxd.instance` label of every engine object.
    instance: String = "sandboxd".into(), key "instance", check validate_instance;
    /// Engine socket; when set, the only one tried.
    docker_socket: Option<String> = None, key "docker_socket";
    /// The sandboxes' bridge network; default `<instance>-net`.
    network_name: Option<String> = None, key "network_name",
        check |n| n.as_ref().map_or(Ok(()), validate_object_name);

    // --- Sandbox containers ---
    /// Workspace directory inside every sandbox: HOME and the default cwd.
    workspace_dir: String = "/workspace".into(), key "workspace_dir", check validate_dir;
    /// More paths the workspace volume is mounted at (the same files);
    /// default: whichever of `/workspace` and `/vercel/sandbox/workspace`
    /// `workspace_dir` is not.
    workspace_aliases: Option<Vec<String>> = None, key "workspace_aliases",
        check |a| a.iter().flatten().try_for_each(validate_dir);
    /// Runtime image of the built-in runtimes.
    image: String = "sandboxd-runtime:latest".into(), key "image";
    /// Base image the embedded runtime Dockerfile builds on.
    base_image: String = "debian:bookworm-slim".into(), key "base_image";
    /// OCI runtime of runtimes that name none (`runsc`: gVisor).
    oci_runtime: Option<String> = None, key "oci_runtime",
        check |r| if r.as_deref() == Some("") { Err("must not be empty".into()) } else { Ok(()) };
    /// Never build a missing runtime image.
    disable_autobuild: bool = false, key "disable_autobuild";
    /// User (uid:gid) every sandbox process runs as; never root.
    sandbox_user: String = "1000:1000".into(), key "sandbox_user", check validate_user;
    /// Process limit of a sandbox.
    pids_limit: i64 = 512, key "pids_limit", check |v| within(16, 1_000_000)(v);
    /// Size of the /tmp tmpfs in a sandbox.
    tmp_size_mb: u64 = 512, key "tmp_size_mb", check |v| within(1, 65_536)(v);
    /// Size limit of a workspace volume, enforced by the engine; 0: none.
    workspace_size_mb: u64 = 0, key "workspace_size_mb", check |v| within(0, 16 * 1024 * 1024)(v);
    /// Size of a workspace that is a tmpfs of its own (in memory; its
    /// files are gone when its container stops); 0: a volume on disk.
    workspace_tmpfs_mb: u64 = 0, key "workspace_tmpfs_mb", check |v| within(0, 65_536)(v);
    /// Largest file any sandbox process may write (RLIMIT_FSIZE); 0: none.
    file_size_limit_mb: u64 = 1024, key "file_size_limit_mb", check |v| within(0, 16 * 1024 * 1024)(v);
    /// vCPUs of a sandbox whose request names none.
    default_vcpus: u32 = 1, key "default_vcpus", check |v| within(1, 8)(v);
    /// Memory of a sandbox whose request names none.
    default_memory_mb: u32 = 1024, key "default_memory_mb", check |v| within(256, 16_384)(v);

    // --- Capacity and idle expiry ---
    /// Most sandboxes alive at once.
    max_concurrent: usize = 20, key "max_concurrent", check |v| at_least(1)(v);
    /// Warm sandboxes kept ready for new sessions of the `default` runtime.
    pool_size: usize = 2, key "pool_size", check |v| within(0, MAX_POOL_SIZE)(v);
    /// Idle time after which a sandbox without running work is stopped.
    default_idle_ttl: Duration = Duration::from_secs(15 * 60), key "default_idle_ttl_ms",
        check |v| ms_within(10_000, 21_600_000)(v);
    /// Most ports one sandbox may allowlist.
    max_ports: usize = 4, key "max_ports", check |v| within(1, 64)(v);

    // --- Commands ---
    /// Timeout of a command whose request names none.
    default_timeout: Duration = Duration::from_secs(30), key "default_timeout_ms";
    /// Longest timeout a command gets; longer requests are capped to it.
    max_timeout: Duration = Duration::from_secs(30 * 60), key "max_timeout_ms",
        check |v| ms_within(1_000, 86_400_000)(v);
    /// Output one command retains for its readers (a ring).
    output_buffer_bytes: usize = 8 * MIB, key "output_buffer_bytes", check |v| within(64 * 1024, 1 << 30)(v);
    /// Output all commands together may hold.
    output_memory_bytes: usize = 256 * MIB, key "output_memory_bytes";
    /// Time between SIGTERM and SIGKILL when a command is killed or times out.
    kill_grace: Duration = Duration::from_secs(2), key "kill_grace_ms", check |v| ms_within(0, 60_000)(v);
    /// How long a finished command stays listed.
    command_retention: Duration = Duration::from_secs(10 * 60), key "command_retention_ms",
        check |v| ms_within(1_000, 86_400_000)(v);
    /// Most finished commands kept per sandbox.
    max_finished_commands: usize = 100, key "max_finished_commands", check |v| within(1, 10_000)(v);
    /// Most commands running at once in one sandbox.
    max_running_commands: usize = 64, key "max_running_commands", check |v| within(1, 10_000)(v);
    /// Most inotify watches one sandbox's agent holds for `changes` (all
    /// its commands together); past it that sandbox's reports are scans.
    changes_watch_budget: u32 = 8192, key "changes_watch_budget", check |v| within(0, 1_048_576)(v);
    /// How long a request to a sandbox's agent may go unanswered before the
    /// agent counts as stuck (the connection is closed; if it still does
    /// not answer, its sandbox is restarted).
    agent_timeout: Duration = Duration::from_secs(20), key "agent_timeout_ms", check |v| ms_within(1_000, 600_000)(v);
    /// A silent log stream sends a heartbeat this often.
    log_heartbeat: Duration = Duration::from_secs(15), key "log_heartbeat_ms", check |v| ms_within(100, 60_000)(v);

    // --- Files ---
    /// Largest file `files:read` returns.
    max_file_bytes: u64 = 32 * 1024 * 1024, key "max_file_bytes", check |v| within(1, 1 << 32)(v);

    // --- Published ports ---
    /// Host address published sandbox ports bind to.
    publish_host_ip: IpAddr = IpAddr::from([127, 0, 0, 1]), key "publish_host_ip";
    /// Host name in port URLs.
    public_host: Option<String> = None, key "public_host";
    /// Scheme of port URLs.
    public_proto: String = "http".into(), key "public_proto",
        check |p| if p == "http" || p == "https" { Ok(()) } else { Err(format!("{p:?} must be http or https")) };
    /// Image of the port proxy containers; default: `image`.
    proxy_image: Option<String> = None, key "proxy_image";
    /// Where link networks get their blocks.
    link_subnet_pool: String = "10.213.0.0/16".into(), key "link_subnet_pool";

    // --- Egress ---
    /// What `network.mode` `default` (and no mode) means.
    network_default: String = "internet".into(), key "network_default", check validate_network_mode;
    /// The modes a request may name; `open` (the engine's bridge, the host
    /// and private networks included) only when listed here.
    network_modes: Vec<String> = vec!["none".into(), "internet".into(), "allowlist".into()], key "network_modes",
        check |m| m.iter().try_for_each(validate_network_mode);
    /// Domains (`pypi.org`, `*.npmjs.org`) and CIDRs every `allowlist`
    /// sandbox may reach besides its own list.
    egress_allow: Vec<String> = Vec::new(), key "egress_allow",
        check |v| egress_list_fits(v).and_then(|()| v.iter().try_for_each(|e| {
            let cidr = sandboxd_proto::egress::Cidr::parse(e).is_ok();
            let domain = sandboxd_proto::egress::DomainPattern::parse(e).is_ok();
            if cidr || domain { Ok(()) } else { Err(format!("{e:?} is neither a CIDR nor a domain pattern")) }
        }));
    /// CIDRs no sandbox may reach (in every mode but `open`), on top of the
    /// built-in never-list (private, loopback, link-local and the like).
    egress_deny: Vec<String> = Vec::new(), key "egress_deny",
        check |v| egress_list_fits(v).and_then(|()| v.iter().try_for_each(|e| sandboxd_proto::egress::Cidr::parse(e).map(|_| ()).map_err(|_| format!("{e:?} is not a CIDR"))));
    /// Name servers of the egress proxy (IP addresses); default: the
    /// engine's.
    egress_dns: Vec<String> = Vec::new(), key "egress_dns",
        check |d| d.iter().try_for_each(|a| a.parse::<IpAddr>().map(|_| ()).map_err(|_| format!("{a:?} is not an IP address")));
    /// Image of the egress proxy containers; default: `image`.
    egress_image: Option<String> = None, key "egress_image";
}

/// Most entries of `egress_allow` or `egress_deny`: an egress proxy takes
/// at most `MAX_ENTRIES` of each kind, and a sandbox's own allowlist (up
/// to 64) or this machine's addresses come on top.
const MAX_EGRESS_LIST: usize = sandboxd_proto::egress::MAX_ENTRIES / 2;

fn egress_list_fits(list: &[String]) -> Result<(), String> {
    if list.len() > MAX_EGRESS_LIST {
        return Err(format!("{} entries; at most {MAX_EGRESS_LIST}", list.len()));
    }
    Ok(())
}

/// Every network mode there is.
pub const NETWORK_MODES: [&str; 4] = ["none", "internet", "allowlist", "open"];

fn validate_network_mode(m: &String) -> Result<(), String> {
    if NETWORK_MODES.contains(&m.as_str()) {
        Ok(())
    } else {
        Err(format!(
            "{m:?} is not a network mode ({})",
            NETWORK_MODES.join(", ")
        ))
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
        cfg.workspace_dir = trim_dir(&cfg.workspace_dir);
        let aliases = match cfg.workspace_aliases.take() {
            Some(list) => list.iter().map(|d| trim_dir(d)).collect(),
            None => WORKSPACE_SPELLINGS
                .iter()
                .filter(|d| **d != cfg.workspace_dir)
                .map(|d| d.to_string())
                .collect(),
        };
        cfg.workspace_aliases = Some(aliases);
        if cfg.network_name.is_none() {
            cfg.network_name = Some(format!("{}-net", cfg.instance));
        }
        cfg.runtimes = BUILTIN_RUNTIMES
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
        cfg.runtimes.extend(runtimes);
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
        if self.origin_policy.any_host() && self.admin_token.is_none() {
            return Err(ConfigError::invalid(
                "allowed_hosts",
                "\"*\" turns the Host check off, which lets any web page drive a token-less \
                 sandboxd through DNS rebinding; set SANDBOXD_ADMIN_TOKEN too, or list the names",
            ));
        }
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
        let prefix = crate::subnet::link_prefix(self.max_ports);
        if crate::subnet::link_subnet_range(&self.link_subnet_pool, prefix).is_none() {
            return Err(ConfigError::invalid(
                "link_subnet_pool",
                format!(
                    "{:?} must be an IPv4 CIDR from /8 to /{prefix} (one link network is a /{prefix} with max_ports {}), e.g. 10.213.0.0/16",
                    self.link_subnet_pool, self.max_ports
                ),
            ));
        }
        if !self.network_modes.contains(&self.network_default) {
            return Err(ConfigError::invalid(
                "network_default",
                format!(
                    "{:?} must be one of network_modes ({})",
                    self.network_default,
                    self.network_modes.join(", ")
                ),
            ));
        }
        self.validate_workspace_aliases()?;
        self.validate_workspace_volume()?;
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

    /// Aliases are mount points of the workspace volume: none may hold or
    /// be held by another spelling (the volume would appear inside
    /// itself), nor shadow what every sandbox needs.
    fn validate_workspace_aliases(&self) -> Result<(), ConfigError> {
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
    fn validate_workspace_volume(&self) -> Result<(), ConfigError> {
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

    /// The network sandboxes with a network join.
    pub fn network_name(&self) -> &str {
        self.network_name.as_deref().unwrap_or_default()
    }

    /// Every path the workspace volume is mounted at, canonical first.
    pub fn workspace_dirs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.workspace_dir.as_str())
            .chain(self.workspace_aliases.iter().flatten().map(String::as_str))
    }

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

fn validate_instance(v: &String) -> Result<(), String> {
    if v.len() > 40 {
        return Err("must be at most 40 characters".into());
    }
    validate_object_name(v)
}

/// Engine object names: what Docker accepts for containers and networks.
fn validate_object_name(v: &String) -> Result<(), String> {
    let mut chars = v.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && v.len() <= 64 {
        Ok(())
    } else {
        Err(format!(
            "{v:?} must start with a letter or digit and hold only letters, digits, '_', '.', '-' (at most 64)"
        ))
    }
}

fn validate_dir(v: &String) -> Result<(), String> {
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

fn validate_user(v: &String) -> Result<(), String> {
    let (uid, gid) = v
        .split_once(':')
        .map(|(u, g)| (u, Some(g)))
        .unwrap_or((v, None));
    let gid_ok = gid.is_none_or(|g| g.parse::<u32>().is_ok_and(|g| g != 0));
    match uid.parse::<u32>() {
        Ok(uid) if uid != 0 && gid_ok => Ok(()),
        _ => Err(format!(
            "{v:?} must be a numeric non-root uid[:gid], e.g. 1000:1000"
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
        assert_eq!(
            cfg.workspace_dirs().collect::<Vec<_>>(),
            ["/workspace", "/vercel/sandbox/workspace"],
            "RemcoChat's spelling works with no configuration"
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
            ["/vercel/sandbox/workspace", "/workspace"]
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
    fn egress_lists_fit_what_an_egress_proxy_takes() {
        let list = |n: usize| {
            (0..n)
                .map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256))
                .collect::<Vec<_>>()
                .join(",")
        };
        for key in ["egress_deny", "egress_allow"] {
            Config::from_toml_and_env(&format!("{key} = [{}]", list(128)), env_of(&[]))
                .unwrap_or_else(|e| panic!("{key} of 128: {e}"));
            let e = err_of(&format!("{key} = [{}]", list(129)), &[]);
            assert!(e.contains(key) && e.contains("at most 128"), "{e}");
        }
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

    /// config.example.toml documents every key, with its variable and its
    /// default, and nothing else: the two cannot drift.
    #[test]
    fn the_example_file_matches_the_declaration() {
        let text = include_str!("../config.example.toml");
        let blocks: Vec<&str> = text.split("\n\n").collect();
        let mut documented = Vec::new();
        for block in &blocks {
            for line in block.lines() {
                if let Some((key, value)) = line
                    .strip_prefix("# ")
                    .and_then(|l| l.split_once(" = "))
                    .filter(|(k, _)| k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
                {
                    documented.push((key, value, *block));
                }
            }
        }
        // The first mention of a key is its own; `image` and `oci_runtime`
        // come again later, inside the [runtimes.*] example.
        for info in keys() {
            let (_, value, block) = documented
                .iter()
                .find(|(k, _, _)| *k == info.key)
                .unwrap_or_else(|| {
                    panic!("config.example.toml does not show `# {} = …`", info.key)
                });
            let var = env_var(info.key);
            assert!(
                block.contains(&format!("Env: {var}")),
                "the block of {} names no `Env: {var}`",
                info.key
            );
            if let Some(default) = &info.default {
                let shown: toml::Table = toml::from_str(&format!("v = {value}"))
                    .unwrap_or_else(|e| panic!("{}: {value} is not TOML: {e}", info.key));
                assert_eq!(
                    shown.get("v"),
                    Some(default),
                    "config.example.toml shows {} = {value}, the default is {default}",
                    info.key
                );
            }
        }
        let known: Vec<&str> = keys().iter().map(|k| k.key).collect();
        let runtime_keys = ["image", "oci_runtime"];
        for (key, _, _) in &documented {
            assert!(
                known.contains(key) || runtime_keys.contains(key),
                "config.example.toml shows `{key}`, which is no key"
            );
        }
    }
}
