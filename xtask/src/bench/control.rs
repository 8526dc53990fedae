//! The control plane: building a Maglev table, and how long an `lbctl backends add` takes to
//! reach the data path (from starting `lbctl` to the VIP's active table naming the new
//! backend, watched in the running balancer's pinned maps), with the optimized `lbd` and
//! `lbctl` a deployment runs.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use spillway_common::{
    limits::DEFAULT_RING_SIZE,
    maglev::{self, MaglevBackend},
    types::RingRef,
};
use spillway_dataplane::PinnedView;
use spillway_dataplane::pins::PinLayout;
use spillway_harness::{
    TopologyConfig, VIP4,
    cluster::{Cluster, ClusterConfig, TCP_PORT, XdpMode},
};
use spillway_reconcile::vip_key;

use super::{Section, median};

/// Backends in the timed Maglev build, and builds.
const MAGLEV_BACKENDS: u32 = 1000;
const MAGLEV_BUILDS: usize = 11;
/// Backends the VIP has, and adds (each followed by a removal) timed.
const VIP_BACKENDS: usize = 3;
const ADDS: usize = 11;
/// How often the table is looked at.
const POLL: Duration = Duration::from_micros(50);
/// Longest wait for a change to reach the data path.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(5);

pub fn part() -> Result<Section> {
    let build_ms = maglev_build_ms()?;
    let (add_ms, backends) = backend_add_ms()?;
    let mut text = String::new();
    writeln!(
        text,
        "Control plane (optimized build): Maglev table for {MAGLEV_BACKENDS} backends at M={DEFAULT_RING_SIZE}, median of \
         {MAGLEV_BUILDS}: {build_ms:.2} ms (goal 5). From starting `lbctl backends add` to the data path reading a table \
         that names the new backend (a VIP of {backends} backends, M={DEFAULT_RING_SIZE}, real lbd with health checks), median of {ADDS}: \
         {add_ms:.2} ms (goal 10)."
    )?;
    Ok(Section {
        text,
        rows: vec![("maglev_build_1000_backends_ms".into(), build_ms), ("backends_add_to_dataplane_ms".into(), add_ms)],
        ..Section::default()
    })
}

fn maglev_build_ms() -> Result<f64> {
    let backends: Vec<MaglevBackend> = (1..=MAGLEV_BACKENDS)
        .map(|i| MaglevBackend { id: i, addr: [u32::from_be_bytes([10, 9, (i >> 8) as u8, i as u8]), 0, 0, 0], weight: 100 })
        .collect();
    let mut times = Vec::with_capacity(MAGLEV_BUILDS);
    for _ in 0..MAGLEV_BUILDS {
        let started = Instant::now();
        let table = maglev::build(&backends, DEFAULT_RING_SIZE)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        ensure!(table.iter().all(|&id| id != maglev::EMPTY_SLOT), "the table has empty slots");
    }
    Ok(median(times))
}

/// Median ms per add, and the VIP's backends before each add.
fn backend_add_ms() -> Result<(f64, usize)> {
    let bins = crate::bins::build(true)?;
    let config = ClusterConfig {
        topology: TopologyConfig { backends: VIP_BACKENDS + 1, clients: 1 },
        mode: XdpMode::Native,
        lbd_args: Vec::new(),
        agent_args: Vec::new(),
    };
    let cluster = Cluster::start(bins, config)?;
    let vip = format!("{VIP4}:{TCP_PORT}/tcp");
    cluster.lbctl(&["vips", "add", &vip])?;
    let hosts = cluster.topo.backends();
    for b in &hosts[..VIP_BACKENDS] {
        cluster.lbctl(&["backends", "add", "--vip", &vip, &b.ipv4().to_string()])?;
    }
    let view =
        PinnedView::open(&PinLayout::new(&cluster.topo.pin_dir()?.join("lb")).balancer_maps()).context("opening lbd's pinned maps")?;
    let key = vip_key(&vip.parse()?);
    let joining = IpAddr::V4(hosts[VIP_BACKENDS].ipv4());
    let active = || view.vips.get(&key).map(|meta| meta.active).context("the VIP left the index");
    let mut times = Vec::with_capacity(ADDS);
    for _ in 0..ADDS {
        let before = active()?;
        let started = Instant::now();
        let lbctl = cluster.lbctl_spawn(&["backends", "add", "--vip", &vip, &joining.to_string()])?;
        let flipped = wait_for_flip(&active, before)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        ensure!(view.backends_in(flipped)?.contains(&joining), "the table packets read after the add does not name {joining}");
        cluster.lbctl_wait(lbctl)?;
        let before = active()?;
        cluster.lbctl(&["backends", "remove", "--vip", &vip, &joining.to_string()])?;
        let flipped = wait_for_flip(&active, before)?;
        ensure!(!view.backends_in(flipped)?.contains(&joining), "{joining} is still in the table after its removal");
    }
    Ok((median(times), VIP_BACKENDS))
}

/// Polls the VIP's active table (one word of plain memory) until it is no longer `before`.
fn wait_for_flip(active: &impl Fn() -> Result<RingRef>, before: RingRef) -> Result<RingRef> {
    let started = Instant::now();
    loop {
        let table = active()?;
        if table != before {
            return Ok(table);
        }
        if started.elapsed() > CHANGE_TIMEOUT {
            bail!("the data path did not change within {CHANGE_TIMEOUT:?}");
        }
        // Not a spin: on two cores it would take one from lbctl and lbd.
        std::thread::sleep(POLL);
    }
}
