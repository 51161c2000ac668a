//! The rehydration contract: everything sandboxd must know about a sandbox to
//! rebuild its state after a restart is written as labels on its container
//! (and volume) at create time, and read back by [`decode`]. The round trip is
//! unit-tested; changing a key here breaks adoption of existing sandboxes.

use std::collections::{BTreeSet, HashMap};

use super::spec::{NetworkMode, Resources};

pub const INSTANCE: &str = "sandboxd.instance";
pub const ROLE: &str = "sandboxd.role";
pub const SANDBOX_ID: &str = "sandboxd.sandbox_id";
pub const SESSION_KEY: &str = "sandboxd.session_key";
pub const RUNTIME: &str = "sandboxd.runtime";
/// The agent version a sandbox container runs, and an agent volume holds.
pub const AGENT: &str = "sandboxd.agent";
const CREATED_AT: &str = "sandboxd.created_at";
const IDLE_TTL_MS: &str = "sandboxd.idle_ttl_ms";
const VCPUS: &str = "sandboxd.vcpus";
const MEMORY_MB: &str = "sandboxd.memory_mb";
const NETWORK: &str = "sandboxd.network";
const PORTS: &str = "sandboxd.ports";
/// Mode `allowlist`: the request's entries, comma-separated (neither a
/// domain pattern nor a CIDR holds a comma).
const ALLOW: &str = "sandboxd.egress.allow";

/// `sandboxd.role` of a sandbox container and its volume.
pub const ROLE_SANDBOX: &str = "sandbox";
/// `sandboxd.role` of a port proxy container.
pub const ROLE_PROXY: &str = "proxy";
/// `sandboxd.role` of a link network (a sandbox, its port proxies and its
/// egress proxy).
pub const ROLE_LINK: &str = "link";
/// `sandboxd.role` of an egress proxy container.
pub const ROLE_EGRESS: &str = "egress";
/// Label on proxies: the sandbox port they publish.
pub const PORT: &str = "sandboxd.port";
/// Label on egress proxies: a fingerprint of what they were started with
/// (command line with the policy, name servers, image); one that differs
/// from what sandboxd would start now is replaced.
pub const EGRESS_POLICY: &str = "sandboxd.egress.policy";

/// Whether a network's labels mark it as a link network.
pub fn is_link_network(labels: &HashMap<String, String>) -> bool {
    labels.get(ROLE).map(String::as_str) == Some(ROLE_LINK)
}

/// What the labels of a sandbox carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: String,
    pub session_key: String,
    pub runtime: String,
    pub created_at: u64,
    pub idle_ttl_ms: u64,
    pub resources: Resources,
    pub network: NetworkMode,
    /// Mode `allowlist`: what the request allowed (canonical entries).
    pub allow: Vec<String>,
    pub ports: BTreeSet<u16>,
}

/// Labels for a sandbox's container and volume.
pub fn encode(instance: &str, r: &SandboxRecord) -> HashMap<String, String> {
    let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
    HashMap::from([
        (INSTANCE.into(), instance.into()),
        (ROLE.into(), ROLE_SANDBOX.into()),
        (SANDBOX_ID.into(), r.id.clone()),
        (SESSION_KEY.into(), r.session_key.clone()),
        (RUNTIME.into(), r.runtime.clone()),
        (CREATED_AT.into(), r.created_at.to_string()),
        (IDLE_TTL_MS.into(), r.idle_ttl_ms.to_string()),
        (VCPUS.into(), r.resources.vcpus.to_string()),
        (MEMORY_MB.into(), r.resources.memory_mb.to_string()),
        (NETWORK.into(), r.network.as_str().into()),
        (PORTS.into(), ports.join(",")),
        (ALLOW.into(), r.allow.join(",")),
    ])
}

/// Labels every object of this instance carries (networks included).
pub fn instance_only(instance: &str) -> HashMap<String, String> {
    HashMap::from([(INSTANCE.into(), instance.into())])
}

