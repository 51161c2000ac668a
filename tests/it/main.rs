//! The integration tests: one binary, one module per capability. Each
//! module but `http_contract` runs the real `sandboxd` binary against the
//! real engine through the harness (`TestServer`), and removes what it made
//! when it ends. `engine_restart` restarts the engine itself, so
//! scripts/test.sh runs it alone, after the rest.

mod harness;

mod abuse;
mod agent;
mod auth;
mod changes;
mod checkpoints;
mod checkpoints_diff;
mod codes;
mod commands;
mod config;
mod disk;
mod e2b;
mod e2b_js;
mod egress;
mod engine;
mod engine_restart;
mod environment;
mod errors;
mod faults;
mod files;
mod files_edit;
mod files_move;
mod files_watch;
mod gvisor;
mod health;
mod host;
mod http_contract;
mod mcp;
mod mcp_typescript;
mod metadata;
mod observability;
mod openapi;
mod pause;
mod pool;
mod ports;
mod pty;
mod remcochat;
mod sandboxes;
mod search;
mod security;
mod session_tokens;
mod shaping;
mod shell;
mod stdin;
mod ui;
