//! End to end: connection-per-request HTTP through the real `lbd`, against the cheapest XDP
//! hop in the same topology. Each phase runs on fresh namespaces (a load test's sockets
//! would slow the next one's connects): three backends with `lbd agent` (decapsulation) and
//! `spillway-http`, two clients each keeping requests in flight on new connections to the
//! VIP. Phase `spillway` is `lbd` with the VIP; phase `hop` is `spillway_hop` on the
//! balancer's `eth0` instead (see `xdp-ebpf/src/bin/hop.rs`): the same tunnel to the same
//! backends, whose agents decapsulate it, with no state, no Maglev and no FIB lookup. The
//! floor (`XDP_TX` unchanged) would bounce the frames back to the client, so it is no hop.
//! Phases alternate, in both orders, and each reports its median.
//!
//! Everything shares this VM's cores: clients, backends and both kernels' softirqs. So the
//! rate is what the machine as a whole does, and the ratio is the whole path's CPU per
//! request without Spillway's extra work over with it. `/proc/stat` over each run says where
//! the CPU went (and whether it was saturated: idle time means the ratio is also latency).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use aya::{
    maps::Array,
    programs::{Xdp, XdpMode},
};
use spillway::{dataplane, objects};
use spillway_common::{
    limits::{map_names, program_names},
    types::{HOP_BACKENDS, HopBackend, HopConfig},
};
use spillway_harness::{
    Host, LB4, TopologyConfig, VIP4,
    cluster::{self, Binaries, Cluster, ClusterConfig},
    rps::{self, ClosedLoopConfig, ClosedLoopReport},
};

use super::{Section, median};

const BACKENDS: usize = 3;
const CLIENTS: usize = 2;
/// The servers' port (the echo servers the cluster starts hold port 80).
const PORT: u16 = 8080;
const SERVER_THREADS: u32 = 2;
/// Requests in flight per client: enough to keep both cores busy.
const CONCURRENCY: usize = 16;
/// Bounds on each part of a phase, so the part ends within ~2 minutes.
const WARMUP: Duration = Duration::from_secs(1);
const WARMUP_TRIES: usize = 10;
const MEASURE: Duration = Duration::from_secs(6);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Rounds of both phases (the first in one order, the next in the other).
const ROUNDS: usize = 3;
/// Share of failed requests above which a run is not a measurement.
const MAX_FAILED: f64 = 0.001;
const GOAL: f64 = 0.97;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Spillway,
    /// `lbd` with its port watcher off the kernel's socket hooks (`--watcher-mode
    /// sock_diag`): here those hooks see every client's and backend's socket too, which on
    /// a balancer of its own they would not. The difference to `Spillway` is their cost.
    SpillwayUnhooked,
    Hop,
}

/// In the order of the first round; each later round starts one further on.
const PHASES: [Phase; 3] = [Phase::Spillway, Phase::SpillwayUnhooked, Phase::Hop];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Spillway => "spillway",
            Phase::SpillwayUnhooked => "spillway_unhooked",
            Phase::Hop => "hop",
        }
    }
}

/// One measured run.
struct Run {
    report: ClosedLoopReport,
    cpu: Cpu,
    /// Frames the balancer's `eth0` received (the clients' packets to the VIP, and a few
    /// health probes and neighbour frames).
    balancer_rx: u64,
    /// CPU time of the `lbd` process itself (its threads; not the XDP program, which runs
    /// in softirq), in USER_HZ ticks.
    lbd_ticks: u64,
}

pub fn part() -> Result<Section> {
    ensure!(nix::unistd::Uid::effective().is_root(), "needs root (network namespaces, XDP)");
    let bins = crate::bins::build(true)?;
    let mut runs: Vec<(Phase, Run)> = Vec::new();
    for round in 0..ROUNDS {
        for phase in PHASES.iter().cycle().skip(round).take(PHASES.len()).copied() {
            let run = run_phase(&bins, phase).with_context(|| format!("phase {} of round {}", phase.name(), round + 1))?;
            runs.push((phase, run));
        }
    }
    report(&runs)
}