/// Reads a sandbox back from its container's labels.
pub fn decode(labels: &HashMap<String, String>) -> Result<SandboxRecord, String> {
    let get = |k: &str| {
        labels
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| format!("label {k} is missing"))
    };
    fn num<T: std::str::FromStr>(k: &str, v: &str) -> Result<T, String> {
        v.parse()
            .map_err(|_| format!("label {k}={v:?} is not a number"))
    }
    let ports_raw = get(PORTS)?;
    let ports = if ports_raw.is_empty() {
        BTreeSet::new()
    } else {
        ports_raw
            .split(',')
            .map(|p| num::<u16>(PORTS, p))
            .collect::<Result<_, _>>()?
    };
    Ok(SandboxRecord {
        id: get(SANDBOX_ID)?.to_string(),
        session_key: get(SESSION_KEY)?.to_string(),
        runtime: get(RUNTIME)?.to_string(),
        created_at: num(CREATED_AT, get(CREATED_AT)?)?,
        idle_ttl_ms: num(IDLE_TTL_MS, get(IDLE_TTL_MS)?)?,
        resources: Resources {
            vcpus: num(VCPUS, get(VCPUS)?)?,
            memory_mb: num(MEMORY_MB, get(MEMORY_MB)?)?,
        },
        network: match get(NETWORK)? {
            // Before egress policies, `default` was the instance's bridge.
            "default" => NetworkMode::Open,
            m => {
                NetworkMode::parse(m).ok_or_else(|| format!("label {NETWORK}={m:?} is no mode"))?
            }
        },
        // Absent on sandboxes made before egress policies: nothing.
        allow: match labels.get(ALLOW).map(String::as_str) {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .take(super::spec::MAX_ALLOW_ENTRIES)
                .map(|e| {
                    super::spec::parse_allow_entry(e).map_err(|m| format!("label {ALLOW}: {m}"))
                })
                .collect::<Result<_, _>>()?,
        },
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SandboxRecord {
        SandboxRecord {
            id: "0123456789abcdef01234567".into(),
            session_key: "chat:42 with spaces, commas; and ünïcode".into(),
            runtime: "node24".into(),
            created_at: 1_700_000_000_123,
            idle_ttl_ms: 900_000,
            resources: Resources {
                vcpus: 2,
                memory_mb: 2048,
            },
            network: NetworkMode::Allowlist,
            allow: vec![
                "pypi.org".into(),
                "*.npmjs.org".into(),
                "203.0.113.0/24".into(),
            ],
            ports: BTreeSet::from([3000, 8080]),
        }
    }

    #[test]
    fn round_trip() {
        let labels = encode("inst", &record());
        assert_eq!(labels[INSTANCE], "inst");
        assert_eq!(labels[ROLE], ROLE_SANDBOX);
        assert_eq!(decode(&labels), Ok(record()));
        let no_ports = SandboxRecord {
            ports: BTreeSet::new(),
            network: NetworkMode::None,
            allow: Vec::new(),
            ..record()
        };
        assert_eq!(decode(&encode("inst", &no_ports)), Ok(no_ports.clone()));
        // A sandbox from before egress policies: `default` was the bridge.
        let mut old = encode("inst", &no_ports);
        old.insert(NETWORK.into(), "default".into());
        old.remove(ALLOW);
        assert_eq!(decode(&old).map(|r| r.network), Ok(NetworkMode::Open));
    }

    #[test]
    fn damaged_labels_are_reported() {
        let mut labels = encode("inst", &record());
        labels.insert(PORTS.into(), "3000,x".into());
        assert!(decode(&labels).unwrap_err().contains(PORTS));
        labels.insert(PORTS.into(), "3000".into());
        labels.remove(SESSION_KEY);
        assert!(decode(&labels).unwrap_err().contains(SESSION_KEY));
    }
}
