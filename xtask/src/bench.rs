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

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

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
    ports::{PROGRAMS, PortKey, ProgramStats, SockWatch, netns_inode},
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
    /// `json` prints only an object mapping each case to its ns/packet (and each socket
    /// watcher figure to its ns).
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

pub fn run(args: &BenchArgs) -> Result<()> {
    let cases = cases()?;
    let (calls, reps) = (args.calls as usize, args.reps as usize);
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
    let sockwatch = sockwatch_overhead(reps).context("measuring the socket watcher")?;
    match args.output {
        Format::Json => print_json(&cases, &medians, &sockwatch.json_rows())?,
        Format::Text => {
            print_table(&cases, &medians, calls, reps, cpu);
            print_sockwatch(&sockwatch, reps);
        }
    }
    Ok(())
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

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

/// `extra`: further rows (name, ns), e.g. the socket watcher's.
fn print_json(cases: &[Case], medians: &[f64], extra: &[(String, f64)]) -> Result<()> {
    let rows = cases.iter().zip(medians).map(|(c, ns)| (c.name.to_owned(), *ns)).chain(extra.iter().cloned());
    let object: serde_json::Map<String, serde_json::Value> = rows.map(|(name, ns)| (name, ((ns * 10.0).round() / 10.0).into())).collect();
    println!("{}", serde_json::to_string(&object)?);
    Ok(())
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

// ---- The socket watcher's overhead (`spillway::ports`) ----

/// TCP connect+close cycles and UDP sockets per repetition, each repetition in a fresh
/// network namespace (so its TIME_WAIT sockets never run the port range out).
const SOCKWATCH_TCP_CYCLES: usize = 2000;
const SOCKWATCH_UDP_SOCKETS: usize = 2000;
/// Datagrams sent from a bound UDP socket per repetition, half with sendto(), half with
/// sendmsg(): the watcher must add nothing per datagram (it does not follow sends).
const SOCKWATCH_UDP_SENDS: usize = 2000;
/// Sockets open during the timed reads: connected UDP sockets, and server sockets left in
/// CLOSE_WAIT (what the two iterators walk).
const SOCKWATCH_READ_UDP: usize = 1000;
const SOCKWATCH_READ_CLOSE_WAIT: usize = 200;
const SOCKWATCH_READS: usize = 20;

/// One repetition's figures, or their medians, in ns.
struct SockwatchCost {
    /// Per program: run time per run.
    per_run: Vec<(&'static str, f64)>,
    /// One connect+close cycle (both ends, loopback), wall time, without and with the watcher.
    tcp_cycle: f64,
    tcp_cycle_watched: f64,
    /// The watcher's programs' run time per cycle.
    tcp_cycle_bpf: f64,
    /// One UDP socket bound to port 0 and closed, wall time without the watcher, and the
    /// programs' run time per socket.
    udp_socket: f64,
    udp_socket_bpf: f64,
    /// One datagram sent from a bound socket: wall time without the watcher, and the
    /// programs' run time per datagram.
    udp_send: f64,
    udp_send_bpf: f64,
    /// One snapshot (maps read, both iterators run) with the read sockets open.
    read: f64,
}

impl SockwatchCost {
    /// The rows of the JSON output: every figure in ns.
    fn json_rows(&self) -> Vec<(String, f64)> {
        let programs = self.per_run.iter().map(|(name, ns)| (format!("{name}_per_run"), *ns));
        let cycles = [
            ("tcp_cycle", self.tcp_cycle),
            ("tcp_cycle_with_sockwatch", self.tcp_cycle_watched),
            ("sockwatch_per_tcp_cycle", self.tcp_cycle_bpf),
            ("udp_socket", self.udp_socket),
            ("sockwatch_per_udp_socket", self.udp_socket_bpf),
            ("udp_send", self.udp_send),
            ("sockwatch_per_udp_send", self.udp_send_bpf),
            ("sockwatch_read", self.read),
        ];
        programs.chain(cycles.into_iter().map(|(k, v)| (k.to_owned(), v))).collect()
    }
}

/// Loads the watcher and drives real sockets over loopback: ns per program run from the
/// kernel's run-time statistics (BPF_ENABLE_STATS: on while the returned descriptor is
/// open, so it is back off however this ends), and the cost per connect+close cycle against
/// the same cycles without the watcher, alternating repetitions.
fn sockwatch_overhead(reps: usize) -> Result<SockwatchCost> {
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enabling BPF run-time statistics")?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (tcp_cycle, udp_socket, udp_send) = in_scratch_netns(|| Ok((time_tcp_cycles()?, time_udp_sockets()?, time_udp_sends()?)))?;
        let (tcp_cycle_watched, read, [start, after_tcp, after_udp, after_sends, end]) = in_scratch_netns(|| {
            let mut watch = SockWatch::load().context("loading sockwatch")?;
            let start = watch.program_stats()?;
            let tcp_ns = time_tcp_cycles()?;
            let after_tcp = watch.program_stats()?;
            time_udp_sockets()?;
            let after_udp = watch.program_stats()?;
            time_udp_sends()?;
            let after_sends = watch.program_stats()?;
            let read_ns = time_reads(&mut watch)?;
            Ok((tcp_ns, read_ns, [start, after_tcp, after_udp, after_sends, watch.program_stats()?]))
        })?;
        let mut per_run = Vec::with_capacity(PROGRAMS.len());
        for (before, after) in start.iter().zip(&end) {
            let runs = after.runs - before.runs;
            ensure!(runs > 0, "{} never ran", after.name);
            per_run.push((after.run_time - before.run_time).as_nanos() as f64 / runs as f64);
        }
        samples.push(SockwatchCost {
            per_run: PROGRAMS.iter().copied().zip(per_run).collect(),
            tcp_cycle,
            tcp_cycle_watched,
            tcp_cycle_bpf: run_ns(&start, &after_tcp) / SOCKWATCH_TCP_CYCLES as f64,
            udp_socket,
            udp_socket_bpf: run_ns(&after_tcp, &after_udp) / SOCKWATCH_UDP_SOCKETS as f64,
            udp_send,
            udp_send_bpf: run_ns(&after_udp, &after_sends) / SOCKWATCH_UDP_SENDS as f64,
            read,
        });
    }
    let med = |figure: &dyn Fn(&SockwatchCost) -> f64| median(samples.iter().map(figure).collect());
    Ok(SockwatchCost {
        per_run: PROGRAMS.iter().enumerate().map(|(i, &name)| (name, med(&|s| s.per_run[i].1))).collect(),
        tcp_cycle: med(&|s| s.tcp_cycle),
        tcp_cycle_watched: med(&|s| s.tcp_cycle_watched),
        tcp_cycle_bpf: med(&|s| s.tcp_cycle_bpf),
        udp_socket: med(&|s| s.udp_socket),
        udp_socket_bpf: med(&|s| s.udp_socket_bpf),
        udp_send: med(&|s| s.udp_send),
        udp_send_bpf: med(&|s| s.udp_send_bpf),
        read: med(&|s| s.read),
    })
}

/// The programs' total run time between two readings, in ns.
fn run_ns(before: &[ProgramStats], after: &[ProgramStats]) -> f64 {
    before.iter().zip(after).map(|(b, a)| (a.run_time - b.run_time).as_nanos() as f64).sum()
}

/// Runs `f` on a thread in a new, unnamed network namespace with only `lo` (up), which
/// disappears with the thread, also on failure.
fn in_scratch_netns<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("creating a network namespace")?;
                // A child process starts in its parent thread's namespace.
                let status = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status().context("running ip")?;
                ensure!(status.success(), "ip link set lo up: {status}");
                f()
            })
            .join()
            .map_err(|_| anyhow!("the socket benchmark panicked"))?
    })
}

