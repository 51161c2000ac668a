//! The rehydration contract: everything sandboxd must know about a sandbox to
//! rebuild its state after a restart is written as labels on its container
//! (and volume) at create time, and read back by [`decode`]. The round trip is
//! unit-tested; changing a key here breaks adoption of existing sandboxes.
//!
//! A warm pool member is made before any session asks for it, so its
//! container's labels ([`encode_member`]) name no session, and labels never
//! change after create. When a session claims it, sandboxd writes the
//! session's record on a claim volume of its own ([`encode_claim`]): an
//! engine object no sandbox can reach (it is mounted nowhere), made before
//! the create answers. [`decode_member`] reads a member back from both, and
//! only from both: what a sandbox writes (its workspace, /tmp, its agent's
//! answers) never decides which session a sandbox belongs to.

use std::collections::{BTreeSet, HashMap};

use super::environment::{self, Environment};
use super::metadata::{self, Metadata};
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
/// Each metadata pair is a label: this prefix and its key.
const METADATA_PREFIX: &str = "sandboxd.metadata.";
/// Each variable of its environment is a label: this prefix and its name.
const ENV_PREFIX: &str = "sandboxd.env.";

/// On a warm pool member's container and volume: its record names no
/// session; a claim volume says whose it is.
pub const POOL: &str = "sandboxd.pool";

/// `sandboxd.role` of a claim volume.
pub const ROLE_CLAIM: &str = "claim";
/// `sandboxd.role` of a sandbox container and its volume.
pub const ROLE_SANDBOX: &str = "sandbox";
/// `sandboxd.role` of a port proxy container.
pub const ROLE_PROXY: &str = "proxy";
/// `sandboxd.role` of a link network (a sandbox, its port proxies and its
/// egress proxy).
pub const ROLE_LINK: &str = "link";
/// `sandboxd.role` of an egress proxy container.
pub const ROLE_EGRESS: &str = "egress";
/// Label on proxies made for a port: the sandbox port they publish. A
/// spare proxy is made before its port is known, and labels never change:
/// once it is a port's proxy, its name says the port (see `port_proxy`).
pub const PORT: &str = "sandboxd.port";
/// Label on proxies: the port inside the sandbox they forward to, where
/// the agent's relay listens.
pub const RELAY_PORT: &str = "sandboxd.relay_port";
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
    /// What its creator gave it (see `metadata`).
    pub metadata: Metadata,
    /// Its processes' variables (see `environment`).
    pub env: Environment,
}

/// Labels for a sandbox's container and volume.
pub fn encode(instance: &str, r: &SandboxRecord) -> HashMap<String, String> {
    let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
    let mut labels = HashMap::from([
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
    ]);
    labels.extend(
        r.metadata
            .iter()
            .map(|(k, v)| (format!("{METADATA_PREFIX}{k}"), v.clone())),
    );
    labels.extend(
        r.env
            .iter()
            .map(|(k, v)| (format!("{ENV_PREFIX}{k}"), v.clone())),
    );
    labels
}

/// The metadata labels read back, checked as a request's are.
fn decode_metadata(labels: &HashMap<String, String>) -> Result<Metadata, String> {
    let found: Metadata = labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(METADATA_PREFIX)?.to_string(), v.clone())))
        .collect();
    metadata::parse(Some(found)).map_err(|e| format!("label {METADATA_PREFIX}…: {}", e.message))
}

/// The environment labels read back, checked as a request's are.
fn decode_env(labels: &HashMap<String, String>) -> Result<Environment, String> {
    let found: Environment = labels
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(ENV_PREFIX)?.to_string(), v.clone())))
        .collect();
    environment::parse(Some(found)).map_err(|e| format!("label {ENV_PREFIX}…: {}", e.message))
}

/// Labels of a warm pool member's container and volume: `r` with an empty
/// session key, marked as a member.
pub fn encode_member(instance: &str, r: &SandboxRecord) -> HashMap<String, String> {
    let mut labels = encode(instance, r);
    labels.insert(POOL.into(), "member".into());
    labels
}

/// Whether a sandbox container was made as a pool member.
pub fn is_member(labels: &HashMap<String, String>) -> bool {
    labels.contains_key(POOL)
}

