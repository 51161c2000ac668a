//! The report: what a run measured ([`RunFigures`], one [`Figure`] a line),
//! the table's lines in the order it prints them ([`TABLE`], each line
//! declared by its section with its target and check), the header naming
//! the commit and machine, and the writer of the markdown table and of the
//! run's raw JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::sections::{
    burst, changes, checkpoints, core, density, e2b, egress, gvisor, mcp, pool, pty, shaping,
};
use crate::support::{self, Res, median, pct};

/// A MB in the lines measured in binary units (the agent's binary, a pool
/// member's cgroup): 2^20 bytes.
pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// The table, section by section in the order it prints them; the gVisor
/// lines stand next to the runc lines they compare with.
const TABLE: [&[Line]; 15] = [
    core::EXEC_LINES,
    gvisor::EXEC_LINES,
    core::LOG_LINES,
    gvisor::LOG_LINES,
    core::LINES,
    egress::LINES,
    pty::LINES,
    changes::LINES,
    checkpoints::LINES,
    mcp::LINES,
    e2b::LINES,
    pool::LINES,
    burst::LINES,
    density::LINES,
    shaping::LINES,
];

/// One line of one run.
#[derive(Clone, Debug)]
struct Figure {
    value: f64,
    floor: Option<f64>,
    samples: Vec<f64>,
    floor_samples: Vec<f64>,
}

/// Everything one run measured.
#[derive(Default)]
pub(crate) struct RunFigures {
    lines: BTreeMap<&'static str, Figure>,
    notes: Vec<String>,
}

impl RunFigures {
    /// A line whose figure is the median of `samples` (floor: of
    /// `floor_samples`, when there are any).
    pub(crate) fn p50(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64]) {
        self.lines.insert(
            key,
            Figure {
                value: median(samples),
                floor: (!floor_samples.is_empty()).then(|| median(floor_samples)),
                samples: samples.to_vec(),
                floor_samples: floor_samples.to_vec(),
            },
        );
    }

    pub(crate) fn p95(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64]) {
        self.percentile(key, samples, floor_samples, 0.95);
    }

    pub(crate) fn p99(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64]) {
        self.percentile(key, samples, floor_samples, 0.99);
    }

    /// A line whose figure is the sample at rank `p` of `samples` (floor:
    /// of `floor_samples`, when there are any).
    fn percentile(&mut self, key: &'static str, samples: &[f64], floor_samples: &[f64], p: f64) {
        self.lines.insert(
            key,
            Figure {
                value: pct(samples, p),
                floor: (!floor_samples.is_empty()).then(|| pct(floor_samples, p)),
                samples: samples.to_vec(),
                floor_samples: floor_samples.to_vec(),
            },
        );
    }

    pub(crate) fn value(&mut self, key: &'static str, value: f64, floor: Option<f64>) {
        self.lines.insert(
            key,
            Figure {
                value,
                floor,
                samples: vec![],
                floor_samples: vec![],
            },
        );
    }

    pub(crate) fn note(&mut self, note: String) {
        println!("note: {note}");
        self.notes.push(note);
    }
}

pub(crate) type Check = fn(f64, Option<f64>) -> bool;

/// A line of the table: key, target, check (none: reported only).
#[derive(Clone, Copy)]
pub(crate) struct Line {
    pub(crate) key: &'static str,
    pub(crate) target: &'static str,
    pub(crate) check: Option<Check>,
}

/// A line of the table, as the sections declare theirs.
pub(crate) const fn line(key: &'static str, target: &'static str, check: Option<Check>) -> Line {
    Line { key, target, check }
}

/// Whether `v` is at most `r` times the floor column `f` (no floor: no).
pub(crate) fn ratio_at_most(v: f64, f: Option<f64>, r: f64) -> bool {
    f.is_some_and(|f| v <= f * r)
}

/// Where the run comes from and what it ran on.
pub(crate) fn meta(
    docker_version: &bollard::models::SystemVersion,
    runsc: bool,
    runs: usize,
) -> Value {
    let mut meta = support::provenance();
    meta.insert(
        "docker".into(),
        json!({
            "version": docker_version.version,
            "apiVersion": docker_version.api_version,
            "runsc": runsc,
        }),
    );
    meta.insert("runs".into(), json!(runs));
    meta.insert(
        "sandboxdLogLevel".into(),
        json!("default (RUST_LOG unset: info)"),
    );
    Value::Object(meta)
}

