//! What runs, in which order, with how many test threads, and how many jobs at once.

use std::path::{Path, PathBuf};

use super::binaries::TestBinary;

/// Jobs running at once in the second phase: four overloaded the machine (see [`TUNING`]);
/// with three, the suite passed and took 398 s.
pub const AT_ONCE: usize = 3;

/// One program to run: a test binary, or cargo (lints, doc tests).
#[derive(Debug)]
pub struct Job {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub dir: PathBuf,
    /// Set in its environment.
    pub env: Vec<(&'static str, &'static str)>,
    /// Jobs start in decreasing priority: the long ones first, so that none of them starts
    /// last (see [`TUNING`]).
    pub priority: u32,
    pub load: Load,
    pub phase: Phase,
    /// The job loads the machine without building topologies (compiling): the task holds
    /// the harness's shared machine lock for it, so a test that runs alone waits for it
    /// (`spillway_harness::alone`).
    pub holds_machine: bool,
}

/// What a job asks of the machine, as far as the jobs beside it go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Mostly waits (timers, sessions, timeouts).
    Waits,
    /// Its tests bound times (failover within half a second, ramps compared step by step):
    /// no [`Load::Computes`] job starts beside it.
    Timed,
    /// Keeps both cores busy (compiling, packet loops).
    Computes,
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
    priority: u32,
    load: Load,
    /// Its tests that take `spillway_harness::alone::alone()`, by exact name: they run in
    /// the first phase, the others in the second.
    alone: &'static [&'static str],
    /// Its tests that run as a job of their own beside the others, by exact name: long
    /// loops that would otherwise come last inside their binary.
    own_job: &'static [&'static str],
}

/// Priority of the binaries not in [`TUNING`]: short ones, after those that are not.
const SHORT: u32 = 10;

/// Measured on the 2-core machine, beside two other engineers' builds (issue #38). e2e and
/// fleet tests mostly wait (health intervals, BGP and BFD sessions, timeouts), so e2e gets
/// more threads than cores: alone on the machine it took 454 s on 2 threads, 240 s on 8;
/// but beside the other jobs 8 threads (with fleet on 4, four jobs at once) drove the load
/// average to 29 and failed tests that bound a time under load (fleet's BFD failover, its
/// slow-start comparisons, ports' `--all-netns` reports, two e2e tests). On 4 threads beside
/// the others it took 336 s and passed. Fleet stays on 2 threads: on 4 it gained little
/// (168 s -> 143 s: its one-minute soak and slow-start tests bound it) and its timing
/// assertions are the first to fail under load, hence [`Load::Timed`].
const TUNING: &[Tuning] = &[
    Tuning {
        target: "e2e",
        threads: Some(4),
        priority: 100,
        load: Load::Waits,
        alone: &["health_policy::router_overload_replay_sheds_at_the_edge_instead_of_collapsing"],
        own_job: &[],
    },
    Tuning { target: "fleet", threads: None, priority: 90, load: Load::Timed, alone: &[], own_job: &[] },
    // Its exhaustion test counts every port of a namespace within 2 s of the last failed
    // connect; beside e2e it saw 88-89 of the ~98 taken, twice in five runs: it runs alone.
    Tuning {
        target: "ports",
        threads: None,
        priority: 80,
        load: Load::Waits,
        alone: &[
            "exhaustion_is_seen_per_destination_with_failing_process::btf",
            "exhaustion_is_seen_per_destination_with_failing_process::tracepoint",
            "exhaustion_is_seen_per_destination_with_failing_process::sock_diag",
        ],
        own_job: &[],
    },
    // The harness's own: 11 s and 1.5 s alone, but 75 s and 51 s when they came last, after
    // e2e, beside the compiling jobs; in the fleet's window nothing computes. capacity
    // checks that the load generator keeps its schedule.
    Tuning { target: "capacity", threads: None, priority: 75, load: Load::Timed, alone: &[], own_job: &[] },
    Tuning { target: "rps", threads: None, priority: 75, load: Load::Waits, alone: &[], own_job: &[] },
    // Its probes keep lbd and the test busy: more than a core, 27 s alone, 114 s beside e2e.
    Tuning { target: "probe_leaks", threads: None, priority: 70, load: Load::Computes, alone: &[], own_job: &[] },
    // Packets through BPF_PROG_TEST_RUN in loops: 29 s alone, 195 s beside the others. The
    // bounded run of the balancer against its model (a fixed number of frames, about a
    // minute here) is a job of its own, like the fuzz job.
    Tuning {
        target: "datapath",
        threads: None,
        priority: 60,
        load: Load::Computes,
        alone: &[],
        own_job: &["differential::the_balancer_agrees_with_its_model"],
    },
];

