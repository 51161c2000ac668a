//! Egress policy: which destinations a sandbox may reach through its egress
//! proxy. Pure logic, shared by sandboxd (which validates a sandbox's policy
//! and hands it to the proxy on its command line, [`EgressPolicy::to_args`])
//! and `sandboxd-agent egress` (which enforces it), so both sides read a
//! policy the same way.
//!
//! A destination passes three tests in order, and the first refusal wins:
//! 1. never: addresses no sandbox may reach, whatever its policy says
//!    ([`never_reason`]: loopback, private networks, link-local with the
//!    cloud metadata service, Azure's WireServer, multicast, …), judged for
//!    the IPv6 forms that embed an IPv4 address by the IPv4 address inside.
//!    A listed CIDR or an allowed domain does not lift this: a policy
//!    cannot open the host's own networks to a sandbox;
//! 2. the policy's deny list of CIDRs;
//! 3. in allowlist mode, the allowlist: a name that matches one of its
//!    domain patterns, or an address in one of its CIDRs.
//!
//! The IPv6 forms that embed an IPv4 address are held to the IPv4 address
//! inside by the policy's lists too: a deny CIDR refuses them if it holds
//! either the address or the IPv4 inside, and an allowlist CIDR passes
//! them only if it holds the IPv4 inside (so an IPv6 entry such as
//! `64:ff9b::/96` cannot open IPv4 addresses the allowlist leaves out).
//!
//! A name is judged by every address it resolves to, and if any is refused
//! the whole name is ([`EgressPolicy::check_resolved`]): otherwise a
//! resolver answering a public and a private address would decide which
//! one a client gets. The proxy connects only to an address it checked, so
//! a second resolution cannot swap in another (DNS rebinding).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Most entries of each kind (deny CIDRs, allowed domains, allowed CIDRs)
/// in one policy: the proxy checks every one per connection, and the
/// policy travels on a command line.
pub const MAX_ENTRIES: usize = 256;

/// Refusal codes and what they mean. Codes are stable (sandboxd counts and
/// logs them) and contain no spaces (they end the proxy's log line).
const REASONS: &[(&str, &str)] = &[
    ("unspecified", "unspecified address"),
    ("this-network", "\"this network\" address (0.0.0.0/8)"),
    ("private", "private address"),
    (
        "shared-address-space",
        "shared address space (100.64.0.0/10)",
    ),
    ("loopback", "loopback address"),
    ("link-local", "link-local address"),
    ("ietf-protocol", "IETF protocol assignment (192.0.0.0/24)"),
    ("benchmarking", "benchmarking address"),
    ("multicast", "multicast address"),
    ("broadcast", "broadcast address"),
    ("reserved", "reserved address"),
    ("unique-local", "unique local address (fc00::/7)"),
    ("site-local", "site-local address (fec0::/10)"),
    ("teredo", "Teredo address (2001::/32)"),
    ("discard", "discard-only address (100::/64)"),
    ("nat64-local", "local-use NAT64 address (64:ff9b:1::/48)"),
    (
        "cloud-metadata",
        "cloud metadata address (Azure's WireServer, 168.63.129.16)",
    ),
    (DENY_LIST, "in the sandbox's deny list"),
    (NOT_ALLOWLISTED, "not on the sandbox's allowlist"),
];
const DENY_LIST: &str = "deny-list";
const NOT_ALLOWLISTED: &str = "not-allowlisted";

