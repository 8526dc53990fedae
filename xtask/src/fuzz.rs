//! `cargo xtask fuzz <target> [--minutes N]`: one fuzz target of `fuzz/` (cargo-fuzz and
//! libFuzzer, on the pinned nightly the eBPF objects are built with), or `all` of them one
//! after another, as `./x test` does for a few seconds each; or `datapath`, a target of its
//! own kind: the balancer against its reference model (`daemon/tests/datapath/differential`),
//! generated frames run through the real program, as root. New inputs go to a working
//! corpus under `fuzz/target/corpus/` (not committed), beside the committed seeds in
//! `fuzz/seeds/`; a crash, a hang or an allocation past libFuzzer's limit fails the run and
//! leaves its input in `fuzz/artifacts/` (see docs/design/fuzzing.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;

/// The targets of `fuzz/Cargo.toml`, in the order `all` runs them.
pub const TARGETS: &[&str] = &["config", "api_request", "ports_report", "netlink", "bird_reply", "quic_lb"];

/// The balancer against its model: not a cargo-fuzz target (see [`run_datapath`]).
pub const DATAPATH: &str = "datapath";

/// Seconds each target runs in `./x test`: six targets, about a minute in all.
pub const SUITE_SECONDS: u64 = 8;

/// An input that takes this long is a hang (libFuzzer's default is 20 minutes).
const HANG_SECONDS: u64 = 10;

#[derive(Args)]
pub struct FuzzArgs {
    /// A target (config, api_request, ports_report, netlink, bird_reply, quic_lb), `all` of
    /// them, or `datapath` (the balancer against its model; root).
    target: String,
    /// How long it runs (each target, with `all`).
    #[arg(long, default_value_t = 10, conflicts_with = "seconds")]
    minutes: u64,
    /// How long it runs, in seconds (each target, with `all`), instead of `--minutes`.
    #[arg(long)]
    seconds: Option<u64>,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(args.minutes * 60);
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let targets: Vec<&str> = match args.target.as_str() {
        DATAPATH => return run_datapath(&workspace, seconds),
        "all" => TARGETS.to_vec(),
        target if TARGETS.contains(&target) => vec![target],
        other => bail!("no fuzz target {other:?}: one of {}, all, or {DATAPATH}", TARGETS.join(", ")),
    };
    let nightly = nightly(&workspace)?;
    ensure!(
        cargo_fuzz(&workspace, &nightly, &["--version"]).output().is_ok_and(|out| out.status.success()),
        "cargo-fuzz is not installed for {nightly}: ./x setup installs it"
    );
    let mut failed = Vec::new();
    for target in targets {
        let corpus = workspace.join("fuzz/target/corpus").join(target);
        std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
        let seeds = workspace.join("fuzz/seeds").join(target);
        println!("fuzz: {target} for {seconds} s");
        let status = cargo_fuzz(&workspace, &nightly, &["run", target])
            .arg(&corpus)
            .arg(&seeds)
            .args(["--", &format!("-max_total_time={seconds}"), &format!("-timeout={HANG_SECONDS}")])
            .status()
            .context("running cargo fuzz")?;
        if !status.success() {
            failed.push(target);
        }
    }
    ensure!(failed.is_empty(), "fuzz targets failed: {} (their inputs are in fuzz/artifacts/)", failed.join(", "));
    Ok(())
}

/// The test that runs generated cases through the balancer and its model for
/// `SPILLWAY_DATAPATH_SECONDS`; it prints the frames per second and the frames that reached
/// each reason, and keeps a difference, minimized, in `daemon/tests/datapath/differential/cases/`.
/// `SPILLWAY_DATAPATH_SEED` (hex), passed through, replays a run.
const DATAPATH_TEST: &str = "differential::the_balancer_agrees_with_its_model_for_a_while";

fn run_datapath(workspace: &Path, seconds: u64) -> Result<()> {
    println!("fuzz: {DATAPATH} for {seconds} s");
    let status = Command::new(env!("CARGO"))
        .args(["test", "-p", "spillway-daemon", "--test", "datapath", DATAPATH_TEST, "--", "--ignored", "--exact", "--nocapture"])
        .env("SPILLWAY_DATAPATH_SECONDS", seconds.to_string())
        .current_dir(workspace)
        .status()
        .context("running cargo test")?;
    ensure!(
        status.success(),
        "the datapath run failed (a difference it found is kept, minimized, in daemon/tests/datapath/differential/cases/)"
    );
    Ok(())
}

/// `cargo +NIGHTLY fuzz SUBCOMMAND ...` on `fuzz/`, said on the terminal. Through rustup's
/// proxy (not `$CARGO`, this task's own stable cargo), so that `+NIGHTLY` picks the compiler.
/// No sanitizer: the parsers are safe Rust, so AddressSanitizer would find nothing the
/// bounds checks do not, at twice the build and run time; debug assertions are on, so an
/// arithmetic overflow is a crash.
fn cargo_fuzz(workspace: &Path, nightly: &str, subcommand: &[&str]) -> Command {
    let mut command = Command::new("cargo");
    command.arg(format!("+{nightly}")).arg("fuzz").args(subcommand);
    if subcommand.first() != Some(&"--version") {
        command.args(["--fuzz-dir", "fuzz", "--sanitizer", "none", "--debug-assertions"]);
        println!("+ cargo +{nightly} fuzz {} --fuzz-dir fuzz --sanitizer none --debug-assertions ...", subcommand.join(" "));
    }
    // The stand-ins of the eBPF objects: the targets never load them. Built in fuzz/target
    // whatever CARGO_TARGET_DIR says: the working corpus lives there too.
    command
        .current_dir(workspace)
        .env("AYA_BUILD_SKIP", "1")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO");
    command
}

/// The pinned nightly, where `./x` reads it too: the loader's build script.
fn nightly(workspace: &Path) -> Result<String> {
    let build = workspace.join("dataplane/build.rs");
    let text = std::fs::read_to_string(&build).with_context(|| format!("reading {}", build.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("const EBPF_TOOLCHAIN: &str = \"")?.strip_suffix("\";"))
        .map(str::to_owned)
        .with_context(|| format!("no EBPF_TOOLCHAIN in {}", build.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_of_the_fuzz_package_is_run_and_the_nightly_is_the_pinned_one() {
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let manifest = std::fs::read_to_string(workspace.join("fuzz/Cargo.toml")).unwrap();
        let mut declared: Vec<&str> = manifest
            .lines()
            .filter_map(|line| line.strip_prefix("name = \"")?.strip_suffix('"'))
            .filter(|n| *n != "spillway-fuzz")
            .collect();
        let mut run = TARGETS.to_vec();
        declared.sort_unstable();
        run.sort_unstable();
        assert_eq!(declared, run, "fuzz/Cargo.toml's targets and fuzz::TARGETS differ");
        for target in TARGETS {
            assert!(workspace.join("fuzz/seeds").join(target).read_dir().unwrap().next().is_some(), "{target} has no seeds");
        }
        assert!(nightly(&workspace).unwrap().starts_with("nightly-"));
    }
}
