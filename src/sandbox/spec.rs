//! A create request, parsed and validated into a [`SandboxSpec`] before any
//! engine call: out-of-range values are refused by field name, never clamped.

use std::collections::BTreeSet;

use serde::Deserialize;
use utoipa::ToSchema;

use crate::config::Config;
use crate::field_error::FieldError;

/// Inclusive bounds from the API contract.
const IDLE_TTL_MS: (u64, u64) = (10_000, 21_600_000);
const VCPUS: (u32, u32) = (1, 8);
const MEMORY_MB: (u32, u32) = (256, 16_384);
const SESSION_KEY_MAX_CHARS: usize = 256;

/// `POST /v1/sandboxes` as the client sends it. Only `sessionKey` is
/// required; ranges are checked by the domain, which names the field.
// Named `CreateSandbox` in the OpenAPI document, as it always was.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateSandbox)]
pub struct CreateSandboxRequest {
    /// 1–256 characters; one sandbox per session key.
    pub session_key: String,
    /// A configured runtime name (`default`, `node24`, `python3.13`, …).
    #[serde(default)]
    pub runtime: Option<String>,
    /// 10000–21600000.
    #[serde(default)]
    pub idle_ttl_ms: Option<i64>,
    #[serde(default)]
    pub resources: Option<ResourcesRequest>,
    #[serde(default)]
    pub network: Option<NetworkRequest>,
    /// Ports to allow (each 1–65535, at most `max_ports`).
    #[serde(default)]
    pub ports: Option<Vec<i64>>,
    /// String pairs kept with the sandbox and shown with it (at most 32;
    /// keys 1–64 bytes of `A–Z a–z 0–9 . _ -`, values at most 1024 bytes).
    /// Ignored when the session already has its sandbox.
    #[serde(default)]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    /// Variables every process started in the sandbox gets, under its own
    /// `env` (which wins for a name both give): at most 64, names of
    /// `A–Z a–z 0–9 _` not starting with a digit, 32 KiB of names and
    /// values in all. Kept with the sandbox, never shown. Ignored when the
    /// session already has its sandbox.
    #[serde(default)]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Start the workspace as a checkpoint of another sandbox (a fork),
    /// for a session that has no sandbox yet.
    // Taken out by `App` before the sandbox layer parses the request.
    #[serde(default)]
    pub from: Option<ForkSource>,
}

/// `from` of a create: the checkpoint a fork's workspace starts as.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateFrom)]
pub struct ForkSource {
    pub sandbox_id: String,
    pub checkpoint_id: String,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = CreateResources)]
pub struct ResourcesRequest {
    /// 1–8.
    #[serde(default)]
    pub vcpus: Option<i64>,
    /// 256–16384.
    #[serde(default)]
    pub memory_mb: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateNetwork)]
pub struct NetworkRequest {
    /// `default` (the server's `network_default`, out of the box
    /// `internet`), `none`, `internet`, `allowlist`, or `open` where the
    /// server enables it (`network_modes`).
    #[serde(default)]
    pub mode: Option<String>,
    /// Mode `allowlist` only: at most 64 domains (`pypi.org`,
    /// `*.npmjs.org`: any subdomain) and CIDRs (`203.0.113.0/24`, or one
    /// address) the sandbox may reach.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
}

/// CPU and memory of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub vcpus: u32,
    pub memory_mb: u32,
}

/// What a sandbox's network reaches (see `sandbox::egress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// Loopback only.
    None,
    /// The public internet through the egress proxy; never the host,
    /// private or link-local addresses, or other sandboxes.
    Internet,
    /// Only the listed domains and CIDRs, through the egress proxy, with
    /// the never-list of `Internet` on top.
    Allowlist,
    /// The instance's bridge network: whatever the engine's bridge reaches
    /// (the host and private networks included); no traffic between
    /// sandboxes. Only when the operator lists it in `network_modes`.
    Open,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Internet => "internet",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Open => "open",
        }
    }

    /// A mode's name; `default` is the request's word for the configured
    /// default and is resolved by [`SandboxSpec::parse`], not here.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(NetworkMode::None),
            "internet" => Some(NetworkMode::Internet),
            "allowlist" => Some(NetworkMode::Allowlist),
            "open" => Some(NetworkMode::Open),
            _ => None,
        }
    }

    /// Whether the sandbox sits on a network of its own with the egress
    /// proxy as its only way out.
    pub fn through_egress(self) -> bool {
        matches!(self, NetworkMode::Internet | NetworkMode::Allowlist)
    }
}

