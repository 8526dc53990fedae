//! Per-packet timing in a [`PacketLab`], so `bpf_fib_lookup` resolves the backends, with the
//! balancer configured through the real reconciler as the packet tests do it. Every whole-
//! balancer case is verified (action, reason counters, encapsulation, table entries); the
//! floor and the stage cuts are checked for their action only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;

use anyhow::{Context, Result, bail, ensure};
use aya::{
    Ebpf,
    programs::{Xdp, XdpMode},
};
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};
use spillway_common::{
    addr::{from_words, to_words},
    hash::{FLOW_SEED, flow_hash, gue_source_port, hop_index},
    limits::{
        Capacity, DEFAULT_GUE_PORT, DEFAULT_RING_SIZE, DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S, map_names, program_names,
    },
    types::{Bucket, FAMILY_V4, FlowKey, HOP_BACKENDS, HopBackend, HopConfig, LbConfig, Reason},
};
use spillway_dataplane::objects;
use spillway_dataplane::{
    self as dataplane, Balancer, LoadOptions,
    test_run::{self, HEADROOM_BYTES},
};
use spillway_harness::{
    frames::{self, ETH_LEN},
    packet_lab::{self, PacketLab},
};
use spillway_model::{DEFAULT_WEIGHT, DesiredState, Encap, LimitConfig, RateSpec, RuleAction, RuleConfig, RuleMatch, Vip};
use spillway_reconcile::{Reconciler, vip_key};

use super::median;

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

/// Calls of one case before switching to the next, so slow drifts (clock frequency, a
/// noisy neighbour) reach every case alike.
pub const CHUNK: usize = 10_000;
/// Calls of each case checked one at a time (counters, table entry) before timing.
const CHECKED_CALLS: usize = 3;
/// What IPIP adds: an outer IPv4 header without options.
const IPV4_HEADER_LEN: usize = 20;

pub const VIP: &str = "10.200.1.1:80/tcp";
/// A second VIP, with a per-source limit, for the overload-protection cases.
pub const LIMITED_VIP: &str = "10.200.1.2:80/tcp";
/// Its per-source limit: generous, so each new source's first flow is admitted.
const SOURCE_LIMIT: RateSpec = RateSpec { per_s: 1000, burst: 100 };
/// A third VIP whose budget is deep in debt: every new flow to it is dropped, no rule involved.
pub const BUDGET_VIP: &str = "10.200.1.3:80/tcp";
/// A fourth VIP, like [`VIP`] but tunnelled in GUE.
pub const GUE_VIP: &str = "10.200.1.4:80/tcp";
/// What GUE adds to IPIP: a UDP header.
const UDP_HEADER_LEN: usize = 8;
/// A client whose class (an operator rule) is deep in debt: every new flow from it is dropped.
pub const LIMITED_CLIENT: &str = "192.168.10.30:40000";
/// The established flow's client, and the client that repeats one SYN.
pub const CLIENT: &str = "192.168.10.20:40000";
pub const SYN_CLIENT: &str = "192.168.10.21:40000";
pub const NON_VIP: &str = "10.1.0.1:22";

/// Which program a case runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `return XDP_TX`.
    Floor,
    /// The balancer `lbd` loads.
    Balancer,
    /// A program of the bench-only stage object (the path cut short), sharing the maps.
    Stage(&'static str),
    /// The cheapest hop to the backends (`spillway_hop`), for [`VIP`] on three of them.
    Hop,
    /// The balancer of another build, sharing the maps (`--against`, `against.rs`).
    Against,
}

#[derive(Clone)]
pub enum Frames {
    /// The same frame on every call.
    Fixed(Vec<u8>),
    /// The same frame on every call, of a flow whose `syn` the balancer saw during setup.
    Established { syn: Vec<u8>, frame: Vec<u8> },
    /// This SYN from a source never used before on every call (see [`write_new_source`]).
    NewFlows(Vec<u8>),
    /// This SYN from the same source with a new port on every call (never admitted).
    NewPorts(Vec<u8>),
    /// This SYN from a spoofed source never used before on every call (172.16.0.0/12): a
    /// flood, whose entries are left to evict each other.
    Spoofed(Vec<u8>),
    /// The same frame on every call: a QUIC short header that the balancer sends to
    /// `backend`, the server its connection id names, leaving no connection-table entry.
    ByConnectionId { frame: Vec<u8>, backend: Ipv4Addr },
    /// [`Frames::ByConnectionId`] with another of `ids` (each naming `backend`) at offset
    /// `dcid_at` on every call: an encrypted id the balancer has not decoded yet.
    NewConnectionIds { frame: Vec<u8>, backend: Ipv4Addr, dcid_at: usize, ids: Vec<Vec<u8>> },
}

