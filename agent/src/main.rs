//! `sandboxd-agent`: the process manager inside every sandbox. It runs as
//! the sandbox user from container start and owns what happens inside:
//! commands (each under a keeper that reaps and kills its whole tree),
//! their output, file I/O confined to the workspace, and port relays.
//! sandboxd talks to it over one connection per sandboxd process (see
//! `sandboxd-proto`); the agent trusts sandboxd, sandboxd does not trust
//! the agent.

mod files;

fn main() {}
