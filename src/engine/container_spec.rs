//! The hardened container spec, in one function. Every property here is a
//! security decision; the unit test below pins each one, and the integration
//! tests read them back from `docker inspect` and try them from inside.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, HostConfigCgroupnsModeEnum,
    HostConfigLogConfig, Mount, MountType, MountVolumeOptions, NetworkingConfig, PortBinding,
    ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};

/// What the domain asks for when it wants a sandbox container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxContainer {
    pub name: String,
    pub image: String,
    /// OCI runtime registered with the engine (e.g. `runsc`); default if None.
    pub oci_runtime: Option<String>,
    /// Numeric `uid:gid`, never root.
    pub user: String,
    pub workspace_dir: String,
    /// More paths the workspace volume is mounted at: the same files.
    pub workspace_aliases: Vec<String>,
    pub volume: String,
    /// Do not copy the image's content at the workspace path into a new
    /// volume (its owner would come along).
    pub workspace_nocopy: bool,
    /// The volume holding the agent, mounted read-only at `agent_dir`.
    pub agent_volume: String,
    pub agent_dir: String,
    /// The container's process: the agent, under the engine's init.
    pub command: Vec<String>,
    /// Network to join; `None` means no network at all.
    pub network: Option<String>,
    /// Names the container answers to on `network`, besides its own.
    pub network_aliases: Vec<String>,
    /// Variables every process gets, besides HOME and the like.
    pub env: Vec<String>,
    pub vcpus: u32,
    pub memory_mb: u32,
    pub pids_limit: i64,
    pub tmp_size_mb: u64,
    /// RLIMIT_FSIZE of every process, in MiB; 0 leaves it unlimited.
    pub file_size_limit_mb: u64,
    pub labels: HashMap<String, String>,
}

const MIB: i64 = 1024 * 1024;

/// gVisor's kernel (the sentry) runs as host tasks inside the container's
/// pids cgroup: about 200 at rest, and on the ptrace platform several more
/// per guest process. Measured on our machines: 198 idle, +8 per running
/// `bash -lc` command, about 10 per idle process, and a fork bomb held at
/// its 512 processes (by RLIMIT_NPROC, see `ulimits`) peaked at 8,325: past
/// the limit the sentry cannot make a thread and panics, taking the whole
/// sandbox with it. 1024 + 20 per process leaves it room.
const GVISOR_BASE_TASKS: i64 = 1024;
const GVISOR_TASKS_PER_PROCESS: i64 = 20;

/// The engine's pids limit for a sandbox meant to hold `pids` processes.
fn host_pids_limit(pids: i64, under_gvisor: bool) -> i64 {
    if under_gvisor {
        GVISOR_BASE_TASKS.saturating_add(pids.saturating_mul(GVISOR_TASKS_PER_PROCESS))
    } else {
        pids
    }
}

/// Limits every process of a sandbox gets, soft equal to hard so the
/// sandbox user cannot raise them: the file size limit; and under gVisor,
/// its process count. gVisor's kernel does not apply the pids limit inside
/// the sandbox (only to the host tasks that carry it, where a fork bomb
/// would starve gVisor's own kernel of threads); it does apply
/// RLIMIT_NPROC, and counts only the sandbox's processes. (Under runc
/// RLIMIT_NPROC would count the user's processes of every container on the
/// host, so there the pids cgroup does the job alone.)
fn ulimits(spec: &SandboxContainer, under_gvisor: bool) -> Vec<ResourcesUlimits> {
    let mut limits = Vec::new();
    if spec.file_size_limit_mb > 0 {
        let bytes =
            i64::try_from(spec.file_size_limit_mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
        limits.push(ResourcesUlimits {
            name: Some("fsize".into()),
            soft: Some(bytes),
            hard: Some(bytes),
        });
    }
    if under_gvisor {
        limits.push(ResourcesUlimits {
            name: Some("nproc".into()),
            soft: Some(spec.pids_limit),
            hard: Some(spec.pids_limit),
        });
    }
    limits
}

/// What every container sandboxd starts has, sandbox or proxy: a read-only
/// root, no capabilities, no privilege gain (seccomp and AppArmor stay at
/// the engine's defaults), no devices or bind mounts, its own IPC and
/// cgroup namespaces, an init, no IPv6 and no forwarding, and no
/// restarts behind sandboxd's back.
fn hardened(memory: i64, pids: i64, nano_cpus: i64, network: String) -> HostConfig {
    HostConfig {
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(vec![]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        privileged: Some(false),
        pids_limit: Some(pids),
        nano_cpus: Some(nano_cpus),
        memory: Some(memory),
        // Equal to memory: no swap on top, so the limit is the limit.
        memory_swap: Some(memory),
        // An init as PID 1 reaps the orphans processes leave behind.
        init: Some(true),
        binds: Some(vec![]),
        devices: Some(vec![]),
        network_mode: Some(network),
        ipc_mode: Some("private".into()),
        cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
        // Empty means "not the host's": the engine gives each its own.
        pid_mode: Some(String::new()),
        uts_mode: Some(String::new()),
        userns_mode: Some(String::new()),
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::NO),
            maximum_retry_count: None,
        }),
        sysctls: Some(network_sysctls()),
        ..Default::default()
    }
}

