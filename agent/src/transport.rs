//! How sandboxd's connections reach the agent: the name of the abstract
//! unix socket the agent listens on (and the bridge connects to), and the
//! size the pipes carrying a connection ask for (the bridge's, and the
//! agent's own stdio when it is one).

/// The abstract socket name (`\0sandboxd-agent`): in the sandbox's own
/// network namespace, so only processes of this sandbox see it.
/// `SANDBOXD_AGENT_SOCKET` names another (tests run several agents in one
/// namespace).
pub(crate) fn socket_name() -> Vec<u8> {
    std::env::var("SANDBOXD_AGENT_SOCKET")
        .unwrap_or_else(|_| "sandboxd-agent".into())
        .into_bytes()
}

/// What a connection's pipes are asked to hold (the usual limit for a
/// user, `/proc/sys/fs/pipe-max-size`).
pub(crate) const PIPE_BYTES: usize = 1024 * 1024;
