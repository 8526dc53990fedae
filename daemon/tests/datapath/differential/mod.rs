//! The balancer against its reference model (`spillway-pathmodel`): generated cases (a
//! declared state and frames of every kind, fields mutated) run through the real program with
//! BPF_PROG_TEST_RUN and through the model; any difference in the action, the reason counted
//! or the bytes that leave fails, minimized and kept in `cases/`.
//!
//! What the kernel decides by time or chance is made deterministic rather than ignored: the
//! program's clock is frozen (`ns_per_jiffy` 0) and moved by the case's steps, so budgets
//! refill, entries age and fragment records expire exactly as the model computes; the
//! connection table is emptied before each case and sized so that no insert has to evict;
//! the next hop is the static one, or the packet lab's routes, which the model is given. A case may
//! declare a state `before` its own, so that VIPs whose tables changed have a second chance.

mod case;
mod generate;
mod shrink;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use spillway_common::{
    addr::to_words,
    hash::FLOW_SEED,
    limits::{Capacity, QUIC_CONFIG_IDS_PER_VIP},
    quic_lb::QuicLbConfig,
    types::{CFG_F_STATIC_NEXTHOP, EchoConfig, LbConfig, Reason, VIP_F_QUIC},
};
use spillway_harness::{packet_lab, rng::Rng};
use spillway_model::DesiredState;
use spillway_pathmodel::{Link, MapState, Model, Prediction, Routes, VipEntry};

use crate::support::*;
use case::{Case, Egress, Knobs};

/// Between two cases the clock moves past every timeout and bucket tolerance a case uses, so
/// nothing one case left in the kernel's buckets matters to the next.
const CASE_GAP_MS: u64 = 1_000_000;
/// Cases per loaded balancer: the table's 31-bit tick clock must not wrap (26 days of the
/// frozen clock) while the program still holds the fragment records of earlier cases, and
/// those records (a few hundred a case at most) must never fill their LRU map, which would
/// evict one the model still follows.
const CASES_PER_LOAD: u32 = 300;
/// A small table: emptied before every case, and still roomy for a case's flows.
const CAPACITY: Capacity = Capacity { flows: 1 << 14, ..Capacity::DEFAULT };
const STATIC_SRC_MAC: [u8; 6] = [0x02, 0x5b, 0, 0, 0, 1];
const STATIC_DST_MAC: [u8; 6] = [0x02, 0x5b, 0, 0, 0, 2];

/// Frames run and the reasons they reached.
pub struct Tally {
    pub frames: u64,
    /// Since the run started, loading balancers and declaring states included.
    pub started: Instant,
    /// Running frames through the program and the model only.
    pub running: Duration,
    pub reasons: Vec<u64>,
}

impl Tally {
    fn count(&mut self, reason: Reason) {
        self.frames += 1;
        self.reasons[reason as usize] += 1;
    }

    fn new() -> Tally {
        Tally { frames: 0, started: Instant::now(), running: Duration::ZERO, reasons: vec![0; Reason::COUNT as usize] }
    }

    /// Frames per second, and every reason with how many frames reached it (0 too: a branch
    /// the generator never reaches shows).
    pub fn report(&self) -> String {
        let per_s = |d: Duration| self.frames as f64 / d.as_secs_f64().max(1e-9);
        let mut out = format!(
            "differential: {} frames, {:.0} frames/s ({:.0} frames/s while running frames, without loading and declaring)\n",
            self.frames,
            per_s(self.started.elapsed()),
            per_s(self.running)
        );
        for reason in Reason::ALL {
            out += &format!("  {:<26} {}\n", reason.label(), self.reasons[*reason as usize]);
        }
        out
    }
}

