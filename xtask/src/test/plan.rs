//! What runs, in which order, with how many test threads, and how many jobs at once.

use std::path::{Path, PathBuf};

use super::binaries::TestBinary;

/// Jobs running at once in the second phase. PLACEHOLDER
pub const AT_ONCE: usize = 4;

/// One program to run: a test binary, or cargo (lints, doc tests).
#[derive(Debug)]
pub struct Job {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub dir: PathBuf,
    /// Set in its environment.
    pub env: Vec<(&'static str, &'static str)>,
    /// Seconds it took when last measured here; only orders the queue, longest first, so
    /// the longest job does not start last.
    pub expected_s: u32,
    pub phase: Phase,
    /// The job loads the machine without building topologies (compiling): the task holds
    /// the harness's shared machine lock for it, so a test that runs alone waits for it
    /// (`spillway_harness::alone`).
    pub holds_machine: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// One at a time, before anything else: tests that measure rates against what the
    /// machine can do. Inside a running binary they would first wait for every topology of
    /// every binary to go, then keep all of them waiting.
    Alone,
    /// Side by side, [`AT_ONCE`] at a time.
    Together,
}

/// Settings of one integration-test binary, by target name.
struct Tuning {
    target: &'static str,
    /// libtest's `--test-threads`; without it, one per core.
    threads: Option<usize>,
    expected_s: u32,
    /// Its tests that take `spillway_harness::alone::alone()`, by exact name: they run in
    /// the first phase, the others in the second.
    alone: &'static [&'static str],
}

/// PLACEHOLDER
const TUNING: &[Tuning] = &[
    Tuning {
        target: "e2e",
        threads: Some(8),
        expected_s: 400,
        alone: &["health_policy::router_overload_replay_sheds_at_the_edge_instead_of_collapsing"],
    },
    Tuning { target: "fleet", threads: Some(4), expected_s: 160, alone: &[] },
    Tuning { target: "ports", threads: None, expected_s: 76, alone: &[] },
    Tuning { target: "datapath", threads: None, expected_s: 30, alone: &[] },
    Tuning { target: "probe_leaks", threads: None, expected_s: 27, alone: &[] },
];

/// The lints, the doc tests and every test binary, longest first.
pub fn jobs(binaries: Vec<TestBinary>, workspace: &Path) -> Vec<Job> {
    // Run beside the tests, not before them: most tests wait far more than they compute.
    // AYA_BUILD_SKIP: the lints need no eBPF objects (the loader's build script then embeds
    // stand-ins instead of building them again for clippy's own units).
    let mut clippy = cargo_job("clippy", &["clippy", "--all-targets", "--", "-D", "warnings"], workspace, 150);
    clippy.env.push(("AYA_BUILD_SKIP", "1"));
    let mut jobs = vec![clippy, cargo_job("doc tests", &["test", "--doc"], workspace, 0)];
    jobs.extend(binaries.into_iter().flat_map(test_jobs));
    jobs.sort_by_key(|job| std::cmp::Reverse(job.expected_s));
    jobs
}

fn cargo_job(name: &str, args: &[&str], workspace: &Path, expected_s: u32) -> Job {
    Job {
        name: name.into(),
        program: PathBuf::from(env!("CARGO")),
        args: super::SAME_HOST_UNITS.iter().chain(args).map(|arg| arg.to_string()).collect(),
        dir: workspace.to_owned(),
        env: Vec::new(),
        expected_s,
        phase: Phase::Together,
        holds_machine: true,
    }
}

/// The binary's job, or two: its tests that run alone, and the others.
fn test_jobs(binary: TestBinary) -> Vec<Job> {
    let tuning = TUNING.iter().find(|t| binary.kind == "test" && t.target == binary.target);
    let mut args = match tuning.and_then(|t| t.threads) {
        Some(threads) => vec!["--test-threads".to_owned(), threads.to_string()],
        None => Vec::new(),
    };
    let name = match binary.kind.as_str() {
        "lib" => format!("{} lib", binary.package),
        kind => format!("{} {kind} {}", binary.package, binary.target),
    };
    let job = |name: String, args: Vec<String>, phase| Job {
        name,
        program: binary.executable.clone(),
        args,
        dir: binary.package_dir.clone(),
        env: Vec::new(),
        expected_s: tuning.map_or(0, |t| t.expected_s),
        phase,
        holds_machine: false,
    };
    let alone = tuning.map_or(&[][..], |t| t.alone);
    if alone.is_empty() {
        return vec![job(name, args, Phase::Together)];
    }
    let alone_args = ["--exact"].into_iter().chain(alone.iter().copied()).map(str::to_owned).collect();
    args.push("--exact".into());
    args.extend(alone.iter().flat_map(|test| ["--skip".to_owned(), (*test).to_owned()]));
    vec![job(format!("{name} (alone)"), alone_args, Phase::Alone), job(name, args, Phase::Together)]
}