/// Priority of the fuzz job: below the timed jobs (fleet, capacity), which it must not run
/// beside, so that it starts after them; above datapath, as its first build takes longer.
const FUZZ: u32 = 65;

/// The lints, the doc tests, every test binary and a short run of every fuzz target (through
/// `xtask`, this task's own executable), in the order they start.
pub fn jobs(binaries: Vec<TestBinary>, workspace: &Path, xtask: PathBuf) -> Vec<Job> {
    // Beside the tests, not before them: most tests wait far more than they compute.
    // AYA_BUILD_SKIP: neither needs the eBPF objects, which the loader's build script would
    // otherwise build again for them. Clippy builds units of its own, and so does `cargo test
    // --doc`: without the test targets, cargo builds the dependencies of build scripts and
    // proc macros without debug info, where `cargo test` shares them with the code under
    // test, so the build script is another unit (45 units of `cargo test --doc`, the eBPF
    // objects among them, were not those of `cargo test`).
    let mut jobs = vec![
        cargo_job("clippy", &["clippy", "--all-targets", "--", "-D", "warnings"], workspace, 50),
        cargo_job("doc tests", &["test", "--doc"], workspace, 40),
    ];
    jobs.extend(binaries.into_iter().flat_map(test_jobs));
    jobs.push(fuzz_job(xtask, workspace));
    // Stable: jobs of one priority keep cargo's order.
    jobs.sort_by_key(|job| std::cmp::Reverse(job.priority));
    jobs
}

fn cargo_job(name: &str, args: &[&str], workspace: &Path, priority: u32) -> Job {
    Job {
        name: name.into(),
        program: PathBuf::from(env!("CARGO")),
        args: args.iter().map(|arg| arg.to_string()).collect(),
        dir: workspace.to_owned(),
        env: vec![("AYA_BUILD_SKIP", "1")],
        priority,
        load: Load::Computes,
        phase: Phase::Together,
        holds_machine: true,
    }
}

/// `cargo xtask fuzz all` for a few seconds a target: it builds the targets with the
/// nightly first, then keeps both cores busy (its own environment: `AYA_BUILD_SKIP` and the
/// nightly are set by the task).
fn fuzz_job(xtask: PathBuf, workspace: &Path) -> Job {
    let args = ["fuzz", "all", "--seconds", &crate::fuzz::SUITE_SECONDS.to_string()].map(str::to_owned).to_vec();
    Job {
        name: "fuzz".into(),
        program: xtask,
        args,
        dir: workspace.to_owned(),
        env: Vec::new(),
        priority: FUZZ,
        load: Load::Computes,
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
        priority: tuning.map_or(SHORT, |t| t.priority),
        load: tuning.map_or(Load::Waits, |t| t.load),
        phase,
        holds_machine: false,
    };
    let alone = tuning.map_or(&[][..], |t| t.alone);
    let own_job = tuning.map_or(&[][..], |t| t.own_job);
    if alone.is_empty() && own_job.is_empty() {
        return vec![job(name, args, Phase::Together)];
    }
    let exactly = |tests: &[&str]| ["--exact"].into_iter().chain(tests.iter().copied()).map(str::to_owned).collect::<Vec<_>>();
    let mut jobs: Vec<Job> = own_job.iter().map(|test| job(format!("{name} {test}"), exactly(&[test]), Phase::Together)).collect();
    if !alone.is_empty() {
        jobs.push(job(format!("{name} (alone)"), exactly(alone), Phase::Alone));
    }
    args.push("--exact".into());
    args.extend(alone.iter().chain(own_job).flat_map(|test| ["--skip".to_owned(), (*test).to_owned()]));
    jobs.push(job(name, args, Phase::Together));
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_of_its_own_runs_as_its_own_job_and_not_in_its_binarys() {
        let binary = TestBinary {
            package: "spillway-daemon".into(),
            kind: "test".into(),
            target: "datapath".into(),
            executable: PathBuf::from("/bin/datapath"),
            package_dir: PathBuf::from("/daemon"),
        };
        let jobs = test_jobs(binary);
        let own = "differential::the_balancer_agrees_with_its_model";
        let [its_own, rest] = &jobs[..] else { panic!("{} jobs", jobs.len()) };
        assert_eq!(its_own.args, ["--exact", own]);
        assert_eq!((its_own.phase, its_own.load), (Phase::Together, Load::Computes));
        assert_eq!(rest.args, ["--exact", "--skip", own]);
    }
}
