//! sandboxd: one hardened Docker container per chat session, behind a small
//! HTTP API, so a chat backend's `bash`, `readFile`, `writeFile` and
//! `sandboxUrl` tools never run anything on the host.
//!
//! The data path: a request enters at [`api`], where it is authorised and
//! parsed into typed values; the domain ([`sandbox`]) decides what to do;
//! only [`engine`] turns that into Docker Engine API calls. Answers travel
//! back the same way, and each layer sees only the types of the one below.
//!
//! - [`config`]: defaults, TOML file, environment; validated once.
//! - [`server`]: bind, background tasks, graceful shutdown.
//! - [`app`]: the shared state handlers get.
//! - [`api`]: routes, auth, extractors, the one error type.
//! - [`sandbox`]: registry, lifecycle, labels, reaper, rehydration.
//! - [`command`]: commands, their output logs, timeouts and tree kills.
//! - [`files`]: read, write, list, delete inside the workspace, symlink-safe.
//! - [`ports`]: relays and proxy containers that publish sandbox ports.
//! - [`telemetry`]: Prometheus metrics and request ids.
//! - [`healthcheck`]: the `sandboxd healthcheck` subcommand.
//! - [`id`]: random identifiers.
//! - [`engine`]: the container engine, behind a small interface.

pub mod api;
pub mod app;
pub mod command;
pub mod config;
pub mod engine;
pub mod files;
pub mod healthcheck;
pub mod id;
pub mod ports;
pub mod sandbox;
pub mod server;
pub mod telemetry;
