//! `cargo xtask bench`: the data path's per-packet cost, measured the way Katran's reference
//! figures were: BPF_PROG_TEST_RUN with repeat = 1 called in a loop (repeat > 1 would rerun a
//! packet the program already rewrote), the kernel-measured time of each call, the thread
//! pinned to one CPU, cases alternating in chunks, the median of several repetitions.
//! Absolute times drift between runs on a VM; ratios to the floor (a trivial `XDP_TX`
//! program) measured in the same run do not, so those are what the targets are stated in.
//!
//! Everything runs in a [`PacketLab`], so `bpf_fib_lookup` resolves the backends, with the
//! balancer configured through the real reconciler, as the packet tests do it. Every
//! result is verified (action, reason counters, encapsulation, table inserts); performance
//! is only reported.

mod sockwatch;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use anyhow::{Context, Result, anyhow, bail, ensure};
use aya::{
    Ebpf,
    programs::{Xdp, XdpMode},
};
use clap::{Args, ValueEnum};
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};
use spillway::{
    dataplane::{
        self, Balancer, LoadOptions,
        test_run::{self, HEADROOM_BYTES},
    },
    model::{DEFAULT_WEIGHT, DesiredState, LimitConfig, RateSpec, RuleAction, RuleConfig, RuleMatch, Vip},
    objects,
    reconcile::Reconciler,
};
use spillway_common::{
    addr::{from_words, to_words},
    hash::{FLOW_SEED, flow_hash},
    limits::{DEFAULT_RING_SIZE, DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S, FLOW_TABLE_ENTRIES, program_names},
    types::{Bucket, FAMILY_V4, FlowKey, LbConfig, Reason, RuleState, VipKey, VipMeta},
};
use spillway_harness::{
    frames::{self, ETH_LEN},
    packet_lab::{self, PacketLab},
};

const XDP_DROP: u32 = 1;
const XDP_TX: u32 = 3;
const XDP_PASS: u32 = 2;

/// Calls of one case before switching to the next, so slow drifts (clock frequency, a
/// noisy neighbour) reach every case alike.
const CHUNK: usize = 10_000;
/// Calls of each case checked one at a time (counters, table entry) before timing.
const CHECKED_CALLS: usize = 3;
/// What IPIP adds: an outer IPv4 header without options.
const IPV4_HEADER_LEN: usize = 20;

const VIP: &str = "10.200.1.1:80/tcp";
/// A second VIP, with a per-source limit, for the overload-protection cases.
const LIMITED_VIP: &str = "10.200.1.2:80/tcp";
/// Its per-source limit: generous, so each new source's first flow is admitted.
const SOURCE_LIMIT: RateSpec = RateSpec { per_s: 1000, burst: 100 };
/// A client whose class (an operator rule) is deep in debt: every new flow from it is dropped.
const LIMITED_CLIENT: &str = "192.168.10.30:40000";
const CLIENT: &str = "192.168.10.20:40000";
const NON_VIP: &str = "10.1.0.1:22";

#[derive(Args)]
pub struct BenchArgs {
    /// Test runs per case per repetition.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..))]
    calls: u32,
    /// Repetitions; each case reports its median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// `json` prints only an object mapping each case to its ns/packet and each socket
    /// watcher figure to its ns (keys `sockwatch_<mode>_...`), with `skipped` naming each
    /// part that could not run and why.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    output: Format,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Program {
    Floor,
    Balancer,
}

enum Frames {
    /// The same frame on every call.
    Fixed(Vec<u8>),
    /// The same frame on every call, of a flow whose `syn` the balancer saw during setup.
    Established { syn: Vec<u8>, frame: Vec<u8> },
    /// This SYN from a source never used before on every call (see [`write_new_source`]).
    NewFlows(Vec<u8>),
    /// This SYN from the same source with a new port on every call (never admitted).
    NewPorts(Vec<u8>),
}

struct Case {
    /// Stable: the key in the JSON output.
    name: &'static str,
    program: Program,
    frames: Frames,
    action: u32,
    /// The balancer counter every call must land in; `None` for the floor, which counts nothing.
    reason: Option<Reason>,
    /// Spillway's target and Katran's reference figure (`None`: not measured), in multiples
    /// of the floor.
    target: f64,
    katran: Option<f64>,
}

