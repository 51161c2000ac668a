//! Every key, declared once in the `settings!` table: its field in
//! [`Config`], type, default, range check and doc line; the table also
//! makes the loader and the list of keys. The checks that concern one key
//! alone are here too.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::ConfigError;
use super::auth::AdminToken;
use super::e2b::validate_template_entries;
use super::network::{egress_list_fits, validate_network_mode};
use super::runtimes::{MAX_POOL_SIZE, RuntimeConfig};
use super::sources::{Setting, Sources};
use super::state::{MAX_TOKEN_TTL_MS, validate_state_dir};
use super::workspace::validate_dir;

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

        pub(super) fn read_settings(src: &Sources<'_>) -> Result<Config, ConfigError> {
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

settings! {
    // --- Listening and authentication ---
    /// Address the API binds to.
    bind_host: IpAddr = IpAddr::from([127, 0, 0, 1]), key "bind_host";
    /// API port.
    port: u16 = 8080, key "port", check |p| if *p == 0 { Err("must be 1-65535, not 0".into()) } else { Ok(()) };
    /// Required on every route but health when set.
    admin_token: Option<AdminToken> = None, key "admin_token",
        check |t| if t.as_ref().is_some_and(|t| t.expose().trim().is_empty()) { Err("must not be empty".into()) } else { Ok(()) };
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
    /// Warm sandboxes kept ready for new sessions of the `default` runtime
    /// at least (the floor; the pool grows above it with demand).
    pool_size: usize = 2, key "pool_size", check |v| within(0, MAX_POOL_SIZE)(v);
    /// Most warm sandboxes of all runtimes together the pool grows to;
    /// `pool_size` floors are kept even above it.
    pool_max: usize = 8, key "pool_max", check |v| within(0, MAX_POOL_SIZE)(v);
    /// Host memory the pool's growth above the floors may take, at 32 MB
    /// per idle member.
    pool_memory_mb: u64 = 512, key "pool_memory_mb", check |v| within(0, 1_048_576)(v);
    /// Half-life of the arrival rate of new sessions the pool follows.
    pool_rate_halflife_secs: u64 = 60, key "pool_rate_halflife_secs", check |v| within(1, 3600)(v);
    /// Link networks kept made ahead for the next cold creates in mode
    /// `internet` (the default), each with a spare port proxy.
    links_ahead: usize = 4, key "links_ahead", check |v| within(0, 32)(v);
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
    /// Most directories one `files:watch` watches (a recursive one watches
    /// each directory below the one named).
    watch_max_dirs: u32 = 4096, key "watch_max_dirs", check |v| within(1, 65_536)(v);
    /// Most events of one `files:watch` waiting to be sent, in the sandbox
    /// and in sandboxd each; past it an `overflow` event replaces the rest.
    watch_queue_events: usize = 4096, key "watch_queue_events", check |v| within(1, 65_536)(v);

    // --- Checkpoints ---
    /// Most checkpoints one sandbox keeps; another is refused (429).
    checkpoint_max_count: usize = 100, key "checkpoint_max_count", check |v| within(1, 10_000)(v);
    /// Most bytes of content one sandbox's checkpoint store holds (each
    /// content once); a checkpoint that would pass it is refused (507).
    checkpoint_max_store_bytes: u64 = 4 << 30, key "checkpoint_max_store_bytes", check |v| within(1 << 20, 1 << 50)(v);
    /// Most entries (files, directories, symlinks) a checkpoint holds.
    checkpoint_max_entries: u32 = 200_000, key "checkpoint_max_entries", check |v| within(1, 10_000_000)(v);

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

    // --- The E2B dialect ---
    /// E2B template names and the runtime each creates, `TEMPLATE=RUNTIME`;
    /// an unknown template is refused.
    e2b_templates: Vec<String> = vec!["base=default".into()], key "e2b_templates",
        check |v| validate_template_entries(v);
    /// The `domain` create and connect answer, from which the SDKs' `get_host(port)`
    /// builds `PORT-ID.DOMAIN`: `NAME[:PORT]`, a name this server serves
    /// (loopback, the bind address or an `allowed_hosts` entry). Empty: the
    /// `Host` the create or connect was sent to.
    e2b_domain: String = String::new(), key "e2b_domain";

    // --- State kept across restarts ---
    /// Directory on the host of what must survive a restart (the session
    /// tokens' hashes); never mounted into a sandbox. Default: see
    /// `state::default_state_dir`.
    state_dir: Option<String> = None, key "state_dir",
        check |d| d.as_deref().map_or(Ok(()), validate_state_dir);
    /// Lifetime of a session token whose request names none.
    session_token_ttl: Duration = Duration::from_secs(3600), key "session_token_ttl_ms",
        check |v| ms_within(1_000, MAX_TOKEN_TTL_MS)(v);
    /// Longest lifetime a session token may be given; longer requests are
    /// refused.
    session_token_max_ttl: Duration = Duration::from_secs(86_400), key "session_token_max_ttl_ms",
        check |v| ms_within(1_000, MAX_TOKEN_TTL_MS)(v);
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
    use crate::config::env_var;

    /// config.example.toml documents every key, with its variable and its
    /// default, and nothing else: the two cannot drift.
    #[test]
    fn the_example_file_matches_the_declaration() {
        let text = include_str!("../../config.example.toml");
        let blocks: Vec<&str> = text.split("\n\n").collect();
        let mut documented = Vec::new();
        for block in &blocks {
            for line in block.lines() {
                if let Some((key, value)) = line
                    .strip_prefix("# ")
                    .and_then(|l| l.split_once(" = "))
                    .filter(|(k, _)| {
                        k.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    })
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