impl Frames {
    /// The frame the first call sends (later ones may differ in their source).
    pub fn frame(&self) -> &[u8] {
        match self {
            Frames::Fixed(frame)
            | Frames::Established { frame, .. }
            | Frames::NewFlows(frame)
            | Frames::NewPorts(frame)
            | Frames::Spoofed(frame)
            | Frames::ByConnectionId { frame, .. }
            | Frames::NewConnectionIds { frame, .. } => frame,
        }
    }
}

#[derive(Clone)]
pub struct Case {
    /// Stable: the key in the JSON output.
    pub name: String,
    pub program: Program,
    pub frames: Frames,
    pub action: u32,
    /// The balancer counter every call must land in, for cases whose output and table
    /// entries are checked too; `None` for the floor and the stage cuts (action only).
    pub reason: Option<Reason>,
    /// Every call adds a flow to the connection table.
    pub inserts: bool,
}

impl Case {
    /// The floor, on `frame`.
    pub fn floor(frame: &[u8]) -> Case {
        Case {
            name: "floor".into(),
            program: Program::Floor,
            frames: Frames::Fixed(frame.to_vec()),
            action: XDP_TX,
            reason: None,
            inserts: false,
        }
    }

    /// A case of the balancer's program, ending in `action` for `reason`.
    pub fn balancer(name: &str, frames: Frames, action: u32, reason: Reason, inserts: bool) -> Case {
        Case { name: name.to_owned(), program: Program::Balancer, frames, action, reason: Some(reason), inserts }
    }

    /// A case of the balancer's program that forwards every frame (XDP_TX).
    pub fn forwarded(name: &str, frames: Frames, inserts: bool) -> Case {
        Case::balancer(name, frames, XDP_TX, Reason::Tx, inserts)
    }
}

/// The frames of the bench's flows.
pub struct Flows {
    pub syn: Vec<u8>,
    pub ack: Vec<u8>,
    pub same_syn: Vec<u8>,
    pub non_vip: Vec<u8>,
    pub limited: Vec<u8>,
    pub through_limit: Vec<u8>,
    pub over_budget: Vec<u8>,
    /// The established flow's SYN and ACK to [`GUE_VIP`].
    pub gue_syn: Vec<u8>,
    pub gue_ack: Vec<u8>,
}

impl Flows {
    pub fn new() -> Result<Self> {
        let client: SocketAddr = CLIENT.parse()?;
        let vip = vip_addr(VIP)?;
        let limited = vip_addr(LIMITED_VIP)?;
        Ok(Self {
            syn: frames::tcp(client, vip, true, &[]),
            ack: frames::tcp(client, vip, false, &[]),
            same_syn: frames::tcp(SYN_CLIENT.parse()?, vip, true, &[]),
            non_vip: frames::tcp(client, NON_VIP.parse()?, true, &[]),
            limited: frames::tcp(LIMITED_CLIENT.parse()?, limited, true, &[]),
            through_limit: frames::tcp(client, limited, true, &[]),
            over_budget: frames::tcp(client, vip_addr(BUDGET_VIP)?, true, &[]),
            gue_syn: frames::tcp(client, vip_addr(GUE_VIP)?, true, &[]),
            gue_ack: frames::tcp(client, vip_addr(GUE_VIP)?, false, &[]),
        })
    }
}

/// Whether `key` is a packet to [`GUE_VIP`]: its address, port and protocol (other VIPs of
/// the lab share the address).
fn to_gue_vip(key: &FlowKey) -> Result<bool> {
    let vip: Vip = GUE_VIP.parse().with_context(|| format!("parsing {GUE_VIP}"))?;
    Ok(dataplane::vip_of(key) == vip_key(&vip))
}

fn vip_addr(vip: &str) -> Result<SocketAddr> {
    let vip: Vip = vip.parse().with_context(|| format!("parsing {vip}"))?;
    Ok(SocketAddr::new(vip.addr, vip.port))
}

/// Everything a part measures with, loaded inside a packet lab's namespace.
pub struct Lab {
    pub balancer: Balancer,
    pub reconciler: Reconciler,
    stages: Ebpf,
    /// Another build's balancer object, when loaded ([`Lab::load_against`]).
    against: Option<Ebpf>,
    /// Where the maps are pinned, for objects loaded later.
    pins: LoadOptions,
    floor: Ebpf,
    hop: Ebpf,
    ingress: u32,
    ingress_mac: [u8; 6],
    /// The CPU every call runs on.
    pub cpu: usize,
    new_flows: NewFlows,
    /// Share of inserting calls that may find both buckets full of established flows (and go
    /// unremembered): 0 unless the table is filled on purpose.
    pub may_overflow: f64,
    /// Inserting calls that went unremembered.
    pub unremembered: usize,
    /// Attached natively to the lab's interfaces, which gives test runs a receive queue.
    _decap: Ebpf,
}

/// The stage object's programs (see `xdp-ebpf/src/bin/lb_stages.rs`).
pub const STAGE_PROGRAMS: [&str; 11] = [
    "lb_to_parse",
    "lb_to_filter",
    "lb_to_vip",
    "lb_to_table",
    "lb_to_limits",
    "lb_to_slot",
    "lb_to_backend",
    "lb_to_insert",
    "lb_to_next_hop",
    "lb_to_encap",
    "lb_all",
];

