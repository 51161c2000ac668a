//! The sandboxes' networks: the bridge network's name, the network modes
//! and the default one, the egress lists, and the pool of link-network
//! blocks.

use super::{Config, ConfigError};

/// Most entries of `egress_allow` or `egress_deny`: an egress proxy takes
/// at most `MAX_ENTRIES` of each kind, and a sandbox's own allowlist (up
/// to 64) or this machine's addresses come on top.
const MAX_EGRESS_LIST: usize = sandboxd_proto::egress::MAX_ENTRIES / 2;

pub(super) fn egress_list_fits(list: &[String]) -> Result<(), String> {
    if list.len() > MAX_EGRESS_LIST {
        return Err(format!("{} entries; at most {MAX_EGRESS_LIST}", list.len()));
    }
    Ok(())
}

/// Every network mode there is.
pub const NETWORK_MODES: [&str; 4] = ["none", "internet", "allowlist", "open"];

pub(super) fn validate_network_mode(m: &String) -> Result<(), String> {
    if NETWORK_MODES.contains(&m.as_str()) {
        Ok(())
    } else {
        Err(format!(
            "{m:?} is not a network mode ({})",
            NETWORK_MODES.join(", ")
        ))
    }
}

impl Config {
    /// The network sandboxes with a network join.
    pub fn network_name(&self) -> &str {
        self.network_name.as_deref().unwrap_or_default()
    }

    /// The link-network pool fits the ports a sandbox may publish, and the
    /// default mode is one a request may name.
    pub(super) fn validate_network(&self) -> Result<(), ConfigError> {
        let prefix = crate::subnet::link_prefix(self.max_ports);
        if crate::subnet::link_subnet_range(&self.link_subnet_pool, prefix).is_none() {
            return Err(ConfigError::invalid(
                "link_subnet_pool",
                format!(
                    "{:?} must be an IPv4 CIDR from /8 to /{prefix} (one link network is a /{prefix} with max_ports {}), e.g. 10.213.0.0/16",
                    self.link_subnet_pool, self.max_ports
                ),
            ));
        }
        if !self.network_modes.contains(&self.network_default) {
            return Err(ConfigError::invalid(
                "network_default",
                format!(
                    "{:?} must be one of network_modes ({})",
                    self.network_default,
                    self.network_modes.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::config::tests::{env_of, err_of};

    #[test]
    fn egress_lists_fit_what_an_egress_proxy_takes() {
        let list = |n: usize| {
            (0..n)
                .map(|i| format!("\"10.{}.{}.0/24\"", i / 256, i % 256))
                .collect::<Vec<_>>()
                .join(",")
        };
        for key in ["egress_deny", "egress_allow"] {
            Config::from_toml_and_env(&format!("{key} = [{}]", list(128)), env_of(&[]))
                .unwrap_or_else(|e| panic!("{key} of 128: {e}"));
            let e = err_of(&format!("{key} = [{}]", list(129)), &[]);
            assert!(e.contains(key) && e.contains("at most 128"), "{e}");
        }
    }
}