/// Labels of the claim volume of a member claimed for session `r`.
pub fn encode_claim(instance: &str, r: &SandboxRecord) -> HashMap<String, String> {
    let mut labels = encode(instance, r);
    labels.insert(ROLE.into(), ROLE_CLAIM.into());
    labels
}

/// A claimed member's record: the session's record from its claim volume,
/// which must be of the same sandbox as the container (its runtime name may
/// differ: runtimes that share an image and OCI runtime share members). A
/// member without a claim was never handed out.
pub fn decode_member(
    container: &HashMap<String, String>,
    claim: Option<&HashMap<String, String>>,
) -> Result<SandboxRecord, String> {
    let member = decode(container)?;
    let claim = claim.ok_or("a pool member that no session claimed")?;
    if claim.get(ROLE).map(String::as_str) != Some(ROLE_CLAIM) {
        return Err("its claim volume is not labelled as a claim".into());
    }
    let record = decode(claim)?;
    if record.id != member.id {
        return Err(format!(
            "its claim is of sandbox {:?}, not of this one",
            record.id
        ));
    }
    if record.session_key.is_empty() {
        return Err("its claim names no session".into());
    }
    Ok(record)
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
        // Absent on sandboxes made before metadata: none.
        metadata: decode_metadata(labels)?,
        // Absent on sandboxes made before environments: none.
        env: decode_env(labels)?,
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
            metadata: Metadata::from([
                ("user-id".into(), "42".into()),
                (
                    "purpose".into(),
                    "a value, with commas = and ünïcode".into(),
                ),
            ]),
            env: Environment::from([
                ("API_KEY".into(), "k=v, with ünïcode".into()),
                ("EMPTY".into(), String::new()),
            ]),
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
            metadata: Metadata::new(),
            env: Environment::new(),
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
    fn a_member_is_whoever_its_claim_names_and_only_that() {
        let member = SandboxRecord {
            session_key: String::new(),
            ..record()
        };
        let container = encode_member("inst", &member);
        assert!(is_member(&container));
        assert!(!is_member(&encode("inst", &record())));
        let claim = encode_claim("inst", &record());
        assert_eq!(decode_member(&container, Some(&claim)), Ok(record()));
        assert!(
            decode_member(&container, None)
                .unwrap_err()
                .contains("no session claimed")
        );
        // A claim of another sandbox, or something else labelled with this
        // id, does not count.
        let other = encode_claim(
            "inst",
            &SandboxRecord {
                id: "ffffffffffffffffffffffff".into(),
                ..record()
            },
        );
        assert!(decode_member(&container, Some(&other)).is_err());
        let workspace = encode("inst", &record());
        assert!(decode_member(&container, Some(&workspace)).is_err());
        let keyless = encode_claim("inst", &member);
        assert!(decode_member(&container, Some(&keyless)).is_err());
    }

    #[test]
    fn damaged_labels_are_reported() {
        let mut labels = encode("inst", &record());
        labels.insert(PORTS.into(), "3000,x".into());
        assert!(decode(&labels).unwrap_err().contains(PORTS));
        labels.insert(PORTS.into(), "3000".into());
        labels.remove(SESSION_KEY);
        assert!(decode(&labels).unwrap_err().contains(SESSION_KEY));
        let mut labels = encode("inst", &record());
        labels.insert(format!("{METADATA_PREFIX}bad key"), "v".into());
        assert!(decode(&labels).unwrap_err().contains(METADATA_PREFIX));
        let mut labels = encode("inst", &record());
        labels.insert(format!("{ENV_PREFIX}1BAD"), "v".into());
        assert!(decode(&labels).unwrap_err().contains(ENV_PREFIX));
    }

    /// A claim carries its session's metadata and environment; a member
    /// has none of its own.
    #[test]
    fn metadata_travels_with_the_claim() {
        let member = SandboxRecord {
            session_key: String::new(),
            metadata: Metadata::new(),
            env: Environment::new(),
            ..record()
        };
        let claimed = decode_member(
            &encode_member("inst", &member),
            Some(&encode_claim("inst", &record())),
        )
        .expect("claimed");
        assert_eq!(claimed.metadata, record().metadata);
        assert_eq!(claimed.env, record().env);
    }
}
