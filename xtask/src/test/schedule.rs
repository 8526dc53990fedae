//! Runs jobs side by side, a few at a time, taking them in the order given.
//! Each job's output (stdout and stderr together, as a terminal would show them) goes to its
//! own log file; when a job ends, one line says how it went, followed by the whole log if it
//! failed.

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::plan::{Job, Load, Phase};

/// How one job went.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    /// Tests libtest said it ran (its `running N tests` lines).
    pub tests: usize,
    pub elapsed: Duration,
    /// `Err` says why it failed: its exit status, or why it did not start.
    pub result: Result<(), String>,
    pub log: PathBuf,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.result.is_ok()
    }
}

/// Runs every job and returns how each went, in the order they ended: first the jobs of
/// [`Phase::Alone`], one at a time, then the others, `at_once` at a time.
pub fn run(jobs: Vec<Job>, at_once: usize, log_dir: &Path) -> Result<Vec<Outcome>> {
    std::fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let (alone, together): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|job| job.phase == Phase::Alone);
    let mut outcomes = Vec::new();
    for job in alone {
        let outcome = run_job(job, log_dir);
        report(&outcome);
        outcomes.push(outcome);
    }
    let queue = Queue { state: Mutex::new((VecDeque::from(together), 0)), changed: Condvar::new() };
    let (done, finished) = mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..at_once {
            let (queue, done) = (&queue, done.clone());
            scope.spawn(move || {
                while let Some(job) = queue.take() {
                    let timed = job.load == Load::Timed;
                    let _ = done.send(run_job(job, log_dir));
                    if timed {
                        queue.timed_done();
                    }
                }
            });
        }
        drop(done);
        for outcome in finished {
            report(&outcome);
            outcomes.push(outcome);
        }
    });
    Ok(outcomes)
}

/// The jobs still to start, and how many [`Load::Timed`] jobs run.
struct Queue {
    state: Mutex<(VecDeque<Job>, usize)>,
    changed: Condvar,
}

