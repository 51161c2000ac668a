//! Who may call the API: the admin token, and the checks that a server
//! reachable from elsewhere, or answering any `Host`, has one.

use super::sources::Setting;
use super::{Config, ConfigError};

/// The admin token. Its `Debug` is redacted so it cannot reach a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// The token itself, for the constant-time comparison only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Never shown: the example file holds no token.
impl Setting for AdminToken {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(AdminToken(s.to_string()))
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        String::from_toml(v).map(AdminToken)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        None
    }
}

impl Config {
    /// A token is needed where anyone but this machine's users could
    /// reach the API.
    pub(super) fn validate_exposure(&self) -> Result<(), ConfigError> {
        if !self.bind_host.is_loopback()
            && self.admin_token.is_none()
            && !self.allow_insecure_no_token
        {
            return Err(ConfigError::invalid(
                "SANDBOXD_ADMIN_TOKEN",
                format!(
                    "binding to the non-loopback address {} needs an admin token \
                     (anyone who reaches the port could run code next to the engine socket); \
                     set SANDBOXD_ADMIN_TOKEN, or allow_insecure_no_token = true to accept the risk",
                    self.bind_host
                ),
            ));
        }
        if self.origin_policy.any_host() && self.admin_token.is_none() {
            return Err(ConfigError::invalid(
                "allowed_hosts",
                "\"*\" turns the Host check off, which lets any web page drive a token-less \
                 sandboxd through DNS rebinding; set SANDBOXD_ADMIN_TOKEN too, or list the names",
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
    fn non_loopback_without_token_is_refused_unless_allowed() {
        let e = err_of("", &[("SANDBOXD_BIND_HOST", "0.0.0.0")]);
        assert!(e.starts_with("SANDBOXD_ADMIN_TOKEN:"), "{e}");
        Config::from_toml_and_env(
            "allow_insecure_no_token = true",
            env_of(&[("SANDBOXD_BIND_HOST", "0.0.0.0")]),
        )
        .expect("explicitly allowed");
        Config::from_toml_and_env(
            "",
            env_of(&[
                ("SANDBOXD_BIND_HOST", "0.0.0.0"),
                ("SANDBOXD_ADMIN_TOKEN", "t"),
            ]),
        )
        .expect("token given");
    }
}
