//! SETUP and CHECK helpers for the packet tests: a balancer loaded in a [`PacketLab`],
//! configured through the real reconciler, run with BPF_PROG_TEST_RUN.

use std::net::{IpAddr, SocketAddr};

use aya::{Ebpf, programs::XdpMode};
use spillway_common::{
    addr::{from_words, to_words},
    hash::{FLOW_SEED, maglev_hash},
    limits::{Capacity, DEFAULT_GUE_PORT, DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S},
    types::{FlowKey, LbConfig, Reason, VipMeta},
};
use spillway_dataplane::objects;
use spillway_dataplane::{
    Balancer, LoadOptions, load_simple,
    test_run::{self, RunOutcome},
};
use spillway_harness::{
    frames,
    packet_lab::{self, PacketLab},
};
use spillway_model::{DesiredState, Vip};
use spillway_reconcile::{Reconciler, vip_key};

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

pub fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn vip(s: &str) -> Vip {
    s.parse().unwrap()
}

pub struct Env {
    pub balancer: Balancer,
    pub reconciler: Reconciler,
    pub state: DesiredState,
    pub ingress: u32,
    /// The interface the redirect map holds.
    pub egress: u32,
    pub ingress_mac: [u8; 6],
    pub egress_mac: [u8; 6],
    /// The backend-side decapsulator; also attached natively to the lab's interfaces, which
    /// gives test runs a receive queue.
    pub decap: Ebpf,
}

/// Builds a lab, enters it, loads and configures the balancer, and runs `body`.
pub fn with_env<T: Send>(body: impl FnOnce(&mut Env) -> T + Send) -> T {
    with_env_in(&PacketLab::build().expect("building the packet lab"), body)
}

/// [`with_env`] with maps of these sizes.
pub fn with_env_sized<T: Send>(capacity: Capacity, body: impl FnOnce(&mut Env) -> T + Send) -> T {
    with_env_options(&PacketLab::build().expect("building the packet lab"), LoadOptions { capacity, ..LoadOptions::default() }, body)
}

/// [`with_env`] in a lab the caller keeps (to change its routes or neighbours mid-test).
pub fn with_env_in<T: Send>(lab: &PacketLab, body: impl FnOnce(&mut Env) -> T + Send) -> T {
    with_env_options(lab, LoadOptions::default(), body)
}

fn with_env_options<T: Send>(lab: &PacketLab, options: LoadOptions, body: impl FnOnce(&mut Env) -> T + Send) -> T {
    let ingress = lab.ifindex(packet_lab::INGRESS).unwrap();
    let egress = lab.ifindex(packet_lab::EGRESS).unwrap();
    let ingress_mac = lab.mac(packet_lab::INGRESS).unwrap();
    let egress_mac = lab.mac(packet_lab::EGRESS).unwrap();
    lab.in_lab(move || {
        let mut decap = load_simple(objects::DECAP, "spillway-decap", "spillway_decap").unwrap();
        let program = spillway_dataplane::xdp(&mut decap, "spillway_decap").unwrap();
        program.attach(ingress, XdpMode::Driver).unwrap();
        program.attach(egress, XdpMode::Driver).unwrap();

        let mut balancer = Balancer::load(&options).unwrap();
        balancer.maps.set_config(&default_config()).unwrap();
        balancer.tx_ports.insert(egress, egress, None, 0).unwrap();
        let reconciler = Reconciler::adopt(&balancer.maps).unwrap();
        let mut env = Env { balancer, reconciler, state: DesiredState::default(), ingress, egress, ingress_mac, egress_mac, decap };
        body(&mut env)
    })
}

/// Sets a static next hop: every encapsulated packet leaves by the ingress to a fixed
/// neighbour MAC, whatever the backend's address (one no lab route reaches included).
pub fn static_next_hop(env: &mut Env) -> LbConfig {
    let mut cfg = default_config();
    cfg.flags = spillway_common::types::CFG_F_STATIC_NEXTHOP;
    cfg.static_ifindex = env.ingress;
    cfg.static_src_mac = env.ingress_mac;
    cfg.static_dst_mac = [0x02, 0x99, 0, 0, 0, 1];
    env.balancer.maps.set_config(&cfg).unwrap();
    cfg
}

