//! The egress policy's unit tests: the never list, CIDRs and domain
//! patterns, both modes, the embedded IPv4 forms and the argument round trip.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn never(s: &str) -> Option<&'static str> {
    never_reason(ip(s))
}

#[test]
fn ipv4_never_list_address_by_address() {
    let cases = [
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "this-network"),
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("100.64.0.1", "shared-address-space"),
        ("100.127.255.254", "shared-address-space"),
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("168.63.129.16", "cloud-metadata"),
        ("169.254.169.254", "link-local"),
        ("169.254.0.1", "link-local"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.0.0.1", "ietf-protocol"),
        ("192.0.0.255", "ietf-protocol"),
        ("192.168.1.1", "private"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.254", "reserved"),
        ("255.255.255.255", "broadcast"),
    ];
    for (addr, reason) in cases {
        assert_eq!(never(addr), Some(reason), "{addr}");
    }
}

#[test]
fn ipv4_public_and_edges_pass() {
    for addr in [
        "8.8.8.8",
        "1.1.1.1",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "168.63.129.15",
        "168.63.129.17",
        "169.253.255.255",
        "169.255.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.0",
        "192.0.2.10",
        "192.167.255.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "198.51.100.7",
        "203.0.113.10",
        "223.255.255.255",
    ] {
        assert_eq!(never(addr), None, "{addr}");
    }
}

#[test]
fn ipv6_never_list_address_by_address() {
    let cases = [
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("febf:ffff::1", "link-local"),
        ("fec0::1", "site-local"),
        ("feff::1", "site-local"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("ff02::1", "multicast"),
        ("ff0e::101", "multicast"),
        ("100::1", "discard"),
        ("100::ffff:ffff:ffff:ffff", "discard"),
        ("2001::1", "teredo"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
        ("2001:2::1", "benchmarking"),
        ("64:ff9b:1::1", "nat64-local"),
        ("64:ff9b:1:ffff::1", "nat64-local"),
        // Outside 2000::/3 and no special block: nothing global lives there.
        ("4000::1", "reserved"),
        ("100:0:0:1::1", "reserved"),
        ("::ffff:0:1.2.3.4", "reserved"),
    ];
    for (addr, reason) in cases {
        assert_eq!(never(addr), Some(reason), "{addr}");
    }
}

#[test]
fn ipv6_forms_with_an_ipv4_inside_are_judged_by_it() {
    let cases = [
        // IPv4-mapped.
        ("::ffff:127.0.0.1", Some("loopback")),
        ("::ffff:10.0.0.1", Some("private")),
        ("::ffff:169.254.169.254", Some("link-local")),
        ("::ffff:168.63.129.16", Some("cloud-metadata")),
        ("::ffff:0.0.0.0", Some("unspecified")),
        ("::ffff:8.8.8.8", None),
        ("::ffff:203.0.113.10", None),
        // IPv4-compatible.
        ("::127.0.0.1", Some("loopback")),
        ("::10.0.0.1", Some("private")),
        ("::169.254.169.254", Some("link-local")),
        ("::0.0.0.2", Some("this-network")),
        ("::8.8.8.8", None),
        // NAT64.
        ("64:ff9b::127.0.0.1", Some("loopback")),
        ("64:ff9b::10.0.0.1", Some("private")),
        ("64:ff9b::169.254.169.254", Some("link-local")),
        ("64:ff9b::168.63.129.16", Some("cloud-metadata")),
        ("64:ff9b::8.8.8.8", None),
        // 6to4: the IPv4 address in bits 16..48.
        ("2002:7f00:1::", Some("loopback")),
        ("2002:a00:1::1", Some("private")),
        ("2002:a9fe:a9fe::1", Some("link-local")),
        ("2002:a83f:8110::", Some("cloud-metadata")),
        ("2002:808:808::1", None),
        ("2002:cb00:710a:1::", None),
    ];
    for (addr, reason) in cases {
        assert_eq!(never(addr), reason, "{addr}");
    }
}

#[test]
fn ipv6_public_addresses_pass() {
    for addr in [
        "2606:4700::1111",
        "2a00:1450:4001:80b::200e",
        "2001:4860:4860::8888",
        "2001:db8::1",
        "3fff:ffff::1",
    ] {
        assert_eq!(never(addr), None, "{addr}");
    }
}

#[test]
fn every_reason_has_a_message_and_no_space() {
    let codes = NEVER_V4
        .iter()
        .map(|(_, _, r)| *r)
        .chain(NEVER_V6.iter().map(|(_, _, r)| *r))
        .chain([
            "unspecified",
            "loopback",
            "reserved",
            DENY_LIST,
            NOT_ALLOWLISTED,
        ]);
    for reason in codes {
        assert!(!reason.contains(' '), "{reason}");
        let denied = Denied { reason };
        assert_ne!(denied.message(), reason, "{reason} has no message");
    }
    assert_eq!(Denied { reason: "private" }.to_string(), "private address");
}

#[test]
fn cidrs_parse_contain_and_print() {
    let c = Cidr::parse("10.213.4.8/29").expect("cidr");
    assert!(c.contains(ip("10.213.4.9")));
    assert!(c.contains(ip("::ffff:10.213.4.14")));
    assert!(!c.contains(ip("10.213.4.16")));
    assert!(!c.contains(ip("::1")));
    assert!(!c.contains(ip("::10.213.4.9")));
    assert_eq!(c.to_string(), "10.213.4.8/29");
    assert_eq!(
        Cidr::parse("10.1.2.3/8").expect("cidr").to_string(),
        "10.0.0.0/8"
    );
    assert_eq!(
        Cidr::parse("203.0.113.5").expect("host").to_string(),
        "203.0.113.5/32"
    );
    assert!(
        Cidr::parse("0.0.0.0/0")
            .expect("all")
            .contains(ip("1.2.3.4"))
    );
    assert!(
        !Cidr::parse("0.0.0.0/0")
            .expect("all")
            .contains(ip("2001:db8::1"))
    );

    let v6 = Cidr::parse("2001:DB8::/32").expect("cidr");
    assert_eq!(v6.to_string(), "2001:db8::/32");
    assert!(v6.contains(ip("2001:db8:ffff::1")));
    assert!(!v6.contains(ip("2001:db9::1")));
    assert!(!v6.contains(ip("10.0.0.1")));
    assert_eq!(
        Cidr::parse("2001:db8::1").expect("host").to_string(),
        "2001:db8::1/128"
    );
    let mapped = Cidr::parse("::ffff:10.0.0.0/104").expect("mapped");
    assert!(mapped.contains(ip("10.9.8.7")));
    assert!(
        Cidr::parse("::/0")
            .expect("all")
            .contains(ip("2606:4700::1111"))
    );

    for bad in [
        "",
        "nonsense",
        "10.0.0.0/33",
        "2001:db8::/129",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/0008",
        "10.0.0/8",
        "10.0.0.0/8/8",
        " 10.0.0.0/8",
        "fe80::1%eth0/64",
        "[::1]/128",
    ] {
        assert!(Cidr::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn domain_patterns_parse_and_match() {
    let exact = DomainPattern::parse("PyPI.org.").expect("exact");
    assert_eq!(exact.to_string(), "pypi.org");
    assert!(exact.matches("pypi.org"));
    assert!(exact.matches("PYPI.ORG."));
    assert!(!exact.matches("files.pypi.org"));
    assert!(!exact.matches("notpypi.org"));
    assert!(!exact.matches("pypi.org.evil"));

    let wild = DomainPattern::parse("*.npmjs.org").expect("wildcard");
    assert_eq!(wild.to_string(), "*.npmjs.org");
    assert!(wild.matches("registry.npmjs.org"));
    assert!(wild.matches("a.b.c.NPMJS.org."));
    assert!(!wild.matches("npmjs.org"));
    assert!(!wild.matches("evilnpmjs.org"));
    assert!(!wild.matches(".npmjs.org"));
    assert!(!wild.matches("a..npmjs.org"));
    assert!(!wild.matches("-a.npmjs.org"));

    assert!(DomainPattern::parse("_dmarc.example.com").is_ok());
    assert!(DomainPattern::parse("localhost").is_ok());
    assert!(DomainPattern::parse("*.com").is_ok());
    let long_label = "a".repeat(63);
    assert!(DomainPattern::parse(&format!("{long_label}.com")).is_ok());
    let name_253 = format!("{0}.{0}.{0}.{1}.com", "a".repeat(63), "a".repeat(57));
    assert_eq!(name_253.len(), 253);
    assert!(DomainPattern::parse(&name_253).is_ok());
    assert!(DomainPattern::parse(&format!("a{name_253}")).is_err());

    for bad in [
        "",
        ".",
        "*",
        "*.",
        "**.example.com",
        "*example.com",
        "a.*.example.com",
        "example.*",
        "exa mple.com",
        "-example.com",
        "example-.com",
        "example..com",
        ".example.com",
        "example.com..",
        "10.0.0.1",
        "[::1]",
        "::1",
        "2001:db8::1",
        "127.1",
        "*.0.1",
        "example.123",
        "ex/ample.com",
        "exämple.com",
        "ex@mple.com",
    ] {
        assert!(DomainPattern::parse(bad).is_err(), "{bad:?}");
    }
    assert!(DomainPattern::parse(&format!("{long_label}a.com")).is_err());

    // Hosts that are no names are never matched.
    let everything_com = DomainPattern::parse("*.com").expect("pattern");
    assert!(!everything_com.matches("127.0.0.1"));
    assert!(!everything_com.matches(""));
}

fn allowlist(domains: &[&str], cidrs: &[&str]) -> EgressPolicy {
    EgressPolicy {
        allowlist: Some(Allowlist {
            domains: domains
                .iter()
                .map(|d| DomainPattern::parse(d).expect("pattern"))
                .collect(),
            cidrs: cidrs
                .iter()
                .map(|c| Cidr::parse(c).expect("cidr"))
                .collect(),
        }),
        deny: Vec::new(),
    }
}

fn reason<T>(r: Result<T, Denied>) -> &'static str {
    match r {
        Ok(_) => "passed",
        Err(d) => d.reason,
    }
}

#[test]
fn internet_mode_allows_public_only() {
    let p = EgressPolicy {
        allowlist: None,
        deny: vec![Cidr::parse("203.0.113.0/28").expect("cidr")],
    };
    assert_eq!(p.check_name("example.com"), Ok(NameCheck::Allowed));
    assert_eq!(reason(p.check_name("127.0.0.1")), "loopback");
    assert_eq!(reason(p.check_name("[::1]")), "loopback");
    assert_eq!(
        reason(p.check_name("[::ffff:169.254.169.254]")),
        "link-local"
    );
    assert_eq!(
        p.check_name("203.0.113.200"),
        Ok(NameCheck::AddressesDecide)
    );
    assert_eq!(reason(p.check_name("203.0.113.2")), "deny-list");
    assert_eq!(
        reason(p.check_addr(ip("::ffff:203.0.113.3"), true)),
        "deny-list"
    );
    assert_eq!(p.check_addr(ip("8.8.8.8"), false), Ok(()));
    assert_eq!(p.check_addr(ip("2606:4700::1111"), false), Ok(()));
    assert_eq!(reason(p.check_addr(ip("10.0.0.1"), true)), "private");
}

#[test]
fn allowlist_mode_names_and_addresses() {
    let mut p = allowlist(
        &["pypi.org", "*.npmjs.org"],
        &["198.51.100.0/24", "10.0.0.0/8"],
    );
    p.deny.push(Cidr::parse("198.51.100.128/25").expect("cidr"));

    assert_eq!(p.check_name("PyPI.org"), Ok(NameCheck::Allowed));
    assert_eq!(p.check_name("registry.npmjs.org"), Ok(NameCheck::Allowed));
    assert_eq!(p.check_name("example.com"), Ok(NameCheck::AddressesDecide));
    // An allowed name still only reaches public addresses off the deny list.
    assert_eq!(p.check_addr(ip("8.8.8.8"), true), Ok(()));
    assert_eq!(
        reason(p.check_addr(ip("169.254.169.254"), true)),
        "link-local"
    );
    assert_eq!(
        reason(p.check_addr(ip("198.51.100.200"), true)),
        "deny-list"
    );
    // Other addresses need a CIDR, and a listed private CIDR does not
    // lift the never list.
    assert_eq!(p.check_addr(ip("198.51.100.7"), false), Ok(()));
    assert_eq!(
        reason(p.check_addr(ip("8.8.8.8"), false)),
        "not-allowlisted"
    );
    assert_eq!(reason(p.check_addr(ip("10.1.2.3"), false)), "private");
    assert_eq!(reason(p.check_name("10.1.2.3")), "private");
    assert_eq!(p.check_name("198.51.100.9"), Ok(NameCheck::AddressesDecide));
    assert_eq!(reason(p.check_name("8.8.8.8")), "not-allowlisted");

    // Without CIDRs an unlisted name is refused before any lookup.
    let names_only = allowlist(&["pypi.org"], &[]);
    assert_eq!(
        reason(names_only.check_name("example.com")),
        "not-allowlisted"
    );
    let nothing = allowlist(&[], &[]);
    assert_eq!(reason(nothing.check_name("pypi.org")), "not-allowlisted");
    assert_eq!(
        reason(nothing.check_addr(ip("8.8.8.8"), false)),
        "not-allowlisted"
    );
}

#[test]
fn deny_cidrs_hold_the_ipv4_inside_ipv6_forms() {
    let p = EgressPolicy {
        allowlist: None,
        deny: vec![
            Cidr::parse("203.0.113.0/24").expect("cidr"),
            Cidr::parse("2001:db8:dead::/48").expect("cidr"),
        ],
    };
    for refused in [
        "203.0.113.9",
        // Mapped, compatible, NAT64 and 6to4 forms of 203.0.113.9.
        "::ffff:203.0.113.9",
        "::203.0.113.9",
        "64:ff9b::203.0.113.9",
        "64:ff9b::cb00:7109",
        "2002:cb00:7109::",
        "2002:cb00:7109:ffff::1",
        "2001:db8:dead::1",
    ] {
        assert_eq!(
            reason(p.check_addr(ip(refused), false)),
            "deny-list",
            "{refused}"
        );
        assert_eq!(reason(p.check_name(refused)), "deny-list", "{refused}");
        assert_eq!(
            reason(p.check_addr(ip(refused), true)),
            "deny-list",
            "{refused} from an allowed name"
        );
    }
    for passed in [
        "203.0.114.9",
        "::ffff:203.0.114.9",
        "64:ff9b::203.0.114.9",
        "2002:cb00:7209::",
        "2001:db8:beef::1",
    ] {
        assert_eq!(p.check_addr(ip(passed), false), Ok(()), "{passed}");
    }
    // An IPv6 deny CIDR covering the translated forms refuses those,
    // not the plain IPv4 addresses they stand for.
    let nat64 = EgressPolicy {
        allowlist: None,
        deny: vec![
            Cidr::parse("64:ff9b::/96").expect("cidr"),
            Cidr::parse("2002::/16").expect("cidr"),
        ],
    };
    assert_eq!(
        reason(nat64.check_addr(ip("64:ff9b::8.8.8.8"), false)),
        "deny-list"
    );
    assert_eq!(
        reason(nat64.check_addr(ip("2002:808:808::"), false)),
        "deny-list"
    );
    assert_eq!(nat64.check_addr(ip("8.8.8.8"), false), Ok(()));
}

#[test]
fn allow_cidrs_judge_the_ipv4_inside_ipv6_forms() {
    let p = allowlist(&[], &["198.51.100.0/24", "64:ff9b::/96", "2002::/16"]);
    // An allowed IPv4 network is allowed in every form.
    for passed in [
        "198.51.100.7",
        "::ffff:198.51.100.7",
        "::198.51.100.7",
        "64:ff9b::198.51.100.7",
        "2002:c633:6407::1",
    ] {
        assert_eq!(p.check_addr(ip(passed), false), Ok(()), "{passed}");
    }
    // IPv4 addresses off the list stay off it in every form, even where
    // an IPv6 entry covers the form itself.
    for refused in [
        "8.8.8.8",
        "::ffff:8.8.8.8",
        "::8.8.8.8",
        "64:ff9b::8.8.8.8",
        "2002:808:808::",
    ] {
        assert_eq!(
            reason(p.check_addr(ip(refused), false)),
            "not-allowlisted",
            "{refused}"
        );
    }
    // A listed name still decides for the addresses it resolves to,
    // within the never list and the deny list.
    let mut named = allowlist(&["pypi.org"], &[]);
    named
        .deny
        .push(Cidr::parse("203.0.113.0/24").expect("cidr"));
    assert_eq!(named.check_addr(ip("64:ff9b::8.8.8.8"), true), Ok(()));
    assert_eq!(
        reason(named.check_addr(ip("64:ff9b::203.0.113.1"), true)),
        "deny-list"
    );
    assert_eq!(
        reason(named.check_addr(ip("64:ff9b::10.0.0.1"), true)),
        "private"
    );
    // Plain IPv6 addresses are judged as before.
    let v6 = allowlist(&[], &["2001:db8::/32"]);
    assert_eq!(v6.check_addr(ip("2001:db8::1"), false), Ok(()));
    assert_eq!(
        reason(v6.check_addr(ip("2606:4700::1111"), false)),
        "not-allowlisted"
    );
}

#[test]
fn one_refused_address_refuses_the_name() {
    let p = allowlist(&["pypi.org"], &["198.51.100.0/24"]);
    let public = ip("8.8.8.8");
    let private = ip("10.0.0.1");
    let listed = ip("198.51.100.1");
    assert_eq!(
        p.check_resolved(NameCheck::Allowed, &[public, listed]),
        Ok(())
    );
    assert_eq!(
        p.check_resolved(NameCheck::Allowed, &[public, private]),
        Err((private, Denied { reason: "private" }))
    );
    assert_eq!(
        p.check_resolved(NameCheck::AddressesDecide, &[listed]),
        Ok(())
    );
    assert_eq!(
        p.check_resolved(NameCheck::AddressesDecide, &[listed, public]),
        Err((
            public,
            Denied {
                reason: "not-allowlisted"
            }
        ))
    );
    let internet = EgressPolicy::default();
    assert_eq!(
        internet.check_resolved(NameCheck::Allowed, &[public, ip("::1")]),
        Err((ip("::1"), Denied { reason: "loopback" }))
    );
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn policies_round_trip_through_arguments() {
    let internet = EgressPolicy::default();
    assert!(internet.to_args().is_empty());
    assert_eq!(EgressPolicy::from_args(&[]), Ok(internet));

    let mut p = allowlist(
        &["pypi.org", "*.npmjs.org"],
        &["198.51.100.0/24", "2001:db8::/32"],
    );
    p.deny = vec![Cidr::parse("203.0.113.0/24").expect("cidr")];
    let written = p.to_args();
    assert_eq!(
        written,
        args(&[
            "--deny",
            "203.0.113.0/24",
            "--allowlist",
            "--allow-domain",
            "pypi.org",
            "--allow-domain",
            "*.npmjs.org",
            "--allow-cidr",
            "198.51.100.0/24",
            "--allow-cidr",
            "2001:db8::/32",
        ])
    );
    assert_eq!(EgressPolicy::from_args(&written), Ok(p));

    let empty = allowlist(&[], &[]);
    assert_eq!(empty.to_args(), args(&["--allowlist"]));
    assert_eq!(EgressPolicy::from_args(&empty.to_args()), Ok(empty));

    // Allowed entries imply allowlist mode.
    let implied = EgressPolicy::from_args(&args(&["--allow-domain", "pypi.org"])).expect("policy");
    assert_eq!(implied, allowlist(&["pypi.org"], &[]));
}

#[test]
fn bad_arguments_are_refused() {
    for bad in [
        &["--deny"][..],
        &["--deny", "nonsense"],
        &["--allow-domain", "*"],
        &["--allow-domain", "10.0.0.1"],
        &["--allow-cidr", "10.0.0.0/33"],
        &["--allow"],
        &["pypi.org"],
        &["--listen", "3128"],
    ] {
        assert!(EgressPolicy::from_args(&args(bad)).is_err(), "{bad:?}");
    }
    let mut many = Vec::new();
    for i in 0..=MAX_ENTRIES {
        many.push("--allow-domain".to_owned());
        many.push(format!("host{i}.example.com"));
    }
    assert!(EgressPolicy::from_args(&many[..2 * MAX_ENTRIES]).is_ok());
    assert!(EgressPolicy::from_args(&many).is_err());
}
