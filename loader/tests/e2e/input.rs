//! Bad lbctl input is refused with a message naming the problem and changes nothing.

use std::time::Duration;

use spillway_harness::cluster::XdpMode;

use crate::in_both_modes;
use crate::support::*;

fn bad_input_changes_nothing(mode: XdpMode) {
    let c = start(mode, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    let b1 = backend_addr(&c.topo.backends()[0], false);
    let snapshot = || stable_view(&c, &vip);
    // Health changes by itself until the backends are up: the baseline starts after that.
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let before = snapshot();
    let cases: &[(&[&str], &str)] = &[
        (&["vips", "add", "10.100.0.300:80/tcp"], "10.100.0.300"),
        (&["vips", "add", "10.100.0.1:80/sctp"], "sctp"),
        (&["vips", "add", &vip], "already exists"),
        (&["vips", "remove", "10.100.0.9:80/tcp"], "unknown VIP"),
        (&["backends", "add", "--vip", "10.100.0.9:80/tcp", "10.0.0.101"], "unknown VIP"),
        (&["backends", "add", "--vip", &vip, &b1], "already exists"),
        (&["backends", "add", "--vip", &vip, "10.0.0.999"], "10.0.0.999"),
        (&["backends", "add", "--vip", &vip, "10.0.0.120", "--weight", "0"], "weight"),
        (&["backends", "add", "--vip", &vip, "10.0.0.120", "--weight", "1000001"], "weight"),
        (&["backends", "add", "--vip", &vip, "10.0.0.120", "--weight=-5"], "weight"),
        (&["backends", "remove", "--vip", &vip, "10.0.0.199"], "not in VIP"),
        (&["backends", "drain", "--vip", &vip, "10.0.0.199"], "not in VIP"),
    ];
    for (args, needle) in cases {
        let out = c.lbctl_output(args).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "lbctl {args:?} succeeded");
        assert!(stderr.contains(needle), "lbctl {args:?}: {stderr:?} does not mention {needle:?}");
        assert_eq!(snapshot(), before, "lbctl {args:?} changed the state");
    }
    // An IPv4 backend for an IPv6 VIP is refused too.
    let v6 = tcp_vip(true);
    c.lbctl(&["vips", "add", &v6]).unwrap();
    let out = c.lbctl_output(&["backends", "add", "--vip", &v6, "10.0.0.101"]).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("IPv6"));
    // With lbd gone, lbctl says so.
    c.stop_lbd(spillway_harness::Signal::SIGTERM).unwrap();
    let out = c.lbctl_output(&["vips", "list"]).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"), "{out:?}");
}
in_both_modes!(bad_input_changes_nothing);
