//! Processes in a running container, attached: their output (stdout and
//! stderr demultiplexed) and their stdin held open. Either one started for
//! the purpose (sandboxd starts one per connection to a sandbox's agent,
//! its bridge), or the container's own process (the agent, whose stdio is
//! the first connection); everything else runs under the agent.

use std::pin::Pin;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::AttachContainerOptionsBuilder;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWrite;

use super::{Engine, EngineError, EngineResult};

/// Biggest frame we ask bollard to buffer: large enough that a flood
/// arrives in few, large chunks.
const OUTPUT_CAPACITY: usize = 256 * 1024;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// `NAME=value` pairs added to the container's environment.
    pub env: Vec<String>,
    pub working_dir: String,
}

/// Output chunks of a process, tagged by stream, until it ends.
pub type ExecOutput = Pin<Box<dyn Stream<Item = EngineResult<(OutputStream, Bytes)>> + Send>>;

/// A started process: its output until it ends, and its stdin.
pub struct ExecSession {
    pub output: ExecOutput,
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSession").finish_non_exhaustive()
    }
}

/// Creates and starts `req` in `container`, attached.
pub(super) async fn start(
    docker: &Docker,
    container: &str,
    req: &ExecRequest,
) -> EngineResult<ExecSession> {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(req.argv.clone()),
                env: Some(req.env.clone()),
                working_dir: Some(req.working_dir.clone()),
                ..Default::default()
            },
        )
        .await?;
    let started = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: Some(OUTPUT_CAPACITY),
            }),
        )
        .await?;
    match started {
        StartExecResults::Attached { output, input } => Ok(session(output, input)),
        StartExecResults::Detached => Err(EngineError::Failed(
            "the engine started the process detached".into(),
        )),
    }
}

/// Attaches to the stdio of `container`'s own process (created or
/// running): its output from now on, and its stdin. Without a terminal the
/// engine copies the input as it is (no detach keys are looked for), and
/// a container made with `StdinOnce` has its input closed when this
/// session ends.
pub(super) async fn attach(docker: &Docker, container: &str) -> EngineResult<ExecSession> {
    let options = AttachContainerOptionsBuilder::new()
        .stream(true)
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .build();
    let attached = docker.attach_container(container, Some(options)).await?;
    Ok(session(attached.output, attached.input))
}

fn session(
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    stdin: Pin<Box<dyn AsyncWrite + Send>>,
) -> ExecSession {
    ExecSession {
        output: Box::pin(output.filter_map(|item| async move {
            match item {
                Ok(LogOutput::StdOut { message }) => Some(Ok((OutputStream::Stdout, message))),
                Ok(LogOutput::StdErr { message }) => Some(Ok((OutputStream::Stderr, message))),
                Ok(_) => None,
                Err(e) => Some(Err(EngineError::from(e))),
            }
        })),
        stdin,
    }
}

impl Engine {
    /// Starts a process in a running container, attached.
    pub async fn exec(&self, container: &str, req: &ExecRequest) -> EngineResult<ExecSession> {
        let docker = self.docker()?;
        start(&docker, container, req).await
    }

    /// Attaches to the stdio of a container's own process (see
    /// `attach` below).
    pub async fn attach(&self, container: &str) -> EngineResult<ExecSession> {
        let docker = self.docker()?;
        attach(&docker, container).await
    }
}