fn run_phase(bins: &Binaries, phase: Phase) -> Result<Run> {
    let config = ClusterConfig {
        topology: TopologyConfig { backends: BACKENDS, clients: CLIENTS },
        mode: cluster::XdpMode::Native,
        lbd_args: match phase {
            Phase::SpillwayUnhooked => vec!["--watcher-mode".into(), "sock_diag".into()],
            _ => Vec::new(),
        },
        agent_args: Vec::new(),
    };
    let cluster = match phase {
        Phase::Spillway | Phase::SpillwayUnhooked => Cluster::start(bins.clone(), config)?,
        Phase::Hop => Cluster::start_without_lbd(bins.clone(), config)?,
    };
    let backends = cluster.topo.backends();
    let _servers = backends.iter().map(|b| rps::start_http_server(b, PORT, SERVER_THREADS)).collect::<Result<Vec<_>>>()?;
    // Declared after the cluster: detached before its namespaces go.
    let _hop = match phase {
        Phase::Spillway | Phase::SpillwayUnhooked => {
            let vip = format!("{VIP4}:{PORT}/tcp");
            cluster.lbctl(&["vips", "add", &vip])?;
            for b in backends {
                cluster.lbctl(&["backends", "add", "--vip", &vip, &b.ipv4().to_string()])?;
            }
            None
        }
        Phase::Hop => Some(attach_hop(cluster.topo.lb(), backends)?),
    };
    let clients: Vec<&Host> = cluster.topo.clients().iter().collect();
    let load = |duration| ClosedLoopConfig {
        target: SocketAddr::new(VIP4.into(), PORT),
        concurrency: CONCURRENCY,
        duration,
        timeout: REQUEST_TIMEOUT,
    };
    warm_up(&clients, load(WARMUP))?;
    let lb = cluster.topo.lb();
    let rx_before: Vec<u64> = std::iter::once(lb).chain(backends).map(rx_packets).collect::<Result<_>>()?;
    let lbd_ticks = || cluster.lbd_pid().map_or(Ok(0), process_ticks);
    let (cpu_before, lbd_before) = (Cpu::read()?, lbd_ticks()?);
    let report = rps::closed_loop(&clients, load(MEASURE))?;
    let (cpu, lbd_ticks) = (Cpu::read()?.since(&cpu_before), lbd_ticks()? - lbd_before);
    let rx: Vec<u64> =
        std::iter::once(lb).chain(backends).zip(&rx_before).map(|(h, before)| Ok(rx_packets(h)? - before)).collect::<Result<_>>()?;
    ensure!(
        report.failed as f64 <= report.ok as f64 * MAX_FAILED,
        "{} of {} requests failed: {:?}",
        report.failed,
        report.ok + report.failed,
        report.errors
    );
    // Every backend served its share (by the frames it received).
    let least = rx[1..].iter().min().copied().unwrap_or(0);
    ensure!(least as f64 >= report.ok as f64, "a backend received {least} frames for {} requests: {rx:?}", report.ok);
    Ok(Run { report, cpu, balancer_rx: rx[0], lbd_ticks })
}

/// Short runs until one has no failure: `lbd` has programmed the VIP, neighbours resolved.
fn warm_up(clients: &[&Host], config: ClosedLoopConfig) -> Result<()> {
    let mut last = None;
    for _ in 0..WARMUP_TRIES {
        let report = rps::closed_loop(clients, config)?;
        if report.failed == 0 && report.ok > 0 {
            return Ok(());
        }
        last = Some(report);
    }
    let last = last.unwrap_or_default();
    bail!("still failing after {WARMUP_TRIES} warm-up runs: {} ok, {} failed: {:?}", last.ok, last.failed, last.errors)
}

/// Loads `spillway_hop` for `backends` and attaches it natively to the balancer's `eth0`
/// (it stays attached while the returned object lives).
fn attach_hop(lb: &Host, backends: &[Host]) -> Result<aya::Ebpf> {
    ensure!(backends.len() <= HOP_BACKENDS, "the hop takes at most {HOP_BACKENDS} backends");
    let mut cfg = HopConfig {
        vip: u32::from(VIP4).to_be(),
        src: u32::from(LB4).to_be(),
        src_mac: lb.netns().mac("eth0")?,
        port: PORT.to_be(),
        count: backends.len() as u32,
        backends: [HopBackend::default(); HOP_BACKENDS],
    };
    for (slot, b) in cfg.backends.iter_mut().zip(backends) {
        *slot = HopBackend { addr: u32::from(b.ipv4()).to_be(), mac: b.netns().mac("eth0")?, _pad: [0; 2] };
    }
    lb.in_netns(|| {
        let mut ebpf = dataplane::load_simple(objects::HOP, "spillway-hop", program_names::HOP)?;
        let mut map: Array<_, HopConfig> = Array::try_from(ebpf.map_mut(map_names::HOP_CONFIG).context("no hop config map")?)?;
        map.set(0, &cfg, 0)?;
        let ifindex = nix::net::if_::if_nametoindex("eth0").context("index of eth0")?;
        let program: &mut Xdp = dataplane::xdp(&mut ebpf, program_names::HOP)?;
        program.attach(ifindex, XdpMode::Driver).context("attaching the hop to eth0")?;
        Ok(ebpf)
    })
}