/// Kernel network settings of every container: IPv6 off (the networks
/// are IPv4-only; an IPv6 link-local address would still reach the host
/// side of a bridge, which engines from Docker 26 on leave configured),
/// and no forwarding (port and egress proxies sit on two networks and
/// must not route between them; a new network namespace inherits the
/// host's `ip_forward`, which the engine turns on). All three are
/// per-namespace, so the engine allows them without privileges.
pub(crate) fn network_sysctls() -> HashMap<String, String> {
    HashMap::from([
        (
            "net.ipv6.conf.all.disable_ipv6".to_string(),
            "1".to_string(),
        ),
        (
            "net.ipv6.conf.default.disable_ipv6".to_string(),
            "1".to_string(),
        ),
        ("net.ipv4.ip_forward".to_string(), "0".to_string()),
    ])
}

/// The agent's volume, read-only (nothing in the container can replace it
/// on disk).
fn agent_mount(volume: &str, dir: &str) -> Mount {
    Mount {
        target: Some(dir.to_string()),
        source: Some(volume.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(true),
        ..Default::default()
    }
}

/// The engine's memory limit (bytes) and CPU quota (nano-CPUs) for a
/// sandbox of `vcpus` and `memory_mb`.
pub(super) fn cpu_and_memory(vcpus: u32, memory_mb: u32) -> (i64, i64) {
    (i64::from(memory_mb) * MIB, i64::from(vcpus) * 1_000_000_000)
}

/// The engine request for a sandbox container. `under_gvisor`: its OCI
/// runtime is gVisor's runsc (the engine knows, see `Engine::is_gvisor`).
pub fn sandbox_container_body(spec: &SandboxContainer, under_gvisor: bool) -> ContainerCreateBody {
    let (memory, nano_cpus) = cpu_and_memory(spec.vcpus, spec.memory_mb);
    let tmp_bytes = spec.tmp_size_mb.saturating_mul(1024 * 1024);
    let host_config = HostConfig {
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,noexec,nosuid,nodev,size={tmp_bytes},mode=1777"),
        )])),
        // One volume, mounted at each spelling of the workspace; and the
        // agent, read-only (the sandbox user cannot replace it on disk).
        mounts: Some(
            std::iter::once(&spec.workspace_dir)
                .chain(&spec.workspace_aliases)
                .map(|target| Mount {
                    target: Some(target.clone()),
                    source: Some(spec.volume.clone()),
                    typ: Some(MountType::VOLUME),
                    read_only: Some(false),
                    volume_options: spec.workspace_nocopy.then(|| MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .chain(std::iter::once(agent_mount(
                    &spec.agent_volume,
                    &spec.agent_dir,
                )))
                .collect(),
        ),
        runtime: spec.oci_runtime.clone(),
        // Its init's output is the agent's connection to sandboxd (see
        // `open_stdin`): never written to the engine host's disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        // Soft equals hard: the sandbox user cannot raise it again.
        ulimits: Some(ulimits(spec, under_gvisor)).filter(|u| !u.is_empty()),
        ..hardened(
            memory,
            host_pids_limit(spec.pids_limit, under_gvisor),
            nano_cpus,
            spec.network.clone().unwrap_or_else(|| "none".into()),
        )
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: Some(spec.user.clone()),
        working_dir: Some(spec.workspace_dir.clone()),
        hostname: Some("sandbox".into()),
        env: Some(
            [
                format!("HOME={}", spec.workspace_dir),
                "GIT_DISCOVERY_ACROSS_FILESYSTEM=1".into(),
            ]
            .into_iter()
            .chain(spec.env.iter().cloned())
            .collect(),
        ),
        networking_config: match &spec.network {
            Some(network) if !spec.network_aliases.is_empty() => Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    network.clone(),
                    EndpointSettings {
                        aliases: Some(spec.network_aliases.clone()),
                        ..Default::default()
                    },
                )])),
            }),
            _ => None,
        },
        // The agent: everything in the sandbox runs under it.
        cmd: Some(spec.command.clone()),
        entrypoint: Some(vec![]),
        labels: Some(spec.labels.clone()),
        tty: Some(false),
        // The agent's stdio is sandboxd's first connection to it (attached
        // at create, no exec needed); the engine closes the input when
        // sandboxd detaches, so the agent sees that connection end.
        open_stdin: Some(true),
        stdin_once: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// A container made only to read or write files through the archive API
