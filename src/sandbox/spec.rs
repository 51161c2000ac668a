//! A create request, parsed and validated into a [`SandboxSpec`] before any
//! engine call: out-of-range values are refused by field name, never clamped.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::config::Config;
use crate::field_error::FieldError;

/// Inclusive bounds from the API contract.
const IDLE_TTL_MS: (u64, u64) = (10_000, 21_600_000);
const VCPUS: (u32, u32) = (1, 8);
const MEMORY_MB: (u32, u32) = (256, 16_384);
const SESSION_KEY_MAX_CHARS: usize = 256;

/// `POST /v1/sandboxes` as the client sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub session_key: String,
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub idle_ttl_ms: Option<i64>,
    #[serde(default)]
    pub resources: Option<ResourcesRequest>,
    #[serde(default)]
    pub network: Option<NetworkRequest>,
    #[serde(default)]
    pub ports: Option<Vec<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesRequest {
    #[serde(default)]
    pub vcpus: Option<i64>,
    #[serde(default)]
    pub memory_mb: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    #[serde(default)]
    pub mode: Option<String>,
}

/// CPU and memory of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub vcpus: u32,
    pub memory_mb: u32,
}

/// Whether a sandbox has a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// The instance's bridge network, outbound allowed, no container-to-container.
    Default,
    /// Loopback only.
    None,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Default => "default",
            NetworkMode::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(NetworkMode::Default),
            "none" => Some(NetworkMode::None),
            _ => None,
        }
    }
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
    pub ports: BTreeSet<u16>,
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

impl SandboxSpec {
    /// Validates `req` against the contract and `config`.
    pub fn parse(req: CreateSandboxRequest, config: &Config) -> Result<SandboxSpec, FieldError> {
        let chars = req.session_key.chars().count();
        if chars == 0 || chars > SESSION_KEY_MAX_CHARS {
            return Err(bad(
                "sessionKey",
                format!("must be 1 to {SESSION_KEY_MAX_CHARS} characters (got {chars})"),
            ));
        }
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
        let network = match req.network.and_then(|n| n.mode) {
            None => NetworkMode::Default,
            Some(m) => NetworkMode::parse(&m).ok_or_else(|| {
                bad(
                    "network.mode",
                    format!("must be default or none (got {m:?})"),
                )
            })?,
        };
        let ports = parse_ports(req.ports.unwrap_or_default(), config.max_ports)?;
        Ok(SandboxSpec {
            session_key: req.session_key,
            runtime,
            image,
            oci_runtime,
            idle_ttl_ms,
            resources,
            network,
            ports,
        })
    }
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
        assert_eq!(s.network, NetworkMode::Default);
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