/// Frames `eth0` of `host` received so far (`/proc/net/dev` of its namespace).
fn rx_packets(host: &Host) -> Result<u64> {
    let dev = host.in_netns(|| std::fs::read_to_string("/proc/thread-self/net/dev")).context("reading /proc/net/dev")?;
    let line = dev.lines().find(|l| l.trim_start().starts_with("eth0:")).context("no eth0 in /proc/net/dev")?;
    let fields: Vec<&str> = line.split(':').nth(1).unwrap_or_default().split_whitespace().collect();
    Ok(fields.get(1).context("short /proc/net/dev line")?.parse()?)
}

/// User and system time of process `pid` so far, in USER_HZ ticks (`/proc/<pid>/stat`).
fn process_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').context("no command in /proc/<pid>/stat")?.1.split_whitespace().collect();
    let tick = |i: usize| -> Result<u64> { Ok(fields.get(i - 3).context("short /proc/<pid>/stat")?.parse()?) };
    Ok(tick(14)? + tick(15)?)
}

/// The machine's CPU time (all CPUs, in USER_HZ ticks) from the `cpu` line of `/proc/stat`.
#[derive(Clone, Copy, Default)]
struct Cpu {
    user: u64,
    system: u64,
    softirq: u64,
    idle: u64,
    /// irq, steal and the rest.
    other: u64,
}

impl Cpu {
    fn read() -> Result<Cpu> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let line = stat.lines().find(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
        let v: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
        ensure!(v.len() >= 8, "short cpu line in /proc/stat: {line}");
        // user nice system idle iowait irq softirq steal ...
        Ok(Cpu {
            user: v[0] + v[1],
            system: v[2],
            idle: v[3] + v[4],
            softirq: v[6],
            other: v[5] + v[7],
        })
    }

    fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            user: self.user - before.user,
            system: self.system - before.system,
            softirq: self.softirq - before.softirq,
            idle: self.idle - before.idle,
            other: self.other - before.other,
        }
    }

    fn total(&self) -> u64 {
        self.user + self.system + self.softirq + self.idle + self.other
    }
}

/// Microseconds of CPU per answered request.
fn us_per_request(ticks: u64, requests: u64) -> f64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    ticks as f64 / hz * 1e6 / requests.max(1) as f64
}

/// What one phase's runs come to: medians over the rounds.
struct Summary {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    user_us: f64,
    system_us: f64,
    softirq_us: f64,
    idle_share: f64,
    balancer_frames: f64,
    lbd_us: f64,
}

impl Summary {
    /// All busy CPU per request.
    fn busy_us(&self) -> f64 {
        self.user_us + self.system_us + self.softirq_us
    }
}

fn summarize(runs: &[&Run]) -> Summary {
    let med = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(|r| f(r)).collect());
    let us = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
    Summary {
        rps: med(&|r| r.report.per_second()),
        p50_us: med(&|r| us(r.report.percentile(50.0))),
        p99_us: med(&|r| us(r.report.percentile(99.0))),
        user_us: med(&|r| us_per_request(r.cpu.user, r.report.ok)),
        system_us: med(&|r| us_per_request(r.cpu.system, r.report.ok)),
        softirq_us: med(&|r| us_per_request(r.cpu.softirq, r.report.ok)),
        idle_share: med(&|r| r.cpu.idle as f64 / r.cpu.total().max(1) as f64),
        balancer_frames: med(&|r| r.balancer_rx as f64 / r.report.ok.max(1) as f64),
        lbd_us: med(&|r| us_per_request(r.lbd_ticks, r.report.ok)),
    }
}