/// IPv4 networks no sandbox may reach, in the order they are tried (the
/// broadcast address before the reserved block that holds it). Most cloud
/// metadata services sit in link-local space (169.254.169.254) or in one
/// of these blocks already (AWS's fd00:ec2::254 is unique-local,
/// Alibaba's 100.100.100.200 shared address space); Azure's WireServer is
/// a public address its hosts answer on every VM's behalf, which hands out
/// the VM's configuration and certificates, so it is named here.
/// Documentation networks (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24)
/// are not here: they route nowhere anyway, and tests use them as
/// stand-ins for public servers.
const NEVER_V4: &[(Ipv4Addr, u32, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 32, "unspecified"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "this-network"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "shared-address-space"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(168, 63, 129, 16), 32, "cloud-metadata"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "ietf-protocol"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// IPv6 networks no sandbox may reach, tried after the forms that embed an
/// IPv4 address. Whatever is outside 2000::/3, the only block global
/// unicast addresses come from, is refused as reserved after these.
const NEVER_V6: &[(Ipv6Addr, u32, &str)] = &[
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "nat64-local",
    ),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64, "discard"),
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, "teredo"),
    (
        Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0),
        48,
        "benchmarking",
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "unique-local",
    ),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "link-local"),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, "site-local"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
];
const GLOBAL_UNICAST: (Ipv6Addr, u32) = (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);
const NAT64: (Ipv6Addr, u32) = (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
const SIX_TO_FOUR: (Ipv6Addr, u32) = (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16);

/// Why `ip` may never be reached from a sandbox (a stable code such as
/// `"private"` or `"loopback"`), or `None` for a public address.
pub fn never_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => never_v4(v4),
        IpAddr::V6(v6) => never_v6(v6),
    }
}

fn never_v4(ip: Ipv4Addr) -> Option<&'static str> {
    NEVER_V4
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, reason)| *reason)
}

fn never_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // The kernel or a translator on the way turns these into IPv4
    // connections: ::ffff:127.0.0.1 is 127.0.0.1.
    if let Some(v4) = embedded_v4(ip) {
        return never_v4(v4);
    }
    if let Some((_, _, reason)) = NEVER_V6
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
    {
        return Some(reason);
    }
    if !in_v6(ip, GLOBAL_UNICAST.0, GLOBAL_UNICAST.1) {
        return Some("reserved");
    }
    None
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped
/// (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d, deprecated but still
/// parsed by stacks), NAT64 (64:ff9b::a.b.c.d) and 6to4 (2002:aabb:ccdd::).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = ip.to_bits();
    let low = Ipv4Addr::from_bits(bits as u32);
    if bits >> 32 == 0xffff || bits >> 32 == 0 || in_v6(ip, NAT64.0, NAT64.1) {
        return Some(low);
    }
    if in_v6(ip, SIX_TO_FOUR.0, SIX_TO_FOUR.1) {
        return Some(Ipv4Addr::from_bits((bits >> 80) as u32));
    }
    None
}

fn mask_v4(prefix: u32) -> u32 {
    u32::MAX.checked_shl(32 - prefix).unwrap_or(0)
}

fn mask_v6(prefix: u32) -> u128 {
    u128::MAX.checked_shl(128 - prefix).unwrap_or(0)
}

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, prefix: u32) -> bool {
    ip.to_bits() & mask_v4(prefix) == net.to_bits()
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u32) -> bool {
    ip.to_bits() & mask_v6(prefix) == net.to_bits()
}

/// An IPv4 or IPv6 network. Host bits in the text are cleared (the network
/// of `10.1.2.3/8` is `10.0.0.0/8`), as the relay's CIDRs always were.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u32,
}

impl Cidr {
    /// `address/prefix`, or a bare address for a single host (/32, /128).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let invalid = || format!("{text:?} is not a CIDR (an address, or address/prefix)");
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, bits)) => (addr, Some(bits)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| invalid())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            // Digits only: u32's parser would take "+8".
            Some(bits) if !bits.is_empty() && bits.len() <= 3 => {
                if !bits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid());
                }
                bits.parse::<u32>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(invalid)?
            }
            Some(_) => return Err(invalid()),
        };
        let network = match addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from_bits(a.to_bits() & mask_v4(prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from_bits(a.to_bits() & mask_v6(prefix))),
        };
        Ok(Cidr { network, prefix })
    }

    /// Whether `ip` is in this network. An IPv4 network also holds the
    /// IPv4-mapped IPv6 form of its addresses, and an IPv6 network that
    /// covers mapped addresses holds their plain IPv4 form.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match self.network {
            IpAddr::V4(net) => match ip.to_canonical() {
                IpAddr::V4(a) => in_v4(a, net, self.prefix),
                IpAddr::V6(_) => false,
            },
            IpAddr::V6(net) => {
                let a = match ip {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                in_v6(a, net, self.prefix)
            }
        }
    }

    /// The network's first address.
    pub fn network(&self) -> IpAddr {
        self.network
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// A domain name a sandbox may reach: exactly one name (`pypi.org`), or
/// every name below a suffix at any depth (`*.npmjs.org`: `registry.npmjs.org`
/// and `a.b.npmjs.org`, not `npmjs.org` itself). Case-insensitive; a
/// trailing dot is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    /// Lowercase, without a trailing dot.
    name: String,
    /// Subdomains of `name` rather than `name` itself.
    wildcard: bool,
}

