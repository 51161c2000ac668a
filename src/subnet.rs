//! Subnet arithmetic for link networks (see `sandbox::network`): how big one block is
//! for a number of ports, and which blocks a pool holds. Pure functions.

use std::net::Ipv4Addr;

/// The prefix length of a link network. The engine hands out addresses
/// from the block's lower half only (see [`allocation_range`]): room there
/// for the network address, the gateway, the sandbox and one port proxy
/// per port; the upper half keeps the egress proxy's fixed address free
/// (/28 for the default four ports).
pub fn link_prefix(max_ports: usize) -> u32 {
    let half = (max_ports as u32).saturating_add(3).next_power_of_two();
    32 - half.saturating_mul(2).trailing_zeros()
}

/// The lower half of `subnet` ("10.213.0.16/28" → "10.213.0.16/29"): where
/// the engine allocates addresses on a link network. Its allocator moves on
/// from the last address it gave, so without a range a proxy replaced often
/// enough would take the egress proxy's address.
pub fn allocation_range(subnet: &str) -> Option<String> {
    let (base, bits) = subnet.split_once('/')?;
    let (base, bits) = (base.parse::<Ipv4Addr>().ok()?, bits.parse::<u32>().ok()?);
    if !(8..=29).contains(&bits) {
        return None;
    }
    let start = u32::from(base) & (u32::MAX << (32 - bits));
    Some(format!("{}/{}", Ipv4Addr::from(start), bits + 1))
}

/// The link-network blocks of `pool` ("10.213.0.0/16"), each `/prefix`:
/// (first address, block size, how many); None unless the pool is an IPv4
/// CIDR from /8 up to `prefix`.
pub fn link_subnet_range(pool: &str, prefix: u32) -> Option<(u32, u32, u32)> {
    let (base, bits) = pool.split_once('/')?;
    let (base, bits) = (base.parse::<Ipv4Addr>().ok()?, bits.parse::<u32>().ok()?);
    if !(8..=prefix).contains(&bits) || prefix > 30 {
        return None;
    }
    let start = u32::from(base) & (u32::MAX << (32 - bits));
    Some((start, 1u32 << (32 - prefix), 1u32 << (prefix - bits)))
}

/// The `i`th block of a range from [`link_subnet_range`].
pub fn link_subnet((start, size, count): (u32, u32, u32), i: u32) -> String {
    let prefix = 32 - size.trailing_zeros();
    format!("{}/{prefix}", Ipv4Addr::from(start + (i % count) * size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_subnets_are_blocks_of_the_pool() {
        assert_eq!(
            link_prefix(4),
            28,
            "network, gateway, sandbox and 4 proxies in the lower half of a /28"
        );
        assert_eq!(link_prefix(1), 29);
        assert_eq!(
            link_prefix(3),
            28,
            "3 + 3 do not fit the lower half of a /29"
        );
        assert_eq!(link_prefix(5), 28);
        assert_eq!(link_prefix(6), 27);
        assert_eq!(link_prefix(64), 24);
        assert_eq!(
            allocation_range("10.213.0.16/28").as_deref(),
            Some("10.213.0.16/29")
        );
        assert_eq!(
            allocation_range("10.213.1.0/24").as_deref(),
            Some("10.213.1.0/25")
        );
        assert_eq!(allocation_range("10.213.0.0/30"), None, "no room");
        assert_eq!(allocation_range("nonsense"), None);
        let r = link_subnet_range("10.213.0.0/16", 29).expect("range");
        assert_eq!(r.2, 8192);
        assert_eq!(link_subnet(r, 0), "10.213.0.0/29");
        assert_eq!(link_subnet(r, 1), "10.213.0.8/29");
        assert_eq!(link_subnet(r, 8191), "10.213.255.248/29");
        assert_eq!(link_subnet(r, 8192), "10.213.0.0/29", "wraps around");
        let r = link_subnet_range("10.213.0.0/16", 25).expect("range");
        assert_eq!(
            (r.2, link_subnet(r, 1)),
            (512, "10.213.0.128/25".to_string())
        );
        assert_eq!(link_subnet_range("nonsense", 29), None);
        assert_eq!(link_subnet_range("10.0.0.0/30", 29), None);
        assert_eq!(
            link_subnet_range("10.0.0.0/28", 25),
            None,
            "smaller than one block"
        );
        assert_eq!(
            link_subnet_range("0.0.0.0/0", 29),
            None,
            "too large to enumerate"
        );
        let one = link_subnet_range("10.1.2.3/29", 29).expect("range");
        assert_eq!((one.2, link_subnet(one, 0)), (1, "10.1.2.0/29".to_string()));
    }
}