impl Queue {
    /// The first job that may start now: no [`Load::Computes`] job beside a timed one. Waits
    /// while only such jobs are left; `None` once none is left.
    fn take(&self) -> Option<Job> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (queue, timed) = &mut *state;
            if queue.is_empty() {
                return None;
            }
            if let Some(i) = queue.iter().position(|job| *timed == 0 || job.load != Load::Computes) {
                let job = queue.remove(i).expect("an index of the queue");
                if job.load == Load::Timed {
                    *timed += 1;
                }
                return Some(job);
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn timed_done(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 -= 1;
        self.changed.notify_all();
    }
}

fn run_job(job: Job, log_dir: &Path) -> Outcome {
    let log = log_dir.join(format!("{}.log", job.name.replace([' ', '(', ')'], "-")));
    println!("started   {}{}", job.name, if job.args.is_empty() { String::new() } else { format!(" {}", job.args.join(" ")) });
    let started = Instant::now();
    let held = if job.holds_machine { spillway_harness::alone::shared().map(Some) } else { Ok(None) };
    let result = match held {
        Ok(_held) => run_logged(&job, &log),
        Err(err) => Err(format!("cannot hold the machine: {err:#}")),
    };
    let tests = std::fs::read_to_string(&log).map_or(0, |text| tests_run(&text));
    let result = match result {
        // A test renamed without its plan entry would leave the phase empty, unnoticed.
        Ok(()) if job.phase == Phase::Alone && tests == 0 => Err("it ran no test: does the plan name tests that exist?".into()),
        other => other,
    };
    Outcome { name: job.name, tests, elapsed: started.elapsed(), result, log }
}

fn run_logged(job: &Job, log: &Path) -> Result<(), String> {
    let file = File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let stderr = file.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
    let status = Command::new(&job.program)
        .args(&job.args)
        .envs(job.env.iter().copied())
        .current_dir(&job.dir)
        .stdout(file)
        .stderr(stderr)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", job.program.display()))?;
    if status.success() { Ok(()) } else { Err(status.to_string()) }
}

/// Tests run according to libtest's `running N tests` lines (doc tests print one per crate).
fn tests_run(log: &str) -> usize {
    log.lines()
        .filter_map(|line| {
            line.strip_prefix("running ")?.strip_suffix(" tests").or_else(|| line.strip_prefix("running ")?.strip_suffix(" test"))
        })
        .filter_map(|n| n.parse::<usize>().ok())
        .sum()
}

fn report(outcome: &Outcome) {
    let seconds = outcome.elapsed.as_secs_f64();
    match &outcome.result {
        Ok(()) => println!("ok        {}: {} tests, {seconds:.1} s", outcome.name, outcome.tests),
        Err(why) => {
            let log = std::fs::read_to_string(&outcome.log).unwrap_or_else(|e| format!("(cannot read {}: {e})", outcome.log.display()));
            println!("FAILED    {} ({why}) after {seconds:.1} s; its output ({}):\n{log}", outcome.name, outcome.log.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job of `sh -c script` named `name`.
    fn sh(name: &str, script: &str, dir: &Path) -> Job {
        Job {
            name: name.into(),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            dir: dir.to_owned(),
            env: Vec::new(),
            priority: 0,
            load: Load::Waits,
            phase: Phase::Together,
            holds_machine: false,
        }
    }

    /// Each job waits (up to 10 s) for a file the other creates: both pass only if they run
    /// at the same time. A failing job fails alone, and its output is kept.
    #[test]
    fn jobs_run_side_by_side_and_a_failure_stops_none() {
        let dir = spillway_harness::TempDir::new("xtask-schedule");
        let meet = |me: &str, other: &str| {
            format!("touch {me}; i=0; while [ ! -e {other} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; [ -e {other} ]")
        };
        let jobs = vec![
            sh("a", &meet("a", "b"), dir.path()),
            sh("b", &meet("b", "a"), dir.path()),
            sh("fails", "echo why; exit 3", dir.path()),
            sh("last", "echo running 2 tests", dir.path()),
        ];
        let outcomes = run(jobs, 2, &dir.path().join("logs")).unwrap();
        let by_name = |name: &str| outcomes.iter().find(|o| o.name == name).unwrap();
        assert!(by_name("a").passed() && by_name("b").passed(), "{outcomes:?}");
        assert!(!by_name("fails").passed());
        assert_eq!(std::fs::read_to_string(&by_name("fails").log).unwrap(), "why\n");
        assert!(by_name("last").passed());
        assert_eq!(by_name("last").tests, 2);
    }

    /// A job that computes waits for the timed one before it, though a slot is free; one
    /// that only waits does not.
    #[test]
    fn a_computing_job_does_not_run_beside_a_timed_one() {
        let dir = spillway_harness::TempDir::new("xtask-timed");
        let job = |name: &str, script: &str, load| Job { load, ..sh(name, script, dir.path()) };
        let jobs = vec![
            job("timed", "touch started; sleep 0.5; touch ended", Load::Timed),
            job("waits", "[ -e started ] && [ ! -e ended ] || sleep 0.2; [ -e started ] && [ ! -e ended ]", Load::Waits),
            job("computes", "[ ! -e started ] || [ -e ended ]", Load::Computes),
        ];
        let outcomes = run(jobs, 3, &dir.path().join("logs")).unwrap();
        assert!(outcomes.iter().all(Outcome::passed), "{outcomes:?}");
    }

    #[test]
    fn tests_are_counted_from_libtests_running_lines() {
        let log = "running 85 tests\ntest a ... ok\n\ntest result: ok.\n   Doc-tests spillway\n\nrunning 1 test\nrunning 0 tests\n";
        assert_eq!(tests_run(log), 86);
        assert_eq!(tests_run("a line about running 3 tests elsewhere\n"), 0);
    }
}
