//! Finding and connecting to the Docker engine: socket discovery in a fixed,
//! documented order, API version negotiation, and a background connector
//! that keeps trying until an engine answers, so sandboxd can start first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, Docker};
use tokio_util::sync::CancellationToken;

/// A socket chosen by discovery, and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SocketChoice {
    pub(crate) path: PathBuf,
    pub(crate) reason: String,
}

/// What discovery looks at; a struct so the order can be unit-tested.
#[derive(Debug, Clone, Default)]
pub(crate) struct DiscoveryInputs {
    /// SANDBOXD_DOCKER_SOCKET / `docker_socket`: when set, the only candidate.
    pub(crate) configured: Option<String>,
    /// DOCKER_HOST, used when it is a unix:// address.
    pub(crate) docker_host: Option<String>,
    pub(crate) home: Option<PathBuf>,
    pub(crate) xdg_runtime_dir: Option<PathBuf>,
}

impl DiscoveryInputs {
    /// Reads the process environment.
    pub(crate) fn from_env(configured: Option<String>) -> Self {
        DiscoveryInputs {
            configured,
            docker_host: std::env::var("DOCKER_HOST").ok().filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME").map(PathBuf::from),
            xdg_runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        }
    }

    /// Every candidate, in order. An explicitly configured socket (ours or
    /// DOCKER_HOST) is the only candidate: silently falling back to another
    /// engine than the operator named would be a surprise.
    pub(crate) fn candidates(&self) -> Vec<(PathBuf, String)> {
        if let Some(p) = &self.configured {
            return vec![(PathBuf::from(p), "SANDBOXD_DOCKER_SOCKET is set".into())];
        }
        if let Some(host) = &self.docker_host {
            if let Some(p) = host.strip_prefix("unix://") {
                return vec![(PathBuf::from(p), "DOCKER_HOST is set".into())];
            }
        }
        let mut out = vec![(
            PathBuf::from("/var/run/docker.sock"),
            "the default Docker socket".to_string(),
        )];
        if let Some(home) = &self.home {
            for (rel, what) in [
                (".docker/run/docker.sock", "Docker Desktop"),
                (".colima/default/docker.sock", "Colima"),
                (".orbstack/run/docker.sock", "OrbStack"),
                (".rd/docker.sock", "Rancher Desktop"),
            ] {
                out.push((home.join(rel), format!("{what}'s socket")));
            }
        }
        if let Some(xdg) = &self.xdg_runtime_dir {
            out.push((
                xdg.join("podman/podman.sock"),
                "rootless Podman's socket".into(),
            ));
        }
        out.push((
            PathBuf::from("/run/podman/podman.sock"),
            "Podman's socket".into(),
        ));
        out
    }

    /// The first candidate that exists, or a sentence listing what was tried.
    pub(crate) fn choose(&self, exists: impl Fn(&Path) -> bool) -> Result<SocketChoice, String> {
        let candidates = self.candidates();
        for (path, why) in &candidates {
            if exists(path) {
                return Ok(SocketChoice {
                    path: path.clone(),
                    reason: why.clone(),
                });
            }
        }
        let tried: Vec<String> = candidates
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        let mut msg = format!("no engine socket found (tried {})", tried.join(", "));
        if let Some(host) = &self.docker_host {
            if !host.starts_with("unix://") && self.configured.is_none() {
                msg.push_str(&format!(
                    "; DOCKER_HOST={host} is not a unix:// socket and was ignored"
                ));
            }
        }
        Err(msg)
    }
}

/// Connects to `choice` and negotiates the API version down to what the
/// engine speaks (Docker 20.10 speaks 1.41; newer engines more).
pub(crate) async fn connect(choice: &SocketChoice, timeout: Duration) -> Result<Docker, String> {
    let path = choice.path.to_string_lossy();
    let docker = Docker::connect_with_unix(&path, 120, API_DEFAULT_VERSION)
        .map_err(|e| format!("cannot use {path}: {e}"))?;
    match tokio::time::timeout(timeout, docker.negotiate_version()).await {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(format!("engine at {path} did not answer: {e}")),
        Err(_) => Err(format!(
            "engine at {path} did not answer within {} ms",
            timeout.as_millis()
        )),
    }
}

/// Keeps trying to connect until it succeeds or shutdown. Logs each change
/// of what it sees once, not every retry.
pub(crate) async fn connect_until_ready(
    inputs: DiscoveryInputs,
    shutdown: CancellationToken,
    on_status: impl Fn(Result<&Docker, &str>),
) -> Option<(Docker, SocketChoice)> {
    let mut last_error = String::new();
    loop {
        let attempt = match inputs.choose(|p| p.exists()) {
            Ok(choice) => connect(&choice, Duration::from_secs(2))
                .await
                .map(|d| (d, choice)),
            Err(e) => Err(e),
        };
        match attempt {
            Ok((docker, choice)) => {
                on_status(Ok(&docker));
                return Some((docker, choice));
            }
            Err(e) => {
                if e != last_error {
                    tracing::warn!(error = %e, "no Docker engine yet; retrying every second");
                    last_error = e;
                }
                on_status(Err(&last_error));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> DiscoveryInputs {
        DiscoveryInputs {
            configured: None,
            docker_host: None,
            home: Some("/home/u".into()),
            xdg_runtime_dir: Some("/run/user/1000".into()),
        }
    }

    #[test]
    fn default_order_is_the_documented_one() {
        let order: Vec<String> = inputs()
            .candidates()
            .into_iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        assert_eq!(
            order,
            [
                "/var/run/docker.sock",
                "/home/u/.docker/run/docker.sock",
                "/home/u/.colima/default/docker.sock",
                "/home/u/.orbstack/run/docker.sock",
                "/home/u/.rd/docker.sock",
                "/run/user/1000/podman/podman.sock",
                "/run/podman/podman.sock",
            ]
        );
    }

    #[test]
    fn first_existing_candidate_wins() {
        let choice = inputs()
            .choose(|p| p.ends_with(".colima/default/docker.sock") || p.ends_with("podman.sock"))
            .expect("found");
        assert_eq!(
            choice.path,
            PathBuf::from("/home/u/.colima/default/docker.sock")
        );
        assert!(choice.reason.contains("Colima"));
    }

    #[test]
    fn configured_socket_is_the_only_candidate() {
        let i = DiscoveryInputs {
            configured: Some("/tmp/x.sock".into()),
            docker_host: Some("unix:///tmp/y.sock".into()),
            ..inputs()
        };
        assert_eq!(i.candidates().len(), 1);
        let e = i
            .choose(|p| p == Path::new("/var/run/docker.sock"))
            .unwrap_err();
        assert!(e.contains("/tmp/x.sock"), "{e}");
    }

    #[test]
    fn docker_host_unix_comes_before_defaults() {
        let i = DiscoveryInputs {
            docker_host: Some("unix:///tmp/y.sock".into()),
            ..inputs()
        };
        let c = i.choose(|_| true).expect("found");
        assert_eq!(c.path, PathBuf::from("/tmp/y.sock"));
        assert_eq!(c.reason, "DOCKER_HOST is set");
    }

    #[test]
    fn tcp_docker_host_is_ignored_and_said() {
        let i = DiscoveryInputs {
            docker_host: Some("tcp://10.0.0.1:2375".into()),
            ..inputs()
        };
        let e = i.choose(|_| false).unwrap_err();
        assert!(e.contains("not a unix:// socket"), "{e}");
        let c = i
            .choose(|p| p == Path::new("/var/run/docker.sock"))
            .expect("default");
        assert_eq!(c.path, PathBuf::from("/var/run/docker.sock"));
    }
}