fn cases() -> Result<Vec<Case>> {
    let client: SocketAddr = CLIENT.parse()?;
    let vip = vip()?;
    let vip = SocketAddr::new(vip.addr, vip.port);
    let non_vip: SocketAddr = NON_VIP.parse()?;
    let syn = frames::tcp(client, vip, true, &[]);
    let limited: SocketAddr = SocketAddr::new(limited_vip()?.addr, limited_vip()?.port);
    Ok(vec![
        Case {
            name: "floor",
            program: Program::Floor,
            frames: Frames::Fixed(syn.clone()),
            action: XDP_TX,
            reason: None,
            target: 1.0,
            katran: Some(1.0),
        },
        Case {
            name: "new_flow",
            program: Program::Balancer,
            frames: Frames::NewFlows(syn.clone()),
            action: XDP_TX,
            reason: Some(Reason::Tx),
            target: 5.3,
            katran: Some(6.6),
        },
        Case {
            name: "table_hit",
            program: Program::Balancer,
            frames: Frames::Established { syn, frame: frames::tcp(client, vip, false, &[]) },
            action: XDP_TX,
            reason: Some(Reason::Tx),
            target: 2.8,
            katran: Some(3.5),
        },
        Case {
            name: "non_vip_pass",
            program: Program::Balancer,
            frames: Frames::Fixed(frames::tcp(client, non_vip, true, &[])),
            action: XDP_PASS,
            reason: Some(Reason::PassNotVip),
            target: 1.6,
            katran: Some(2.0),
        },
        Case {
            name: "rate_limited_drop",
            program: Program::Balancer,
            frames: Frames::NewPorts(frames::tcp(LIMITED_CLIENT.parse()?, limited, true, &[])),
            action: XDP_DROP,
            reason: Some(Reason::DropRuleLimit),
            target: 1.5,
            // Katran's SYN flood limiter, tripped.
            katran: Some(3.4),
        },
        Case {
            name: "admitted_through_limit",
            program: Program::Balancer,
            frames: Frames::NewFlows(frames::tcp(client, limited, true, &[])),
            action: XDP_TX,
            reason: Some(Reason::Tx),
            target: 5.3,
            katran: None,
        },
    ])
}

fn vip() -> Result<Vip> {
    VIP.parse().context("parsing the benchmark VIP")
}

fn limited_vip() -> Result<Vip> {
    LIMITED_VIP.parse().context("parsing the limited VIP")
}

/// Runs each part (the data path, the socket watcher) on its own: a part that cannot run
/// says why, and the others still run and report.
pub fn run(args: &BenchArgs) -> Result<()> {
    let (calls, reps) = (args.calls as usize, args.reps as usize);
    let datapath = measure_datapath(calls, reps);
    let sockwatch = sockwatch::measure(reps);
    match args.output {
        Format::Json => {
            let mut figures = Figures::default();
            match &datapath {
                Ok(d) => figures.rows.extend(d.cases.iter().zip(&d.medians).map(|(c, ns)| (c.name.to_owned(), *ns))),
                Err(e) => figures.skipped.push(("datapath".to_owned(), format!("{e:#}"))),
            }
            match &sockwatch {
                Ok(s) => s.add_to(&mut figures),
                Err(e) => figures.skipped.push(("sockwatch".to_owned(), format!("{e:#}"))),
            }
            figures.print_json()?;
        }
        Format::Text => {
            match &datapath {
                Ok(d) => print_table(&d.cases, &d.medians, calls, reps, d.cpu),
                Err(e) => println!("data path: not measured: {e:#}"),
            }
            match &sockwatch {
                Ok(s) => sockwatch::print(s, reps),
                Err(e) => println!("\nsocket watcher: not measured: {e:#}"),
            }
        }
    }
    Ok(())
}

/// The data path's cases and their medians (ns per packet), and the CPU they ran on.
struct Datapath {
    cases: Vec<Case>,
    medians: Vec<f64>,
    cpu: usize,
}