/// Wall ns per TCP connect+close cycle over loopback: the client connects and closes, the
/// server accepts, reads to the end and closes; the next cycle starts when the server is done.
fn time_tcp_cycles() -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let (done, cycles) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        for _ in 0..SOCKWATCH_TCP_CYCLES {
            let (mut stream, _) = listener.accept()?;
            std::io::copy(&mut stream, &mut std::io::sink())?;
            drop(stream);
            if done.send(()).is_err() {
                break;
            }
        }
        Ok(())
    });
    let started = Instant::now();
    for i in 0..SOCKWATCH_TCP_CYCLES {
        drop(TcpStream::connect(addr).with_context(|| format!("connect #{i}"))?);
        cycles.recv_timeout(Duration::from_secs(5)).with_context(|| format!("the server did not finish cycle #{i}"))?;
    }
    let elapsed = started.elapsed();
    server.join().map_err(|_| anyhow!("the server thread panicked"))??;
    Ok(elapsed.as_nanos() as f64 / SOCKWATCH_TCP_CYCLES as f64)
}

/// Wall ns per UDP socket bound to port 0 and closed.
fn time_udp_sockets() -> Result<f64> {
    let started = Instant::now();
    for _ in 0..SOCKWATCH_UDP_SOCKETS {
        drop(UdpSocket::bind("127.0.0.1:0")?);
    }
    Ok(started.elapsed().as_nanos() as f64 / SOCKWATCH_UDP_SOCKETS as f64)
}

