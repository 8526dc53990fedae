//! End to end: connection-per-request HTTP through the real `lbd`, against the cheapest XDP
//! hop in the same topology. Each phase runs on fresh namespaces (a load test's sockets
//! would slow the next one's connects): three backends with `lbd agent` (decapsulation) and
//! `spillway-http`, two clients each keeping requests in flight on new connections to the
//! VIP. Phase `spillway` is `lbd` with the VIP; phase `hop` is `spillway_hop` on the
//! balancer's `eth0` instead (see `xdp-ebpf/src/bin/hop.rs`): the same tunnel to the same
//! backends, whose agents decapsulate it, with no state, no Maglev and no FIB lookup. The
//! floor (`XDP_TX` unchanged) would bounce the frames back to the client, so it is no hop.
//! A third phase runs `lbd` with its port watcher off the socket hooks. Phases rotate over
//! the rounds; a ratio is the median of each round's own (its runs were next to each other).
//! Test runs of both programs in the packet lab apportion the difference per frame.
//!
//! Everything shares this VM's cores: clients, backends and both kernels' softirqs. So the
//! rate is what the machine as a whole does, and the ratio is the whole path's CPU per
//! request without Spillway's extra work over with it. `/proc/stat` over each run says where
//! the CPU went (and whether it was saturated: idle time means the ratio is also latency).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use aya::{
    maps::Array,
    programs::{Xdp, XdpMode},
};
use spillway_common::{
    limits::{map_names, program_names},
    types::{HOP_BACKENDS, HopBackend, HopConfig},
};
use spillway_dataplane as dataplane;
use spillway_dataplane::objects;
use spillway_harness::{
    Host, LB4, TopologyConfig, VIP4,
    cluster::{self, Binaries, Cluster, ClusterConfig},
    rps::{self, ClosedLoopConfig, ClosedLoopReport},
};

use super::{
    Section, median,
    packets::{Case, Flows, Frames, Lab, Program, XDP_TX},
};

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
const MEASURE: Duration = Duration::from_secs(4);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Rounds of every phase, each starting one phase further on.
const ROUNDS: usize = 4;
/// Share of failed requests above which a run is not a measurement.
const MAX_FAILED: f64 = 0.001;
const GOAL: f64 = 0.97;
/// Test runs per case for the per-frame costs, at most: they only apportion the difference.
const FRAME_CALLS: usize = 50_000;
/// Share of the busy CPU other users of the machine may take before the figures are flagged.
const BUSY: f64 = 0.1;

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
    /// CPU time of the processes in the topology's namespaces and of this one (the load).
    own_ticks: u64,
    /// CPU time of the backends' agents (their threads: polls answered, maps read).
    agent_ticks: u64,
}

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    ensure!(nix::unistd::Uid::effective().is_root(), "needs root (network namespaces, XDP)");
    let frames = frame_costs(calls.min(FRAME_CALLS), reps)?;
    let bins = crate::bins::build(true)?;
    let mut runs: Vec<(Phase, Run)> = Vec::new();
    for round in 0..ROUNDS {
        for phase in PHASES.iter().cycle().skip(round).take(PHASES.len()).copied() {
            let run = run_phase(&bins, phase).with_context(|| format!("phase {} of round {}", phase.name(), round + 1))?;
            runs.push((phase, run));
        }
    }
    report(&runs, &frames)
}

/// What one frame costs each program, ns (BPF_PROG_TEST_RUN in the packet lab, as `paths`).
struct FrameCosts {
    floor: f64,
    hop: f64,
    /// The balancer's new flow (a SYN) and table hit (every later frame of a connection).
    new_flow: f64,
    hit: f64,
}