/// (which refuses a read-only root): it holds `volume` at `target`, if
/// any, is never started, and is otherwise as hardened as the rest.
pub(crate) fn scratch_body(
    volume: Option<(&str, &str)>,
    image: &str,
    labels: HashMap<String, String>,
) -> ContainerCreateBody {
    let host_config = HostConfig {
        mounts: Some(
            volume
                .map(|(volume, target)| Mount {
                    target: Some(target.to_string()),
                    source: Some(volume.to_string()),
                    typ: Some(MountType::VOLUME),
                    read_only: Some(false),
                    volume_options: Some(MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
        ),
        readonly_rootfs: Some(false),
        ..hardened(64 * MIB, 16, 100_000_000, "none".into())
    };
    ContainerCreateBody {
        image: Some(image.to_string()),
        user: Some("65534:65534".into()),
        cmd: Some(vec!["true".into()]),
        entrypoint: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// What the domain asks for when it wants a port proxy: a socat that
/// listens on `listen_port`, published on `publish_ip` at a random host
/// port, and forwards to `target_host:target_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyContainer {
    pub name: String,
    pub image: String,
    pub user: String,
    /// The network the port is published on (the instance network: a link
    /// network has no way to the host, so no published port either).
    pub network: String,
    /// The sandbox's link network, where the proxy reaches the sandbox.
    pub link_network: String,
    pub publish_ip: String,
    pub listen_port: u16,
    pub target_host: String,
    pub target_port: u16,
    pub labels: HashMap<String, String>,
}

/// Limits of a proxy: it only shuffles bytes.
const PROXY_MEMORY: i64 = 64 * MIB;
const PROXY_PIDS: i64 = 64;

/// What a proxy prints once it accepts connections (socat's notice at
/// `-d -d`): a started container is not yet a listening one, and a
/// connection in between is refused.
pub(crate) const PROXY_LISTENING: &str = "listening on";

/// The engine's log of a container: its own file format whatever the
/// daemon's default (sandboxd reads a proxy's back), and small, on the
/// engine host's disk: a proxy notes every connection, and a sandbox's
/// log takes whatever its processes write to its init's output.
fn bounded_log() -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".into()),
        config: Some(HashMap::from([
            ("max-size".to_string(), "1m".to_string()),
            ("max-file".to_string(), "1".to_string()),
        ])),
    }
}

/// The engine request for a proxy container: hardened like a sandbox.
pub(crate) fn proxy_container_body(spec: &ProxyContainer) -> ContainerCreateBody {
    let port_key = format!("{}/tcp", spec.listen_port);
    let host_config = HostConfig {
        port_bindings: Some(HashMap::from([(
            port_key.clone(),
            Some(vec![PortBinding {
                host_ip: Some(spec.publish_ip.clone()),
                host_port: Some(String::new()),
            }]),
        )])),
        log_config: Some(bounded_log()),
        ..hardened(PROXY_MEMORY, PROXY_PIDS, 500_000_000, spec.network.clone())
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: Some(spec.user.clone()),
        working_dir: Some("/".into()),
        cmd: Some(vec![
            "socat".into(),
            "-d".into(),
            "-d".into(),
            format!("TCP-LISTEN:{},fork,reuseaddr", spec.listen_port),
            format!("TCP:{}:{}", spec.target_host, spec.target_port),
        ]),
        exposed_ports: Some(vec![port_key]),
        labels: Some(spec.labels.clone()),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// What the domain asks for when it wants an egress proxy: the agent's
/// `egress` role on the instance network (its way out), joined to link
/// networks afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressContainer {
    pub name: String,
    pub image: String,
    pub user: String,
    /// The network it reaches the internet through.
    pub network: String,
    pub agent_volume: String,
    pub agent_dir: String,
    pub command: Vec<String>,
    /// Name servers; empty: the engine's.
    pub dns: Vec<String>,
    pub labels: HashMap<String, String>,
}

/// Limits of an egress proxy: it carries every sandbox's downloads.
const EGRESS_MEMORY: i64 = 384 * MIB;
const EGRESS_PIDS: i64 = 128;
/// Descriptors the egress proxy may hold: it serves at most 2048
/// connections of two sockets each (`MAX_CONNECTIONS` in the agent's
/// `egress.rs`), plus a socket per lookup under way (64 at most) and a
/// few of its own; twice that is room to spare. Soft equal to hard, and
/// stated rather than left to the engine's default (which varies with
/// the host's systemd, 1024 on some).
const EGRESS_NOFILE: i64 = 8192;
const _: () = assert!(EGRESS_NOFILE >= 2 * 2048 + 64 + 16);

/// The engine request for an egress proxy: hardened like the rest, and
/// restarted by the engine if it crashes (it holds no state, and every
/// sandbox of its networks depends on it).
pub(crate) fn egress_container_body(spec: &EgressContainer) -> ContainerCreateBody {
    let host_config = HostConfig {
        mounts: Some(vec![agent_mount(&spec.agent_volume, &spec.agent_dir)]),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".into()),
            soft: Some(EGRESS_NOFILE),
            hard: Some(EGRESS_NOFILE),
        }]),
        dns: Some(spec.dns.clone()).filter(|d| !d.is_empty()),
        log_config: Some(bounded_log()),
        // A crash is retried by the engine a few times (CIS 5.14 allows
        // no more); anything else sandboxd notices and replaces it.
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::ON_FAILURE),
            maximum_retry_count: Some(5),
        }),
        ..hardened(
            EGRESS_MEMORY,
            EGRESS_PIDS,
            1_000_000_000,
            spec.network.clone(),
        )
    };
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        user: Some(spec.user.clone()),
        working_dir: Some("/".into()),
        cmd: Some(spec.command.clone()),
        entrypoint: Some(vec![]),
        labels: Some(spec.labels.clone()),
        host_config: Some(host_config),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxContainer {
        SandboxContainer {
            name: "inst-abc".into(),
            image: "sandboxd-runtime:latest".into(),
            oci_runtime: None,
            user: "1000:1000".into(),
            workspace_dir: "/workspace".into(),
            workspace_aliases: vec!["/vercel/sandbox/workspace".into()],
            agent_volume: "inst-agent-0123".into(),
            agent_dir: "/.sandboxd".into(),
            command: vec![
                "/.sandboxd/sandboxd-agent".into(),
                "serve".into(),
                "--stdio".into(),
            ],
            volume: "inst-abc-workspace".into(),
            workspace_nocopy: false,
            network: Some("inst-net".into()),
            network_aliases: vec!["sandbox-link".into()],
            env: vec!["HTTP_PROXY=http://10.213.0.14:3128".into()],
            vcpus: 2,
            memory_mb: 512,
            pids_limit: 512,
            tmp_size_mb: 64,
            file_size_limit_mb: 8,
            labels: HashMap::from([("sandboxd.instance".into(), "inst".into())]),
        }
    }

    #[test]
    fn hardening_properties() {
        let body = sandbox_container_body(&spec(), false);
        let hc = body.host_config.clone().expect("host config");
        let log = hc.log_config.clone().expect("log config");
        assert_eq!(
            log.typ.as_deref(),
            Some("none"),
            "the agent's stream is never logged"
        );
        assert_eq!((body.open_stdin, body.stdin_once), (Some(true), Some(true)));
        assert_eq!(body.tty, Some(false), "no terminal: no detach keys");
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, Some(vec![]));
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges:true".to_string()])
        );
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.pids_limit, Some(512));
        assert_eq!(hc.nano_cpus, Some(2_000_000_000));
        assert_eq!(hc.memory, Some(512 * MIB));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.init, Some(true));
        let tmp = hc.tmpfs.expect("tmpfs").remove("/tmp").expect("/tmp");
        for opt in ["rw", "noexec", "nosuid", "nodev", "size=67108864"] {
            assert!(tmp.split(',').any(|o| o == opt), "{opt} in {tmp}");
        }
        let mounts = hc.mounts.expect("mounts");
        let targets: Vec<_> = mounts.iter().map(|m| m.target.as_deref()).collect();
        assert_eq!(
            targets,
            [
                Some("/workspace"),
                Some("/vercel/sandbox/workspace"),
                Some("/.sandboxd")
            ],
            "the workspace volume at each spelling, then the agent"
        );
        for m in &mounts[..2] {
            assert_eq!(m.typ, Some(MountType::VOLUME));
            assert_eq!(m.source.as_deref(), Some("inst-abc-workspace"));
            assert_eq!(m.read_only, Some(false));
        }
        assert_eq!(mounts[2].source.as_deref(), Some("inst-agent-0123"));
        assert_eq!(
            mounts[2].read_only,
            Some(true),
            "the agent cannot be replaced"
        );
        assert_eq!(hc.binds, Some(vec![]));
        assert_eq!(hc.devices, Some(vec![]));
        assert_eq!(hc.network_mode.as_deref(), Some("inst-net"));
        assert_eq!(hc.pid_mode.as_deref(), Some(""));
        assert_eq!(hc.ipc_mode.as_deref(), Some("private"));
        assert_eq!(
            hc.restart_policy.and_then(|r| r.name),
            Some(RestartPolicyNameEnum::NO)
        );
        assert_eq!(hc.runtime, None);
        let fsize = hc.ulimits.expect("ulimits");
        assert_eq!(fsize.len(), 1);
        assert_eq!(fsize[0].name.as_deref(), Some("fsize"));
        assert_eq!(fsize[0].soft, Some(8 * MIB));
        assert_eq!(fsize[0].hard, fsize[0].soft);
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        let env = body.env.expect("env");
        assert!(env.contains(&"HOME=/workspace".to_string()));
        assert!(env.contains(&"GIT_DISCOVERY_ACROSS_FILESYSTEM=1".to_string()));
        assert!(env.contains(&"HTTP_PROXY=http://10.213.0.14:3128".to_string()));
        let endpoints = body
            .networking_config
            .and_then(|n| n.endpoints_config)
            .expect("endpoints");
        assert_eq!(
            endpoints["inst-net"].aliases,
            Some(vec!["sandbox-link".to_string()])
        );
    }

    #[test]
    fn gvisor_sandboxes_get_host_tasks_for_their_kernel() {
        let runc = sandbox_container_body(&spec(), false);
        assert_eq!(
            runc.host_config.as_ref().and_then(|h| h.pids_limit),
            Some(512)
        );
        let gvisor = sandbox_container_body(
            &SandboxContainer {
                oci_runtime: Some("runsc".into()),
                ..spec()
            },
            true,
        );
        let hc = gvisor.host_config.expect("host config");
        assert_eq!(hc.runtime.as_deref(), Some("runsc"));
        assert_eq!(hc.pids_limit, Some(1024 + 512 * 20));
        let nproc: Vec<_> = hc
            .ulimits
            .unwrap_or_default()
            .into_iter()
            .filter(|u| u.name.as_deref() == Some("nproc"))
            .collect();
        assert_eq!(
            nproc.len(),
            1,
            "gVisor counts the sandbox's processes itself"
        );
        assert_eq!((nproc[0].soft, nproc[0].hard), (Some(512), Some(512)));
        let runc_limits = runc.host_config.and_then(|h| h.ulimits).unwrap_or_default();
        assert!(
            runc_limits
                .iter()
                .all(|u| u.name.as_deref() != Some("nproc")),
            "under runc RLIMIT_NPROC would count every container's processes"
        );
    }

    #[test]
    fn a_zero_file_size_limit_sets_no_ulimit() {
        let body = sandbox_container_body(
            &SandboxContainer {
                file_size_limit_mb: 0,
                ..spec()
            },
            false,
        );
        assert_eq!(body.host_config.expect("host config").ulimits, None);
    }

    #[test]
    fn proxy_is_hardened_and_published_on_the_host_ip() {
        let body = proxy_container_body(&ProxyContainer {
            name: "inst-abc-port-3000".into(),
            image: "sandboxd-runtime:latest".into(),
            user: "1000:1000".into(),
            network: "inst-net".into(),
            link_network: "inst-abc-link".into(),
            publish_ip: "127.0.0.1".into(),
            listen_port: 8080,
            target_host: "inst-abc".into(),
            target_port: 52152,
            labels: HashMap::new(),
        });
        let hc = body.host_config.expect("host config");
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges:true".to_string()])
        );
        assert_eq!(hc.privileged, Some(false));
        assert!(hc.memory.is_some_and(|m| m <= 64 * MIB));
        assert!(hc.pids_limit.is_some_and(|p| p <= 64));
        let bindings = hc.port_bindings.expect("bindings");
        let b = bindings["8080/tcp"].clone().expect("binding");
        assert_eq!(b[0].host_ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(b[0].host_port.as_deref(), Some(""), "a random host port");
        let log = hc.log_config.expect("log config");
        assert_eq!(log.typ.as_deref(), Some("json-file"), "readable back");
        assert!(log.config.expect("log options").contains_key("max-size"));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(
            body.cmd,
            Some(vec![
                "socat".into(),
                "-d".into(),
                "-d".into(),
                "TCP-LISTEN:8080,fork,reuseaddr".into(),
                "TCP:inst-abc:52152".into()
            ])
        );
    }

    #[test]
    fn egress_is_hardened_restarts_and_logs_readably() {
        let body = egress_container_body(&EgressContainer {
            name: "inst-egress".into(),
            image: "sandboxd-runtime:latest".into(),
            user: "1000:1000".into(),
            network: "inst-net".into(),
            agent_volume: "inst-agent-0123".into(),
            agent_dir: "/.sandboxd".into(),
            command: vec!["/.sandboxd/sandboxd-agent".into(), "egress".into()],
            dns: vec!["203.0.113.53".into()],
            labels: HashMap::new(),
        });
        let hc = body.host_config.expect("host config");
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges:true".to_string()])
        );
        assert_eq!(hc.network_mode.as_deref(), Some("inst-net"));
        assert_eq!(hc.dns, Some(vec!["203.0.113.53".to_string()]));
        let restart = hc.restart_policy.expect("restart policy");
        assert_eq!(
            (restart.name, restart.maximum_retry_count),
            (Some(RestartPolicyNameEnum::ON_FAILURE), Some(5)),
            "a crash is retried, within CIS 5.14"
        );
        assert_eq!(hc.sysctls, Some(network_sysctls()));
        let mounts = hc.mounts.expect("mounts");
        assert_eq!(mounts.len(), 1, "the agent only");
        assert_eq!(mounts[0].read_only, Some(true));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
    }

    #[test]
    fn no_network_means_none_and_runtime_passes_through() {
        let body = sandbox_container_body(
            &SandboxContainer {
                network: None,
                oci_runtime: Some("runsc".into()),
                ..spec()
            },
            true,
        );
        let hc = body.host_config.expect("host config");
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn the_egress_proxy_has_descriptors_for_its_connections() {
        let body = egress_container_body(&EgressContainer {
            name: "inst-egress".into(),
            image: "sandboxd-runtime:latest".into(),
            user: "1000:1000".into(),
            network: "inst-net".into(),
            agent_volume: "inst-agent-0123".into(),
            agent_dir: "/.sandboxd".into(),
            command: vec!["/.sandboxd/sandboxd-agent".into(), "egress".into()],
            dns: Vec::new(),
            labels: HashMap::new(),
        });
        let hc = body.host_config.expect("host config");
        assert_eq!(
            hc.ulimits,
            Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(8192),
                hard: Some(8192),
            }])
        );
        // The agent's limits were sized against these two (its
        // MAX_CONNECTIONS and LOOKUP_THREADS): a change here is one there.
        assert_eq!(hc.pids_limit, Some(128), "sized for 64 lookup threads");
        assert_eq!(hc.memory, Some(384 * MIB), "sized for 2048 connections");
    }
}