/// Wall ns per datagram sent from one bound UDP socket to a closed port on loopback, half
/// with sendto(), half with sendmsg().
fn time_udp_sends() -> Result<f64> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    let discard: SocketAddr = "127.0.0.1:9".parse()?;
    let mut to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let mut byte = *b"x";
    let started = Instant::now();
    for _ in 0..SOCKWATCH_UDP_SENDS / 2 {
        socket.send_to(&byte, discard)?;
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        // SAFETY: a zeroed msghdr is valid; it points at live locals for the call only.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&raw mut to).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        // SAFETY: a valid socket and a msghdr whose pointers outlive the call.
        let sent = unsafe { libc::sendmsg(std::os::fd::AsRawFd::as_raw_fd(&socket), &raw const msg, 0) };
        ensure!(sent == 1, "sendmsg: {}", std::io::Error::last_os_error());
    }
    Ok(started.elapsed().as_nanos() as f64 / SOCKWATCH_UDP_SENDS as f64)
}

/// Median ns per snapshot with [`SOCKWATCH_READ_UDP`] UDP and [`SOCKWATCH_READ_CLOSE_WAIT`]
/// CLOSE_WAIT sockets open in this namespace, after checking that it counts them all.
fn time_reads(watch: &mut SockWatch) -> Result<f64> {
    let netns = netns_inode(Path::new("/proc/thread-self/ns/net"))?;
    let discard: SocketAddr = "127.0.0.1:9".parse()?;
    let udp = (0..SOCKWATCH_READ_UDP)
        .map(|_| {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            socket.connect(discard)?;
            Ok(socket)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut held = Vec::new();
    for _ in 0..SOCKWATCH_READ_CLOSE_WAIT {
        drop(TcpStream::connect(addr)?);
        held.push(listener.accept()?.0);
    }
    let key = PortKey::udp(netns, discard.ip(), discard.ip(), discard.port());
    let counted = |watch: &mut SockWatch| -> Result<(u64, usize)> {
        let snapshot = watch.snapshot()?;
        Ok((snapshot.udp_count(&key), snapshot.close_wait.iter().filter(|r| r.key.netns == netns).count()))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while counted(watch)?.1 < SOCKWATCH_READ_CLOSE_WAIT && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = counted(watch)?;
    ensure!(seen == (SOCKWATCH_READ_UDP as u64, SOCKWATCH_READ_CLOSE_WAIT), "the watcher saw (UDP, CLOSE_WAIT) = {seen:?}");
    let mut times = Vec::with_capacity(SOCKWATCH_READS);
    for _ in 0..SOCKWATCH_READS {
        let started = Instant::now();
        watch.snapshot()?;
        times.push(started.elapsed().as_nanos() as f64);
    }
    drop((udp, held));
    Ok(median(times))
}

fn print_sockwatch(cost: &SockwatchCost, reps: usize) {
    println!();
    println!(
        "Socket watcher (sockwatch), median of {reps} repetitions, each in a new network namespace: {SOCKWATCH_TCP_CYCLES} \
         TCP connect+close cycles over loopback, {SOCKWATCH_UDP_SOCKETS} UDP sockets bound to port 0 and closed, \
         {SOCKWATCH_UDP_SENDS} datagrams sent (sendto and sendmsg) from a bound socket, \
         {SOCKWATCH_READS} reads with {SOCKWATCH_READ_UDP} UDP and {SOCKWATCH_READ_CLOSE_WAIT} CLOSE_WAIT sockets open. \
         Program times from the kernel's run-time statistics (host-wide: other sockets' events count too)."
    );
    println!();
    println!("{:<24} | {:>9}", "program", "ns/run");
    println!("{:-<24}-|-{:->9}", "", "");
    for (name, ns) in &cost.per_run {
        println!("{name:<24} | {ns:>9.1}");
    }
    println!();
    println!("{:<22} | {:>12} | {:>15} | {:>8}", "per", "ns without", "ns in programs", "added");
    println!("{:-<22}-|-{:->12}-|-{:->15}-|-{:->8}", "", "", "", "");
    for (what, base, bpf) in [
        ("TCP connect+close", cost.tcp_cycle, cost.tcp_cycle_bpf),
        ("UDP socket", cost.udp_socket, cost.udp_socket_bpf),
        ("UDP datagram sent", cost.udp_send, cost.udp_send_bpf),
    ] {
        println!("{what:<22} | {base:>12.0} | {bpf:>15.0} | {:>7.1}%", 100.0 * bpf / base);
    }
    println!(
        "TCP cycle wall time with the watcher: {:.0} ns ({:+.1}%, noisy); one read: {:.0} µs.",
        cost.tcp_cycle_watched,
        100.0 * (cost.tcp_cycle_watched / cost.tcp_cycle - 1.0),
        cost.read / 1000.0
    );
}
