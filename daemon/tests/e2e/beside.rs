//! Spillway beside an operator's own XDP programs on the balancer's interface, with the
//! operator's programs of `xdp-ebpf/src/bin/operator_example.rs` loaded as an operator would:
//! a root program that drops a blocked source and tail-calls the balancer (`lbd --xdp-attach
//! none --root-array`), and a counter the balancer hands what it does not serve (`lbd
//! --pass-to`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::Ebpf;
use aya::maps::{HashMap, PerCpuHashMap, ProgramArray};
use aya::programs::{ProgramInfo, Xdp, XdpMode};
use spillway_dataplane::objects;
use spillway_harness::cluster::{Binaries, Cluster, ClusterConfig, XdpMode as ClusterMode};
use spillway_harness::{Signal, TopologyConfig, ping, run_connections};

use crate::in_both_modes;
use crate::support::*;

const ROOT: &str = "operator_root";
const COUNT: &str = "operator_count";

/// The operator's object, loaded, its maps and programs in hand.
struct Operator {
    ebpf: Ebpf,
}

impl Operator {
    fn load() -> Operator {
        let mut ebpf = spillway_dataplane::load_simple(objects::OPERATOR_EXAMPLE, "spillway-operator-example", ROOT).unwrap();
        spillway_dataplane::xdp(&mut ebpf, COUNT).unwrap().load().unwrap();
        Operator { ebpf }
    }

    fn program(&mut self, name: &'static str) -> &mut Xdp {
        spillway_dataplane::xdp(&mut self.ebpf, name).unwrap()
    }

    /// Attaches the root program to the balancer host's `eth0`, in the cluster's mode; it
    /// stays attached while `self` lives.
    fn attach_root(&mut self, c: &Cluster, mode: ClusterMode) {
        let mode = match mode {
            ClusterMode::Native => XdpMode::Driver,
            ClusterMode::Generic => XdpMode::Skb,
        };
        let program = self.program(ROOT);
        c.topo.lb().in_netns(|| program.attach(c"eth0", mode)).unwrap();
    }

    /// Drops every IPv4 frame from `source` in the root program.
    fn block(&mut self, source: Ipv4Addr) {
        let mut blocked: HashMap<_, u32, u8> = HashMap::try_from(self.ebpf.map_mut("op_blocked").unwrap()).unwrap();
        blocked.insert(&u32::from_ne_bytes(source.octets()), &1, 0).unwrap();
    }

    /// Pins the root program's array, as an operator does for `lbd --root-array`.
    fn pin_chain(&mut self, path: &Path) {
        let chain: ProgramArray<_> = ProgramArray::try_from(self.ebpf.map_mut("op_chain").unwrap()).unwrap();
        chain.pin(path).unwrap();
    }

    /// Frames the counting program saw to `dst`, over all CPUs.
    fn seen(&self, dst: Ipv4Addr) -> u64 {
        let seen: PerCpuHashMap<_, u32, u64> = PerCpuHashMap::try_from(self.ebpf.map("op_seen").unwrap()).unwrap();
        seen.get(&u32::from_ne_bytes(dst.octets()), 0).map(|cpus| cpus.iter().sum()).unwrap_or(0)
    }
}

/// The backends and clients, with no `lbd` yet: the operator's pins must exist before it.
fn cluster(mode: ClusterMode, backends: usize, clients: usize) -> (Cluster, PathBuf) {
    let bins = Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
    let config = ClusterConfig { topology: TopologyConfig { backends, clients }, mode, lbd_args: Vec::new(), agent_args: Vec::new() };
    let c = Cluster::start_without_lbd(bins, config).expect("starting the cluster");
    let pins = c.topo.pin_dir().unwrap().join("operator");
    std::fs::create_dir(&pins).unwrap();
    (c, pins)
}

/// The id of the program pinned at `path`.
fn pinned_id(path: &Path) -> u32 {
    ProgramInfo::from_pin(path).unwrap().id()
}

fn is_loaded(id: u32) -> bool {
    aya::programs::loaded_programs().flatten().any(|p| p.id() == id)
}

