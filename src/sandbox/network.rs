//! A sandbox's networks and its way out. Modes `internet` and `allowlist`
//! put a sandbox on a link network of its own from the start: an internal
//! bridge whose gateway address is never assigned, so nothing on it
//! reaches the host, the engine's other networks or the internet. On it
//! are the sandbox, its port proxies (see `ports`) and an egress proxy,
//! the one way out: the agent binary's `egress` role, an HTTP proxy that
//! resolves each destination, checks every address against the
//! never-list (private, loopback, link-local and the like; see
//! `sandboxd_proto::egress`) and the sandbox's allowlist, and connects to
//! the address it checked. Every process of the sandbox gets
//! `HTTP(S)_PROXY` pointing at it, so pip, npm and curl work as they
//! are; a program that ignores them has no route to go around it.
//!
//! `internet` sandboxes share one egress container (joined to each of
//! their link networks at a fixed address); an `allowlist` sandbox gets
//! its own, its policy on its command line. Refusals are printed by the
//! proxy; [`Sandboxes::watch_egress`] counts and logs them with the
//! sandbox's id, and replaces a proxy that is gone. Mode `open` keeps the instance's bridge network (and
//! gets a link network only when a port is published).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sandboxd_proto::egress::{Allowlist, Cidr, DomainPattern, EgressPolicy};
use tokio_util::sync::CancellationToken;

use super::agent_delivery::{AGENT_DIR, AGENT_PATH, AGENT_VERSION, agent_volume};
use super::registry::Sandbox;
use super::spec::NetworkMode;
use super::{SandboxError, SandboxResult, Sandboxes, labels};
use crate::engine::{ContainerStatus, EgressContainer, EngineError};
use crate::subnet;

/// The sandbox's DNS name on its link network. The container name resolves
/// on the instance network too, where inter-container traffic is off; this
/// alias exists only on the link network.
pub const LINK_ALIAS: &str = "sandbox-link";
/// The port the egress proxy listens on.
pub const EGRESS_PORT: u16 = 3128;
/// What the egress proxy prints (on stderr) once it accepts connections.
const EGRESS_LISTENING: &str = "egress listening";
/// How long a started egress proxy may take to listen.
const EGRESS_START: Duration = Duration::from_secs(10);
/// How often the denial watch looks for new egress containers; a
/// follower reads a container's log from sandboxd's start, so a late look
/// delays a count, never loses one.
const WATCH_TICK: Duration = Duration::from_secs(2);
/// Longest refusal line read; anything longer is not the proxy's.
const MAX_DENIAL_LINE: usize = 1024;

/// Engine name of a sandbox's link network.
pub fn link_name(instance: &str, sandbox_id: &str) -> String {
    format!("{instance}-{sandbox_id}-link")
}

/// Engine name of the egress proxy `internet` sandboxes share.
pub fn shared_egress_name(instance: &str) -> String {
    format!("{instance}-egress")
}

/// Engine name of an `allowlist` sandbox's own egress proxy.
pub fn own_egress_name(instance: &str, sandbox_id: &str) -> String {
    format!("{instance}-{sandbox_id}-egress")
}

/// The egress proxy's address on a link network: the block's last host
/// (the engine hands out addresses from the bottom: gateway, sandbox,
/// proxies).
pub fn egress_address(subnet: &str) -> Option<Ipv4Addr> {
    let (base, bits) = subnet.split_once('/')?;
    let base = u32::from(base.parse::<Ipv4Addr>().ok()?);
    let bits: u32 = bits.parse().ok().filter(|b| (8..=29).contains(b))?;
    let size = 1u32 << (32 - bits);
    Some(Ipv4Addr::from((base & !(size - 1)) + size - 2))
}

/// What every process of a sandbox behind `egress` gets: the proxy in
/// both spellings each tool reads, loopback left direct.
pub fn proxy_env(egress: Ipv4Addr) -> Vec<String> {
    let url = format!("http://{egress}:{EGRESS_PORT}");
    let direct = "localhost,127.0.0.1,::1";
    vec![
        format!("HTTP_PROXY={url}"),
        format!("HTTPS_PROXY={url}"),
        format!("http_proxy={url}"),
        format!("https_proxy={url}"),
        format!("NO_PROXY={direct}"),
        format!("no_proxy={direct}"),
        // Node's fetch reads the variables only when asked to.
        "NODE_USE_ENV_PROXY=1".into(),
    ]
}

