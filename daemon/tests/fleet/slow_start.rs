//! Slow start on the wall clock, with slow start on (30 s, the default): balancers that agree
//! on health program the same tables at every moment, also when one of them returns after
//! a backend was added and ramped without it, and while both ramp a backend. The backend's
//! start travels in the file (`started_at`, written by `lbctl apply`), so the ramp is the
//! same function of the wall clock on both.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use spillway_harness::fleet::{Balancer, Fleet};
use spillway_harness::{Signal, Stream};

use crate::support::{self, echo_vip, http_vip, vip_json, wait_for_next_hops};

const STREAMS_PER_CLIENT: usize = 14;
/// `lbd`'s default slow start and its steps (`health::SLOW_START_STEPS`).
const SLOW_START: Duration = Duration::from_secs(30);
const STEP_MS: u64 = 3_000;
/// After a step, how long a balancer may take to program it (its health round is 100 ms).
const PROGRAMMING: u64 = 500;

/// The fleet's file, shared by the balancers (`lbd --config`); removed when dropped.
struct FleetFile(PathBuf);

impl Drop for FleetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fourth {
    Absent,
    Serving,
    Drained,
}

/// Both VIPs with the first three backends (started long ago: no ramp) and the fourth as
/// `fourth` says, without a start of its own (`lbd` gives one, `lbctl apply` writes it in).
fn write_file(path: &Path, addrs: &[String], fourth: Fourth) {
    let mut toml = String::from("# The fleet's desired state (slow start on: lbd's default).\n");
    for vip in [echo_vip(), http_vip()] {
        toml.push_str(&format!("\n[[vips]]\nvip = \"{vip}\"\n"));
        for addr in &addrs[..3] {
            toml.push_str(&format!("\n[[vips.backends]]\naddress = \"{addr}\"\nstarted_at = 2026-01-01T00:00:00Z\n"));
        }
        match fourth {
            Fourth::Absent => {}
            Fourth::Serving => toml.push_str(&format!("\n[[vips.backends]]\naddress = \"{}\"\n", addrs[3])),
            Fourth::Drained => toml.push_str(&format!("\n[[vips.backends]]\naddress = \"{}\"\ndrain = true\n", addrs[3])),
        }
    }
    std::fs::write(path, toml).unwrap();
}