/// Most entries a request's `network.allow` may list.
pub const MAX_ALLOW_ENTRIES: usize = 64;

/// One `network.allow` entry: a CIDR (or bare address) or a domain
/// pattern, in canonical text; refused with the reason otherwise.
pub fn parse_allow_entry(entry: &str) -> Result<String, String> {
    if let Ok(cidr) = sandboxd_proto::egress::Cidr::parse(entry) {
        return Ok(cidr.to_string());
    }
    sandboxd_proto::egress::DomainPattern::parse(entry)
        .map(|d| d.to_string())
        .map_err(|e| format!("{entry:?} is neither a CIDR nor a domain pattern: {e}"))
}

/// A validated create request with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    pub session_key: String,
    pub runtime: String,
    pub image: String,
    pub oci_runtime: Option<String>,
    /// `None` when the request did not say, so a reconnect keeps its TTL.
    pub idle_ttl_ms: Option<u64>,
    pub resources: Resources,
    pub network: NetworkMode,
    /// Mode `allowlist`: the request's entries, canonical (see
    /// [`parse_allow_entry`]).
    pub allow: Vec<String>,
    pub ports: BTreeSet<u16>,
    pub metadata: super::metadata::Metadata,
    pub env: super::environment::Environment,
}

fn bad(field: &str, message: impl Into<String>) -> FieldError {
    FieldError::new(field, message)
}

fn in_range<T>(field: &str, v: i64, (lo, hi): (T, T)) -> Result<T, FieldError>
where
    T: TryFrom<i64> + PartialOrd + std::fmt::Display + Copy,
{
    T::try_from(v)
        .ok()
        .filter(|x| *x >= lo && *x <= hi)
        .ok_or_else(|| bad(field, format!("must be between {lo} and {hi} (got {v})")))
}

/// The rule of a `sessionKey` wherever one is given (the create body, a
/// path): 1 to 256 characters, counted as characters, not bytes.
pub fn check_session_key(key: &str) -> Result<(), FieldError> {
    let chars = key.chars().count();
    if chars == 0 || chars > SESSION_KEY_MAX_CHARS {
        return Err(bad(
            "sessionKey",
            format!("must be 1 to {SESSION_KEY_MAX_CHARS} characters (got {chars})"),
        ));
    }
    Ok(())
}

impl SandboxSpec {
    /// Validates `req` against the contract and `config`.
    pub fn parse(req: CreateSandboxRequest, config: &Config) -> Result<SandboxSpec, FieldError> {
        check_session_key(&req.session_key)?;
        let runtime = req.runtime.unwrap_or_else(|| "default".into());
        let (image, oci_runtime) = config.runtime(&runtime).ok_or_else(|| {
            let known: Vec<&str> = config.runtimes.keys().map(String::as_str).collect();
            bad(
                "runtime",
                format!("unknown runtime {runtime:?}; known: {}", known.join(", ")),
            )
        })?;
        let idle_ttl_ms = req
            .idle_ttl_ms
            .map(|v| in_range("idleTtlMs", v, IDLE_TTL_MS))
            .transpose()?;
        let res = req.resources.unwrap_or(ResourcesRequest {
            vcpus: None,
            memory_mb: None,
        });
        let resources = Resources {
            vcpus: match res.vcpus {
                Some(v) => in_range("resources.vcpus", v, VCPUS)?,
                None => config.default_vcpus,
            },
            memory_mb: match res.memory_mb {
                Some(v) => in_range("resources.memoryMb", v, MEMORY_MB)?,
                None => config.default_memory_mb,
            },
        };
        let (network, allow) = parse_network(req.network, config)?;
        let ports = parse_ports(req.ports.unwrap_or_default(), config.max_ports)?;
        let metadata = super::metadata::parse(req.metadata)?;
        let env = super::environment::parse(req.env)?;
        Ok(SandboxSpec {
            session_key: req.session_key,
            runtime,
            image,
            oci_runtime,
            idle_ttl_ms,
            resources,
            network,
            allow,
            ports,
            metadata,
            env,
        })
    }
}