fn measure_datapath(calls: usize, reps: usize) -> Result<Datapath> {
    let cases = cases()?;
    check_table_room(&cases, calls)?;
    let lab = PacketLab::build().context("building the packet lab (needs root)")?;
    let ingress = lab.ifindex(packet_lab::INGRESS)?;
    let egress = lab.ifindex(packet_lab::EGRESS)?;
    let ingress_mac = lab.mac(packet_lab::INGRESS)?;
    let (cpu, medians) = lab.in_lab(|| -> Result<(usize, Vec<f64>)> {
        // Pinned before anything is loaded, so the per-CPU connection table fills on this CPU.
        let cpu = pin_to_one_cpu()?;
        let mut bench = Bench::load(ingress, egress, ingress_mac)?;
        let medians = bench.measure(&cases, calls, reps)?;
        Ok((cpu, medians))
    })?;
    Ok(Datapath { cases, medians, cpu })
}

/// Every call of a new-flow case inserts into the connection table, a per-CPU LRU: past
/// one CPU's share of it, inserts would evict and measure something else.
fn check_table_room(cases: &[Case], calls: usize) -> Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow!(e).context(format!("reading {path}")))?;
    let room = (FLOW_TABLE_ENTRIES / cpus.get()) as usize;
    let count = |f: fn(&Frames) -> bool| cases.iter().filter(|c| f(&c.frames)).count();
    let new_flows = count(|f| matches!(f, Frames::NewFlows(_))) * calls;
    let established = count(|f| matches!(f, Frames::Established { .. }));
    ensure!(
        new_flows + established <= room,
        "--calls {calls} makes {new_flows} new flows per repetition, but one CPU's share of the connection table holds {room}"
    );
    Ok(())
}

/// Pins the calling thread to the last CPU it may run on (CPU 0 usually takes more
/// interrupts); returns that CPU.
fn pin_to_one_cpu() -> Result<usize> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).context("reading the CPU affinity")?;
    let cpu = (0..CpuSet::count()).rev().find(|&c| allowed.is_set(c).unwrap_or(false)).context("the CPU affinity mask is empty")?;
    let mut only = CpuSet::new();
    only.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &only).with_context(|| format!("pinning to CPU {cpu}"))?;
    Ok(cpu)
}

/// One BPF_PROG_TEST_RUN (repeat = 1) of `program` on `frame` arriving on
/// `ingress_ifindex`. Returns the action, the output length and the run time the kernel
/// measured (what the reference figures use).
fn run_timed(program: &Xdp, frame: &[u8], ingress_ifindex: u32, out: &mut [u8]) -> Result<(u32, usize, u64)> {
    let run = test_run::run_into(program, frame, ingress_ifindex, out).context("BPF_PROG_TEST_RUN")?;
    Ok((run.action, run.len, run.duration_ns))
}

/// Rewrites an untagged IPv4 SYN's source to the `n`-th new-flow source: the low 15 bits of
/// `n` in the address (192.168.128.0/17, apart from the fixed frames' client), the rest in
/// the port (from 1024). Checksums are left stale: the balancer does not check them.
fn write_new_source(frame: &mut [u8], n: u32) {
    let low = n % 0x8000;
    let ip = ETH_LEN;
    frame[ip + 12..ip + 16].copy_from_slice(&[192, 168, 0x80 | (low >> 8) as u8, low as u8]);
    frame[ip + 20..ip + 22].copy_from_slice(&(1024 + n / 0x8000).to_be_bytes()[2..]);
}

fn is_new_flow(key: &FlowKey) -> bool {
    let [a, b, c, _] = key.src[0].to_ne_bytes();
    key.family == FAMILY_V4 && [a, b] == [192, 168] && c & 0x80 != 0
}

