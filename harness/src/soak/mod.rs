//! A seeded chaos soak of a fleet (`crate::fleet`): real traffic (long-lived echo streams
//! and a connection-per-request HTTP load) while a seeded [`Schedule`] adds, removes,
//! drains and re-weights backends, applies configuration files, adds and removes rules,
//! flaps backend servers, restarts agents, and SIGKILLs `lbd`, BIRD or a whole balancer.
//!
//! Checked all the time, a failure naming the seed and the step:
//! - every change `lbctl` confirmed is what every balancer shows after the step (also right
//!   after an `lbd` was SIGKILLed and restarted), and the fleet settles (every active
//!   backend healthy everywhere, every balancer routed) within a bound;
//! - no stream breaks unless the steps it lived through explain it: its backend's servers
//!   were killed, its backend was removed, or ECMP moved it while the table changed
//!   (beyond what second chance covers, see ARCHITECTURE.md);
//! - no request fails in a second that no killing or removing step overlaps;
//! - no `level=error` line in an `lbd` log except on a balancer a step killed something of;
//! - once the schedule ends and the first state is restored, every `lbd`'s descriptors,
//!   map entries (backend ids, ring slots, VIP and rule indexes) and counts come back to the
//!   baseline measured before the first step; its memory is reported.

mod file;
pub mod schedule;
mod streams;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::cluster::{Binaries, TCP_PORT, XdpMode};
use crate::fleet::{Fleet, FleetConfig, HTTP_PORT, vip_target};
use crate::load::{Bucket, Load, LoadConfig, LoadReport};
use crate::stream::Stream;
use crate::{Signal, VIP4};

pub use schedule::{Op, Schedule, Shape, State, Step};
use streams::{PING_TIMEOUT, Watched};

/// How long the fleet may take to settle after a step: a backend readmitted by two
/// balancers on either side of a ramp step's boundary ramps one step apart on them until
/// its slow start ends (see ARCHITECTURE.md, "Slow start on the wall clock").
const SETTLE_TIMEOUT: Duration = Duration::from_millis(file::SLOW_START_MS + 15_000);
/// How long after a step that starts a slow start the tables keep changing: the ramp, its
/// first step's wait, and a margin for the health round that programs each step.
const RAMP_WINDOW: Duration = Duration::from_millis(file::SLOW_START_MS + file::SLOW_START_MS / 10 + 2_000);
/// A `lbctl` change made on every balancer that starts a slow start is begun at least this
/// long before the next ramp step's boundary, so every balancer stamps its start within the
/// same step and programs the same ramp.
const RAMP_STEP_GUARD: Duration = Duration::from_secs(2);
/// How long an `lbd` may take to give back what the schedule made it hold.
const BASELINE_TIMEOUT: Duration = Duration::from_secs(20);
/// One run of the load generator: the soak judges its requests when it ends (a failure is
/// found within about this long, while the logs still show its cause) and starts the next.
const LOAD_SEGMENT: Duration = Duration::from_secs(20);
/// How [`not_in_table`] says a serving backend's weight is not programmed yet.
const NOT_YET_IN_TABLE: &str = "not yet in the table";
/// Lines of each `lbd` log a failure prints.
const LOG_TAIL: usize = 40;
/// Maps whose use follows the traffic, not the configuration.
const TRAFFIC_MAPS: [&str; 2] = ["spw_flows", "spw_sources"];

#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub seed: u64,
    /// Steps start until this much time has passed; the last one, the restore and the
    /// checks take a little longer.
    pub duration: Duration,
    pub balancers: usize,
    pub backends: usize,
    pub clients: usize,
    /// Long-lived streams kept open from each client.
    pub streams_per_client: usize,
    /// New HTTP connections a second (one request each).
    pub load_per_s: u32,
}

impl SoakConfig {
    /// Two balancers, four backends, two clients with six streams each, 50 requests a second.
    pub fn new(seed: u64, duration: Duration) -> SoakConfig {
        SoakConfig { seed, duration, balancers: 2, backends: 4, clients: 2, streams_per_client: 6, load_per_s: 50 }
    }

    fn shape(&self) -> Shape {
        Shape { balancers: self.balancers, backends: self.backends }
    }
}

/// What one `lbd` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub fds: usize,
    pub rss_kib: u64,
    /// Entries in use per map (not the traffic's, [`TRAFFIC_MAPS`]).
    pub maps: BTreeMap<String, u64>,
    /// VIPs, backends and rules (`lbctl status`).
    pub counts: [u64; 3],
}