/// One refusal line of an egress proxy: `egress-denied <client> <dest> <reason>`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Denial {
    pub client: IpAddr,
    pub destination: String,
    pub reason: String,
}

/// Refusals past a proxy's line budget for one client (it prints at most
/// a burst, then a few a second, per client), as its summary line says:
/// `egress-denied-suppressed <client> <count>`. Counted, not logged one
/// by one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Suppressed {
    pub client: IpAddr,
    pub count: u64,
}

impl Suppressed {
    /// Parses a summary line; untrusted like every line of the proxy.
    pub(crate) fn parse(line: &str) -> Option<Suppressed> {
        let (client, mut parts) = proxy_line(line, "egress-denied-suppressed")?;
        let count = parts.next()?;
        // One proxy cannot refuse more than this in a second.
        let count = count
            .parse::<u64>()
            .ok()
            .filter(|c| (1..=1_000_000).contains(c))?;
        if parts.next().is_some() {
            return None;
        }
        Some(Suppressed { client, count })
    }
}

impl Denial {
    /// Parses a line the proxy printed. The proxy handles what sandboxes
    /// send, so its lines are read as untrusted: bounded, every field
    /// checked, anything else ignored.
    pub(crate) fn parse(line: &str) -> Option<Denial> {
        let (client, mut parts) = proxy_line(line, "egress-denied")?;
        let destination = parts.next()?;
        let reason = parts.next()?;
        let printable = |s: &str, extra: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || extra.contains(c))
        };
        if parts.next().is_some() || !printable(destination, ":[]*?") || !printable(reason, "") {
            return None;
        }
        Some(Denial {
            client,
            destination: destination.to_string(),
            reason: reason.to_string(),
        })
    }
}

/// A proxy line within bounds that starts with `tag` and a client
/// address: the address, and the fields after it.
fn proxy_line<'a>(line: &'a str, tag: &str) -> Option<(IpAddr, std::str::Split<'a, char>)> {
    if line.len() > MAX_DENIAL_LINE {
        return None;
    }
    let mut parts = line.trim_end().split(' ');
    if parts.next()? != tag {
        return None;
    }
    let client = parts.next()?.parse().ok()?;
    Some((client, parts))
}

/// The addresses of the machine sandboxd runs on, as far as it can see
/// them (on the engine host: all of them; in a container: its own), from
/// the kernel's tables. The never-list covers private ones; these cover a
/// host with a public address, whose services the egress proxy would
/// otherwise reach.
fn own_addresses() -> Vec<IpAddr> {
    let v4 = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
    let mut all = local_ipv4(&v4);
    all.extend(local_ipv6(&v6));
    all.sort();
    all.dedup();
    all
}

/// The addresses `/proc/net/fib_trie` lists as this host's (`/32 host
/// LOCAL` under the address).
fn local_ipv4(fib_trie: &str) -> Vec<IpAddr> {
    let mut last: Option<IpAddr> = None;
    let mut out = Vec::new();
    for line in fib_trie.lines() {
        let t = line.trim_start();
        if let Some(addr) = t.strip_prefix("|-- ") {
            last = addr.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL") {
            out.extend(last);
        }
    }
    out
}

/// The addresses `/proc/net/if_inet6` lists (32 hex digits first).
fn local_ipv6(if_inet6: &str) -> Vec<IpAddr> {
    if_inet6
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|hex| {
            u128::from_str_radix(hex, 16)
                .ok()
                .filter(|_| hex.len() == 32)
        })
        .map(|v| IpAddr::V6(std::net::Ipv6Addr::from(v)))
        .collect()
}

/// A new sandbox's link network as its launch finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Link {
    /// Made already (ahead, or because no block was free): its subnet.
    Made(String),
    /// A free block, whose network is made beside the sandbox's volume
    /// and container: the engine creates a container on a network that
    /// does not exist yet and joins it at the start, so a cold create
    /// waits for the longer of the two rather than both in turn.
    Planned(String),
}