/// The connection-table key the balancer builds for an untagged IPv4 TCP/UDP frame.
fn flow_key(frame: &[u8]) -> Result<FlowKey> {
    ensure!(
        frame.len() >= ETH_LEN + 24 && frame[12..14] == [0x08, 0x00] && frame[ETH_LEN] == 0x45,
        "not an untagged IPv4 frame without options"
    );
    let ip = &frame[ETH_LEN..];
    let addr = |at: usize| to_words(IpAddr::from([ip[at], ip[at + 1], ip[at + 2], ip[at + 3]])).0;
    Ok(FlowKey {
        src: addr(12),
        dst: addr(16),
        sport: u16::from_ne_bytes([ip[20], ip[21]]),
        dport: u16::from_ne_bytes([ip[22], ip[23]]),
        proto: ip[9],
        family: FAMILY_V4,
        _pad: [0; 2],
    })
}

/// Puts the next new-flow source in a new-flow case's frame, or the next port in a
/// new-port case's; other frames stay as they are.
fn next_frame(slot: &mut Slot, next_flow: &mut u32) {
    match slot.case.frames {
        Frames::NewFlows(_) => {
            write_new_source(&mut slot.frame, *next_flow);
            *next_flow += 1;
        }
        Frames::NewPorts(_) => {
            slot.next_port = slot.next_port.wrapping_add(1).max(1024);
            slot.frame[ETH_LEN + 20..ETH_LEN + 22].copy_from_slice(&slot.next_port.to_be_bytes());
        }
        Frames::Fixed(_) | Frames::Established { .. } => {}
    }
}

fn program<'a>(balancer: &'a Balancer, floor: &'a Ebpf, program: Program) -> Result<&'a Xdp> {
    Ok(match program {
        Program::Balancer => balancer.program_ref()?,
        Program::Floor => {
            let name = program_names::FLOOR;
            floor.program(name).with_context(|| format!("{name} missing"))?.try_into()?
        }
    })
}

/// A case's buffers during a measurement.
struct Slot<'c> {
    case: &'c Case,
    frame: Vec<u8>,
    /// Source port of the next call of a new-port case.
    next_port: u16,
    out: Vec<u8>,
    len: usize,
    ns: u64,
}

struct Bench {
    balancer: Balancer,
    floor: Ebpf,
    ingress: u32,
    ingress_mac: [u8; 6],
    /// Index of the next new-flow source; every new flow is removed after use, so this
    /// restarts at 0.
    next_flow: u32,
    /// Attached natively to the lab's interfaces, which gives test runs a receive queue.
    _decap: Ebpf,
}

impl Bench {
    /// Loads the programs and configures the balancer as the packet tests do (called in the lab).
    fn load(ingress: u32, egress: u32, ingress_mac: [u8; 6]) -> Result<Self> {
        let mut decap = dataplane::load_simple(objects::DECAP, "spillway-decap", program_names::DECAP)?;
        let program = dataplane::xdp(&mut decap, program_names::DECAP)?;
        program.attach(ingress, XdpMode::Driver).context("attaching the decap program to the ingress")?;
        program.attach(egress, XdpMode::Driver).context("attaching the decap program to the egress")?;
        let floor = dataplane::load_simple(objects::FLOOR, "spillway-floor", program_names::FLOOR)?;

        let mut balancer = Balancer::load(&LoadOptions::default())?;
        balancer.maps.set_config(&LbConfig {
            outer_src_v4: to_words(packet_lab::LOCAL4.into()).0[0],
            outer_src_v6: to_words(packet_lab::LOCAL6.into()).0,
            tcp_idle_timeout_s: DEFAULT_TCP_IDLE_TIMEOUT_S,
            udp_idle_timeout_s: DEFAULT_UDP_IDLE_TIMEOUT_S,
            flow_seed: FLOW_SEED,
            ..LbConfig::default()
        })?;
        balancer.maps.tx_ports.insert(egress, egress, None, 0).context("adding the egress to the redirect map")?;
        let mut state = DesiredState::default();
        for vip in [vip()?, limited_vip()?] {
            state.add_vip(vip, DEFAULT_RING_SIZE)?;
            for n in packet_lab::RESOLVED_BACKENDS {
                state.add_backend(&vip, packet_lab::backend4(n).into(), DEFAULT_WEIGHT)?;
            }
        }
        let limited_vip = limited_vip()?;
        let limits = LimitConfig { per_source: Some(SOURCE_LIMIT), ..LimitConfig::default() };
        state.set_limits(Some(&limited_vip), limits)?;
        // The limited client is a client class of its own, held to one flow a second...
        let class = RuleMatch { cidr: format!("{}/32", LIMITED_CLIENT.parse::<SocketAddr>()?.ip()).parse()?, vip: Some(limited_vip) };
        let one_per_s = RuleConfig { action: RuleAction::Limit(RateSpec { per_s: 1, burst: 0 }), observe: false };
        state.set_rule(class, one_per_s)?;
        Reconciler::adopt(&balancer.maps)?.apply(&mut balancer.maps, &state).context("configuring the VIPs")?;
        // ...and its bucket is an hour in debt, so every flow it starts during the run is
        // dropped. (A rule's bucket lives in an array; a source's could be evicted from its
        // LRU by the new-flow cases' sources.)
        let rule = balancer.maps.rules.iter().next().context("the rule is not in the trie")??.1;
        let in_debt = RuleState { bucket: Bucket { tat_ns: u64::MAX / 2 }, ..RuleState::default() };
        balancer.maps.rule_state.set(rule.id, &in_debt, 0).context("indebting the limited client's class")?;
        Ok(Self { balancer, floor, ingress, ingress_mac, next_flow: 0, _decap: decap })
    }