/// What a clean run saw.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    pub seed: u64,
    pub elapsed: Duration,
    pub steps: usize,
    pub ops: BTreeMap<&'static str, u64>,
    pub streams_opened: u64,
    pub stream_pings: u64,
    /// Streams that broke, by the cause the steps gave.
    pub stream_breaks: BTreeMap<&'static str, u64>,
    pub requests: Bucket,
    /// Requests that did not succeed, by the cause the overlapping steps gave.
    pub request_failures: BTreeMap<&'static str, u64>,
    pub baseline: Vec<Resources>,
    pub end: Vec<Resources>,
    /// Highest RSS of any `lbd`, sampled after every step.
    pub peak_rss_kib: u64,
    /// `level=error` lines of the `lbd`s, all on balancers a step killed something of.
    pub error_lines: u64,
    /// Settles that found a backend serving by its health on a balancer but not yet in its
    /// table (`lbd` programs health at most once a probe interval) while the digests were
    /// equal, and waited for it.
    pub settles_waiting_for_table: u64,
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "soak seed {}: {} steps in {:.0} s", self.seed, self.steps, self.elapsed.as_secs_f64())?;
        let ops: Vec<String> = self.ops.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(f, "  operations: {}", ops.join(", "))?;
        let breaks: Vec<String> = self.stream_breaks.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "  streams: {} opened, {} pings, broken: {}",
            self.streams_opened,
            self.stream_pings,
            if breaks.is_empty() { "none".into() } else { breaks.join(", ") }
        )?;
        let failures: Vec<String> = self.request_failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(
            f,
            "  requests (one connection each): {} attempted, {} ok, failed: {}",
            self.requests.attempted,
            self.requests.ok,
            if failures.is_empty() { "none".into() } else { failures.join(", ") }
        )?;
        for (i, (b, e)) in self.baseline.iter().zip(&self.end).enumerate() {
            writeln!(
                f,
                "  lb{}: fds {} -> {}, RSS {} -> {} KiB, maps {:?} -> {:?}",
                i + 1,
                b.fds,
                e.fds,
                b.rss_kib,
                e.rss_kib,
                b.maps,
                e.maps
            )?;
        }
        writeln!(f, "  settles that waited for a health change to reach the table: {}", self.settles_waiting_for_table)?;
        write!(
            f,
            "  peak lbd RSS: {} KiB; lbd error lines: {} (each on a balancer a step killed something of)",
            self.peak_rss_kib, self.error_lines
        )
    }
}

/// A step as it ran, in time since the soak started.
struct Record {
    index: usize,
    op: Op,
    /// An `ApplyFile` that took a backend out of the set.
    removed: BTreeSet<usize>,
    /// It started a slow start: a backend added, given a weight again, or flapped (its
    /// readmission ramps), so the tables go on changing for [`RAMP_WINDOW`].
    ramps: bool,
    start: Duration,
    end: Duration,
}

/// Builds a fleet, runs the schedule of `config.seed` for `config.duration` and checks it
/// (see the module docs). An error names the seed and the step, and how to replay it.
pub fn run(bins: Binaries, config: &SoakConfig) -> Result<SoakReport> {
    let lbd_args = vec!["--announce-hold-s".to_owned(), "2".to_owned()];
    let fleet_config =
        FleetConfig { balancers: config.balancers, backends: config.backends, clients: config.clients, mode: XdpMode::Native, lbd_args };
    let fleet = Fleet::start(bins, fleet_config).context("starting the fleet")?;
    let mut soak = Soak::new(fleet, config)?;
    let result = soak.run();
    soak.stop_traffic();
    result.map_err(|e| {
        let minutes = config.duration.as_secs().div_ceil(60).max(1);
        anyhow!("{e:#}\n{}replay: cargo xtask soak --seed {} --minutes {minutes}", soak.diagnostics(), config.seed)
    })
}

struct Soak<'c> {
    fleet: Fleet,
    config: &'c SoakConfig,
    started: Instant,
    vips: [String; 2],
    addrs: Vec<String>,
    records: Vec<Record>,
    streams: Vec<Watched>,
    load: Option<(Duration, Load)>,
    /// Per balancer: the pid of the `lbd` whose log was read, and how many lines of it.
    log_seen: Vec<(Option<u32>, usize)>,
    report: SoakReport,
    files: usize,
}