fn frame_costs(calls: usize, reps: usize) -> Result<FrameCosts> {
    Lab::with(|lab| {
        let flows = Flows::new()?;
        let hop = |name: &str, frame: &[u8]| Case {
            name: name.into(),
            program: Program::Hop,
            frames: Frames::Fixed(frame.to_vec()),
            action: XDP_TX,
            reason: None,
            inserts: false,
        };
        let cases = [
            Case::floor(&flows.syn),
            hop("hop_syn", &flows.syn),
            hop("hop_ack", &flows.ack),
            Case::forwarded("new_flow", Frames::NewFlows(flows.syn.clone()), true),
            Case::forwarded("table_hit", Frames::Established { syn: flows.syn.clone(), frame: flows.ack.clone() }, false),
        ];
        // Sent where it should be, whole, from sources that reach every backend.
        let mut reached = HashSet::new();
        for n in 0..32 {
            let mut syn = flows.syn.clone();
            super::packets::write_new_source(&mut syn, n);
            reached.insert(lab.check_hop(&syn).with_context(|| format!("the hop, source {n}"))?);
        }
        ensure!(reached.len() == 3, "32 sources reached only the hop's backends {reached:?}");
        lab.check_hop(&flows.ack).context("the hop, an ACK")?;
        let ns = lab.measure(&cases, calls, reps)?;
        Ok(FrameCosts { floor: ns[0], hop: (ns[1] + ns[2]) / 2.0, new_flow: ns[3], hit: ns[4] })
    })
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
    let namespaces = topology_namespaces(&cluster)?;
    let (cpu_before, lbd_before, (own_before, agents_before)) = (Cpu::read()?, lbd_ticks()?, own_ticks(&namespaces)?);
    let report = rps::closed_loop(&clients, load(MEASURE))?;
    let (cpu, lbd_ticks) = (Cpu::read()?.since(&cpu_before), lbd_ticks()? - lbd_before);
    let (own_after, agents_after) = own_ticks(&namespaces)?;
    let (own_ticks, agent_ticks) = (own_after.saturating_sub(own_before), agents_after.saturating_sub(agents_before));
    let rx: Vec<u64> =
        std::iter::once(lb).chain(backends).zip(&rx_before).map(|(h, before)| Ok(rx_packets(h)? - before)).collect::<Result<_>>()?;
    ensure!(
        report.failed as f64 <= report.ok as f64 * MAX_FAILED,
        "{} of {} requests failed: {:?}",
        report.failed,
        report.ok + report.failed,
        report.errors
    );
    // Every backend took part: as many frames as requests is a fifth of the load (5 frames a
    // request), where an even spread gives each a third.
    let least = rx[1..].iter().min().copied().unwrap_or(0);
    ensure!(least as f64 >= report.ok as f64, "a backend received {least} frames for {} requests: {rx:?}", report.ok);
    Ok(Run { report, cpu, balancer_rx: rx[0], lbd_ticks, own_ticks, agent_ticks })
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

/// The inode numbers of the namespaces of the cluster's topology: all, and the backends'.
struct Namespaces {
    all: HashSet<u64>,
    backends: HashSet<u64>,
}

fn topology_namespaces(cluster: &Cluster) -> Result<Namespaces> {
    let inode = |p: &std::path::Path| Ok(std::fs::metadata(p).with_context(|| format!("{}", p.display()))?.ino());
    let topo = &cluster.topo;
    let backends = topo.backends().iter().map(|h| inode(h.netns().path())).collect::<Result<HashSet<u64>>>()?;
    let mut all = std::iter::once(topo.lb()).chain(topo.clients()).map(|h| inode(h.netns().path())).collect::<Result<HashSet<u64>>>()?;
    all.insert(inode(topo.bridge().path())?);
    all.extend(&backends);
    Ok(Namespaces { all, backends })
}

/// CPU time so far (USER_HZ ticks) of this process and of every process in the topology's
/// namespaces, and of theirs the agents' (`lbd` on a backend). They all live through a run,
/// so the difference of two readings is theirs.
fn own_ticks(namespaces: &Namespaces) -> Result<(u64, u64)> {
    let (mut ticks, mut agents) = (process_ticks(std::process::id())?, 0);
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process that ended since the listing, or that is not ours to read, is not ours.
        let Ok(link) = std::fs::read_link(entry.path().join("ns/net")) else { continue };
        let Some(inode) = link.to_str().and_then(|l| l.strip_prefix("net:[")?.strip_suffix(']')?.parse::<u64>().ok()) else {
            continue;
        };
        if !namespaces.all.contains(&inode) || pid == std::process::id() {
            continue;
        }
        let own = process_ticks(pid).unwrap_or(0);
        ticks += own;
        if namespaces.backends.contains(&inode) && std::fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == "lbd") {
            agents += own;
        }
    }
    Ok((ticks, agents))
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
        Ok(Cpu { user: v[0] + v[1], system: v[2], idle: v[3] + v[4], softirq: v[6], other: v[5] + v[7] })
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
    agents_us: f64,
    own_us: f64,
    foreign_share: f64,
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
        agents_us: med(&|r| us_per_request(r.agent_ticks, r.report.ok)),
        own_us: med(&|r| us_per_request(r.own(), r.report.ok)),
        foreign_share: med(&|r| r.foreign() as f64 / r.cpu.total().max(1) as f64),
    }
}

