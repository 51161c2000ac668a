//! The bench's sections, one file each, named as `--only` names them:
//! which there are, and what one run measures for `--only X` or for all of
//! them. Each section's file declares its lines of the table (key, target,
//! check) and measures them.

pub(crate) mod burst;
pub(crate) mod changes;
pub(crate) mod checkpoints;
pub(crate) mod core;
pub(crate) mod density;
pub(crate) mod e2b;
pub(crate) mod egress;
pub(crate) mod gvisor;
pub(crate) mod mcp;
pub(crate) mod pool;
pub(crate) mod pty;
pub(crate) mod shaping;

use crate::floor::Floor;
use crate::report::RunFigures;
use crate::support::{Res, Server};

/// A section `--only` measures alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// Every line but the shaping, MCP, pool, burst and density sections.
    Core,
    Egress,
    Gvisor,
    Pty,
    Pool,
    Shaping,
    Changes,
    /// Workspace checkpoints of a 500 MB tree, on a sandboxd of its own.
    Checkpoints,
    Mcp,
    /// E2B's Python SDK against the REST.
    E2b,
    /// The burst lines, then the density lines.
    Burst,
    /// The burst's rate lines alone (the sustained rate, 5/s and 1/s).
    Rate,
    /// The burst's sustained rate alone.
    Sustained,
    /// The burst's new sessions one after another alone.
    Sequential,
    /// The burst's 50 new sessions at once alone.
    Fifty,
    Density,
}

impl Section {
    /// The section `--only NAME` names.
    pub(crate) fn from_name(name: &str) -> Option<Section> {
        match name {
            "core" => Some(Section::Core),
            "egress" => Some(Section::Egress),
            "gvisor" => Some(Section::Gvisor),
            "pty" => Some(Section::Pty),
            "pool" => Some(Section::Pool),
            "shaping" => Some(Section::Shaping),
            "changes" => Some(Section::Changes),
            "checkpoints" => Some(Section::Checkpoints),
            "mcp" => Some(Section::Mcp),
            "e2b" => Some(Section::E2b),
            "burst" => Some(Section::Burst),
            "rate" => Some(Section::Rate),
            "sustained" => Some(Section::Sustained),
            "sequential" => Some(Section::Sequential),
            "fifty" => Some(Section::Fifty),
            "density" => Some(Section::Density),
            _ => None,
        }
    }
}

/// One run's measurements on `server`: `only` that section, or (`None`)
/// core, then shaping, then MCP, then E2B, then checkpoints, then pool,
/// then burst (with density).
pub(crate) async fn measure(
    only: Option<Section>,
    server: &Server,
    floor: &Floor,
    fig: &mut RunFigures,
    profile: bool,
    runsc: bool,
    idle_secs: u64,
) -> Res<()> {
    match only {
        None => {
            core::measure(server, floor, fig, profile, runsc).await?;
            shaping::measure(server, fig).await?;
            mcp::measure(server, fig).await?;
            e2b::measure(floor, fig).await?;
            checkpoints::measure(floor, fig).await?;
            pool::measure(server, floor, fig, idle_secs).await?;
            burst::measure(server, floor, fig).await
        }
        Some(Section::Core) => core::measure(server, floor, fig, profile, runsc).await,
        Some(Section::Shaping) => shaping::measure(server, fig).await,
        Some(Section::Pool) => pool::measure(server, floor, fig, idle_secs).await,
        Some(Section::Egress) => egress::measure(server, fig).await,
        Some(Section::Gvisor) => gvisor::measure(server, floor, fig).await,
        Some(Section::Pty) => pty::measure(server, fig).await,
        Some(Section::Changes) => changes::measure(server, fig).await,
        Some(Section::Checkpoints) => checkpoints::measure(floor, fig).await,
        Some(Section::Mcp) => mcp::measure(server, fig).await,
        Some(Section::E2b) => e2b::measure(floor, fig).await,
        Some(Section::Burst) => burst::measure(server, floor, fig).await,
        Some(Section::Rate) => burst::rates(floor, fig).await,
        Some(Section::Sustained) => burst::sustained(floor, fig).await,
        Some(Section::Sequential) => burst::one_after_another(server, floor, fig).await,
        Some(Section::Fifty) => burst::all_at_once(floor, fig).await,
        Some(Section::Density) => density::measure(floor, fig).await,
    }
}