fn digests(balancer: &Balancer) -> Vec<String> {
    [echo_vip(), http_vip()].iter().map(|v| vip_json(balancer, v)["table_digest"].as_str().unwrap().to_owned()).collect()
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The fourth backend's programmed weight on `balancer`.
fn fourth_weight(balancer: &Balancer, addr: &str) -> u64 {
    let list = balancer.lbctl_json(&["backends", "list", "--vip", &echo_vip()]).unwrap();
    let b = list["backends"].as_array().unwrap().iter().find(|b| b["address"] == addr).cloned().unwrap_or_default();
    b["effective_weight"].as_u64().unwrap_or(0)
}

/// For `duration`: pings every stream and compares the balancers' digests, again and again.
/// With `steps`, a comparison that a wall-clock step (or the programming right after it)
/// falls into is not counted. Returns (comparisons, distinct digests seen); panics at the
/// first disagreement or failed ping.
fn compare_while_pinging(lb1: &Balancer, lb2: &Balancer, streams: &mut [Stream], duration: Duration, steps: bool) -> (usize, usize) {
    let (end, mut compared, mut seen) = (Instant::now() + duration, 0, std::collections::BTreeSet::new());
    while Instant::now() < end {
        for stream in streams.iter_mut() {
            stream.ping().unwrap_or_else(|e| panic!("a connection broke: {e:#}"));
        }
        let before = unix_ms();
        let (one, two) = (digests(lb1), digests(lb2));
        let after = unix_ms();
        let near_step = (before.saturating_sub(PROGRAMMING) / STEP_MS) != (after / STEP_MS);
        if steps && near_step {
            continue;
        }
        assert_eq!(one, two, "lb1 and lb2 program different tables (at {before}..{after} ms)");
        seen.insert(one);
        compared += 1;
    }
    (compared, seen.len())
}

#[test]
fn balancers_program_the_same_ramp_whether_or_not_they_were_up_when_it_began() {
    let path = std::env::temp_dir().join(format!("spw-fleet-slow-start-{}.toml", std::process::id()));
    let file = FleetFile(path.clone());
    // Before the fleet: both balancers start from it.
    let addrs: Vec<String> = (1..=4).map(|n| spillway_harness::backend4(n).to_string()).collect();
    write_file(&file.0, &addrs, Fourth::Absent);
    let config = file.0.display().to_string();
    let fleet: Fleet = support::start(2, 4, 3, &["--health-slow-start-ms", "30000", "--config", &config]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    assert_eq!(addrs, fleet.backends().iter().map(|b| b.ipv4().to_string()).collect::<Vec<_>>());
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(20));
    assert_eq!(digests(lb1), digests(lb2), "the same file, no ramp: the same tables");

    // lb1 dies; the fourth backend is added on lb2 and ramps there.
    lb1.set_link(false).unwrap();
    lb1.stop_lbd(Signal::SIGKILL).unwrap();
    lb1.stop_bird(Signal::SIGKILL).unwrap();
    wait_for_next_hops(&fleet, &[lb2], Duration::from_secs(20));
    write_file(&file.0, &addrs, Fourth::Serving);
    let applied = lb2.lbctl(&["apply", "-f", &config]).unwrap();
    assert!(applied.contains("wrote started_at of 2 backends"), "{applied}");
    let text = std::fs::read_to_string(&file.0).unwrap();
    assert_eq!(text.matches("started_at = ").count(), 8, "lbctl wrote the fourth backend's start into the file:\n{text}");
    let b4 = &addrs[3];
    assert!(fourth_weight(lb2, b4) < 100, "slow start is on");
    let ramped = fleet
        .wait_for(SLOW_START + Duration::from_secs(15), "the fourth backend at full weight on lb2", || Ok(fourth_weight(lb2, b4) == 100))
        .unwrap();
    println!("the fourth backend ramped on lb2 in {ramped:?}");

    // Long-lived connections through lb2, a quarter of them on the new backend.
    let mut streams = support::open_streams(&fleet, STREAMS_PER_CLIENT);
    let on_b4 = streams.iter().filter(|s| s.backend() == fleet.backends()[3].name()).count();
    println!("{on_b4} of {} connections on the fourth backend", streams.len());
    assert!(on_b4 > 0, "no connection on the new backend: this proves nothing");

    // lb1 returns with the same file: the backend's start is in it, so lb1's table is lb2's
    // at once (not a ramp of its own from the floor), and the connections ECMP moves to lb1
    // keep their backends.
    lb1.set_link(true).unwrap();
    lb1.start_bird().unwrap();
    lb1.start_lbd().unwrap();
    assert_eq!(digests(lb1), digests(lb2), "lb1 started with another table than lb2's");
    assert_eq!(fourth_weight(lb1, b4), 100, "lb1 runs the fourth backend as lb2 does, not in a slow start of its own");
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(20));
    let (compared, distinct) = compare_while_pinging(lb1, lb2, &mut streams, SLOW_START + Duration::from_secs(3), false);
    println!("lb1 back: {compared} comparisons, {distinct} tables, every connection alive");
    assert_eq!(distinct, 1, "nothing ramps: one table all along");
    let through_lb1 = support::vip_packets(lb1, &echo_vip());
    assert!(through_lb1 > 0, "ECMP moved no connection to lb1: this proves nothing");

    // Both ramp it: drained, then given a weight again by the file applied on lb2 (which
    // writes the new start in) and then on lb1. The connections are closed first: those on
    // the fourth backend that ECMP moved to lb1 are not in its connection table (second
    // chance never remembers them), so a drain of their backend ends them by design.
    streams.clear();
    write_file(&file.0, &addrs, Fourth::Drained);
    for lb in [lb2, lb1] {
        lb.lbctl(&["apply", "-f", &config]).unwrap();
    }
    write_file(&file.0, &addrs, Fourth::Serving);
    lb2.lbctl(&["apply", "-f", &config]).unwrap();
    let applied = lb1.lbctl(&["apply", "-f", &config]).unwrap();
    assert!(!applied.contains("wrote started_at"), "lb1 took lb2's start from the file: {applied}");
    let (compared, distinct) = compare_while_pinging(lb1, lb2, &mut streams, SLOW_START + Duration::from_secs(4), true);
    println!("both ramping: {compared} comparisons away from steps agreed, {distinct} tables");
    assert!(compared >= 20, "{compared} comparisons");
    assert!(distinct >= 8, "the ramp went through its steps on both: {distinct} tables");
    assert_eq!(fourth_weight(lb1, b4), 100);
    drop(fleet);
    drop(file);
}
