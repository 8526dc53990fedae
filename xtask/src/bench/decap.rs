//! The backend agent's decapsulation with its allow-list (`lbd agent --allow-from`): what the
//! source check costs a tunnel packet, with one balancer prefix and with the trie full, and
//! what a refused tunnel costs, as multiples of the floor measured in the same run. Cases
//! alternate in chunks; each reports the median of its repetitions.

use std::fmt::Write as _;

use anyhow::{Context, Result, ensure};
use aya::{
    maps::{Array, HashMap, LpmTrie},
    programs::{Xdp, XdpMode},
};
use spillway_common::{
    addr::to_words,
    limits::{DEFAULT_GUE_PORT, MAX_ALLOW_FROM, map_names, program_names},
    types::{AddrKey, DecapConfig},
};
use spillway_dataplane::objects;
use spillway_dataplane::{self as dataplane, test_run};
use spillway_harness::{frames, packet_lab::PacketLab};

use super::{
    Section,
    packets::{CHUNK, XDP_DROP, XDP_PASS, XDP_TX, pin_to_one_cpu},
};

/// The balancer (the tunnels' outer source) and the backend's address (their destination).
const BALANCER: &str = "10.9.0.1";
const LOCAL: &str = "10.1.0.1";
const VIP: &str = "10.200.1.1:80";

struct Case {
    name: &'static str,
    frame: Vec<u8>,
    action: u32,
}

pub fn part(calls: usize, reps: usize) -> Result<Section> {
    let lab = PacketLab::build().context("building the packet lab (needs root)")?;
    let ingress = lab.ifindex(spillway_harness::packet_lab::INGRESS)?;
    lab.in_lab(|| measure(ingress, calls, reps))
}

fn measure(ingress: u32, calls: usize, reps: usize) -> Result<Section> {
    let cpu = pin_to_one_cpu()?;
    let mut floor = dataplane::load_simple(objects::FLOOR, "spillway-floor", program_names::FLOOR)?;
    // Attached natively, which gives test runs on the interface a receive queue.
    dataplane::xdp(&mut floor, program_names::FLOOR)?.attach(ingress, XdpMode::Driver).context("attaching the floor")?;
    // Two decapsulators: one trusting one prefix, one with the allow-list full (256 /32s).
    let (one, full) = (load(1)?, load(MAX_ALLOW_FROM)?);
    let inner = frames::tcp("192.168.10.20:40000".parse()?, VIP.parse()?, false, b"data");
    let tunnel = |src: &str| -> Result<Vec<u8>> { Ok(frames::tunnel(src.parse()?, LOCAL.parse()?, &inner[14..])) };
    let gue = frames::gue_tunnel(BALANCER.parse()?, LOCAL.parse()?, (50123, DEFAULT_GUE_PORT), 0, &inner[14..]);
    let cases = [
        (Case { name: "floor", frame: inner.clone(), action: XDP_TX }, program(&floor, program_names::FLOOR)?),
        (Case { name: "decap_allowed", frame: tunnel(BALANCER)?, action: XDP_PASS }, program(&one, program_names::DECAP)?),
        (Case { name: "decap_allowed_gue", frame: gue, action: XDP_PASS }, program(&one, program_names::DECAP)?),
        (Case { name: "decap_allowed_full_list", frame: tunnel(BALANCER)?, action: XDP_PASS }, program(&full, program_names::DECAP)?),
        (Case { name: "decap_refused", frame: tunnel("203.0.113.7")?, action: XDP_DROP }, program(&full, program_names::DECAP)?),
    ];
    let mut per_rep: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut out = vec![0u8; 2048];
    for _ in 0..reps {
        let mut ns = vec![0u64; cases.len()];
        for _ in 0..calls.div_ceil(CHUNK) {
            for ((case, prog), total) in cases.iter().zip(&mut ns) {
                for _ in 0..CHUNK {
                    let run = test_run::run_into(prog, &case.frame, ingress, &mut out)?;
                    ensure!(run.action == case.action, "{}: action {} (expected {})", case.name, run.action, case.action);
                    *total += run.duration_ns;
                }
            }
        }
        for (times, total) in per_rep.iter_mut().zip(ns) {
            times.push(total as f64 / (calls.div_ceil(CHUNK) * CHUNK) as f64);
        }
    }
    let medians: Vec<f64> = per_rep.into_iter().map(super::median).collect();
    let mut text = String::new();
    writeln!(
        text,
        "Decapsulation (lbd agent): a {}-byte IPIP tunnel (and the same in GUE) from the balancer to a local address, with \
         an allow-list of one prefix and of {MAX_ALLOW_FROM}, and from a source outside it (dropped); thread pinned to CPU {cpu}.",
        cases[1].0.frame.len()
    )?;
    writeln!(text, "{:<24} | {:>9} | {:>7}", "case", "ns/packet", "x floor")?;
    writeln!(text, "{:-<24}-|-{:->9}-|-{:->7}", "", "", "")?;
    let mut rows = Vec::new();
    for ((case, _), ns) in cases.iter().zip(&medians) {
        let ratio = ns / medians[0];
        writeln!(text, "{:<24} | {ns:>9.1} | {ratio:>7.2}", case.name)?;
        if case.name != "floor" {
            rows.push((case.name.to_owned(), *ns));
            rows.push((format!("{}_x_floor", case.name), ratio));
        }
    }
    writeln!(text, "decap_allowed_gue / decap_allowed (GUE against IPIP): {:.3}", medians[2] / medians[1])?;
    rows.push(("decap_allowed_gue_x_ipip".to_owned(), medians[2] / medians[1]));
    Ok(Section { text, rows, ..Section::default() })
}

/// A decapsulator for the lab's address and the VIP, trusting the balancer and
/// `prefixes - 1` other /32s.
fn load(prefixes: u32) -> Result<aya::Ebpf> {
    let mut ebpf = dataplane::load_simple(objects::DECAP, "spillway-decap", program_names::DECAP)?;
    let mut local: HashMap<_, AddrKey, u32> = HashMap::try_from(ebpf.map_mut(map_names::LOCAL_ADDRS).context("no local map")?)?;
    for addr in [LOCAL, VIP.split(':').next().unwrap_or_default()] {
        let (addr, family) = to_words(addr.parse()?);
        local.insert(&AddrKey { addr, family, _pad: [0; 3] }, &1, 0)?;
    }
    let mut config: Array<_, DecapConfig> = Array::try_from(ebpf.map_mut(map_names::DECAP_CONFIG).context("no config map")?)?;
    config.set(0, &DecapConfig { gue_port: DEFAULT_GUE_PORT.to_be(), _pad: 0 }, 0)?;
    let mut allow = LpmTrie::try_from(ebpf.map_mut(map_names::ALLOW_FROM).context("no allow-list map")?)?;
    allow.insert(&spillway_dataplane::decap::allow_key(BALANCER.parse()?, 32), &1, 0)?;
    for n in 1..prefixes {
        let other = format!("10.{}.{}.1/32", 10 + n / 256, n % 256);
        let other: spillway_model::Cidr = other.parse()?;
        allow.insert(&spillway_dataplane::decap::allow_key(other.addr, other.prefix_len), &1, 0)?;
    }
    Ok(ebpf)
}

fn program<'a>(ebpf: &'a aya::Ebpf, name: &str) -> Result<&'a Xdp> {
    Ok(ebpf.program(name).with_context(|| format!("no program {name}"))?.try_into()?)
}