impl Lab {
    /// Builds a packet lab, loads everything in it with the bench's VIPs and runs `f` there,
    /// on a thread pinned to one CPU.
    pub fn with<T: Send>(f: impl FnOnce(&mut Lab) -> Result<T> + Send) -> Result<T> {
        Self::sized(Capacity::DEFAULT, |lab| {
            lab.configure_bench_vips()?;
            f(lab)
        })
    }

    /// [`Lab::with`] with maps of these sizes and no VIP.
    pub fn sized<T: Send>(capacity: Capacity, f: impl FnOnce(&mut Lab) -> Result<T> + Send) -> Result<T> {
        let lab = PacketLab::build().context("building the packet lab (needs root)")?;
        let ingress = lab.ifindex(packet_lab::INGRESS)?;
        let egress = lab.ifindex(packet_lab::EGRESS)?;
        let ingress_mac = lab.mac(packet_lab::INGRESS)?;
        let pins = LoadOptions { map_pin_dir: Some(lab.pin_dir()?.join("maps")), capacity };
        lab.in_lab(|| {
            // Pinned before anything is loaded, so per-CPU state fills on this CPU.
            let cpu = pin_to_one_cpu()?;
            let mut lab = Lab::load(ingress, egress, ingress_mac, cpu, &pins)?;
            f(&mut lab)
        })
    }

    fn load(ingress: u32, egress: u32, ingress_mac: [u8; 6], cpu: usize, pins: &LoadOptions) -> Result<Self> {
        let mut decap = dataplane::load_simple(objects::DECAP, "spillway-decap", program_names::DECAP)?;
        let program = dataplane::xdp(&mut decap, program_names::DECAP)?;
        program.attach(ingress, XdpMode::Driver).context("attaching the decap program to the ingress")?;
        program.attach(egress, XdpMode::Driver).context("attaching the decap program to the egress")?;
        let floor = dataplane::load_simple(objects::FLOOR, "spillway-floor", program_names::FLOOR)?;
        let hop = load_hop(ingress_mac)?;

        let mut balancer = Balancer::load(pins)?;
        let stages = dataplane::load_sharing_maps(objects::BALANCER_STAGES, "spillway-lb-stages", pins, &STAGE_PROGRAMS)?;
        balancer.maps.set_config(&LbConfig {
            outer_src_v4: to_words(packet_lab::LOCAL4.into()).0[0],
            outer_src_v6: to_words(packet_lab::LOCAL6.into()).0,
            tcp_idle_timeout_s: DEFAULT_TCP_IDLE_TIMEOUT_S,
            udp_idle_timeout_s: DEFAULT_UDP_IDLE_TIMEOUT_S,
            flow_seed: FLOW_SEED,
            gue_port: DEFAULT_GUE_PORT.to_be(),
            ..LbConfig::default()
        })?;
        balancer.tx_ports.insert(egress, egress, None, 0).context("adding the egress to the redirect map")?;
        let reconciler = Reconciler::adopt(&balancer.maps)?;
        Ok(Self {
            balancer,
            reconciler,
            stages,
            against: None,
            pins: pins.clone(),
            floor,
            hop,
            ingress,
            ingress_mac,
            cpu,
            new_flows: NewFlows::default(),
            may_overflow: 0.0,
            unremembered: 0,
            _decap: decap,
        })
    }

    /// The bench's VIPs (each on the lab's ten backends): one plain, one with a per-source
    /// limit and a rule holding a client class in debt, one with its budget in debt, one
    /// plain in GUE.
    fn configure_bench_vips(&mut self) -> Result<()> {
        let vip: Vip = VIP.parse()?;
        let limited_vip: Vip = LIMITED_VIP.parse()?;
        let budget_vip: Vip = BUDGET_VIP.parse()?;
        let gue_vip: Vip = GUE_VIP.parse()?;
        let mut state = DesiredState::default();
        for vip in [vip, limited_vip, budget_vip, gue_vip] {
            state.add_vip(vip, DEFAULT_RING_SIZE)?;
            for n in packet_lab::RESOLVED_BACKENDS {
                state.add_backend(&vip, packet_lab::backend4(n).into(), DEFAULT_WEIGHT)?;
            }
        }
        state.set_encap(&gue_vip, Encap::Gue)?;
        let limits = LimitConfig { per_source: Some(SOURCE_LIMIT), ..LimitConfig::default() };
        state.set_limits(Some(&limited_vip), limits)?;
        let budget = LimitConfig { vip_budget: Some(RateSpec { per_s: 1, burst: 0 }), ..LimitConfig::default() };
        state.set_limits(Some(&budget_vip), budget)?;
        // The limited client is a client class of its own, held to one flow a second...
        let class = RuleMatch { cidr: format!("{}/32", LIMITED_CLIENT.parse::<SocketAddr>()?.ip()).parse()?, vip: Some(limited_vip) };
        let one_per_s = RuleConfig { action: RuleAction::Limit(RateSpec { per_s: 1, burst: 0 }), observe: false };
        state.set_rule(class, one_per_s)?;
        let (reconciler, balancer) = (&mut self.reconciler, &mut self.balancer);
        reconciler.apply(&mut balancer.maps, &state).context("configuring the VIPs")?;
        // ...and its bucket is an hour in debt, so every flow it starts during the run is
        // dropped. (A rule's bucket lives in an array; a source's could be evicted from its
        // LRU by the new-flow cases' sources.)
        let rule = balancer.maps.rules.rules().first().context("the rule is not in the rule index")?.1;
        let in_debt = Bucket { tat_ns: u64::MAX / 2 };
        balancer.maps.rule_buckets.set(rule.id, &in_debt, 0).context("indebting the limited client's class")?;
        let budget_id = reconciler.vip_id(&budget_vip).context("the budget VIP has no id")?;
        balancer.maps.budget.set(budget_id, &in_debt, 0).context("indebting the budget VIP")?;
        Ok(())
    }

