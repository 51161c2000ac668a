//! The `sandboxd` binary: parse the command line, load the configuration,
//! set up logging, run the server. Everything else lives in the library,
//! but for the `shell` client (module `shell`), which is no part of the
//! server.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

mod shell;

/// One hardened container per chat session, behind an HTTP API.
#[derive(Debug, Parser)]
#[command(name = "sandboxd", version)]
struct Cli {
    /// TOML configuration file; environment variables override it.
    #[arg(long, env = "SANDBOXD_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Ask the configured address for /v1/health: exit 0 when ok, 1 otherwise.
    Healthcheck,
    /// Print the OpenAPI 3.1 document (as served at /v1/openapi.json).
    Openapi,
    /// Open an interactive terminal in a sandbox of a running sandboxd;
    /// exits with the session's exit code.
    Shell(shell::ShellArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The document depends on no configuration, so a broken one does not
    // stop it being printed.
    if let Some(Command::Openapi) = cli.command {
        print!("{}", sandboxd::api::openapi::json());
        return ExitCode::SUCCESS;
    }
    // A client of some sandboxd, maybe on another machine: this machine's
    // server configuration is not its business.
    if let Some(Command::Shell(args)) = cli.command {
        return shell::main(args);
    }
    let config = match sandboxd::config::Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandboxd: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Healthcheck) = cli.command {
        return healthcheck(&config);
    }
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sandboxd::server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandboxd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn healthcheck(config: &sandboxd::config::Config) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("unhealthy: cannot start the async runtime: {e}"))
        .and_then(|rt| rt.block_on(sandboxd::healthcheck::check(config)));
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(line) => {
            println!("{line}");
            ExitCode::FAILURE
        }
    }
}

/// Human-readable logs by default, JSON with SANDBOXD_LOG_FORMAT=json;
/// RUST_LOG filters (default: info).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if std::env::var("SANDBOXD_LOG_FORMAT").is_ok_and(|v| v == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