/// Where the program and the model parted.
#[derive(Debug)]
pub struct Difference {
    pub step: usize,
    pub expected: Prediction,
    pub action: u32,
    pub counted: Vec<Reason>,
    /// The program counted the packet on the backend the model sent it to.
    pub on_backend: bool,
    pub frame: Vec<u8>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let labels: Vec<&str> = self.counted.iter().map(|r| r.label()).collect();
        writeln!(f, "step {}: the program: action {} reasons {labels:?}", self.step, self.action)?;
        writeln!(f, "         the model:   action {} reason {}", self.expected.action as u32, self.expected.reason.label())?;
        if !self.on_backend {
            writeln!(f, "  the program did not count the packet on backend {:?}, where the model sent it", self.expected.backend)?;
        }
        if self.frame != self.expected.frame {
            let at = self
                .frame
                .iter()
                .zip(&self.expected.frame)
                .position(|(a, b)| a != b)
                .unwrap_or(self.frame.len().min(self.expected.frame.len()));
            writeln!(f, "  frames differ from byte {at} (lengths {} and {}):", self.frame.len(), self.expected.frame.len())?;
            writeln!(f, "  program {}", hex(&self.frame))?;
            writeln!(f, "  model   {}", hex(&self.expected.frame))?;
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A loaded balancer the cases run on, and its frozen clock.
pub struct Lab<'e> {
    env: &'e mut Env,
    now_ns: u64,
}

impl<'e> Lab<'e> {
    pub fn new(env: &'e mut Env) -> Lab<'e> {
        // A table that changes has a second-chance table at once (a case's `before`).
        env.reconciler.set_second_chance_settle(Duration::ZERO);
        Lab { env, now_ns: 1 << 40 }
    }

    /// Runs `case` on the program and on the model, step by step, until they differ.
    pub fn run(&mut self, case: &Case, mut tally: Option<&mut Tally>) -> Result<(), Difference> {
        self.now_ns += CASE_GAP_MS * 1_000_000;
        self.env.update(|s| *s = DesiredState::default());
        if let Some(before) = &case.before {
            self.env.update(|s| *s = before.clone());
        }
        self.env.update(|s| *s = case.state.clone());
        self.env.balancer.maps.flows.clear();
        self.configure(&case.knobs);
        let mut model = Model::new(self.map_state(), self.now_ns);
        for (n, step) in case.steps.iter().enumerate() {
            if let Some(state) = &step.declare {
                self.env.update(|s| *s = state.clone());
                model.set_state(self.map_state());
            }
            if step.advance_ms != 0 {
                self.now_ns += step.advance_ms * 1_000_000;
                self.configure(&case.knobs);
                model.set_now(self.now_ns);
            }
            let started = Instant::now();
            let expected = model.run(&step.frame).unwrap_or_else(|e| panic!("step {n} of a case the model cannot judge: {e}"));
            // The backend the program counts the packet on: the one the model sent it to.
            let sent_on = |env: &Env| expected.backend.map(|id| env.balancer.maps.backend_traffic(id).unwrap().packets);
            let (before, packets_before) = (self.env.reasons(), sent_on(self.env));
            let out = self.env.run(&step.frame);
            let (after, packets_after) = (self.env.reasons(), sent_on(self.env));
            let counted: Vec<Reason> = Reason::ALL.iter().copied().filter(|r| after[*r as usize] != before[*r as usize]).collect();
            let on_backend = packets_before.zip(packets_after).is_none_or(|(b, a)| a == b + 1);
            if let Some(tally) = tally.as_deref_mut() {
                tally.running += started.elapsed();
                tally.count(expected.reason);
            }
            if out.action != expected.action as u32 || counted != [expected.reason] || out.frame != expected.frame || !on_backend {
                return Err(Difference { step: n, expected, action: out.action, counted, on_backend, frame: out.frame });
            }
        }
        Ok(())
    }

    /// The config a case runs with: its knobs, the static next hop, the frozen clock.
    fn configure(&mut self, knobs: &Knobs) {
        let static_ifindex = match knobs.egress {
            Egress::Ingress => self.env.ingress,
            Egress::TxPort => self.env.egress,
            // No such interface in the redirect map: the kernel is handed the packet.
            Egress::Kernel => self.env.egress + 1000,
            Egress::Routes => 0,
        };
        let config = LbConfig {
            outer_src_v4: to_words(packet_lab::LOCAL4.into()).0[0],
            outer_src_v4_hostmask: knobs.hostmask_v4,
            outer_src_v6: to_words(packet_lab::LOCAL6.into()).0,
            outer_src_v6_hostmask: knobs.hostmask_v6,
            flags: if knobs.egress == Egress::Routes { 0 } else { CFG_F_STATIC_NEXTHOP },
            gue_port: knobs.gue_port.to_be(),
            tcp_idle_timeout_s: knobs.tcp_idle_timeout_s,
            udp_idle_timeout_s: knobs.udp_idle_timeout_s,
            static_ifindex,
            static_src_mac: STATIC_SRC_MAC,
            static_dst_mac: STATIC_DST_MAC,
            flow_seed: FLOW_SEED,
            table_seed: knobs.table_seed,
            clock_offset_ns: self.now_ns,
            ns_per_jiffy: 0,
        };
        // Written directly: `set_config` would calibrate the clock again.
        self.env.balancer.maps.config.set(0, &config, 0).unwrap();
        self.env.balancer.maps.set_echo_config(&EchoConfig::new(knobs.echo_per_source, knobs.echo_total)).unwrap();
    }

    /// What the maps hold, read back from the kernel.
    fn map_state(&self) -> MapState {
        let maps = &self.env.balancer.maps;
        let vips: Vec<VipEntry> = maps
            .vips
            .vips()
            .into_iter()
            .map(|(key, meta)| VipEntry {
                key,
                id: meta.id,
                flags: meta.flags,
                ring: maps.rings.read(meta.active),
                prior: maps.rings.read(meta.prior),
                quic: (meta.flags & VIP_F_QUIC != 0).then_some(meta.quic),
            })
            .collect();
        // Every backend declared (a draining one is in no table) or a table names (a
        // second-chance table may name one removed since).
        let declared = self
            .env
            .state
            .vips
            .iter()
            .flat_map(|(vip, config)| config.backends.keys().map(|addr| self.env.reconciler.backend_id(vip, addr)));
        let ids: std::collections::BTreeSet<u32> =
            vips.iter().flat_map(|v| v.ring.iter().chain(&v.prior)).copied().chain(declared.flatten()).collect();
        let backends = ids.into_iter().map(|id| (id, maps.backend(id).unwrap())).collect();
        let configured = |slot: u32| maps.limits.get(&slot, 0).ok().filter(|l| l.configured != 0);
        // A QUIC VIP's configurations by config id: the one in use, and another during a rotation.
        let quic_configs = vips
            .iter()
            .filter(|v| v.quic.is_some())
            .flat_map(|v| (0..QUIC_CONFIG_IDS_PER_VIP).map(move |id| (v.id, id)))
            .filter_map(|(vip, id)| {
                let word = maps.quic_configs.get(&(vip * QUIC_CONFIG_IDS_PER_VIP + id), 0).ok()?;
                (word != 0).then(|| ((vip, id as u8), QuicLbConfig::from_word(word)))
            })
            .collect();
        MapState {
            config: maps.config().unwrap(),
            addresses: maps.vip_addrs.iter().map(|entry| entry.map(|(a, flags)| ((a.family, a.addr), flags)).unwrap()).collect(),
            echo: maps.echo_config.get(&0, 0).unwrap(),
            limits: vips.iter().filter_map(|v| Some((v.id, configured(v.id)?))).collect(),
            default_limits: configured(maps.capacity().default_limit_slot()),
            vips,
            backends,
            rules: maps.rules.rules(),
            quic_servers: maps.quic_servers.entries(),
            quic_configs,
            table_buckets: maps.flows.buckets() as u32,
            ingress: self.env.ingress,
            tx_ports: vec![self.env.egress],
            routes: self.routes(),
        }
    }

    /// The packet lab's routes: a connected subnet of each family on each interface, and the
    /// neighbours it resolves there (`spillway_harness::packet_lab`).
    fn routes(&self) -> Routes {
        let words = |addr: IpAddr| {
            let (words, family) = to_words(addr);
            (family, words)
        };
        let link = |ifindex, mac, subnets: [&str; 2], neighbours: Vec<IpAddr>| Link {
            ifindex,
            mac,
            mtu: packet_lab::MTU.into(),
            prefixes: subnets
                .iter()
                .map(|cidr| {
                    let cidr: spillway_model::Cidr = cidr.parse().unwrap();
                    let (family, words) = words(cidr.addr);
                    (family, words, cidr.prefix_len)
                })
                .collect(),
            neighbours: neighbours.into_iter().map(|a| (words(a), packet_lab::neighbour_mac(a).unwrap())).collect(),
        };
        let resolved =
            packet_lab::RESOLVED_BACKENDS.flat_map(|n| [packet_lab::backend4(n).into(), packet_lab::backend6(n).into()]).collect();
        Routes {
            links: vec![
                link(self.env.ingress, self.env.ingress_mac, ["10.1.0.0/24", "fd01::/64"], resolved),
                link(
                    self.env.egress,
                    self.env.egress_mac,
                    ["10.2.0.0/24", "fd02::/64"],
                    vec![packet_lab::BEHIND_EGRESS4.into(), packet_lab::BEHIND_EGRESS6.into()],
                ),
            ],
        }
    }
}

/// Runs generated cases from `seed` while `more` says so, a fresh balancer every
/// `CASES_PER_LOAD` cases. A difference is minimized, printed, kept in `cases/`, and fails.
pub fn fuzz(seed: u64, mut more: impl FnMut(&Tally) -> bool + Send) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::new();
    while more(&tally) {
        with_env_sized(CAPACITY, |env| {
            let mut lab = Lab::new(env);
            for _ in 0..CASES_PER_LOAD {
                if !more(&tally) {
                    break;
                }
                let case = generate::case(&mut rng);
                if let Err(difference) = lab.run(&case, Some(&mut tally)) {
                    let (case, difference) = shrink::minimize(&mut lab, case, difference);
                    let case = Case { found: format!("seed {seed:#x}: {difference}"), ..case };
                    let path = case::keep(&case, seed);
                    panic!("the program and its model differ (kept, minimized, in {}):\n{difference}", path.display());
                }
            }
        });
    }
    tally
}

/// The seed of a run: `SPILLWAY_DATAPATH_SEED`, else a new one (printed, to reproduce).
fn seed() -> u64 {
    let seed = std::env::var("SPILLWAY_DATAPATH_SEED").ok().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    let seed = seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    println!("differential: seed {seed:#x} (SPILLWAY_DATAPATH_SEED={seed:x} runs it again)");
    seed
}

/// Frames of the bounded run in the suite: about half a minute alone on the 2-core machine
/// (100,000 took 14 s), a minute or more beside the suite's other jobs.
const SUITE_FRAMES: u64 = 250_000;

#[test]
fn the_balancer_agrees_with_its_model() {
    let tally = fuzz(seed(), |t| t.frames < SUITE_FRAMES);
    println!("{}", tally.report());
    // The generator must reach the path's outcomes, or agreeing proves little.
    for reason in Reason::ALL.iter().filter(|r| !UNREACHED.contains(r)) {
        assert!(tally.reasons[*reason as usize] > 0, "no frame reached {}:\n{}", reason.label(), tally.report());
    }
}

/// The reason no case reaches: an ingress that does not forward (the lab forwards).
const UNREACHED: &[Reason] = &[Reason::DropForwardingDisabled];

/// `cargo xtask fuzz datapath --minutes N` runs this for `SPILLWAY_DATAPATH_SECONDS`.
#[test]
#[ignore = "long: cargo xtask fuzz datapath"]
fn the_balancer_agrees_with_its_model_for_a_while() {
    let seconds: u64 = std::env::var("SPILLWAY_DATAPATH_SECONDS").ok().and_then(|m| m.parse().ok()).unwrap_or(60);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tally = fuzz(seed(), |_| Instant::now() < deadline);
    println!("{}", tally.report());
}

#[test]
fn kept_cases_agree() {
    let kept = case::kept();
    assert!(!kept.is_empty(), "no kept cases in {}", case::folder().display());
    with_env_sized(CAPACITY, |env| {
        let mut lab = Lab::new(env);
        for (name, case) in &kept {
            if let Err(difference) = lab.run(case, None) {
                panic!("kept case {name} ({}):\n{difference}", case.found);
            }
        }
    });
}