impl Run {
    /// The machine's CPU that went to this run: its processes', and all softirq and irq
    /// time (the network's, nearly all of it ours).
    fn own(&self) -> u64 {
        self.own_ticks + self.cpu.softirq + self.cpu.other
    }

    /// Busy CPU that did not go to this run: the other users of a shared machine.
    fn foreign(&self) -> u64 {
        (self.cpu.user + self.cpu.system + self.cpu.softirq + self.cpu.other).saturating_sub(self.own())
    }
}

fn report(runs: &[(Phase, Run)], frames: &FrameCosts) -> Result<Section> {
    let of = |phase| runs.iter().filter(|(p, _)| *p == phase).map(|(_, r)| r).collect::<Vec<_>>();
    let summaries: Vec<(Phase, Summary)> = PHASES.iter().map(|&p| (p, summarize(&of(p)))).collect();
    let get = |phase| &summaries.iter().find(|(p, _)| *p == phase).expect("every phase ran").1;
    let (a, unhooked, b) = (get(Phase::Spillway), get(Phase::SpillwayUnhooked), get(Phase::Hop));
    // Each round's own ratio (its runs were next to each other, so under about the same load
    // from the machine's other users), and their median.
    let per_round =
        |x: Phase, y: Phase, f: &dyn Fn(&Run) -> f64| -> Vec<f64> { of(x).iter().zip(of(y)).map(|(x, y)| f(x) / f(y)).collect() };
    let rps = |r: &Run| r.report.per_second();
    // CPU ratios are inverted (hop over spillway), so that above 1 is better for both.
    let cpu = |r: &Run| 1.0 / us_per_request(r.own(), r.report.ok);
    let rounds = per_round(Phase::Spillway, Phase::Hop, &rps);
    let ratio = median(rounds.clone());
    let unhooked_ratio = median(per_round(Phase::SpillwayUnhooked, Phase::Hop, &rps));
    let cpu_ratio = median(per_round(Phase::Spillway, Phase::Hop, &cpu));
    let unhooked_cpu_ratio = median(per_round(Phase::SpillwayUnhooked, Phase::Hop, &cpu));
    let rounds: Vec<String> = rounds.iter().map(|r| format!("{r:.3}")).collect();
    let mut text = String::new();
    writeln!(
        text,
        "End to end: connection-per-request HTTP to the VIP from {CLIENTS} clients ({CONCURRENCY} requests in flight each) onto \
         {BACKENDS} backends (lbd agent decapsulating, spillway-http answering), {}s per run on fresh namespaces, median of \
         {ROUNDS} rounds. `hop` is the cheapest XDP hop that delivers the same tunnel to the same backends (spillway_hop: a \
         stateless hash onto the backends, fixed MACs, no table, no Maglev, no FIB lookup, no counters), so the backends' \
         decapsulation is in both; `spillway_unhooked` is lbd with --watcher-mode sock_diag. CPU per answered request: `own` \
         this run's (its processes, softirq, irq), user/sys/softirq the whole machine's, lbd and agents their processes'; `others` \
         is the share of the busy CPU that went to other users of the machine.",
        MEASURE.as_secs()
    )?;
    writeln!(
        text,
        "{:<17} | {:>7} | {:>6} | {:>6} | {:>6} | {:>7} | {:>6} | {:>7} | {:>6} | {:>6} | {:>4} | {:>6} | {:>9}",
        "phase", "req/s", "p50 us", "p99 us", "own us", "user us", "sys us", "softirq", "lbd us", "agents", "idle", "others", "lb frames"
    )?;
    writeln!(
        text,
        "{:-<17}-|-{:->7}-|-{:->6}-|-{:->6}-|-{:->6}-|-{:->7}-|-{:->6}-|-{:->7}-|-{:->6}-|-{:->6}-|-{:->4}-|-{:->6}-|-{:->9}",
        "", "", "", "", "", "", "", "", "", "", "", "", ""
    )?;
    for (phase, s) in &summaries {
        writeln!(
            text,
            "{:<17} | {:>7.0} | {:>6.0} | {:>6.0} | {:>6.1} | {:>7.1} | {:>6.1} | {:>7.1} | {:>6.2} | {:>6.2} | {:>3.0}% | {:>5.0}% | {:>9.2}",
            phase.name(),
            s.rps,
            s.p50_us,
            s.p99_us,
            s.own_us,
            s.user_us,
            s.system_us,
            s.softirq_us,
            s.lbd_us,
            s.agents_us,
            s.idle_share * 100.0,
            s.foreign_share * 100.0,
            s.balancer_frames
        )?;
    }
    let met = if ratio >= GOAL { "met" } else { "not met" };
    writeln!(
        text,
        "spillway / hop, req/s: {ratio:.3} (goal {GOAL}: {met}), median of the rounds' {}; spillway_unhooked / hop {unhooked_ratio:.3}. \
         By the CPU this run took per request (its processes, softirq and irq; {:.0}% of the busy CPU went to others on \
         the machine): hop / spillway {cpu_ratio:.3}, hop / spillway_unhooked {unhooked_cpu_ratio:.3}.",
        rounds.join(", "),
        median(summaries.iter().map(|(_, s)| s.foreign_share * 100.0).collect()),
    )?;
    let extra = a.own_us - b.own_us;
    let hooks = a.own_us - unhooked.own_us;
    // A connection's first frame to the VIP is a new flow, every later one a table hit.
    let xdp_us = (frames.new_flow + (a.balancer_frames - 1.0).max(0.0) * frames.hit - a.balancer_frames * frames.hop) / 1e3;
    let agents = a.agents_us - b.agents_us;
    let rest = extra - hooks - a.lbd_us - agents - xdp_us;
    writeln!(
        text,
        "Per frame (test runs in the packet lab, this process): the floor {:.0} ns, the hop {:.0}, Spillway's new flow {:.0} and \
         table hit {:.0}; a request's {:.1} frames to the VIP are one new flow and the rest hits: {:.2} us of the balancer \
         program's work over the hop's a request.",
        frames.floor, frames.hop, frames.new_flow, frames.hit, a.balancer_frames, xdp_us
    )?;
    writeln!(
        text,
        "Where the difference goes: {extra:.1} us more CPU per request with Spillway ({:.1} against {:.1}; the machine's user \
         {:+.1}, system {:+.1}, softirq {:+.1}): the balancer program {xdp_us:.2}; lbd's own process {:.2}; the agents' work for \
         lbd (its polls) {:.2}; lbd's port-watcher hooks, which here see every client's and backend's socket (spillway - \
         spillway_unhooked) {hooks:.1}; the rest, {rest:.1}, is noise (compare the rounds).",
        a.own_us,
        b.own_us,
        a.user_us - b.user_us,
        a.system_us - b.system_us,
        a.softirq_us - b.softirq_us,
        a.lbd_us,
        agents,
    )?;
    let others = median(summaries.iter().map(|(_, s)| s.foreign_share).collect());
    if others > BUSY {
        writeln!(
            text,
            "The machine was busy: {:.0}% of its busy CPU went to other users (above {:.0}%), which moves every figure \
             above by more than the goal's 3%; run again on a quiet machine.",
            others * 100.0,
            BUSY * 100.0
        )?;
    }
    let mut rows = vec![
        ("e2e_ratio".to_owned(), ratio),
        ("e2e_goal".to_owned(), GOAL),
        ("e2e_unhooked_ratio".to_owned(), unhooked_ratio),
        ("e2e_cpu_ratio".to_owned(), cpu_ratio),
        ("e2e_unhooked_cpu_ratio".to_owned(), unhooked_cpu_ratio),
        ("e2e_extra_cpu_us_per_req".to_owned(), extra),
        ("e2e_watcher_hooks_cpu_us_per_req".to_owned(), hooks),
        ("e2e_balancer_program_us_per_req".to_owned(), xdp_us),
        ("e2e_others_cpu_share".to_owned(), others),
        ("e2e_frame_floor".to_owned(), frames.floor),
        ("e2e_frame_hop".to_owned(), frames.hop),
        ("e2e_frame_new_flow".to_owned(), frames.new_flow),
        ("e2e_frame_table_hit".to_owned(), frames.hit),
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
            (format!("e2e_{name}_agents_cpu_us_per_req"), s.agents_us),
            (format!("e2e_{name}_idle_share"), s.idle_share),
            (format!("e2e_{name}_own_cpu_us_per_req"), s.own_us),
            (format!("e2e_{name}_others_cpu_share"), s.foreign_share),
            (format!("e2e_{name}_balancer_frames_per_req"), s.balancer_frames),
        ]);
    }
    Ok(Section { text, rows, ..Section::default() })
}