/// The operator's root program drives the interface and tail-calls the balancer, which lbd
/// attached nowhere: a blocked source is dropped before Spillway, others reach the VIP, and
/// a restart of lbd under load breaks nothing and puts the new program in the root array.
fn operator_filter_before_spillway(mode: ClusterMode) {
    let (mut c, pins) = cluster(mode, 3, 2);
    let mut operator = Operator::load();
    let chain = pins.join("chain");
    operator.pin_chain(&chain);
    let blocked = c.topo.clients()[1].ipv4();
    operator.block(blocked);
    operator.attach_root(&c, mode);
    c.add_lbd_args(&["--xdp-attach", "none", "--root-array", chain.to_str().unwrap()]);
    c.start_lbd().unwrap();

    let entry = c.lbd_pin_dir().unwrap().join(format!("v{}", spillway_common::limits::PIN_VERSION)).join("prog");
    let status = c.lbctl_json(&["status"]).unwrap();
    let eth0 = &status["interfaces"][0];
    assert_eq!((&eth0["name"], &eth0["attachment"], &eth0["state"]), (&"eth0".into(), &"unattached".into(), &"up".into()), "{status}");
    assert!(status["alerts"].as_array().is_none_or(|a| a.is_empty()), "unattached on purpose is no alert: {status}");
    assert_eq!(status["entry_program"], entry.to_str().unwrap(), "{status}");
    assert!(c.lbd_log().contains("event=entry_program_pinned"), "{}", c.lbd_log());

    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let tally = connections(&c, tcp_target(false), 20);
    assert_eq!(tally.failures, 0, "through the operator's root program: {:?}", tally.errors);
    let refused = c.topo.clients()[1].in_netns(|| run_connections(tcp_target(false), 1, Duration::ZERO, Duration::from_secs(1)));
    assert_eq!(refused.failures, 1, "the blocked client {blocked} reached the VIP");
    assert_eq!(c.accepted_from(IpAddr::V4(blocked)), 0);

    let before = pinned_id(&entry);
    restart_under_load(&c);
    // The new lbd put its program in the root array: nothing holds the old one any more.
    assert_ne!(pinned_id(&entry), before, "the entry pin names the new program");
    wait_until(Duration::from_secs(5), "the old entry program freed", || !is_loaded(before));

    // `--cleanup` removes the entry program's pin with the rest, and empties the root slot:
    // nothing holds the program any more.
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let now = pinned_id(&entry);
    let pin_dir = c.lbd_pin_dir().unwrap();
    let cleanup = c.lbd_once(&["--cleanup", "--pin-dir", pin_dir.to_str().unwrap(), "--root-array", chain.to_str().unwrap()]).unwrap();
    assert!(cleanup.status.success(), "{}", String::from_utf8_lossy(&cleanup.stderr));
    assert!(entry.symlink_metadata().is_err(), "{} is still pinned", entry.display());
    wait_until(Duration::from_secs(5), "the entry program freed", || !is_loaded(now));
}
in_both_modes!(operator_filter_before_spillway);

/// A host address only this test sends to, so the counting program's count for it is exactly
/// what was sent.
const NOT_A_VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 250);
const METRICS: &str = "127.0.0.1:9479";

/// Sends `count` UDP datagrams from client `c1` to [`NOT_A_VIP`].
fn send_datagrams(c: &Cluster, count: usize) {
    c.topo.clients()[0].in_netns(|| {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        for i in 0..count {
            socket.send_to(&i.to_be_bytes(), SocketAddr::new(NOT_A_VIP.into(), 9)).unwrap();
        }
    });
}

fn pass_to_missing(c: &Cluster) -> f64 {
    value(&scrape(c.topo.lb(), METRICS), "spillway_pass_to_missing_total", &[]).expect("the pass_to_missing metric")
}