    /// Checks every case, then times them; returns each case's median ns/packet.
    fn measure(&mut self, cases: &[Case], calls: usize, reps: usize) -> Result<Vec<f64>> {
        let mut slots = Vec::with_capacity(cases.len());
        for case in cases {
            let frame = self.first_frame(case).with_context(|| format!("setting up {}", case.name))?;
            let out = vec![0; frame.len() + HEADROOM_BYTES];
            slots.push(Slot { case, frame, out, next_port: 0, len: 0, ns: 0 });
        }
        for slot in &mut slots {
            self.check_calls(slot).with_context(|| format!("checking {}", slot.case.name))?;
        }
        self.forget_new_flows()?;

        let mut per_rep: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); cases.len()];
        for _ in 0..reps {
            let before = self.reasons()?;
            self.time_rep(&mut slots, calls)?;
            let after = self.reasons()?;
            for (reason, n) in counted(&before, &after) {
                let expected = cases.iter().filter(|c| c.reason == Some(reason)).count() * calls;
                ensure!(n == expected as u64, "{n} calls counted as {}, expected {expected}", reason.label());
            }
            self.forget_new_flows()?;
            for (slot, times) in slots.iter_mut().zip(&mut per_rep) {
                times.push(slot.ns as f64 / calls as f64);
                slot.ns = 0;
            }
        }
        Ok(per_rep.into_iter().map(median).collect())
    }

    fn first_frame(&mut self, case: &Case) -> Result<Vec<u8>> {
        Ok(match &case.frames {
            Frames::Fixed(frame) | Frames::NewFlows(frame) | Frames::NewPorts(frame) => frame.clone(),
            Frames::Established { syn, frame } => {
                let mut out = vec![0; syn.len() + HEADROOM_BYTES];
                let (action, ..) = run_timed(self.balancer.program_ref()?, syn, self.ingress, &mut out)?;
                ensure!(action == XDP_TX, "the flow's SYN got action {action}");
                self.pinned_backend(&flow_key(syn)?)?.context("the SYN left no connection-table entry")?;
                frame.clone()
            }
        })
    }

    /// Runs a few calls of `slot`'s case one at a time, checking each completely.
    fn check_calls(&mut self, slot: &mut Slot) -> Result<()> {
        let case = slot.case;
        for _ in 0..CHECKED_CALLS {
            next_frame(slot, &mut self.next_flow);
            let key = flow_key(&slot.frame)?;
            let existed = self.pinned_backend(&key)?.is_some();
            let before = self.reasons()?;
            let program = program(&self.balancer, &self.floor, case.program)?;
            let (action, len, _) = run_timed(program, &slot.frame, self.ingress, &mut slot.out)?;
            let after = self.reasons()?;
            ensure!(action == case.action, "action {action}, expected {}", case.action);
            let reasons: Vec<Reason> = counted(&before, &after).filter(|(_, n)| *n > 0).map(|(r, _)| r).collect();
            ensure!(reasons == Vec::from_iter(case.reason), "counted as {reasons:?}, expected {:?}", case.reason);
            self.check_output(case, &slot.frame, &slot.out[..len])?;
            if case.program == Program::Balancer && action == XDP_TX {
                let pinned = self.pinned_backend(&key)?;
                let expected = self.maglev_backend(&key)?;
                ensure!(pinned == Some(expected), "connection table holds {pinned:?}, expected {expected}");
            }
            if let Frames::NewFlows(_) = case.frames {
                ensure!(!existed, "a new flow was already in the connection table");
            }
        }
        Ok(())
    }

    /// One repetition: every case `calls` times, in alternating chunks. The action of every
    /// call and the output of each chunk's last call are checked.
    fn time_rep(&mut self, slots: &mut [Slot], calls: usize) -> Result<()> {
        let mut done = 0;
        while done < calls {
            let chunk = CHUNK.min(calls - done);
            for slot in slots.iter_mut() {
                let case = slot.case;
                let program = program(&self.balancer, &self.floor, case.program)?;
                for _ in 0..chunk {
                    next_frame(slot, &mut self.next_flow);
                    let (action, len, ns) = run_timed(program, &slot.frame, self.ingress, &mut slot.out)?;
                    ensure!(action == case.action, "{}: action {action}, expected {}", case.name, case.action);
                    slot.len = len;
                    slot.ns += ns;
                }
                self.check_output(case, &slot.frame, &slot.out[..slot.len]).with_context(|| format!("{} while timing", case.name))?;
            }
            done += chunk;
        }
        Ok(())
    }

    /// Removes every new flow from the connection table, checking that each call made one
    /// (a miss and an insert), so the next repetition starts from the same table.
    fn forget_new_flows(&mut self) -> Result<()> {
        let flows = &mut self.balancer.maps.flows;
        let mut keys = Vec::new();
        for key in flows.keys() {
            let key = key.context("listing the connection table")?;
            if is_new_flow(&key) {
                keys.push(key);
            }
        }
        ensure!(
            keys.len() == self.next_flow as usize,
            "{} new flows in the connection table after {} new-flow calls",
            keys.len(),
            self.next_flow
        );
        for key in &keys {
            flows.remove(key).context("removing a new flow")?;
        }
        self.next_flow = 0;
        Ok(())
    }

    /// The balancer's reason counters, summed over CPUs.
    fn reasons(&self) -> Result<Vec<u64>> {
        Ok(self.balancer.maps.reasons()?.into_iter().map(|(_, n)| n).collect())
    }

    /// What a call must leave: the frame encapsulated to the flow's backend when the
    /// balancer sends it, the frame untouched otherwise.
    fn check_output(&self, case: &Case, frame: &[u8], out: &[u8]) -> Result<()> {
        if case.program == Program::Balancer && case.action == XDP_TX {
            self.check_ipip(frame, out, self.maglev_backend(&flow_key(frame)?)?)
        } else {
            ensure!(out == frame, "the frame was changed");
            Ok(())
        }
    }

    /// `out` is `input` in IPIP to `backend`, addressed to its neighbour in the lab.
    fn check_ipip(&self, input: &[u8], out: &[u8], backend: Ipv4Addr) -> Result<()> {
        ensure!(out.len() == input.len() + IPV4_HEADER_LEN, "output of {} bytes for a {}-byte frame", out.len(), input.len());
        let mac = packet_lab::neighbour_mac(backend.into()).with_context(|| format!("{backend} has no neighbour in the lab"))?;
        ensure!(out[6..12] == self.ingress_mac, "source MAC {:02x?} is not the ingress interface's", &out[6..12]);
        let src = frames::check_encap(out, input, ETH_LEN, backend.into(), Some(mac))?;
        ensure!(src == IpAddr::V4(packet_lab::LOCAL4), "outer source {src}");
        Ok(())
    }

    /// The backend the VIP's Maglev table gives `key`, computed here with the same hash.
    fn maglev_backend(&self, key: &FlowKey) -> Result<Ipv4Addr> {
        let maps = &self.balancer.maps;
        let vip = VipKey { addr: key.dst, port: key.dport, proto: key.proto, family: key.family };
        let meta = maps.vips.get(&vip, 0).context("reading the VIP")?;
        let slot = VipMeta::ring_base(meta.id, meta.active_half) + flow_hash(key, FLOW_SEED) % meta.ring_size;
        let id = maps.rings.get(&slot, 0).context("reading the Maglev table")?;
        self.backend_addr(id)
    }

    /// The backend the connection table holds for `key`, if any.
    fn pinned_backend(&self, key: &FlowKey) -> Result<Option<Ipv4Addr>> {
        self.balancer.maps.flow(key).map(|v| self.backend_addr(v.backend_id)).transpose()
    }

    fn backend_addr(&self, id: u32) -> Result<Ipv4Addr> {
        let info = self.balancer.maps.backend(id)?;
        match from_words(info.addr, info.family) {
            Some(IpAddr::V4(addr)) => Ok(addr),
            other => bail!("backend {id} is {other:?}, not an IPv4 backend"),
        }
    }
}