impl DomainPattern {
    /// A name of letters, digits, hyphens and underscores in labels of 1
    /// to 63 characters (a hyphen at neither end), at most 253 in all,
    /// optionally behind a leading `*.`. An IP address is refused (it
    /// belongs in a CIDR), and so is any other `*`.
    pub fn parse(text: &str) -> Result<DomainPattern, String> {
        let (wildcard, name) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if text == "*" || text == "*." {
            return Err(format!(
                "{text:?} would allow every name: leave out the allowlist for internet access"
            ));
        }
        if name.trim_end_matches('.').parse::<IpAddr>().is_ok() {
            return Err(format!(
                "{text:?} is an IP address: list it as a CIDR, not a domain"
            ));
        }
        let name = normalise_name(name)
            .map_err(|why| format!("{text:?} is not a domain name or *.domain: {why}"))?;
        Ok(DomainPattern { name, wildcard })
    }

    /// Whether `host` (a name as a client wrote it) is covered. A host
    /// that is not a valid name (an IP literal among them) never is.
    pub fn matches(&self, host: &str) -> bool {
        let Ok(host) = normalise_name(host) else {
            return false;
        };
        if !self.wildcard {
            return host == self.name;
        }
        host.strip_suffix(self.name.as_str())
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)
    }
}

/// `name` lowercased and without one trailing dot, if it is a valid host
/// name; otherwise why not.
fn normalise_name(name: &str) -> Result<String, &'static str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a label is empty or longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' may make up a label");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with '-'");
        }
    }
    // No top-level domain is all digits; resolvers read such names as
    // IPv4 addresses in one of inet_aton's forms ("127.1").
    if name
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the last label is all digits, like an IPv4 address");
    }
    Ok(name.to_ascii_lowercase())
}

/// What a sandbox may reach through its egress proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// `None`: internet mode, any destination the never list and `deny`
    /// leave. `Some`: only what the allowlist names.
    pub allowlist: Option<Allowlist>,
    /// Networks refused on top of the never list.
    pub deny: Vec<Cidr>,
}

/// The destinations of an allowlist-mode policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    pub domains: Vec<DomainPattern>,
    pub cidrs: Vec<Cidr>,
}

/// A refused destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// A stable code without spaces: one of [`never_reason`]'s,
    /// `"deny-list"` or `"not-allowlisted"`.
    pub reason: &'static str,
}

impl Denied {
    /// The reason in words, for the client ("private address").
    pub fn message(&self) -> &'static str {
        REASONS
            .iter()
            .find(|(code, _)| *code == self.reason)
            .map_or(self.reason, |(_, message)| message)
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Denied {}

/// What a destination name is worth before it is resolved
/// ([`EgressPolicy::check_name`]): how its addresses are then judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameCheck {
    /// Internet mode, or the name matches a domain pattern of the
    /// allowlist: each address it resolves to passes unless the never
    /// list or the deny list refuses it.
    Allowed,
    /// Allowlist mode and the name matches no pattern (or is an IP
    /// literal): each address must also be in the allowlist's CIDRs.
    AddressesDecide,
}