fn report(runs: &[(Phase, Run)]) -> Result<Section> {
    let of = |phase| runs.iter().filter(|(p, _)| *p == phase).map(|(_, r)| r).collect::<Vec<_>>();
    let rate = |phase| of(phase).iter().map(|r| r.report.per_second()).collect::<Vec<_>>();
    let summaries: Vec<(Phase, Summary)> = PHASES.iter().map(|&p| (p, summarize(&of(p)))).collect();
    let get = |phase| &summaries.iter().find(|(p, _)| *p == phase).expect("every phase ran").1;
    let (a, unhooked, b) = (get(Phase::Spillway), get(Phase::SpillwayUnhooked), get(Phase::Hop));
    let ratio = a.rps / b.rps;
    // Each round's own ratio, to show the spread.
    let rounds: Vec<String> = rate(Phase::Spillway).iter().zip(rate(Phase::Hop)).map(|(a, b)| format!("{:.3}", a / b)).collect();
    let mut text = String::new();
    writeln!(
        text,
        "End to end: connection-per-request HTTP to the VIP from {CLIENTS} clients ({CONCURRENCY} requests in flight each) onto \
         {BACKENDS} backends (lbd agent decapsulating, spillway-http answering), {}s per run on fresh namespaces, median of \
         {ROUNDS} rounds. `hop` is the cheapest XDP hop that delivers the same tunnel to the same backends (spillway_hop: a \
         stateless hash onto the backends, fixed MACs, no table, no Maglev, no FIB lookup, no counters), so the backends' \
         decapsulation is in both; `spillway_unhooked` is lbd with --watcher-mode sock_diag. CPU is the whole machine's \
         (clients, balancer, backends) per answered request, lbd its own process's.",
        MEASURE.as_secs()
    )?;
    writeln!(
        text,
        "{:<17} | {:>7} | {:>6} | {:>6} | {:>7} | {:>6} | {:>7} | {:>6} | {:>4} | {:>9}",
        "phase", "req/s", "p50 us", "p99 us", "user us", "sys us", "softirq", "lbd us", "idle", "lb frames"
    )?;
    writeln!(text, "{:-<17}-|-{:->7}-|-{:->6}-|-{:->6}-|-{:->7}-|-{:->6}-|-{:->7}-|-{:->6}-|-{:->4}-|-{:->9}", "", "", "", "", "", "", "", "", "", "")?;
    for (phase, s) in &summaries {
        writeln!(
            text,
            "{:<17} | {:>7.0} | {:>6.0} | {:>6.0} | {:>7.1} | {:>6.1} | {:>7.1} | {:>6.2} | {:>3.0}% | {:>9.2}",
            phase.name(),
            s.rps,
            s.p50_us,
            s.p99_us,
            s.user_us,
            s.system_us,
            s.softirq_us,
            s.lbd_us,
            s.idle_share * 100.0,
            s.balancer_frames
        )?;
    }
    let met = if ratio >= GOAL { "met" } else { "not met" };
    writeln!(
        text,
        "spillway / hop: {ratio:.3} (goal {GOAL}: {met}); per round {}; spillway_unhooked / hop: {:.3}.",
        rounds.join(", "),
        unhooked.rps / b.rps
    )?;
    let extra = a.busy_us() - b.busy_us();
    let hooks = a.busy_us() - unhooked.busy_us();
    let rest = extra - hooks - a.lbd_us;
    writeln!(
        text,
        "Where the rest goes: {extra:.1} us more CPU per request with Spillway ({:.1} against {:.1}; user {:+.1}, system {:+.1}, \
         softirq {:+.1}): lbd's own process {:.2}; lbd's port-watcher hooks, which here see every client's and backend's socket \
         {hooks:.1}; the rest, {rest:.1} ({:.0} ns over each of {:.1} balancer frames a request), is the balancer program's work \
         over the hop's and the noise of a shared VM (compare the rounds).",
        a.busy_us(),
        b.busy_us(),
        a.user_us - b.user_us,
        a.system_us - b.system_us,
        a.softirq_us - b.softirq_us,
        a.lbd_us,
        rest * 1e3 / a.balancer_frames.max(1e-9),
        a.balancer_frames,
    )?;
    let mut rows = vec![
        ("e2e_ratio".to_owned(), ratio),
        ("e2e_goal".to_owned(), GOAL),
        ("e2e_unhooked_ratio".to_owned(), unhooked.rps / b.rps),
        ("e2e_extra_cpu_us_per_req".to_owned(), extra),
        ("e2e_watcher_hooks_cpu_us_per_req".to_owned(), hooks),
    ];
    for (phase, s) in &summaries {
        let name = phase.name();
        rows.extend([
            (format!("e2e_{name}_req_per_s"), s.rps),
            (format!("e2e_{name}_p50_us"), s.p50_us),
            (format!("e2e_{name}_p99_us"), s.p99_us),
            (format!("e2e_{name}_cpu_user_us_per_req"), s.user_us),
            (format!("e2e_{name}_cpu_system_us_per_req"), s.system_us),
            (format!("e2e_{name}_cpu_softirq_us_per_req"), s.softirq_us),
            (format!("e2e_{name}_lbd_cpu_us_per_req"), s.lbd_us),
            (format!("e2e_{name}_idle_share"), s.idle_share),
            (format!("e2e_{name}_balancer_frames_per_req"), s.balancer_frames),
        ]);
    }
    Ok(Section { text, rows, ..Section::default() })
}
