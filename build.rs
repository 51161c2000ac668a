//! Builds `sandboxd-agent` (the process manager that runs inside every
//! sandbox) as a static binary, so sandboxd can carry the exact agent it
//! was built with and put it into sandboxes of any image.
//!
//! A nested `cargo build` of the `agent` package, for the target sandboxd
//! is built for, with `-C target-feature=+crt-static` and the `agent`
//! profile, in its own target directory (no lock is shared with the outer
//! build). The binary lands in `OUT_DIR`, where `src/sandbox/agent_delivery.rs`
//! includes it, with a version derived from its bytes.
//!
//! `SANDBOXD_AGENT_BIN` names a prebuilt agent instead (a packaging step
//! that built it already).
//!
//! It also writes `ui_assets.rs` to `OUT_DIR`: a table of the web console's
//! files in `ui/dist` (built by `scripts/build-ui.sh`), each embedded with
//! `include_bytes!`, which `src/api/ui.rs` serves at `/ui/`. Without
//! `ui/dist` the table is empty and sandboxd builds all the same.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for dir in ["agent", "proto"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-env-changed=SANDBOXD_AGENT_BIN");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let built = match std::env::var_os("SANDBOXD_AGENT_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_agent(&out),
    };
    let bytes = std::fs::read(&built)
        .unwrap_or_else(|e| panic!("cannot read the agent at {}: {e}", built.display()));
    std::fs::write(out.join("sandboxd-agent"), &bytes).expect("copy the agent into OUT_DIR");
    // FNV-1a over the bytes: a version that changes with every change of
    // the agent, for volume names and labels (not a security measure).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in &bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    println!("cargo:rustc-env=SANDBOXD_AGENT_VERSION={hash:016x}");
    embed_ui(&out);
}

/// Writes the table of `ui/dist`'s files (relative path, bytes), sorted.
fn embed_ui(out: &Path) {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let dist = manifest.join("ui/dist");
    let mut files = Vec::new();
    if dist.is_dir() {
        println!("cargo:rerun-if-changed=ui/dist");
        collect_files(&dist, &mut files);
    } else {
        // `ui` changes when `dist` appears in it.
        println!("cargo:rerun-if-changed=ui");
    }
    files.sort();
    let mut table = String::from("pub(super) static UI_ASSETS: &[(&str, &[u8])] = &[\n");
    for file in &files {
        let relative = file
            .strip_prefix(&dist)
            .expect("a file under ui/dist")
            .to_str()
            .unwrap_or_else(|| panic!("a non-UTF-8 file name in ui/dist: {}", file.display()));
        let absolute = file.to_str().expect("a UTF-8 path to ui/dist");
        table.push_str(&format!(
            "    ({relative:?}, include_bytes!({absolute:?})),\n"
        ));
    }
    table.push_str("];\n");
    std::fs::write(out.join("ui_assets.rs"), table).expect("write ui_assets.rs");
}

fn collect_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry of ui/dist").path();
        if path.is_dir() {
            collect_files(&path, files);
        } else {
            files.push(path);
        }
    }
}

fn build_agent(out: &Path) -> PathBuf {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    // Beside the outer target directory (OUT_DIR is <target>/<profile>/build/…),
    // so every profile and tool (build, test, clippy) shares one agent build.
    let target_dir = out
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(|build| build.parent())
        .and_then(|profile| profile.parent())
        .map(|t| t.join("agent"))
        .unwrap_or_else(|| out.join("agent"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&manifest)
        .args([
            "build",
            "--locked",
            "--package",
            "sandboxd-agent",
            "--profile",
            "agent",
        ])
        .arg("--target")
        .arg(&target)
        .arg("--target-dir")
        .arg(&target_dir)
        // Only the agent is linked statically; with an explicit --target
        // the flag does not reach build scripts or proc macros.
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        // Whatever wraps the outer rustc (clippy) is not for this build.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .expect("run cargo for the agent");
    assert!(status.success(), "building sandboxd-agent failed");
    target_dir
        .join(&target)
        .join("agent")
        .join("sandboxd-agent")
}