impl EgressPolicy {
    /// Judges a destination host as a client wrote it, before any lookup.
    /// An IP literal (bracketed or not) is judged as an address at once.
    /// In allowlist mode without CIDRs a name that matches no pattern is
    /// refused here, so that no lookup tells a resolver about it; with
    /// CIDRs it must be resolved, which does tell the resolver.
    pub fn check_name(&self, host: &str) -> Result<NameCheck, Denied> {
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            self.check_addr(ip, false)?;
            return Ok(NameCheck::AddressesDecide);
        }
        let Some(list) = &self.allowlist else {
            return Ok(NameCheck::Allowed);
        };
        if list.domains.iter().any(|d| d.matches(host)) {
            return Ok(NameCheck::Allowed);
        }
        if list.cidrs.is_empty() {
            return Err(Denied {
                reason: NOT_ALLOWLISTED,
            });
        }
        Ok(NameCheck::AddressesDecide)
    }

    /// Judges one address: the never list first (nothing lifts it), then
    /// the deny list, then in allowlist mode the allowlist, which passes
    /// the address if it came from a name the allowlist names
    /// (`via_allowed_name`) or lies in one of its CIDRs.
    ///
    /// An IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64,
    /// 6to4) reaches that IPv4 address through the kernel or a translator,
    /// so the lists judge the IPv4 inside as well: a deny CIDR holding
    /// either refuses it, and only an allowlist CIDR holding the IPv4
    /// inside passes it; an IPv6 CIDR that happens to cover the IPv6 form
    /// (`64:ff9b::/96`, `2002::/16`) does not.
    pub fn check_addr(&self, ip: IpAddr, via_allowed_name: bool) -> Result<(), Denied> {
        if let Some(reason) = never_reason(ip) {
            return Err(Denied { reason });
        }
        let inside = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let denied = |c: &Cidr| c.contains(ip) || inside.is_some_and(|v4| c.contains(v4));
        if self.deny.iter().any(denied) {
            return Err(Denied { reason: DENY_LIST });
        }
        let judged = inside.unwrap_or(ip);
        match &self.allowlist {
            Some(list) if !via_allowed_name && !list.cidrs.iter().any(|c| c.contains(judged)) => {
                Err(Denied {
                    reason: NOT_ALLOWLISTED,
                })
            }
            _ => Ok(()),
        }
    }

    /// Judges every address a name resolved to, as `name` says: if any is
    /// refused, the name is, with the first refused address. An empty
    /// list passes (there is nothing to connect to: the caller's "does
    /// not resolve").
    pub fn check_resolved(
        &self,
        name: NameCheck,
        addrs: &[IpAddr],
    ) -> Result<(), (IpAddr, Denied)> {
        let via_allowed_name = name == NameCheck::Allowed;
        addrs.iter().try_for_each(|ip| {
            self.check_addr(*ip, via_allowed_name)
                .map_err(|denied| (*ip, denied))
        })
    }

    /// The policy as arguments of `sandboxd-agent egress`:
    /// `--deny CIDR`…, then in allowlist mode `--allowlist`,
    /// `--allow-domain PATTERN`…, `--allow-cidr CIDR`….
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for c in &self.deny {
            args.push("--deny".to_owned());
            args.push(c.to_string());
        }
        if let Some(list) = &self.allowlist {
            args.push("--allowlist".to_owned());
            for d in &list.domains {
                args.push("--allow-domain".to_owned());
                args.push(d.to_string());
            }
            for c in &list.cidrs {
                args.push("--allow-cidr".to_owned());
                args.push(c.to_string());
            }
        }
        args
    }

    /// Reads what [`to_args`](Self::to_args) wrote, in any order.
    /// `--allow-domain` and `--allow-cidr` imply `--allowlist` (the
    /// stricter reading of a policy that names what it allows).
    pub fn from_args(args: &[String]) -> Result<EgressPolicy, String> {
        let mut policy = EgressPolicy::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            if flag == "--allowlist" {
                policy.allowlist.get_or_insert_with(Allowlist::default);
                continue;
            }
            let value = match flag.as_str() {
                "--deny" | "--allow-domain" | "--allow-cidr" => {
                    args.next().ok_or_else(|| format!("{flag} needs a value"))?
                }
                _ => return Err(format!("unknown egress policy argument {flag:?}")),
            };
            let (len, kind) = match flag.as_str() {
                "--deny" => {
                    policy.deny.push(Cidr::parse(value)?);
                    (policy.deny.len(), "deny CIDRs")
                }
                "--allow-domain" => {
                    let list = policy.allowlist.get_or_insert_with(Allowlist::default);
                    list.domains.push(DomainPattern::parse(value)?);
                    (list.domains.len(), "allowed domains")
                }
                _ => {
                    let list = policy.allowlist.get_or_insert_with(Allowlist::default);
                    list.cidrs.push(Cidr::parse(value)?);
                    (list.cidrs.len(), "allowed CIDRs")
                }
            };
            if len > MAX_ENTRIES {
                return Err(format!("more than {MAX_ENTRIES} {kind}"));
            }
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests;