/// `network`: the mode (`default` or none given: the configured default;
/// any other must be one the configuration lets requests name) and, for
/// `allowlist`, its entries.
fn parse_network(
    req: Option<NetworkRequest>,
    config: &Config,
) -> Result<(NetworkMode, Vec<String>), FieldError> {
    let (mode, allow) = req.map_or((None, None), |n| (n.mode, n.allow));
    let name = match mode.as_deref() {
        None | Some("default") => config.network_default.as_str(),
        Some(m) => m,
    };
    let network = NetworkMode::parse(name).ok_or_else(|| {
        bad(
            "network.mode",
            format!(
                "must be default or one of {} (got {name:?})",
                crate::config::NETWORK_MODES.join(", ")
            ),
        )
    })?;
    if !config.network_modes.iter().any(|m| m == name) {
        return Err(bad(
            "network.mode",
            format!(
                "{name:?} is not enabled on this server (enabled: default, {})",
                config.network_modes.join(", ")
            ),
        ));
    }
    let allow = allow.unwrap_or_default();
    if !allow.is_empty() && network != NetworkMode::Allowlist {
        return Err(bad(
            "network.allow",
            format!("applies to mode allowlist only (the mode is {name})"),
        ));
    }
    if allow.len() > MAX_ALLOW_ENTRIES {
        return Err(bad(
            "network.allow",
            format!("at most {MAX_ALLOW_ENTRIES} entries (got {})", allow.len()),
        ));
    }
    let allow = allow
        .iter()
        .enumerate()
        .map(|(i, e)| parse_allow_entry(e).map_err(|m| bad(&format!("network.allow[{i}]"), m)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((network, allow))
}

/// Ports 1-65535, duplicates folded, at most `max`.
pub fn parse_ports(ports: Vec<i64>, max: usize) -> Result<BTreeSet<u16>, FieldError> {
    let mut out = BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let port = u16::try_from(*p)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| bad(&format!("ports[{i}]"), format!("must be 1-65535 (got {p})")))?;
        out.insert(port);
    }
    if out.len() > max {
        return Err(bad(
            "ports",
            format!("at most {max} ports per sandbox (got {})", out.len()),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml_and_env("", |_| None).expect("defaults")
    }

    fn req(json: &str) -> CreateSandboxRequest {
        serde_json::from_str(json).expect("json")
    }

    fn field_of(json: &str) -> String {
        SandboxSpec::parse(req(json), &config())
            .expect_err("should be refused")
            .field
    }

    #[test]
    fn minimal_request_gets_defaults() {
        let s = SandboxSpec::parse(req(r#"{"sessionKey":"k"}"#), &config()).expect("ok");
        assert_eq!(s.runtime, "default");
        assert_eq!(s.image, "sandboxd-runtime:latest");
        assert_eq!(s.idle_ttl_ms, None);
        assert_eq!(
            s.resources,
            Resources {
                vcpus: 1,
                memory_mb: 1024
            }
        );
        assert_eq!(s.network, NetworkMode::Internet, "default is internet");
        assert!(s.ports.is_empty());
    }

    #[test]
    fn full_compat_request() {
        let s = SandboxSpec::parse(
            req(r#"{"sessionKey":"chat:42","runtime":"node24","idleTtlMs":900000,
                "resources":{"vcpus":2,"memoryMb":2048},"network":{"mode":"none"},"ports":[3000,3000,8080]}"#),
            &config(),
        )
        .expect("ok");
        assert_eq!(s.runtime, "node24");
        assert_eq!(s.idle_ttl_ms, Some(900_000));
        assert_eq!(
            s.resources,
            Resources {
                vcpus: 2,
                memory_mb: 2048
            }
        );
        assert_eq!(s.network, NetworkMode::None);
        assert_eq!(s.ports, BTreeSet::from([3000, 8080]));
    }

    #[test]
    fn out_of_range_names_the_field() {
        assert_eq!(field_of(r#"{"sessionKey":""}"#), "sessionKey");
        let long = "x".repeat(257);
        assert_eq!(
            field_of(&format!(r#"{{"sessionKey":"{long}"}}"#)),
            "sessionKey"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","runtime":"ruby"}"#),
            "runtime"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","idleTtlMs":9999}"#),
            "idleTtlMs"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","idleTtlMs":21600001}"#),
            "idleTtlMs"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","resources":{"vcpus":0}}"#),
            "resources.vcpus"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","resources":{"vcpus":9}}"#),
            "resources.vcpus"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","resources":{"memoryMb":255}}"#),
            "resources.memoryMb"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","network":{"mode":"host"}}"#),
            "network.mode"
        );
        assert_eq!(field_of(r#"{"sessionKey":"k","ports":[0]}"#), "ports[0]");
        assert_eq!(
            field_of(r#"{"sessionKey":"k","ports":[80,65536]}"#),
            "ports[1]"
        );
        assert_eq!(
            field_of(r#"{"sessionKey":"k","ports":[1,2,3,4,5]}"#),
            "ports"
        );
    }

    #[test]
    fn network_modes_follow_the_configuration() {
        let mode = |json: &str, cfg: &Config| {
            SandboxSpec::parse(req(json), cfg).map(|s| (s.network, s.allow))
        };
        let cfg = config();
        for (m, want) in [
            ("default", NetworkMode::Internet),
            ("internet", NetworkMode::Internet),
            ("none", NetworkMode::None),
            ("allowlist", NetworkMode::Allowlist),
        ] {
            let json = format!(r#"{{"sessionKey":"k","network":{{"mode":"{m}"}}}}"#);
            assert_eq!(mode(&json, &cfg).expect(m).0, want);
        }
        let open = r#"{"sessionKey":"k","network":{"mode":"open"}}"#;
        let e = mode(open, &cfg).expect_err("open is off by default");
        assert_eq!(e.field, "network.mode");
        assert!(e.message.contains("not enabled"), "{e}");
        let cfg_open = Config::from_toml_and_env(
            "network_modes = [\"none\", \"internet\", \"open\"]\nnetwork_default = \"open\"",
            |_| None,
        )
        .expect("open enabled");
        assert_eq!(mode(open, &cfg_open).expect("open").0, NetworkMode::Open);
        assert_eq!(
            mode(r#"{"sessionKey":"k"}"#, &cfg_open).expect("default").0,
            NetworkMode::Open
        );
        let (m, allow) = mode(
            r#"{"sessionKey":"k","network":{"mode":"allowlist","allow":["PyPI.org.","*.npmjs.org","203.0.113.0/24","198.51.100.7"]}}"#,
            &cfg,
        )
        .expect("allowlist");
        assert_eq!(m, NetworkMode::Allowlist);
        assert_eq!(
            allow,
            [
                "pypi.org",
                "*.npmjs.org",
                "203.0.113.0/24",
                "198.51.100.7/32"
            ]
        );
        for (json, field) in [
            (
                r#"{"sessionKey":"k","network":{"mode":"internet","allow":["pypi.org"]}}"#,
                "network.allow",
            ),
            (
                r#"{"sessionKey":"k","network":{"mode":"allowlist","allow":["pypi.org","a b"]}}"#,
                "network.allow[1]",
            ),
            (
                r#"{"sessionKey":"k","network":{"mode":"allowlist","allow":["*"]}}"#,
                "network.allow[0]",
            ),
            (
                r#"{"sessionKey":"k","network":{"mode":"allowlist","allow":["10.0.0.0/33"]}}"#,
                "network.allow[0]",
            ),
        ] {
            assert_eq!(mode(json, &cfg).expect_err(json).field, field, "{json}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("\"h{i}.example.com\"")).collect();
        let json = format!(
            r#"{{"sessionKey":"k","network":{{"mode":"allowlist","allow":[{}]}}}}"#,
            many.join(",")
        );
        assert_eq!(
            mode(&json, &cfg).expect_err("too many").field,
            "network.allow"
        );
    }

    #[test]
    fn session_key_counts_characters_not_bytes() {
        let key = "ü".repeat(256);
        SandboxSpec::parse(req(&format!(r#"{{"sessionKey":"{key}"}}"#)), &config())
            .expect("256 chars ok");
    }

    #[test]
    fn unknown_runtime_lists_known_ones() {
        let e =
            SandboxSpec::parse(req(r#"{"sessionKey":"k","runtime":"x"}"#), &config()).unwrap_err();
        assert!(
            e.message.contains("node24") && e.message.contains("python3.13"),
            "{e}"
        );
    }
}
