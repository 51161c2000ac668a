//! The E2B dialect's settings: which runtime each E2B template name
//! creates (`e2b_templates`, entries `TEMPLATE=RUNTIME`; out of the box
//! `base`, the SDKs' default template, is the `default` runtime), and the
//! domain of its port hosts (`e2b_domain`).

use super::{Config, ConfigError};

/// One entry's shape: a template name and a runtime name, both non-empty.
pub(super) fn validate_template_entries(entries: &[String]) -> Result<(), String> {
    for e in entries {
        match e.split_once('=') {
            Some((t, r)) if !t.trim().is_empty() && !r.trim().is_empty() => {}
            _ => return Err(format!("{e:?} must be TEMPLATE=RUNTIME, e.g. base=default")),
        }
    }
    Ok(())
}

impl Config {
    /// Every template names a runtime that exists, and no template twice.
    pub(super) fn validate_e2b_templates(&self) -> Result<(), ConfigError> {
        let mut seen = Vec::new();
        for (template, runtime) in self.e2b_template_table() {
            if !self.runtimes.contains_key(runtime) {
                return Err(ConfigError::invalid(
                    "e2b_templates",
                    format!(
                        "template {template:?} names runtime {runtime:?}, which is not configured"
                    ),
                ));
            }
            if seen.contains(&template) {
                return Err(ConfigError::invalid(
                    "e2b_templates",
                    format!("template {template:?} is listed twice"),
                ));
            }
            seen.push(template);
        }
        Ok(())
    }

    /// `e2b_domain`, when set, is a host this server serves: port hosts
    /// under any other name would be refused.
    pub(super) fn validate_e2b_domain(&self) -> Result<(), ConfigError> {
        if self.e2b_domain.is_empty() {
            return Ok(());
        }
        self.origin_policy
            .check_host(Some(&self.e2b_domain))
            .map_err(|_| {
                ConfigError::invalid(
                    "e2b_domain",
                    format!(
                        "{:?} must be NAME[:PORT] naming this server: loopback, the bind address or an allowed_hosts entry",
                        self.e2b_domain
                    ),
                )
            })
    }

    /// The runtime an E2B template creates; `None` for an unknown template.
    pub fn e2b_runtime(&self, template: &str) -> Option<&str> {
        self.e2b_template_table()
            .find(|(t, _)| *t == template)
            .map(|(_, r)| r)
    }

    /// The first template that creates `runtime`, to show a sandbox's
    /// template; `None` when no template does.
    pub fn e2b_template(&self, runtime: &str) -> Option<&str> {
        self.e2b_template_table()
            .find(|(_, r)| *r == runtime)
            .map(|(t, _)| t)
    }

    fn e2b_template_table(&self) -> impl Iterator<Item = (&str, &str)> {
        self.e2b_templates
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(t, r)| (t.trim(), r.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{env_of, err_of};
    use super::*;

    #[test]
    fn the_e2b_domain_must_name_this_server() {
        let domain = |v: &str, hosts: &str| {
            Config::from_toml_and_env(
                "",
                env_of(&[
                    ("SANDBOXD_E2B_DOMAIN", v),
                    ("SANDBOXD_ALLOWED_HOSTS", hosts),
                ]),
            )
        };
        for (v, hosts) in [
            ("", ""),
            ("localhost:8080", ""),
            ("sandbox.example.com", "sandbox.example.com"),
            ("sandbox.example.com:443", "*.example.com"),
        ] {
            assert_eq!(domain(v, hosts).expect(v).e2b_domain, v);
        }
        for (v, hosts) in [
            ("sandbox.example.com", ""),
            ("http://localhost", ""),
            ("localhost/x", ""),
        ] {
            let e = domain(v, hosts).map(|_| ()).expect_err(v).to_string();
            assert!(e.contains("e2b_domain"), "{v}: {e}");
        }
    }

    #[test]
    fn base_is_the_default_runtime_and_the_table_is_checked() {
        let cfg = Config::from_toml_and_env("", env_of(&[])).expect("defaults");
        assert_eq!(cfg.e2b_runtime("base"), Some("default"));
        assert_eq!(cfg.e2b_runtime("nope"), None);
        assert_eq!(cfg.e2b_template("default"), Some("base"));
        let cfg = Config::from_toml_and_env(
            "",
            env_of(&[("SANDBOXD_E2B_TEMPLATES", "base=default, py = python3.13")]),
        )
        .expect("two");
        assert_eq!(cfg.e2b_runtime("py"), Some("python3.13"));
        for bad in [
            "base",
            "=default",
            "base=",
            "base=nosuch",
            "a=default,a=node24",
        ] {
            let e = err_of("", &[("SANDBOXD_E2B_TEMPLATES", bad)]);
            assert!(e.contains("e2b_templates"), "{bad}: {e}");
        }
    }
}