impl Link {
    /// The block: the subnet the network has or is made with.
    pub(super) fn subnet(&self) -> &str {
        match self {
            Link::Made(subnet) | Link::Planned(subnet) => subnet,
        }
    }
}

impl Sandboxes {
    /// The subnet of sandbox `id`'s link network: found by label, or made
    /// with a free block of `link_subnet_pool`. When no block is free,
    /// blocks held by link networks of removed sandboxes are given back
    /// first (their teardowns are finished), then the block of the link
    /// network made ahead for the next sandbox.
    pub async fn link_network(&self, sandbox_id: &str) -> SandboxResult<String> {
        match self.make_link_network(sandbox_id).await {
            Err(SandboxError::NoLinkBlock { .. }) => {}
            other => return other,
        }
        self.finish_teardowns().await;
        match self.make_link_network(sandbox_id).await {
            Err(e @ SandboxError::NoLinkBlock { .. }) => {
                match self.take_link_for_its_block().await {
                    Some(spare) => {
                        self.release_link(&spare.id).await;
                        self.make_link_network(sandbox_id).await
                    }
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// `link_network` without giving the prepared one's block back.
    pub(super) async fn make_link_network(&self, sandbox_id: &str) -> SandboxResult<String> {
        if let Some(subnet) = self.existing_link_subnet(sandbox_id).await? {
            return Ok(subnet);
        }
        for subnet in self.free_link_blocks(sandbox_id).await? {
            if let Some(made) = self.make_link_at(sandbox_id, &subnet).await? {
                return Ok(made);
            }
        }
        Err(SandboxError::NoLinkBlock {
            prefix: subnet::link_prefix(self.config.max_ports),
            pool: self.config.link_subnet_pool.clone(),
        })
    }

    /// The link network a new sandbox `id` of `mode` gets: the one made
    /// ahead (`prepared`, its subnet), else a free block whose network is
    /// made beside the sandbox's container (see [`Link`]); when no block
    /// is free, one is made now (see `link_network`, which gives blocks
    /// back). `None` for a mode without one from the start.
    pub(super) async fn plan_link(
        &self,
        sandbox_id: &str,
        mode: NetworkMode,
        prepared: Option<&str>,
    ) -> SandboxResult<Option<Link>> {
        if let Some(subnet) = prepared {
            return Ok(Some(Link::Made(subnet.to_string())));
        }
        if !mode.through_egress() {
            return Ok(None);
        }
        Ok(Some(
            match self.free_link_blocks(sandbox_id).await?.next() {
                Some(subnet) => Link::Planned(subnet),
                None => Link::Made(self.link_network(sandbox_id).await?),
            },
        ))
    }

    /// Makes a planned link network (a made one is left as it is); the
    /// subnet it has: another block than planned when that one was taken
    /// meanwhile (by another sandboxd on the engine, or a create that
    /// started from the same free block).
    pub(super) async fn make_planned_link(
        &self,
        sandbox_id: &str,
        link: Option<&Link>,
    ) -> SandboxResult<Option<String>> {
        let subnet = match link {
            None => return Ok(None),
            Some(Link::Made(subnet)) => subnet.clone(),
            Some(Link::Planned(subnet)) => match self.make_link_at(sandbox_id, subnet).await? {
                Some(made) => made,
                None => self.link_network(sandbox_id).await?,
            },
        };
        Ok(Some(subnet))
    }

    /// The blocks of `link_subnet_pool` that no link network on the
    /// engine holds, in the order sandbox `sandbox_id` tries them.
    async fn free_link_blocks(
        &self,
        sandbox_id: &str,
    ) -> SandboxResult<impl Iterator<Item = String> + use<>> {
        // Subnets in use by any sandboxd on this engine (reading others'
        // networks is fine; we never change them).
        let used: HashSet<String> = self
            .engine
            .list_networks(&[(labels::ROLE, labels::ROLE_LINK)])
            .await?
            .into_iter()
            .flat_map(|n| n.subnets)
            .collect();
        let prefix = subnet::link_prefix(self.config.max_ports);
        let Some(range) = subnet::link_subnet_range(&self.config.link_subnet_pool, prefix) else {
            return Err(
                EngineError::Failed("link_subnet_pool is not a usable range".into()).into(),
            );
        };
        // Start where the sandbox id points, so concurrent creates rarely
        // try the same block.
        let offset = u32::from_str_radix(sandbox_id.get(..6).unwrap_or("0"), 16).unwrap_or(0);
        Ok((0..range.2)
            .map(move |i| subnet::link_subnet(range, offset.wrapping_add(i)))
            .filter(move |subnet| !used.contains(subnet)))
    }

    /// Makes sandbox `sandbox_id`'s link network on block `subnet`; its
    /// subnet, or `None` when another network took the block meanwhile.
    async fn make_link_at(&self, sandbox_id: &str, subnet: &str) -> SandboxResult<Option<String>> {
        let name = link_name(&self.config.instance, sandbox_id);
        let mut labels = labels::instance_only(&self.config.instance);
        labels.insert(labels::SANDBOX_ID.into(), sandbox_id.to_string());
        labels.insert(labels::ROLE.into(), labels::ROLE_LINK.into());
        let Some(allocated) = subnet::allocation_range(subnet) else {
            return Err(EngineError::Failed(format!("link subnet {subnet} has no room")).into());
        };
        match self
            .engine
            .create_isolated_network(&name, labels, subnet, &allocated)
            .await
        {
            Ok(()) => Ok(Some(subnet.to_string())),
            // Taken meanwhile: the next block.
            Err(EngineError::Conflict(m)) if m.contains("overlap") => Ok(None),
            // The network exists (made by a request that raced us).
            Err(EngineError::Conflict(_)) => self
                .existing_link_subnet(sandbox_id)
                .await?
                .map(Some)
                .ok_or_else(|| {
                    EngineError::Failed(format!("link network {name} has no subnet")).into()
                }),
            Err(e) => Err(e.into()),
        }
    }

    async fn existing_link_subnet(&self, sandbox_id: &str) -> SandboxResult<Option<String>> {
        Ok(self
            .engine
            .list_networks(&[
                (labels::INSTANCE, &self.config.instance),
                (labels::SANDBOX_ID, sandbox_id),
                (labels::ROLE, labels::ROLE_LINK),
            ])
            .await?
            .into_iter()
            .find_map(|n| n.subnets.into_iter().next()))
    }

    /// The policy a sandbox's egress proxy enforces: the never-list and
    /// `egress_deny` always (with the link pool: sandboxes' own networks
    /// are never a destination, whatever range the pool is; and every
    /// address of this machine sandboxd can see), and for
    /// `allowlist` the configured entries plus the sandbox's own.
    fn egress_policy(&self, mode: NetworkMode, allow: &[String]) -> EgressPolicy {
        let deny = self
            .config
            .egress_deny
            .iter()
            .chain(std::iter::once(&self.config.link_subnet_pool))
            .filter_map(|c| Cidr::parse(c).ok())
            .chain(
                own_addresses()
                    .into_iter()
                    .filter(|a| sandboxd_proto::egress::never_reason(*a).is_none())
                    .filter_map(|a| Cidr::parse(&a.to_string()).ok()),
            )
            .collect();
        let allowlist = (mode == NetworkMode::Allowlist).then(|| {
            let entries = self.config.egress_allow.iter().chain(allow);
            let mut list = Allowlist {
                domains: Vec::new(),
                cidrs: Vec::new(),
            };
            for e in entries {
                if let Ok(c) = Cidr::parse(e) {
                    list.cidrs.push(c);
                } else if let Ok(d) = DomainPattern::parse(e) {
                    list.domains.push(d);
                }
            }
            list
        });
        EgressPolicy { allowlist, deny }
    }

    /// The egress container sandboxd would start now, labelled with a
    /// fingerprint of what decides its behaviour.
    fn egress_spec(
        &self,
        name: String,
        mut labels: HashMap<String, String>,
        policy: &EgressPolicy,
    ) -> EgressContainer {
        let command: Vec<String> = [
            AGENT_PATH.to_string(),
            "egress".into(),
            "--listen".into(),
            EGRESS_PORT.to_string(),
        ]
        .into_iter()
        .chain(policy.to_args())
        .collect();
        let image = self
            .config
            .egress_image
            .clone()
            .unwrap_or_else(|| self.config.image.clone());
        labels.insert(labels::AGENT.into(), AGENT_VERSION.into());
        labels.insert(
            labels::EGRESS_POLICY.into(),
            fingerprint(
                command
                    .iter()
                    .chain(&self.config.egress_dns)
                    .chain([&image]),
            ),
        );
        EgressContainer {
            name,
            image,
            user: self.config.sandbox_user.clone(),
            network: self.config.network_name().to_string(),
            agent_volume: agent_volume(&self.config.instance),
            agent_dir: AGENT_DIR.into(),
            command,
            dns: self.config.egress_dns.clone(),
            labels,
        }
    }

    /// Gives a sandbox behind the egress proxy its way out on the link
    /// network `subnet`: joins the shared proxy to it, or starts the
    /// sandbox's own. Idempotent: also what rehydration calls.
    pub(super) async fn attach_egress(
        &self,
        sandbox_id: &str,
        mode: NetworkMode,
        allow: &[String],
        subnet: &str,
    ) -> SandboxResult<()> {
        let address = egress_address(subnet)
            .ok_or_else(|| EngineError::Failed(format!("link subnet {subnet} has no room")))?;
        let network = link_name(&self.config.instance, sandbox_id);
        match mode {
            NetworkMode::Internet => {
                let name = self.ensure_shared_egress().await?;
                self.engine
                    .connect_network(&network, &name, &[], Some(address))
                    .await?;
            }
            NetworkMode::Allowlist => {
                let name = own_egress_name(&self.config.instance, sandbox_id);
                let mut labels = labels::instance_only(&self.config.instance);
                labels.insert(labels::ROLE.into(), labels::ROLE_EGRESS.into());
                labels.insert(labels::SANDBOX_ID.into(), sandbox_id.to_string());
                let spec = self.egress_spec(name, labels, &self.egress_policy(mode, allow));
                self.start_egress(&spec, &[(network, address)]).await?;
            }
            NetworkMode::None | NetworkMode::Open => {}
        }
        Ok(())
    }

    /// Makes sure the egress container `spec` runs, listening and joined
    /// to `links`. One that is stopped, or was started by another agent or
    /// with another policy, is replaced: it holds no state, and a stopped
    /// one may not start again (its crash retries used up).
    async fn start_egress(
        &self,
        spec: &EgressContainer,
        links: &[(String, Ipv4Addr)],
    ) -> SandboxResult<()> {
        match self.engine.container_status(&spec.name).await? {
            Some(s) if s.running && is_current(&s, spec) => {
                return self.join_links(&spec.name, links).await;
            }
            Some(_) => {
                tracing::info!(container = %spec.name, "replacing an egress proxy that is stopped or of another agent or policy");
                self.engine.remove_container(&spec.name).await?;
            }
            None => {}
        }
        // Its way out (removed out of band, the engine would refuse the
        // create).
        self.ensure_network().await?;
        // Its program, the agent: a create must not make the engine make
        // an empty volume of that name, which a sandbox's create would then
        // find wrong and could not replace while the proxy holds it.
        self.ensure_agent_volume(&spec.image).await?;
        self.engine.create_egress(spec).await?;
        let started = async {
            self.join_links(&spec.name, links).await?;
            self.engine.start_container(&spec.name).await?;
            if !self
                .engine
                .wait_for_output(&spec.name, EGRESS_LISTENING, EGRESS_START)
                .await?
            {
                return Err(EngineError::Failed(format!(
                    "egress proxy {} did not start listening within {EGRESS_START:?}",
                    spec.name
                ))
                .into());
            }
            Ok(())
        };
        if let Err(e) = started.await {
            let _ = self.engine.remove_container(&spec.name).await;
            return Err(e);
        }
        tracing::info!(container = %spec.name, "egress proxy started");
        Ok(())
    }

    /// Joins an egress container to link networks at their egress
    /// address. A network that is gone belongs to a sandbox being removed
    /// meanwhile: the others still get their way out.
    async fn join_links(&self, container: &str, links: &[(String, Ipv4Addr)]) -> SandboxResult<()> {
        for (network, address) in links {
            match self
                .engine
                .connect_network(network, container, &[], Some(*address))
                .await
            {
                Err(EngineError::NotFound(m)) => {
                    tracing::debug!(network = %network, reason = %m, "a link network went meanwhile");
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// The shared egress proxy, running with the current policy; made
    /// (and joined to the link network of every `internet` sandbox there
    /// is) when missing, stopped or outdated.
    async fn ensure_shared_egress(&self) -> SandboxResult<String> {
        let name = shared_egress_name(&self.config.instance);
        let mut labels = labels::instance_only(&self.config.instance);
        labels.insert(labels::ROLE.into(), labels::ROLE_EGRESS.into());
        let spec = self.egress_spec(
            name.clone(),
            labels,
            &self.egress_policy(NetworkMode::Internet, &[]),
        );
        let _one = self.egress_start.lock().await;
        if self
            .engine
            .container_status(&name)
            .await?
            .is_some_and(|s| s.running && is_current(&s, &spec))
        {
            return Ok(name);
        }
        let links: Vec<(String, Ipv4Addr)> = self
            .registry
            .list()
            .into_iter()
            .filter(|s| s.network == NetworkMode::Internet)
            .filter_map(|s| {
                let subnet = s.ports().link_subnet?;
                Some((
                    link_name(&self.config.instance, &s.id),
                    egress_address(&subnet)?,
                ))
            })
            .collect();
        self.start_egress(&spec, &links).await?;
        Ok(name)
    }

    /// Before a link network goes: the shared egress proxy leaves it (the
    /// engine refuses to remove a network with containers on it).
    pub(super) async fn detach_shared_egress(&self, network: &str) -> SandboxResult<()> {
        let name = shared_egress_name(&self.config.instance);
        self.engine.disconnect_network(network, &name).await?;
        Ok(())
    }

    /// Until `shutdown`: follows the refusals of every egress proxy of this
    /// instance (each counted in `sandboxd_egress_denied_total` and logged
    /// with the sandbox it came from), and gives sandboxes whose egress
    /// proxy is gone or stopped (removed out of band, crashed past its
    /// retries, the engine restarted) a new one.
    pub async fn watch_egress(self: Arc<Self>, shutdown: CancellationToken) {
        let since = i32::try_from(crate::clock::now_ms() / 1000).unwrap_or(i32::MAX);
        let mut followed: HashMap<String, tokio::task::JoinHandle<Option<String>>> = HashMap::new();
        // Per container, the stamp of the last line read: a follower that
        // ends (its container restarted) resumes after it, counting nothing
        // twice.
        let mut read_up_to: HashMap<String, String> = HashMap::new();
        let mut tick = tokio::time::interval(WATCH_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let filter = [
                (labels::INSTANCE, self.config.instance.as_str()),
                (labels::ROLE, labels::ROLE_EGRESS),
            ];
            let Ok(list) = self.engine.list_containers(&filter).await else {
                continue;
            };
            let ended: Vec<String> = followed
                .iter()
                .filter(|(_, task)| task.is_finished())
                .map(|(name, _)| name.clone())
                .collect();
            for name in ended {
                if let Some(task) = followed.remove(&name)
                    && let Ok(Some(at)) = task.await
                {
                    read_up_to.insert(name, at);
                }
            }
            let present: HashSet<&str> = list.iter().map(|c| c.name.as_str()).collect();
            read_up_to.retain(|name, _| present.contains(name.as_str()));
            let running: HashSet<String> = list
                .iter()
                .filter(|c| c.running)
                .map(|c| c.name.clone())
                .collect();
            for name in &running {
                if followed.contains_key(name) {
                    continue;
                }
                let this = Arc::clone(&self);
                let (name, after) = (name.clone(), read_up_to.get(name).cloned());
                let task = {
                    let name = name.clone();
                    tokio::spawn(async move { this.follow_denials(&name, since, after).await })
                };
                followed.insert(name, task);
            }
            if *self.ready.borrow() {
                self.repair_egress(running).await;
            }
        }
        for (_, task) in followed {
            task.abort();
        }
    }

    /// Reads `container`'s refusals logged after `since` and after the
    /// stamp `after`; returns the stamp of the last line read.
    async fn follow_denials(
        &self,
        container: &str,
        since: i32,
        after: Option<String>,
    ) -> Option<String> {
        let mut lines = self
            .engine
            .follow_stdout_lines(container, since, MAX_DENIAL_LINE);
        let mut last = after;
        while let Some(line) = lines.next().await {
            if last.as_ref().is_some_and(|l| line.at <= *l) {
                continue;
            }
            last = Some(line.at);
            if let Some(s) = Suppressed::parse(&line.text) {
                crate::telemetry::egress_denied(s.count);
                let sandbox = self.sandbox_of(s.client);
                tracing::warn!(
                    event = "egress_denied_unlisted",
                    sandbox_id = sandbox.as_deref().map_or("", |s| s.id.as_str()),
                    client = %s.client,
                    count = s.count,
                    "more of a sandbox's connections were refused than the proxy lists one by one"
                );
                continue;
            }
            let Some(d) = Denial::parse(&line.text) else {
                continue;
            };
            let sandbox = self.sandbox_of(d.client);
            let (id, key) = sandbox
                .as_deref()
                .map_or(("", ""), |s| (s.id.as_str(), s.session_key.as_str()));
            crate::telemetry::egress_denied(1);
            tracing::warn!(
                event = "egress_denied",
                sandbox_id = id,
                session_key = key,
                client = %d.client,
                destination = %d.destination,
                reason = %d.reason,
                "a sandbox's connection was refused by the egress policy"
            );
        }
        last
    }

    /// Gives each sandbox behind an egress proxy whose proxy is not among
    /// `running` its way out again, under its session's lock (a stop in
    /// progress is not given a new proxy).
    async fn repair_egress(&self, mut running: HashSet<String>) {
        // Sessions, and the warm pool's members: a claim must find its
        // way out in place.
        let members = self.pool.sandboxes();
        for s in self.registry.list().into_iter().chain(members) {
            let Some(subnet) = s.ports().link_subnet.filter(|_| s.network.through_egress()) else {
                continue;
            };
            let name = match s.network {
                NetworkMode::Internet => shared_egress_name(&self.config.instance),
                _ => own_egress_name(&self.config.instance, &s.id),
            };
            if running.contains(&name) {
                continue;
            }
            let _key = self.registry.lock_key(&s.session_key).await;
            let known = if s.session_key.is_empty() {
                self.pool.holds(&s.id)
            } else {
                self.registry.get(&s.id).is_some()
            };
            if !known {
                continue;
            }
            // Listed before a create in flight made it, perhaps.
            if let Ok(Some(status)) = self.engine.container_status(&name).await
                && status.running
            {
                running.insert(name);
                continue;
            }
            match self
                .attach_egress(&s.id, s.network, &s.allow, &subnet)
                .await
            {
                Ok(()) => {
                    tracing::warn!(sandbox_id = %s.id, container = %name, "an egress proxy was gone or stopped; a new one runs");
                    running.insert(name);
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %s.id, container = %name, error = %e, "an egress proxy is gone or stopped and could not be replaced; the sandbox's connections out fail until it is");
                }
            }
        }
    }

    /// The sandbox whose link network holds `client`.
    fn sandbox_of(&self, client: IpAddr) -> Option<Arc<Sandbox>> {
        self.registry.list().into_iter().find(|s| {
            s.ports()
                .link_subnet
                .and_then(|n| Cidr::parse(&n).ok())
                .is_some_and(|n| n.contains(client))
        })
    }
}

/// Whether a running egress container is what `spec` would start: same
/// agent, same policy.
fn is_current(status: &ContainerStatus, spec: &EgressContainer) -> bool {
    [labels::AGENT, labels::EGRESS_POLICY].iter().all(|k| {
        status
            .labels
            .get(*k)
            .is_some_and(|v| spec.labels.get(*k) == Some(v))
    })
}

/// FNV-1a over the parts, each ended by a NUL: a label that changes when
/// any part does (not a security measure; sandboxd writes and reads it).
fn fingerprint<'a>(parts: impl Iterator<Item = &'a String>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.flat_map(|p| p.bytes().chain([0])) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_tells_policies_apart() {
        let of = |parts: &[&str]| {
            let owned: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
            fingerprint(owned.iter())
        };
        assert_eq!(
            of(&["egress", "--deny", "10.0.0.0/8"]),
            of(&["egress", "--deny", "10.0.0.0/8"])
        );
        assert_ne!(
            of(&["egress", "--deny", "10.0.0.0/8"]),
            of(&["egress", "--deny", "10.0.0.0/9"])
        );
        assert_ne!(of(&["ab", "c"]), of(&["a", "bc"]), "parts are delimited");
    }

    #[test]
    fn the_egress_address_is_the_blocks_last_host() {
        assert_eq!(
            egress_address("10.213.0.16/28"),
            Some(Ipv4Addr::new(10, 213, 0, 30))
        );
        assert_eq!(
            egress_address("10.213.1.0/24"),
            Some(Ipv4Addr::new(10, 213, 1, 254))
        );
        assert_eq!(egress_address("10.213.0.0/30"), None, "no room");
        assert_eq!(egress_address("nonsense"), None);
    }

    #[test]
    fn every_spelling_of_the_proxy_variables_is_set() {
        let env = proxy_env(Ipv4Addr::new(10, 213, 0, 30));
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert!(
                env.contains(&format!("{k}=http://10.213.0.30:3128")),
                "{k}: {env:?}"
            );
        }
        assert!(env.contains(&"NO_PROXY=localhost,127.0.0.1,::1".to_string()));
        assert!(env.contains(&"no_proxy=localhost,127.0.0.1,::1".to_string()));
    }

    #[test]
    fn the_hosts_own_addresses_are_read_from_the_kernel_tables() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\n     |-- 198.51.100.1\n        /32 link UNICAST\n        /32 host LOCAL\n     |-- 203.0.113.255\n        /32 link BROADCAST\n";
        assert_eq!(
            local_ipv4(fib),
            vec![
                "127.0.0.1".parse::<IpAddr>().expect("ip"),
                "198.51.100.1".parse().expect("ip")
            ]
        );
        let inet6 = "00000000000000000000000000000001 01 80 10 80       lo\n20010db8000000000000000000000005 02 40 00 80     eth0\nnot-hex\n";
        assert_eq!(
            local_ipv6(inet6),
            vec![
                "::1".parse::<IpAddr>().expect("ip"),
                "2001:db8::5".parse().expect("ip")
            ]
        );
        assert!(!own_addresses().is_empty(), "this machine has addresses");
    }

    #[test]
    fn suppressed_counts_are_read_strictly() {
        assert_eq!(
            Suppressed::parse("egress-denied-suppressed 10.213.0.18 7\n"),
            Some(Suppressed {
                client: "10.213.0.18".parse().expect("ip"),
                count: 7
            })
        );
        for bad in [
            "egress-denied-suppressed 10.213.0.18",
            "egress-denied-suppressed 10.213.0.18 0",
            "egress-denied-suppressed 10.213.0.18 -3",
            "egress-denied-suppressed 10.213.0.18 99999999999",
            "egress-denied-suppressed 10.213.0.18 7 extra",
            "egress-denied-suppressed nothost 7",
            "egress-denied 10.213.0.18 10.0.0.1:80 private",
        ] {
            assert_eq!(Suppressed::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn refusal_lines_are_read_strictly() {
        assert_eq!(
            Denial::parse("egress-denied 10.213.0.18 10.0.0.1:80 private\n"),
            Some(Denial {
                client: "10.213.0.18".parse().expect("ip"),
                destination: "10.0.0.1:80".into(),
                reason: "private".into(),
            })
        );
        assert_eq!(
            Denial::parse("egress-denied 10.213.0.18 [fd00::1]:443 unique-local")
                .map(|d| d.destination),
            Some("[fd00::1]:443".into())
        );
        for bad in [
            "",
            "egress-denied",
            "egress-denied 10.213.0.18 10.0.0.1:80",
            "egress-denied nothost 10.0.0.1:80 private",
            "egress-denied 10.213.0.18 10.0.0.1:80 private extra",
            "egress-denied 10.213.0.18 a\u{1b}[31m:80 private",
            "egress-allowed 10.213.0.18 10.0.0.1:80 private",
            "egress-denied-suppressed 10.213.0.18 7",
            &format!("egress-denied 10.213.0.18 {}:80 private", "a".repeat(2000)),
        ] {
            assert_eq!(Denial::parse(bad), None, "{bad:?}");
        }
    }
}