/// `lbd --pass-to`: the operator's counting program sees exactly the frames Spillway does not
/// serve, never a VIP's; with its pin gone they pass, counted as `pass_to_missing`.
#[test]
fn operator_filter_after_spillway() {
    let (mut c, pins) = cluster(ClusterMode::Native, 2, 1);
    let mut operator = Operator::load();
    let counter = pins.join("count");
    operator.program(COUNT).pin(&counter).unwrap();
    c.add_lbd_args(&["--pass-to", counter.to_str().unwrap(), "--metrics-listen", METRICS]);
    c.start_lbd().unwrap();
    let status = c.lbctl_json(&["status"]).unwrap();
    assert_eq!(status["pass_to"], counter.to_str().unwrap(), "{status}");
    c.topo.lb().run(&["ip", "addr", "add", &format!("{NOT_A_VIP}/32"), "dev", "eth0"]).unwrap();

    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let tally = connections(&c, tcp_target(false), 20);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    // The router learns the address's MAC first: datagrams queued for it could be lost.
    c.topo.clients()[0].in_netns(|| ping(NOT_A_VIP.into(), Duration::from_secs(2))).unwrap();

    let before = operator.seen(NOT_A_VIP);
    let sent = 50;
    send_datagrams(&c, sent);
    wait_until(Duration::from_secs(5), "the operator's program saw the datagrams", || operator.seen(NOT_A_VIP) >= before + sent as u64);
    assert_eq!(operator.seen(NOT_A_VIP), before + sent as u64, "exactly the datagrams sent");
    assert_eq!(operator.seen(spillway_harness::VIP4), 0, "a VIP's frames are the balancer's alone");
    assert_eq!(pass_to_missing(&c), 0.0);

    // The operator unpins the program: lbd empties the slot, and the frames pass, counted.
    std::fs::remove_file(&counter).unwrap();
    wait_until(Duration::from_secs(10), "lbd saw the pin go", || c.lbd_log().contains("event=pass_to_missing"));
    let alerts = c.lbctl_json(&["status"]).unwrap()["alerts"].to_string();
    assert!(alerts.contains(&format!("nothing is pinned at --pass-to {}", counter.display())), "{alerts}");
    let seen = operator.seen(NOT_A_VIP);
    let missing = 30;
    send_datagrams(&c, missing);
    wait_until(Duration::from_secs(10), "pass_to_missing counted", || pass_to_missing(&c) >= missing as f64);
    assert_eq!(operator.seen(NOT_A_VIP), seen, "the unpinned program still saw frames");
}

/// A `--pass-to` pin that is missing, or names no XDP program, stops the start with an error
/// naming the option, and leaves nothing pinned.
#[test]
fn a_pass_to_pin_that_is_no_xdp_program_is_refused() {
    let (c, pins) = cluster(ClusterMode::Native, 1, 1);
    let mut operator = Operator::load();
    let not_a_program = pins.join("seen");
    PerCpuHashMap::<_, u32, u64>::try_from(operator.ebpf.map_mut("op_seen").unwrap()).unwrap().pin(&not_a_program).unwrap();
    let (lb_pins, dir) = (c.lbd_pin_dir().unwrap(), c.topo.tempdir().to_owned());
    let (api, state) = (dir.join("api.sock"), dir.join("state"));
    let base =
        ["--iface", "eth0", "--pin-dir", lb_pins.to_str().unwrap(), "--api", api.to_str().unwrap(), "--state-dir", state.to_str().unwrap()];
    for (pin, says) in [(pins.join("absent"), "nothing is pinned there"), (not_a_program, "not a pinned program")] {
        let out = c.lbd_once(&[&base[..], &["--pass-to", pin.to_str().unwrap()]].concat()).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("--pass-to {}: {says}", pin.display())), "{stderr}");
        assert!(!lb_pins.exists(), "a refused start left pins");
    }
}

/// A balancer attached by an earlier `lbd` is not left attached behind an unattached one: the
/// start is refused naming the link to remove, and the link stays.
#[test]
fn an_unattached_start_over_a_pinned_link_is_refused() {
    let (mut c, _) = cluster(ClusterMode::Native, 1, 1);
    c.start_lbd().unwrap();
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let link = c.lbd_pin_dir().unwrap().join(format!("v{}", spillway_common::limits::PIN_VERSION)).join("links").join("eth0");
    assert!(link.exists(), "the attached lbd pinned {}", link.display());
    c.add_lbd_args(&["--xdp-attach", "none"]);
    assert!(c.start_lbd().is_err(), "started unattached over a pinned link: {}", c.lbd_log());
    let log = c.lbd_log();
    assert!(log.contains(&format!("the balancer's link {} still attaches it", link.display())), "{log}");
    assert!(link.exists(), "the refused start removed the link");
}