    /// Loads another build's balancer object (its ELF bytes, 8-aligned) on this lab's maps,
    /// for [`Program::Against`], with QUIC programs of its own. Its maps must have the shapes
    /// of this build's (but the QUIC hand-over, its own).
    pub fn load_against(&mut self, object: &'static [u8]) -> Result<()> {
        let against = dataplane::load_other_balancer(object, "the --against object", &self.pins)
            .context("loading the --against object on this build's maps (is it a spillway-lb of the same pin version?)")?;
        self.against = Some(against);
        Ok(())
    }

    fn program(&self, program: Program) -> Result<&Xdp> {
        program_in(self.programs(), program)
    }

    fn programs(&self) -> Programs<'_> {
        Programs { balancer: &self.balancer, floor: &self.floor, stages: &self.stages, hop: &self.hop, against: self.against.as_ref() }
    }

    /// One BPF_PROG_TEST_RUN (repeat = 1): the action, the output length and the run time
    /// the kernel measured (what the reference figures use).
    pub fn run(&self, program: Program, frame: &[u8], out: &mut [u8]) -> Result<(u32, usize, u64)> {
        let run = test_run::run_into(self.program(program)?, frame, self.ingress, out).context("BPF_PROG_TEST_RUN")?;
        Ok((run.action, run.len, run.duration_ns))
    }

    /// Runs `frame` through the balancer and checks it was sent in IPIP to its Maglev choice.
    pub fn check_forwarded(&self, frame: &[u8]) -> Result<()> {
        let mut out = vec![0; frame.len() + HEADROOM_BYTES];
        let (action, len, _) = self.run(Program::Balancer, frame, &mut out)?;
        ensure!(action == XDP_TX, "action {action}");
        self.check_ipip(frame, &out[..len], self.maglev_backend(&flow_key(frame)?)?)
    }

    /// Runs `frame` (to [`VIP`]) through the hop and checks it was sent in IPIP to the backend
    /// its hash names; returns that backend's index.
    pub fn check_hop(&self, frame: &[u8]) -> Result<u32> {
        let mut out = vec![0; frame.len() + HEADROOM_BYTES];
        let (action, len, _) = self.run(Program::Hop, frame, &mut out)?;
        ensure!(action == XDP_TX, "action {action}");
        let word = |at: usize| u32::from_ne_bytes(frame[at..at + 4].try_into().expect("4 bytes"));
        let src_port = u16::from_ne_bytes([frame[ETH_LEN + 20], frame[ETH_LEN + 21]]);
        let index = hop_index(word(ETH_LEN + 12), src_port, HOP_LAB_BACKENDS).context("no hop backends")?;
        let backend = packet_lab::backend4(*packet_lab::RESOLVED_BACKENDS.start() + index as u8);
        self.check_ipip(frame, &out[..len], backend)?;
        Ok(index)
    }

    /// Checks every case, then times them; returns each case's median ns/packet.
    pub fn measure(&mut self, cases: &[Case], calls: usize, reps: usize) -> Result<Vec<f64>> {
        Ok(self.measure_each_rep(cases, calls, reps)?.into_iter().map(median).collect())
    }

    /// [`Lab::measure`]'s figures before the median: each case's ns/packet in every
    /// repetition, in order. Two cases' figures of one repetition are a pair: timed in the
    /// same chunks, alternating, so the machine's drift falls on both alike.
    pub fn measure_each_rep(&mut self, cases: &[Case], calls: usize, reps: usize) -> Result<Vec<Vec<f64>>> {
        let mut slots = Vec::with_capacity(cases.len());
        for case in cases {
            let frame = self.first_frame(case).with_context(|| format!("setting up {}", case.name))?;
            let out = vec![0; frame.len() + HEADROOM_BYTES];
            slots.push(Slot { case, frame, out, next_port: 0, next_id: 0, len: 0, ns: 0 });
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
        Ok(per_rep)
    }

    /// Runs `count` frames through the balancer, spread over `cpus` (the k-th of them takes
    /// frames k, k + cpus, ...), each `template` with `write(n, frame)` applied, and checks
    /// each was sent (XDP_TX). What live traffic on every receive queue does, at the speed
    /// all cores give: the bench's own thread is pinned to one of them.
    pub fn send_on_cpus(&self, cpus: &[usize], count: u32, template: &[u8], write: impl Fn(u32, &mut [u8]) + Sync) -> Result<()> {
        let program = self.program(Program::Balancer)?;
        let (ingress, step) = (self.ingress, cpus.len() as u32);
        let write = &write;
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0u32..)
                .zip(cpus)
                .map(|(k, &cpu)| {
                    scope.spawn(move || -> Result<()> {
                        pin_to(cpu)?;
                        let (mut frame, mut out) = (template.to_vec(), vec![0; template.len() + HEADROOM_BYTES]);
                        for n in (k..count).step_by(step as usize) {
                            write(n, &mut frame);
                            let run = test_run::run_into(program, &frame, ingress, &mut out).context("BPF_PROG_TEST_RUN")?;
                            ensure!(run.action == XDP_TX, "frame {n} on CPU {cpu}: action {}", run.action);
                        }
                        Ok(())
                    })
                })
                .collect();
            threads.into_iter().try_for_each(|t| t.join().unwrap_or_else(|_| bail!("a sending thread panicked")))
        })
    }

    /// Runs `case` `calls` times on each of `cpus` at the same time, against the same maps:
    /// one thread pinned to each CPU, all released together. Each CPU has flows of its own
    /// (as a NIC's receive-side scaling gives it): its own established flow, its own new
    /// sources, its own spoofed ones. Every call's action and the reason counters are
    /// checked, and each CPU's last output. Returns each CPU's mean ns per packet.
    pub fn measure_concurrently(&mut self, case: &Case, cpus: &[usize], calls: usize) -> Result<Vec<f64>> {
        let n = cpus.len() as u32;
        let mut slots = Vec::with_capacity(cpus.len());
        for k in 0..n {
            let mut frame = self.first_frame(case)?;
            if let Frames::Established { syn, .. } = &case.frames {
                // A flow of this CPU's own: the same client on another port.
                let port = 50_000 + k as u16;
                let client = SocketAddr::from(([192, 168, 10, 20], port));
                let mut own_syn = syn.clone();
                write_source(&mut own_syn, client);
                write_source(&mut frame, client);
                let mut out = vec![0; own_syn.len() + HEADROOM_BYTES];
                let (action, ..) = self.run(Program::Balancer, &own_syn, &mut out)?;
                ensure!(action == XDP_TX, "CPU {}'s SYN got action {action}", cpus[k as usize]);
            }
            let out = vec![0; frame.len() + HEADROOM_BYTES];
            slots.push(Slot { case, frame, out, next_port: (k * 1000) as u16, next_id: 0, len: 0, ns: 0 });
        }
        // Per CPU k the n-th source is n * cpus + k: no two CPUs share one.
        let (first_new, first_spoofed) = (self.new_flows.next, self.new_flows.spoofed);
        let program = program_in(self.programs(), case.program)?;
        let ingress = self.ingress;
        let before = self.reasons()?;
        let start = std::sync::Barrier::new(cpus.len());
        let runs: Vec<Result<()>> = std::thread::scope(|scope| {
            let threads: Vec<_> = slots
                .iter_mut()
                .zip(cpus)
                .zip(0u32..)
                .map(|((slot, &cpu), k)| {
                    let start = &start;
                    scope.spawn(move || -> Result<()> {
                        pin_to(cpu)?;
                        start.wait();
                        for i in 0..calls as u32 {
                            slot.vary(first_new + i * n + k, first_spoofed.wrapping_add(i * n + k));
                            let run = test_run::run_into(program, &slot.frame, ingress, &mut slot.out).context("BPF_PROG_TEST_RUN")?;
                            ensure!(run.action == slot.case.action, "CPU {cpu}: action {}, expected {}", run.action, slot.case.action);
                            slot.len = run.len;
                            slot.ns += run.duration_ns;
                        }
                        Ok(())
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or_else(|_| bail!("a timing thread panicked"))).collect()
        });
        runs.into_iter().collect::<Result<()>>()?;
        let after = self.reasons()?;
        for (reason, counted) in counted(&before, &after) {
            let expected = if case.reason == Some(reason) { calls * cpus.len() } else { 0 };
            ensure!(counted == expected as u64, "{counted} calls counted as {}, expected {expected}", reason.label());
        }
        for slot in &slots {
            self.check_output(case, &slot.frame, &slot.out[..slot.len])?;
        }
        match case.frames {
            Frames::NewFlows(_) => self.new_flows.next = first_new + calls as u32 * n,
            Frames::Spoofed(_) => self.new_flows.spoofed = first_spoofed.wrapping_add(calls as u32 * n),
            _ => {}
        }
        if case.inserts {
            self.new_flows.inserted += calls * cpus.len();
            self.forget_new_flows()?;
        }
        Ok(slots.iter().map(|s| s.ns as f64 / calls as f64).collect())
    }

    fn first_frame(&mut self, case: &Case) -> Result<Vec<u8>> {
        if let Frames::Established { syn, .. } = &case.frames {
            let mut out = vec![0; syn.len() + HEADROOM_BYTES];
            let (action, ..) = self.run(Program::Balancer, syn, &mut out)?;
            ensure!(action == XDP_TX, "the flow's SYN got action {action}");
            self.pinned_backend(&flow_key(syn)?)?.context("the SYN left no connection-table entry")?;
        }
        Ok(case.frames.frame().to_vec())
    }

    /// Runs a few calls of `slot`'s case one at a time, checking each completely.
    fn check_calls(&mut self, slot: &mut Slot) -> Result<()> {
        let case = slot.case;
        for _ in 0..CHECKED_CALLS {
            self.new_flows.next_frame(slot);
            let key = flow_key(&slot.frame)?;
            let existed = self.pinned_backend(&key)?.is_some();
            let before = self.reasons()?;
            let (action, len, _) = self.run(case.program, &slot.frame, &mut slot.out)?;
            let after = self.reasons()?;
            ensure!(action == case.action, "action {action}, expected {}", case.action);
            let Some(reason) = case.reason else { continue };
            let reasons: Vec<Reason> = counted(&before, &after).filter(|(_, n)| *n > 0).map(|(r, _)| r).collect();
            ensure!(reasons == [reason], "counted as {reasons:?}, expected {reason:?}");
            self.check_output(case, &slot.frame, &slot.out[..len])?;
            if let Frames::ByConnectionId { .. } | Frames::NewConnectionIds { .. } = case.frames {
                ensure!(self.pinned_backend(&key)?.is_none(), "a short header left a connection-table entry");
            } else if action == XDP_TX {
                let pinned = self.pinned_backend(&key)?;
                let expected = self.maglev_backend(&key)?;
                let unremembered = pinned.is_none() && self.may_overflow > 0.0;
                ensure!(pinned == Some(expected) || unremembered, "connection table holds {pinned:?}, expected {expected}");
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
                // Field by field: the frame generator is mutated while the program is borrowed.
                let programs = Programs {
                    balancer: &self.balancer,
                    floor: &self.floor,
                    stages: &self.stages,
                    hop: &self.hop,
                    against: self.against.as_ref(),
                };
                let program = program_in(programs, case.program)?;
                for _ in 0..chunk {
                    self.new_flows.next_frame(slot);
                    let run = test_run::run_into(program, &slot.frame, self.ingress, &mut slot.out).context("BPF_PROG_TEST_RUN")?;
                    ensure!(run.action == case.action, "{}: action {}, expected {}", case.name, run.action, case.action);
                    slot.len = run.len;
                    slot.ns += run.duration_ns;
                }
                self.check_output(case, &slot.frame, &slot.out[..slot.len]).with_context(|| format!("{} while timing", case.name))?;
            }
            done += chunk;
        }
        Ok(())
    }

    /// Removes every new flow from the connection table, checking that each inserting call
    /// made one, so the next repetition starts from the same table.
    pub fn forget_new_flows(&mut self) -> Result<()> {
        let maps = &mut self.balancer.maps;
        let mut keys = Vec::new();
        maps.scan_flows(|key, _| {
            if is_new_flow(key) {
                keys.push(*key);
            }
            ControlFlow::Continue(())
        });
        let inserted = self.new_flows.inserted;
        let missing = inserted.checked_sub(keys.len()).filter(|&m| m as f64 <= inserted as f64 * self.may_overflow);
        let missing =
            missing.with_context(|| format!("{} new flows in the connection table after {inserted} inserting calls", keys.len()))?;
        self.unremembered += missing;
        for key in &keys {
            ensure!(maps.remove_flow(key), "removing the new flow {key:?}");
        }
        self.new_flows = NewFlows::default();
        Ok(())
    }

    /// The reason counters, summed over CPUs: the balancer's, and the `--against` build's
    /// own added to them (it counts in a map of its own, so that a build with another
    /// number of reasons can run on the same tables).
    fn reasons(&self) -> Result<Vec<u64>> {
        let mut counts: Vec<u64> = self.balancer.maps.reasons()?.into_iter().map(|(_, n)| n).collect();
        if let Some(other) = &self.against {
            for (count, theirs) in counts.iter_mut().zip(dataplane::other_reasons(other)?) {
                *count += theirs;
            }
        }
        Ok(counts)
    }

    /// What a checked call must leave: the frame encapsulated to the flow's backend when the
    /// balancer sends it, the frame untouched otherwise. The floor and stage cuts leave what
    /// they leave.
    fn check_output(&self, case: &Case, frame: &[u8], out: &[u8]) -> Result<()> {
        match (case.reason, case.action) {
            (None, _) => Ok(()),
            (Some(_), XDP_TX) => {
                let key = flow_key(frame)?;
                match case.frames {
                    Frames::ByConnectionId { backend, .. } | Frames::NewConnectionIds { backend, .. } => {
                        self.check_ipip(frame, out, backend)
                    }
                    _ if to_gue_vip(&key)? => self.check_gue(frame, out, self.maglev_backend(&key)?),
                    _ => self.check_ipip(frame, out, self.maglev_backend(&key)?),
                }
            }
            (Some(_), _) => {
                ensure!(out == frame, "the frame was changed");
                Ok(())
            }
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

    /// `out` is `input` in GUE to `backend`, byte for byte as built here from the flow hash.
    fn check_gue(&self, input: &[u8], out: &[u8], backend: Ipv4Addr) -> Result<()> {
        let hash = flow_hash(&flow_key(input)?, self.balancer.maps.config()?.table_seed);
        let ports = (gue_source_port(hash), DEFAULT_GUE_PORT);
        let expected = frames::gue_tunnel(packet_lab::LOCAL4.into(), backend.into(), ports, hash, &input[ETH_LEN..]);
        ensure!(
            out.len() == input.len() + IPV4_HEADER_LEN + UDP_HEADER_LEN,
            "output of {} bytes for a {}-byte frame",
            out.len(),
            input.len()
        );
        let mac = packet_lab::neighbour_mac(backend.into()).with_context(|| format!("{backend} has no neighbour in the lab"))?;
        ensure!(out[..6] == mac && out[6..12] == self.ingress_mac, "MACs {:02x?}", &out[..12]);
        ensure!(out[12..] == expected[12..], "not the GUE frame expected to {backend}");
        Ok(())
    }

    /// The backend the VIP's Maglev table gives `key`, computed here with the same hash.
    pub fn maglev_backend(&self, key: &FlowKey) -> Result<Ipv4Addr> {
        let id = self.balancer.maps.maglev_choice(key, FLOW_SEED).context("the flow's VIP has no table")?;
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

/// The lab's loaded objects, borrowed apart from the rest of it.
struct Programs<'a> {
    balancer: &'a Balancer,
    floor: &'a Ebpf,
    stages: &'a Ebpf,
    hop: &'a Ebpf,
    against: Option<&'a Ebpf>,
}

fn program_in(programs: Programs<'_>, program: Program) -> Result<&Xdp> {
    let (ebpf, name) = match program {
        Program::Balancer => return Ok(programs.balancer.program_ref()?),
        Program::Floor => (programs.floor, program_names::FLOOR),
        Program::Stage(name) => (programs.stages, name),
        Program::Hop => (programs.hop, program_names::HOP),
        Program::Against => (programs.against.context("no --against object loaded")?, program_names::BALANCER),
    };
    Ok(ebpf.program(name).with_context(|| format!("{name} missing"))?.try_into()?)
}

/// Backends of the lab's hop: the first of [`packet_lab::RESOLVED_BACKENDS`].
const HOP_LAB_BACKENDS: u32 = 3;

/// `spillway_hop` sending [`VIP`]'s packets to the lab's first [`HOP_LAB_BACKENDS`]
/// backends, from the lab's address and `mac`.
fn load_hop(mac: [u8; 6]) -> Result<Ebpf> {
    let mut hop = dataplane::load_simple(objects::HOP, "spillway-hop", program_names::HOP)?;
    let vip: Vip = VIP.parse()?;
    let IpAddr::V4(vip_addr) = vip.addr else { bail!("the bench VIP is IPv4") };
    let mut cfg = HopConfig {
        vip: u32::from(vip_addr).to_be(),
        src: u32::from(packet_lab::LOCAL4).to_be(),
        src_mac: mac,
        port: vip.port.to_be(),
        count: HOP_LAB_BACKENDS,
        backends: [HopBackend::default(); HOP_BACKENDS],
    };
    for (slot, n) in cfg.backends.iter_mut().zip(packet_lab::RESOLVED_BACKENDS) {
        let addr = packet_lab::backend4(n);
        let mac = packet_lab::neighbour_mac(addr.into()).context("a lab backend without a neighbour")?;
        *slot = HopBackend { addr: u32::from(addr).to_be(), mac, _pad: [0; 2] };
    }
    let map = hop.map_mut(map_names::HOP_CONFIG).context("no hop config map")?;
    aya::maps::Array::try_from(map)?.set(0, &cfg, 0)?;
    Ok(hop)
}

/// The new-flow sources handed out since the new flows were last removed.
#[derive(Default)]
struct NewFlows {
    /// Index of the next source.
    next: u32,
    /// Calls that put a new flow in the connection table.
    inserted: usize,
    /// Index of the next spoofed source (never reset: a flood goes on).
    spoofed: u32,
}

impl NewFlows {
    /// Puts the next new-flow source in a new-flow case's frame, or the next port in a
    /// new-port case's; other frames stay as they are.
    fn next_frame(&mut self, slot: &mut Slot) {
        slot.vary(self.next, self.spoofed);
        match slot.case.frames {
            Frames::NewFlows(_) => self.next += 1,
            Frames::Spoofed(_) => self.spoofed = self.spoofed.wrapping_add(1),
            _ => {}
        }
        if slot.case.inserts {
            self.inserted += 1;
        }
    }
}

/// A case's buffers during a measurement.
struct Slot<'c> {
    case: &'c Case,
    frame: Vec<u8>,
    /// Source port of the next call of a new-port case.
    next_port: u16,
    /// Index of the next id of a new-id case.
    next_id: usize,
    out: Vec<u8>,
    len: usize,
    ns: u64,
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).context("reading the CPU affinity")?;
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    ensure!(!cpus.is_empty(), "the CPU affinity mask is empty");
    Ok(cpus)
}

impl Slot<'_> {
    /// Makes the frame the next of its case: the `new`-th new-flow source, the `spoofed`-th
    /// spoofed source, or the next source port; fixed frames stay as they are.
    fn vary(&mut self, new: u32, spoofed: u32) {
        match self.case.frames {
            Frames::NewFlows(_) => write_new_source(&mut self.frame, new),
            Frames::Spoofed(_) => write_source(&mut self.frame, spoofed_source(spoofed)),
            Frames::NewPorts(_) => {
                self.next_port = self.next_port.wrapping_add(1).max(1024);
                self.frame[ETH_LEN + 20..ETH_LEN + 22].copy_from_slice(&self.next_port.to_be_bytes());
            }
            Frames::NewConnectionIds { ref ids, dcid_at, .. } => {
                let id = &ids[self.next_id % ids.len()];
                self.frame[dcid_at..dcid_at + id.len()].copy_from_slice(id);
                self.next_id += 1;
            }
            Frames::Fixed(_) | Frames::Established { .. } | Frames::ByConnectionId { .. } => {}
        }
    }
}

/// Pins the calling thread to the last CPU it may run on (CPU 0 usually takes more
/// interrupts); returns that CPU.
pub fn pin_to_one_cpu() -> Result<usize> {
    let cpu = *allowed_cpus()?.last().context("no CPU")?;
    pin_to(cpu)?;
    Ok(cpu)
}

fn pin_to(cpu: usize) -> Result<()> {
    let mut only = CpuSet::new();
    only.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &only).with_context(|| format!("pinning to CPU {cpu}"))
}

/// Rewrites an untagged IPv4 SYN's source to the `n`-th new-flow source: the low 15 bits of
/// `n` in the address (192.168.128.0/17, apart from the fixed frames' clients), the rest in
/// the port (from 1024). Checksums are left stale: the balancer does not check them.
pub fn write_new_source(frame: &mut [u8], n: u32) {
    let low = n % 0x8000;
    write_source(frame, SocketAddr::from(([192, 168, 0x80 | (low >> 8) as u8, low as u8], (1024 + n / 0x8000) as u16)));
}

/// The `n`-th spoofed source: 172.16.0.0/12, a new address for each of the first 2^20, then
/// new ports.
pub fn spoofed_source(n: u32) -> SocketAddr {
    let low = n % (1 << 20);
    SocketAddr::from(([172, 16 | (low >> 16) as u8, (low >> 8) as u8, low as u8], (1024 + (n >> 20) % 60_000) as u16))
}

/// Rewrites an untagged IPv4 TCP frame's source address and port (checksums left stale: the
/// balancer does not check them).
pub fn write_source(frame: &mut [u8], src: SocketAddr) {
    let (SocketAddr::V4(src), ip) = (src, ETH_LEN) else { return };
    frame[ip + 12..ip + 16].copy_from_slice(&src.ip().octets());
    frame[ip + 20..ip + 22].copy_from_slice(&src.port().to_be_bytes());
}

fn is_new_flow(key: &FlowKey) -> bool {
    let [a, b, c, _] = key.src[0].to_ne_bytes();
    key.family == FAMILY_V4 && [a, b] == [192, 168] && c & 0x80 != 0
}

/// The connection-table key the balancer builds for an untagged IPv4 TCP/UDP frame.
pub fn flow_key(frame: &[u8]) -> Result<FlowKey> {
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

/// How much each reason counter grew between two readings.
fn counted(before: &[u64], after: &[u64]) -> impl Iterator<Item = (Reason, u64)> {
    Reason::ALL.iter().zip(before.iter().zip(after)).map(|(r, (b, a))| (*r, a - b))
}