pub fn default_config() -> LbConfig {
    LbConfig {
        outer_src_v4: to_words(packet_lab::LOCAL4.into()).0[0],
        outer_src_v6: to_words(packet_lab::LOCAL6.into()).0,
        tcp_idle_timeout_s: DEFAULT_TCP_IDLE_TIMEOUT_S,
        udp_idle_timeout_s: DEFAULT_UDP_IDLE_TIMEOUT_S,
        flow_seed: FLOW_SEED,
        gue_port: DEFAULT_GUE_PORT.to_be(),
        ..LbConfig::default()
    }
}

impl Env {
    /// Edits the desired state and reconciles it into the maps.
    pub fn update(&mut self, edit: impl FnOnce(&mut DesiredState)) {
        edit(&mut self.state);
        self.reconciler.apply(&mut self.balancer.maps, &self.state).unwrap();
    }

    /// Adds `vip` with `backends` (weight 100) on a small table.
    pub fn add_vip(&mut self, vip: Vip, backends: &[IpAddr]) {
        self.update(|s| {
            s.add_vip(vip, 4099).unwrap();
            for b in backends {
                s.add_backend(&vip, *b, 100).unwrap();
            }
        });
    }

    pub fn run(&self, frame: &[u8]) -> RunOutcome {
        let program = self.balancer.program_ref().unwrap();
        test_run::run(program, frame, self.ingress).unwrap()
    }

    /// Runs `frame` and checks that exactly `reason` was counted, and the action.
    pub fn expect(&self, frame: &[u8], action: u32, reason: Reason) -> RunOutcome {
        let before = self.reasons();
        let out = self.run(frame);
        let after = self.reasons();
        let counted: Vec<Reason> = Reason::ALL.iter().copied().filter(|r| after[*r as usize] != before[*r as usize]).collect();
        assert_eq!(counted, [reason], "reasons counted for this frame");
        assert_eq!(after[reason as usize] - before[reason as usize], 1);
        assert_eq!(out.action, action, "action (reason {})", reason.label());
        out
    }

    pub fn reasons(&self) -> Vec<u64> {
        self.balancer.maps.reasons().unwrap().into_iter().map(|(_, n)| n).collect()
    }

    /// The backend the Maglev table gives a new flow, computed on the host with the same
    /// hash (as the VIP's slot says) and the table read back from the kernel.
    pub fn predicted_backend(&self, vip: &Vip, key: &FlowKey) -> IpAddr {
        let meta: VipMeta = self.balancer.maps.vips.get(&vip_key(vip)).unwrap();
        self.backend_addr(self.balancer.maps.rings.choice(meta.active, maglev_hash(key, meta.flags, FLOW_SEED)).unwrap())
    }

    pub fn backend_addr(&self, id: u32) -> IpAddr {
        let info = self.balancer.maps.backend(id).unwrap();
        from_words(info.addr, info.family).unwrap()
    }

    /// Makes the decapsulator take tunnels to `addrs`, as the agent does with the host's.
    pub fn decap_local(&mut self, addrs: &[IpAddr]) {
        let map = self.decap.map_mut(spillway_common::limits::map_names::LOCAL_ADDRS).unwrap();
        let mut local: aya::maps::HashMap<_, spillway_common::types::AddrKey, u32> = aya::maps::HashMap::try_from(map).unwrap();
        for a in addrs {
            let (addr, family) = to_words(*a);
            local.insert(&spillway_common::types::AddrKey { addr, family, _pad: [0; 3] }, &1, 0).unwrap();
        }
    }