/// The report's first line: the commit, date, engine, machine and runs.
pub(crate) fn print_meta(meta: &Value) {
    let dirty = match meta["dirty"].as_bool() {
        Some(true) => " (dirty tree)",
        Some(false) => " (clean tree)",
        None => " (tree state unknown)",
    };
    println!(
        "sandboxd benchmark: commit {}{dirty}, {}, Docker {} (API {}{}), kernel {}, {} cores, {} run(s), sandboxd at its default log level",
        meta["commit"].as_str().unwrap_or("?"),
        meta["date"].as_str().unwrap_or("?"),
        meta["docker"]["version"].as_str().unwrap_or("?"),
        meta["docker"]["apiVersion"].as_str().unwrap_or("?"),
        if meta["docker"]["runsc"] == json!(true) {
            ", runsc registered"
        } else {
            ", NO runsc"
        },
        meta["kernel"].as_str().unwrap_or("?"),
        meta["cores"],
        meta["runs"],
    );
}

/// The markdown table and the JSON of every line over all runs.
fn report(all: &[RunFigures]) -> (String, Value) {
    let mut table = String::from(
        "| measure | sandboxd | floor | ratio | target | |\n|---|---:|---:|---:|---|---|\n",
    );
    let mut out = Vec::new();
    for line in TABLE.iter().flat_map(|section| section.iter()) {
        let figs: Vec<&Figure> = all.iter().filter_map(|r| r.lines.get(line.key)).collect();
        let missing = figs.len() < all.len();
        let value =
            (!figs.is_empty()).then(|| median(&figs.iter().map(|f| f.value).collect::<Vec<_>>()));
        let floors: Vec<f64> = figs.iter().filter_map(|f| f.floor).collect();
        let floor = (!floors.is_empty() && floors.len() == figs.len()).then(|| median(&floors));
        let ratio = value.zip(floor).map(|(v, f)| v / f);
        let ok = match (line.check, value) {
            (Some(check), Some(v)) if !missing => Some(check(v, floor)),
            // Measured in some runs only: the others failed it.
            (Some(_), Some(_)) => Some(false),
            // Not measured at all (another section's line): no verdict.
            (Some(_), None) | (None, _) => None,
        };
        let cell =
            |x: Option<f64>, digits: usize| x.map_or("–".into(), |x| format!("{x:.digits$}"));
        let digits = if line.key.contains("(MB)") { 2 } else { 1 };
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            line.key,
            if missing && value.is_none() {
                "not measured".into()
            } else {
                cell(value, digits)
            },
            cell(floor, digits),
            cell(ratio, 2),
            line.target,
            match ok {
                Some(true) => "ok",
                Some(false) => "MISSED",
                None => "",
            }
        ));
        out.push(json!({
                "measure": line.key,
                "value": value,
                "floor": floor,
                "ratio": ratio,
                "target": line.target,
                "ok": ok,
                "measuredInRuns": figs.len(),
                "runs": all.iter().map(|r| r.lines.get(line.key).map(|f| json!({
                    "value": f.value,
                    "floor": f.floor,
                    "ratio": f.floor.map(|fl| f.value / fl),
                    "samples": f.samples,
                    "floorSamples": f.floor_samples,
                }))).collect::<Vec<_>>(),
        }));
    }
    (table, Value::Array(out))
}

/// Prints the header, the table and every run's notes, and writes the
/// run's raw JSON to `json_out` (default: bench/runs/, named by the commit
/// and `only_name`, the section measured alone).
pub(crate) fn write(
    meta: &Value,
    all: &[RunFigures],
    json_out: Option<PathBuf>,
    only_name: Option<&str>,
) -> Res<()> {
    let runs = all.len();
    let (table, lines_json) = report(all);
    println!();
    print_meta(meta);
    println!(
        "\nEach figure: the median over {runs} run(s) of the run's own figure; ratio = sandboxd / floor column.\n"
    );
    println!("{table}");
    for (r, figures) in all.iter().enumerate() {
        for note in &figures.notes {
            println!("note (run {}): {note}", r + 1);
        }
    }
    let out = json!({
        "meta": meta,
        "lines": lines_json,
        "notes": all.iter().map(|f| f.notes.clone()).collect::<Vec<_>>(),
    });
    let json_out = json_out.unwrap_or_else(|| support::run_file(meta, only_name));
    support::write_run(&json_out, &out)
}