impl<'c> Soak<'c> {
    fn new(fleet: Fleet, config: &'c SoakConfig) -> Result<Soak<'c>> {
        let addrs = fleet.backends().iter().map(|b| b.ipv4().to_string()).collect();
        let balancers = fleet.balancers().len();
        Ok(Soak {
            fleet,
            config,
            started: Instant::now(),
            vips: [format!("{VIP4}:{TCP_PORT}/tcp"), format!("{VIP4}:{HTTP_PORT}/tcp")],
            addrs,
            records: Vec::new(),
            streams: Vec::new(),
            load: None,
            log_seen: vec![(None, 0); balancers],
            report: SoakReport { seed: config.seed, ..SoakReport::default() },
            files: 0,
        })
    }

    fn run(&mut self) -> Result<SoakReport> {
        let initial = State::initial(self.config.backends);
        self.apply_file(&initial).context("applying the first state")?;
        self.settle(&initial).context("the fleet did not settle before the first step")?;
        self.report.baseline = (0..self.config.balancers).map(|lb| self.resources(lb)).collect::<Result<_>>()?;
        self.check_logs(0, None)?;
        self.started = Instant::now();
        self.fill_streams().context("opening the first streams")?;
        self.start_load()?;
        let mut schedule = Schedule::new(self.config.seed, self.config.shape());
        let mut state = initial.clone();
        while self.started.elapsed() < self.config.duration {
            let step = schedule.next().expect("endless");
            self.step(&step, &state).map_err(|e| anyhow!("soak seed {}, step {} ({}): {e:#}", self.config.seed, step.index, step.op))?;
            state = schedule.state().clone();
            std::thread::sleep(Duration::from_millis(step.pause_ms));
        }
        let last = Step { index: self.records.len() + 1, op: Op::ApplyFile { state: initial.clone() }, pause_ms: 0 };
        self.step(&last, &state)
            .and_then(|()| self.restore())
            .map_err(|e| anyhow!("soak seed {}, step {} (restoring the first state): {e:#}", self.config.seed, last.index))?;
        self.report.elapsed = self.started.elapsed();
        self.report.steps = self.records.len();
        Ok(std::mem::take(&mut self.report))
    }

    /// Runs `step` from `before`, then checks what it left.
    fn step(&mut self, step: &Step, before: &State) -> Result<()> {
        let start = self.started.elapsed();
        let mut after = before.clone();
        schedule::apply(&mut after, &step.op);
        if matches!(step.op, Op::AddBackend { .. } | Op::SetWeight { .. }) && starts_ramp(before, &after, &step.op) {
            within_one_ramp_step();
        }
        self.perform(&step.op, &after)?;
        self.check_state(&after).context("after the step")?;
        let waited_for_table = self.settle(&after)?;
        let removed = before.members.keys().filter(|b| !after.members.contains_key(b)).copied().collect();
        let ramps = starts_ramp(before, &after, &step.op);
        self.records.push(Record { index: step.index, op: step.op.clone(), removed, ramps, start, end: self.started.elapsed() });
        *self.report.ops.entry(step.op.kind()).or_default() += 1;
        println!(
            "step {:>4} {:>6.1}s {} ({:.1} s)",
            step.index,
            start.as_secs_f64(),
            step.op,
            (self.started.elapsed() - start).as_secs_f64()
        );
        if let Some(why) = waited_for_table {
            println!("  settled once the table caught up with the health: {why}");
        }
        self.check_logs(step.index, Some(&step.op))?;
        self.harvest_streams()?;
        self.retire_oldest_stream();
        self.fill_streams()?;
        self.rotate_load()?;
        for lb in 0..self.config.balancers {
            let rss = self.resources(lb)?.rss_kib;
            self.report.peak_rss_kib = self.report.peak_rss_kib.max(rss);
        }
        Ok(())
    }

    fn perform(&mut self, op: &Op, after: &State) -> Result<()> {
        let n = self.config.balancers;
        match op {
            Op::AddBackend { backend, weight } => {
                let (addr, weight) = (self.addrs[*backend].clone(), weight.to_string());
                self.on_every_balancer(|vip| vec!["backends", "add", "--vip", vip, &addr, "--weight", &weight])
            }
            Op::RemoveBackend { backend } => {
                let addr = self.addrs[*backend].clone();
                self.on_every_balancer(|vip| vec!["backends", "remove", "--vip", vip, &addr])
            }
            Op::Drain { backend } => {
                let addr = self.addrs[*backend].clone();
                self.on_every_balancer(|vip| vec!["backends", "drain", "--vip", vip, &addr])
            }
            Op::SetWeight { backend, weight } => {
                let (addr, weight) = (self.addrs[*backend].clone(), weight.to_string());
                self.on_every_balancer(|vip| vec!["backends", "set-weight", "--vip", vip, &addr, &weight])
            }
            Op::ApplyFile { .. } => self.apply_file(after),
            Op::AddRule { rule } | Op::RemoveRule { rule } => {
                let r = schedule::RULES[*rule];
                let mut args = vec!["rules".to_owned(), if matches!(op, Op::AddRule { .. }) { "add" } else { "remove" }.to_owned()];
                args.push(r.cidr.to_owned());
                if r.echo_only {
                    args.extend(["--vip".to_owned(), self.vips[0].clone()]);
                }
                if matches!(op, Op::AddRule { .. }) {
                    match r.action {
                        schedule::RuleAction::Block => args.push("--block".to_owned()),
                        schedule::RuleAction::Exempt => args.push("--exempt".to_owned()),
                        schedule::RuleAction::Limit(per_s) => args.extend(["--limit".to_owned(), per_s.to_string()]),
                    }
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.fleet.balancers().iter().try_for_each(|b| b.lbctl(&args).map(drop))
            }
            Op::FlapServer { backend, down_ms } => {
                self.fleet.stop_servers(*backend, Signal::SIGKILL)?;
                if after.is_active(*backend) {
                    let addr = self.addrs[*backend].clone();
                    self.wait("every balancer to eject the killed backend", || {
                        for lb in 0..n {
                            for vip in &self.vips {
                                if serving(&self.backend_health(lb, vip, &addr)?) {
                                    return Ok(false);
                                }
                            }
                        }
                        Ok(true)
                    })?;
                }
                std::thread::sleep(Duration::from_millis(*down_ms));
                self.fleet.start_servers(*backend)
            }
            Op::RestartAgent { backend } => {
                self.fleet.stop_agent(*backend, Signal::SIGKILL)?;
                self.fleet.start_agent(*backend)
            }
            Op::KillLbd { balancer, down_ms } => {
                let lb = self.fleet.balancer(balancer + 1);
                lb.stop_lbd(Signal::SIGKILL)?;
                std::thread::sleep(Duration::from_millis(*down_ms));
                lb.start_lbd()
            }
            Op::KillBird { balancer, down_ms } => {
                let lb = self.fleet.balancer(balancer + 1);
                lb.stop_bird(Signal::SIGKILL)?;
                std::thread::sleep(Duration::from_millis(*down_ms));
                lb.start_bird()
            }
            Op::KillBalancer { balancer, down_ms } => {
                let lb = self.fleet.balancer(balancer + 1);
                lb.set_link(false)?;
                lb.stop_lbd(Signal::SIGKILL)?;
                lb.stop_bird(Signal::SIGKILL)?;
                std::thread::sleep(Duration::from_millis(*down_ms));
                lb.set_link(true)?;
                lb.start_bird()?;
                lb.start_lbd()
            }
        }
    }

    /// Runs the `lbctl` command `args(vip)` for both VIPs on every balancer.
    fn on_every_balancer<'a>(&'a self, args: impl Fn(&'a str) -> Vec<&'a str>) -> Result<()> {
        for b in self.fleet.balancers() {
            for vip in &self.vips {
                b.lbctl(&args(vip))?;
            }
        }
        Ok(())
    }

    /// `lbctl apply -f` of one file on every balancer in turn: the first writes the starts it
    /// gave (`started_at`) into the file, so the others ramp those backends alike. The model
    /// removes backends at once, as `lbctl backends remove` does, so the apply is allowed to
    /// remove serving ones (`--allow-backend-removal`).
    fn apply_file(&mut self, state: &State) -> Result<()> {
        self.files += 1;
        let path: PathBuf = self.fleet.tempdir().join(format!("soak-{}.toml", self.files));
        std::fs::write(&path, file::render(state, &self.vips, &self.addrs)).with_context(|| format!("writing {}", path.display()))?;
        let path = path.display().to_string();
        self.fleet.balancers().iter().try_for_each(|b| b.lbctl(&["apply", "--allow-backend-removal", "-f", &path]).map(drop))
    }

    /// Every balancer shows `state`: the backends of both VIPs, and the rules.
    fn check_state(&self, state: &State) -> Result<()> {
        let want_rules = file::rules_of(state, &self.vips[0]);
        let want_backends = file::backends_of(state, &self.addrs);
        for b in self.fleet.balancers() {
            for vip in &self.vips {
                let list = b.lbctl_json(&["backends", "list", "--vip", vip])?;
                let got: BTreeSet<(String, u64, String)> = array(&list, "backends")?
                    .iter()
                    .map(|e| (str_of(&e["address"]), e["weight"].as_u64().unwrap_or(u64::MAX), str_of(&e["state"])))
                    .collect();
                if got != want_backends {
                    bail!("{} shows {vip} with backends {got:?}, the confirmed state is {want_backends:?}", b.name());
                }
            }
            let list = b.lbctl_json(&["rules", "list"])?;
            let got: BTreeSet<(String, String, String)> =
                array(&list, "rules")?.iter().map(|r| (str_of(&r["cidr"]), str_of(&r["vip"]), str_of(&r["action"]))).collect();
            if got != want_rules {
                bail!("{} shows rules {got:?}, the confirmed state is {want_rules:?}", b.name());
            }
        }
        Ok(())
    }

    /// Waits until every active backend serves (in its health and in the table) on every
    /// balancer, every balancer's tables have the same digests, and the router routes the VIP
    /// through every balancer. Counts the waits for a health change to reach the table, and
    /// returns what the first such wait was for.
    fn settle(&mut self, state: &State) -> Result<Option<String>> {
        let mut want_hops: Vec<_> = self.fleet.balancers().iter().map(|b| b.ipv4()).collect();
        want_hops.sort();
        let started = Instant::now();
        let mut waited_for_table = None;
        loop {
            let Some(last) = self.unsettled(state, &want_hops)? else {
                self.report.settles_waiting_for_table += u64::from(waited_for_table.is_some());
                return Ok(waited_for_table);
            };
            // Counted only where health and digests alone would have called the fleet settled.
            if waited_for_table.is_none()
                && last.contains(NOT_YET_IN_TABLE)
                && self.serving_by_health(state)?
                && self.digests_differ()?.is_none()
            {
                waited_for_table = Some(last.clone());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                bail!("the fleet did not settle within {SETTLE_TIMEOUT:?}: {last}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn unsettled(&self, state: &State, want_hops: &[std::net::Ipv4Addr]) -> Result<Option<String>> {
        let mut hops = self.fleet.router_next_hops(VIP4);
        hops.sort();
        if hops != want_hops {
            return Ok(Some(format!("the router routes {VIP4} via {hops:?}")));
        }
        // Every active backend serves on every balancer, in the table and not only in its
        // health: `lbd` programs a health change at most once a probe interval, so a backend
        // shown healthy may still be out of the table for a moment (on every balancer at
        // once, with equal digests). Read before the digests, so these see what it shows.
        for b in self.fleet.balancers() {
            for vip in &self.vips {
                let list = b.lbctl_json(&["backends", "list", "--vip", vip])?;
                let entries = array(&list, "backends")?;
                for (i, _) in state.members.iter().filter(|(_, m)| !m.drained) {
                    let addr = &self.addrs[*i];
                    let entry = entries.iter().find(|e| e["address"] == addr.as_str());
                    if let Some(why) = not_in_table(entry) {
                        return Ok(Some(format!("{} has {vip} backend {addr} {why}", b.name())));
                    }
                }
            }
        }
        self.digests_differ()
    }

    /// Whether the balancers' tables differ (every balancer sends a new flow where the others
    /// do, so a flow ECMP moves keeps its backend).
    fn digests_differ(&self) -> Result<Option<String>> {
        let mut digests = Vec::new();
        for b in self.fleet.balancers() {
            let list = b.lbctl_json(&["vips", "list"])?;
            let mut per_vip: Vec<(String, String)> =
                array(&list, "vips")?.iter().map(|v| (str_of(&v["vip"]), str_of(&v["table_digest"]))).collect();
            per_vip.sort();
            digests.push((b.name().to_owned(), per_vip));
        }
        Ok(digests.windows(2).any(|w| w[0].1 != w[1].1).then(|| format!("the balancers' tables differ: {digests:?}")))
    }

    /// Whether every active backend serves on every balancer by its health alone.
    fn serving_by_health(&self, state: &State) -> Result<bool> {
        for lb in 0..self.config.balancers {
            for vip in &self.vips {
                for (i, _) in state.members.iter().filter(|(_, m)| !m.drained) {
                    if !serving(&self.backend_health(lb, vip, &self.addrs[*i])?) {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    fn backend_health(&self, lb: usize, vip: &str, addr: &str) -> Result<String> {
        let list = self.fleet.balancer(lb + 1).lbctl_json(&["backends", "list", "--vip", vip])?;
        Ok(array(&list, "backends")?.iter().find(|e| e["address"] == addr).map(|e| str_of(&e["health"])).unwrap_or_default())
    }

    fn wait(&self, what: &str, check: impl FnMut() -> Result<bool>) -> Result<()> {
        self.fleet.wait_for(SETTLE_TIMEOUT, what, check).map(drop)
    }

    /// New `level=error` lines of every `lbd` since the last look: allowed only on a
    /// balancer this step (or the one before, whose effects may log late) killed
    /// something of.
    fn check_logs(&mut self, index: usize, op: Option<&Op>) -> Result<()> {
        let previous = self.records.iter().rev().nth(1).map(|r| &r.op);
        for lb in 0..self.config.balancers {
            let b = self.fleet.balancer(lb + 1);
            let pid = b.lbd_pid();
            if self.log_seen[lb].0 != pid {
                self.log_seen[lb] = (pid, 0);
            }
            let log = b.lbd_log();
            let lines: Vec<&str> = log.lines().collect();
            let new = &lines[self.log_seen[lb].1.min(lines.len())..];
            self.log_seen[lb].1 = lines.len();
            let errors: Vec<&&str> = new.iter().filter(|l| l.contains("level=error")).collect();
            let excused = [op, previous].iter().flatten().any(|o| o.balancer() == Some(lb));
            self.report.error_lines += errors.len() as u64;
            if !errors.is_empty() && !excused {
                bail!(
                    "{} logged errors no step explains (step {index}):\n{}",
                    b.name(),
                    errors.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n")
                );
            }
        }
        Ok(())
    }

    fn resources(&self, lb: usize) -> Result<Resources> {
        let b = self.fleet.balancer(lb + 1);
        let pid = b.lbd_pid().with_context(|| format!("lbd of {} is not running", b.name()))?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).with_context(|| format!("listing the fds of lbd {pid}"))?.count();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let st = b.lbctl_json(&["status"])?;
        let maps = array(&st, "maps")?
            .iter()
            .filter(|m| !TRAFFIC_MAPS.contains(&m["name"].as_str().unwrap_or("")))
            .filter_map(|m| Some((str_of(&m["name"]), m["used"].as_u64()?)))
            .collect();
        let count = |k: &str| st[k].as_u64().unwrap_or(u64::MAX);
        Ok(Resources { fds, rss_kib, maps, counts: [count("vips"), count("backends"), count("rules")] })
    }

    fn target_streams(&self) -> usize {
        self.config.clients * self.config.streams_per_client
    }

    fn fill_streams(&mut self) -> Result<()> {
        while self.streams.len() < self.target_streams() {
            let client = &self.fleet.clients()[self.streams.len() % self.config.clients];
            let stream = client
                .in_netns(|| Stream::open(vip_target(TCP_PORT), PING_TIMEOUT))
                .with_context(|| format!("a new connection from {} failed on a settled fleet", client.name()))?;
            let mut watched = Watched::start(stream, self.started);
            watched.placed = self.flow_ways(watched.client);
            self.streams.push(watched);
            self.report.streams_opened += 1;
        }
        Ok(())
    }

    fn retire_oldest_stream(&mut self) {
        if !self.streams.is_empty() {
            let oldest = self.streams.remove(0);
            self.report.stream_pings += oldest.pings();
            oldest.retire();
        }
    }

    /// Takes the broken streams out; fails on one the steps it lived through do not explain.
    fn harvest_streams(&mut self) -> Result<()> {
        let mut kept = Vec::new();
        for s in std::mem::take(&mut self.streams) {
            match s.failure() {
                None => kept.push(s),
                Some((at, error)) => {
                    self.report.stream_pings += s.pings();
                    let (cause, _) =
                        self.judge_stream(&s.backend, s.opened, at, &error).map_err(|e| self.with_flow(e, s.client, &s.placed))?;
                    *self.report.stream_breaks.entry(cause).or_default() += 1;
                }
            }
        }
        self.streams = kept;
        Ok(())
    }

    /// Why a stream to `backend` open since `opened` broke at `at`: the cause, and the step
    /// it broke in; an error if nothing explains it.
    fn judge_stream(&self, backend: &str, opened: Duration, at: Duration, error: &str) -> Result<(&'static str, usize)> {
        let b: usize = backend.trim_start_matches('b').parse::<usize>().with_context(|| format!("backend name {backend:?}"))? - 1;
        let lived: Vec<&Record> = self.records.iter().filter(|r| r.end >= opened && r.start <= at).collect();
        let during = self.records.iter().find(|r| r.start <= at && at <= r.end).map_or(self.records.len() + 1, |r| r.index);
        let killed = lived.iter().any(|r| matches!(r.op, Op::FlapServer { backend, .. } if backend == b));
        let removed = lived.iter().any(|r| matches!(r.op, Op::RemoveBackend { backend } if backend == b) || r.removed.contains(&b));
        let moved = lived.iter().any(|r| r.op.moves_flows());
        // The table changed while it lived: a change step, or a ramp still stepping.
        let ramping = self.records.iter().any(|r| r.ramps && r.end + RAMP_WINDOW >= opened && r.start <= at);
        let changed = ramping
            || lived.iter().any(|r| {
                matches!(
                    r.op,
                    Op::AddBackend { .. }
                        | Op::RemoveBackend { .. }
                        | Op::Drain { .. }
                        | Op::SetWeight { .. }
                        | Op::ApplyFile { .. }
                        | Op::FlapServer { .. }
                )
            });
        let cause = if killed {
            "server_killed"
        } else if removed {
            "backend_removed"
        } else if moved && changed {
            "rerouted_after_change"
        } else {
            let steps: Vec<String> = lived.iter().map(|r| format!("{} ({})", r.index, r.op)).collect();
            bail!(
                "a stream to {backend} (in the set and healthy all along) broke during step {during} at {:.1}s: {error}; \
                 it was opened at {:.1}s and lived through steps {}",
                at.as_secs_f64(),
                opened.as_secs_f64(),
                steps.join(", ")
            );
        };
        Ok((cause, during))
    }

    /// `err` with where every balancer sends the broken stream's packets now
    /// (`lbctl flows get`: its entry, the table's backend, a second candidate), and where
    /// they sent them right after the stream opened.
    fn with_flow(&self, err: anyhow::Error, client: Option<std::net::SocketAddr>, placed: &str) -> anyhow::Error {
        let Some(client) = client else { return err };
        anyhow!("{err:#}\nthe stream's flow from {client} now: {}\nright after it opened: {placed}", self.flow_ways(Some(client)))
    }

    /// What every balancer's `lbctl flows get` says of the echo VIP's flow from `client`.
    fn flow_ways(&self, client: Option<std::net::SocketAddr>) -> String {
        let Some(client) = client else { return String::new() };
        let ways: Vec<String> = self
            .fleet
            .balancers()
            .iter()
            .map(|b| match b.lbctl_json(&["flows", "get", "--vip", &self.vips[0], &client.to_string()]) {
                Ok(way) => format!("{}: {way}", b.name()),
                Err(e) => format!("{}: {e:#}", b.name()),
            })
            .collect();
        ways.join("; ")
    }

    fn start_load(&mut self) -> Result<()> {
        let client = self.fleet.clients().last().context("no client")?;
        // Longer than a segment: the run is stopped when the next one has started.
        let config = LoadConfig::new(vip_target(HTTP_PORT), self.config.load_per_s, 2 * LOAD_SEGMENT);
        let load = Load::start(client, config)?;
        self.load = Some((self.started.elapsed(), load));
        Ok(())
    }

    /// Starts the next run of the load once this one is a segment old, then judges this one.
    fn rotate_load(&mut self) -> Result<()> {
        if self.load.as_ref().is_some_and(|(_, l)| l.elapsed() >= LOAD_SEGMENT) {
            let old = self.load.take();
            self.start_load()?;
            let (offset, load) = old.expect("checked");
            let report = load.stop()?;
            self.judge_load(offset, &report)?;
        }
        Ok(())
    }

    fn finish_load(&mut self) -> Result<()> {
        let Some((offset, load)) = self.load.take() else { return Ok(()) };
        let report = load.stop()?;
        self.judge_load(offset, &report)
    }

    /// Every second with requests that did not succeed must overlap a step that kills or
    /// removes something (a margin of a second before, and the request timeout after).
    fn judge_load(&mut self, offset: Duration, report: &LoadReport) -> Result<()> {
        self.report.requests.attempted += report.totals.attempted;
        self.report.requests.ok += report.totals.ok;
        for (s, bucket) in report.buckets.iter().enumerate() {
            let bad = bucket.attempted - bucket.ok;
            if bad == 0 {
                continue;
            }
            let t = offset + Duration::from_secs(s as u64);
            let (from, to) = (t.saturating_sub(Duration::from_secs(1)), t + Duration::from_secs(4));
            let near: Vec<&Record> = self.records.iter().filter(|r| r.end >= from && r.start <= to).collect();
            let cause = near.iter().find_map(|r| match &r.op {
                Op::KillBalancer { .. } => Some("kill_balancer"),
                Op::KillBird { .. } => Some("kill_bird"),
                Op::FlapServer { .. } => Some("flap_server"),
                Op::RemoveBackend { .. } => Some("remove_backend"),
                Op::ApplyFile { .. } if !r.removed.is_empty() => Some("apply_file_removing"),
                _ => None,
            });
            match cause {
                Some(cause) => *self.report.request_failures.entry(cause).or_default() += bad,
                None => {
                    let steps: Vec<String> = near.iter().map(|r| format!("{} ({})", r.index, r.op)).collect();
                    let at = near.first().map_or(0, |r| r.index);
                    bail!(
                        "soak seed {}, step {at}: {bad} of {} requests due at {:.0}s failed, and the steps then ({}) kill or remove \
                         nothing: {:?}; errors: {:?}",
                        self.config.seed,
                        bucket.attempted,
                        t.as_secs_f64(),
                        steps.join(", "),
                        bucket,
                        report.errors
                    );
                }
            }
        }
        Ok(())
    }

    /// After the last step (a file with the first state): every stream and the load
    /// judged, and every `lbd` back to its baseline.
    fn restore(&mut self) -> Result<()> {
        self.finish_load()?;
        for s in std::mem::take(&mut self.streams) {
            let (backend, opened, client, placed) = (s.backend.clone(), s.opened, s.client, s.placed.clone());
            self.report.stream_pings += s.pings();
            if let Some((at, error)) = s.finish() {
                let (cause, _) = self.judge_stream(&backend, opened, at, &error).map_err(|e| self.with_flow(e, client, &placed))?;
                *self.report.stream_breaks.entry(cause).or_default() += 1;
            }
        }
        let baseline = self.report.baseline.clone();
        let mut end = Vec::new();
        let what = "every lbd back to its baseline (descriptors, map entries, counts)";
        self.fleet
            .wait_for(BASELINE_TIMEOUT, what, || {
                end = (0..self.config.balancers).map(|lb| self.resources(lb)).collect::<Result<_>>()?;
                Ok(end.iter().zip(&baseline).all(|(e, b)| e.fds <= b.fds && same_maps(&e.maps, &b.maps) && e.counts == b.counts))
            })
            .with_context(|| format!("baseline {baseline:?}, now {end:?}"))?;
        self.report.end = end;
        Ok(())
    }

    /// What a failure prints besides its message: the router's sessions and route, the
    /// end of every `lbd` log.
    fn diagnostics(&self) -> String {
        let mut out = format!(
            "at {:.1}s; the router routes {VIP4} via {:?}\n",
            self.started.elapsed().as_secs_f64(),
            self.fleet.router_next_hops(VIP4)
        );
        if let Ok(protocols) = crate::fleet::birdc(&self.fleet.router_bird_socket(), "show protocols") {
            out.push_str(&protocols);
        }
        for b in self.fleet.balancers() {
            for args in [&["vips", "list"][..], &["stats"]] {
                match b.lbctl_json(args) {
                    Ok(v) => out.push_str(&format!("{} lbctl {}: {v}\n", b.name(), args.join(" "))),
                    Err(e) => out.push_str(&format!("{} lbctl {}: {e:#}\n", b.name(), args.join(" "))),
                }
            }
            let log = b.lbd_log();
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!("---- the last lines of lbd on {} ----\n", b.name()));
            for line in &lines[lines.len().saturating_sub(LOG_TAIL)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    fn stop_traffic(&mut self) {
        self.load.take();
        for s in self.streams.drain(..) {
            s.retire();
        }
    }
}

/// The map entries in use are the baseline's, but for the ring pool: a VIP holds two tables
/// (active and standby) until a change starts its first episode at least
/// `second_chance_settle_s` after it was created, then three (its second-chance table, reused
/// by every later episode). So each VIP's share may have grown by half, never more.
fn same_maps(end: &BTreeMap<String, u64>, baseline: &BTreeMap<String, u64>) -> bool {
    let rings = |m: &BTreeMap<String, u64>| m.get("spw_rings").copied();
    let without = |m: &BTreeMap<String, u64>| m.iter().filter(|(k, _)| *k != "spw_rings").map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>();
    let rings_ok = match (rings(end), rings(baseline)) {
        (Some(e), Some(b)) => e == b || e == b / 2 * 3,
        (e, b) => e == b,
    };
    rings_ok && without(end) == without(baseline)
}

/// Whether `op` (from `before` to `after`) starts a slow start: a backend takes new flows
/// that did not, or an active backend's servers are flapped (its readmission ramps).
fn starts_ramp(before: &State, after: &State, op: &Op) -> bool {
    let flapped = matches!(op, Op::FlapServer { backend, .. } if after.is_active(*backend));
    flapped || after.members.keys().any(|b| after.is_active(*b) && !before.is_active(*b))
}

/// Waits, if need be, until the next ramp step (a wall-clock multiple of a tenth of the
/// slow start) is at least [`RAMP_STEP_GUARD`] away. `lbctl backends add` (or `set-weight`
/// after a drain) stamps the start on each balancer when it gets there; an operator doing
/// it on every balancer within one step gets one ramp everywhere.
fn within_one_ramp_step() {
    let step = (file::SLOW_START_MS / 10).max(1);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let left = Duration::from_millis(step - now % step);
    if left < RAMP_STEP_GUARD {
        std::thread::sleep(left + Duration::from_millis(50));
    }
}

/// A backend health that takes new flows (a slow start is one).
fn serving(health: &str) -> bool {
    matches!(health, "healthy" | "slow_start")
}

/// Why an active backend's entry in `lbctl backends list -o json` does not take its share of
/// new flows yet, if it does not: its health, or a health that serves while the programmed
/// weight (`effective_weight`, what the table was built with) is not the one it implies
/// (the configured weight when healthy, some of it in a slow start).
fn not_in_table(entry: Option<&Value>) -> Option<String> {
    let Some(entry) = entry else { return Some("missing".to_owned()) };
    let health = str_of(&entry["health"]);
    if !serving(&health) {
        return Some(health);
    }
    let (weight, programmed) = (entry["weight"].as_u64().unwrap_or(0), entry["effective_weight"].as_u64().unwrap_or(0));
    let in_table = if health == "healthy" { programmed == weight } else { programmed > 0 && programmed <= weight };
    (!in_table).then(|| format!("{health} with weight {weight} but programmed with {programmed} ({NOT_YET_IN_TABLE})"))
}

fn array<'v>(value: &'v Value, key: &str) -> Result<&'v Vec<Value>> {
    value[key].as_array().with_context(|| format!("no array {key:?} in {value}"))
}

fn str_of(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_backend_serves_only_once_its_weight_is_in_the_table() {
        let entry =
            |health: &str, weight: u64, programmed: u64| json!({"health": health, "weight": weight, "effective_weight": programmed});
        assert_eq!(not_in_table(Some(&entry("healthy", 100, 100))), None);
        assert_eq!(not_in_table(Some(&entry("slow_start", 100, 10))), None);
        // Readmitted, not programmed yet: what let a stream be placed on a table without it.
        let pending = not_in_table(Some(&entry("healthy", 100, 0))).expect("not in the table");
        assert!(pending.contains(NOT_YET_IN_TABLE), "{pending}");
        assert!(not_in_table(Some(&entry("slow_start", 100, 0))).is_some());
        assert!(not_in_table(Some(&entry("healthy", 200, 100))).is_some(), "a re-weight not programmed yet");
        assert_eq!(not_in_table(Some(&entry("unhealthy", 100, 0))).as_deref(), Some("unhealthy"));
        assert_eq!(not_in_table(Some(&entry("held_down", 100, 100))).as_deref(), Some("held_down"));
        assert!(not_in_table(None).is_some());
    }

    #[test]
    fn a_step_starts_a_ramp_when_a_backend_begins_to_serve_or_is_flapped() {
        let initial = State::initial(4);
        let mut added = initial.clone();
        let add = Op::AddBackend { backend: 3, weight: 100 };
        schedule::apply(&mut added, &add);
        assert!(starts_ramp(&initial, &added, &add));
        let reweight = Op::SetWeight { backend: 0, weight: 200 };
        let mut reweighted = initial.clone();
        schedule::apply(&mut reweighted, &reweight);
        assert!(!starts_ramp(&initial, &reweighted, &reweight), "an active backend's new weight is no ramp");
        let mut drained = initial.clone();
        schedule::apply(&mut drained, &Op::Drain { backend: 0 });
        let mut undrained = drained.clone();
        schedule::apply(&mut undrained, &reweight);
        assert!(starts_ramp(&drained, &undrained, &reweight), "a weight again after a drain ramps");
        let flap = |backend| Op::FlapServer { backend, down_ms: 500 };
        assert!(starts_ramp(&initial, &initial, &flap(0)));
        assert!(!starts_ramp(&initial, &initial, &flap(3)), "a backend outside the set is readmitted nowhere");
    }
}