    /// Makes the decapsulator take tunnels from `cidrs` (`lbd agent --allow-from`).
    pub fn decap_allow(&mut self, cidrs: &[&str]) {
        let map = self.decap.map_mut(spillway_common::limits::map_names::ALLOW_FROM).unwrap();
        let mut allow = aya::maps::LpmTrie::try_from(map).unwrap();
        for cidr in cidrs {
            let cidr: spillway_model::Cidr = cidr.parse().unwrap();
            allow.insert(&spillway_dataplane::decap::allow_key(cidr.addr, cidr.prefix_len), &1, 0).unwrap();
        }
    }

    /// Makes the decapsulator take GUE on `port` (0: off), as `lbd agent --gue-port` does.
    pub fn decap_gue_port(&mut self, port: u16) {
        let map = self.decap.map_mut(spillway_common::limits::map_names::DECAP_CONFIG).unwrap();
        let mut config: aya::maps::Array<_, spillway_common::types::DecapConfig> = aya::maps::Array::try_from(map).unwrap();
        config.set(0, &spillway_common::types::DecapConfig { gue_port: port.to_be(), _pad: 0 }, 0).unwrap();
    }

    /// The connection table's entries: (confirmed, unconfirmed).
    pub fn flow_entries(&self) -> (usize, usize) {
        let (mut confirmed, mut unconfirmed) = (0, 0);
        self.balancer.maps.scan_flows(|_, flow| {
            if flow.confirmed {
                confirmed += 1
            } else {
                unconfirmed += 1
            }
            std::ops::ControlFlow::Continue(())
        });
        (confirmed, unconfirmed)
    }

    /// The backend the connection table holds for `key`.
    pub fn pinned_backend(&self, key: &FlowKey) -> Option<IpAddr> {
        self.balancer.maps.flow(key).map(|v| self.backend_addr(v.backend_id))
    }
}

/// The 5-tuple key of a client -> VIP packet.
pub fn flow_key(src: SocketAddr, dst: SocketAddr, proto: u8) -> FlowKey {
    let (s, family) = to_words(src.ip());
    FlowKey { src: s, dst: to_words(dst.ip()).0, sport: src.port().to_be(), dport: dst.port().to_be(), proto, family, _pad: [0; 2] }
}

/// CHECK for an encapsulated frame (see [`frames::check_encap`]); returns the outer source.
pub fn expect_encap(out: &[u8], input: &[u8], l2_len: usize, backend: IpAddr, dst_mac: Option<[u8; 6]>) -> IpAddr {
    frames::check_encap(out, input, l2_len, backend, dst_mac).unwrap_or_else(|e| panic!("{e:#}"))
}

/// 10.200.1.1:80/tcp on backends 101-103, then 104 added with second chance on at once: the
/// flows Maglev moved to 104 have the old backend as a second candidate.
pub fn vip_gaining_a_fourth_backend(env: &mut Env) -> Vip {
    env.reconciler.set_second_chance_settle(std::time::Duration::ZERO);
    let v = vip("10.200.1.1:80/tcp");
    env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
    env.update(|s| s.add_backend(&v, packet_lab::backend4(104).into(), 100).unwrap());
    v
}

/// The most a bucket of `per_s` a second and `burst` admits in `elapsed`, as the program's
/// coarse clock (one tick, at most 10 ms, behind at the start) may see it.
pub fn allowance(per_s: u32, burst: u32, elapsed: std::time::Duration) -> u64 {
    let seen = elapsed + std::time::Duration::from_millis(10);
    burst as u64 + 1 + (per_s as f64 * seen.as_secs_f64()).ceil() as u64
}

/// Runs `frames` (requests for an answer the program rate-limits) and returns how many were
/// answered (`answered`), checking that each was either answered or dropped as over the
/// limit (`limited`).
pub fn answered_or_limited(env: &Env, frames: impl Iterator<Item = Vec<u8>>, answered: Reason, limited: Reason) -> u64 {
    let (tx, limited) = (answered as usize, limited as usize);
    let before = env.reasons();
    let mut runs = 0;
    for f in frames {
        env.run(&f);
        runs += 1;
    }
    let after = env.reasons();
    assert_eq!(after[tx] - before[tx] + after[limited] - before[limited], runs, "each frame answered or limited");
    after[tx] - before[tx]
}