/// How much each reason counter grew between two readings of [`Bench::reasons`].
fn counted(before: &[u64], after: &[u64]) -> impl Iterator<Item = (Reason, u64)> {
    Reason::ALL.iter().zip(before.iter().zip(after)).map(|(r, (b, a))| (*r, a - b))
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// What `-o json` prints: each measured figure (name, ns), and each part that could not run
/// with the reason.
#[derive(Default)]
struct Figures {
    rows: Vec<(String, f64)>,
    skipped: Vec<(String, String)>,
}

impl Figures {
    /// One object: each figure's name to its ns, and `skipped`, each part to its reason.
    fn print_json(&self) -> Result<()> {
        let mut object: serde_json::Map<String, serde_json::Value> =
            self.rows.iter().map(|(name, ns)| (name.clone(), ((ns * 10.0).round() / 10.0).into())).collect();
        if !self.skipped.is_empty() {
            let skipped = self.skipped.iter().map(|(part, why)| (part.clone(), why.clone().into())).collect();
            object.insert("skipped".to_owned(), serde_json::Value::Object(skipped));
        }
        println!("{}", serde_json::to_string(&object)?);
        Ok(())
    }
}

fn print_table(cases: &[Case], medians: &[f64], calls: usize, reps: usize, cpu: usize) {
    let floor = cases.iter().zip(medians).find(|(c, _)| c.program == Program::Floor).map_or(f64::NAN, |(_, ns)| *ns);
    let backends = packet_lab::RESOLVED_BACKENDS.count();
    println!(
        "Method: BPF_PROG_TEST_RUN with repeat=1 in a loop, kernel-measured time per call; {calls} calls per case per \
         repetition, cases alternating in chunks of {CHUNK}; thread pinned to CPU {cpu}; median of {reps} repetitions."
    );
    println!(
        "Setup: VIP {VIP}, {backends} backends (the packet lab resolves only {backends}; Katran's figures used 100), \
         Maglev table {DEFAULT_RING_SIZE}; 54-byte Ethernet/IPv4/TCP frames from {CLIENT} (new_flow: \
         a new source address and port on every call)."
    );
    println!();
    println!("{:<22} | {:>9} | {:>7} | {:>6} | {:>6}", "case", "ns/packet", "x floor", "target", "Katran");
    println!("{:-<22}-|-{:->9}-|-{:->7}-|-{:->6}-|-{:->6}", "", "", "", "", "");
    for (case, ns) in cases.iter().zip(medians) {
        let katran = case.katran.map_or("-".to_owned(), |k| format!("{k:.1}"));
        println!("{:<22} | {ns:>9.1} | {:>7.2} | {:>6.1} | {katran:>6}", case.name, ns / floor, case.target);
    }
}
