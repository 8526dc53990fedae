//! SIGKILL lbd mid-traffic and start it again: no connection fails, none breaks.

use std::time::Duration;

use spillway_harness::Signal;
use spillway_harness::cluster::XdpMode;

use crate::in_both_modes;
use crate::support::*;

fn hitless_restart(mode: XdpMode) {
    let c = start(mode, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let before = stable_view(&c, &vip);

    restart_under_load(&c);
    let after = stable_view(&c, &vip);
    assert_eq!(after, before, "state differs after the restart");
}
in_both_modes!(hitless_restart);

/// `lbd` under `ip netns exec` runs in a mount namespace of its own, where /sys is mounted
/// afresh: the bpffs it mounts there, and its pins, go with the namespace. It must say at
/// start that restarts are not hitless, and at exit that forwarding stops, never claim
/// that forwarding continues; the harness's own `lbd` (the host's mounts) says neither.
#[test]
fn lbd_says_when_its_pins_will_not_outlive_it() {
    let c = start(XdpMode::Native, 1);
    assert!(!c.lbd_log().contains("pins_not_durable"), "the host's bpffs: {}", c.lbd_log());
    c.stop_lbd(Signal::SIGTERM).unwrap();
    assert!(c.lbd_log().contains("message=\"forwarding continues through the pinned link\""), "{}", c.lbd_log());
    // Its link stays attached (that is the point); removed, so that the next lbd, which
    // cannot see the host's pins, can attach.
    let pin_dir = c.lbd_pin_dir().unwrap();
    assert!(c.lbd_once(&["--cleanup", "--pin-dir", pin_dir.to_str().unwrap()]).unwrap().status.success());

    let netns = c.topo.lb().netns().name().to_owned();
    let wrapper = ["ip".as_ref(), "netns".as_ref(), "exec".as_ref(), netns.as_ref()];
    c.spawn_lbd_with(&wrapper, &[]).unwrap();
    c.wait_for_lbd().unwrap();
    let log = c.lbd_log();
    let warning = log.lines().find(|l| l.contains("event=pins_not_durable")).unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("restarts are not hitless") && warning.contains("nsenter --net="), "{warning}");
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let log = c.lbd_log();
    let exited = log.lines().rev().find(|l| l.contains("event=exited")).unwrap();
    assert!(exited.contains("the pins go with this mount namespace: forwarding stops"), "{exited}");
}
