//! Bad lbctl input is refused with a message naming the problem and changes nothing.

use std::time::Duration;

use spillway_harness::cluster::{Cluster, XdpMode};

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

/// Regression (day two): the `vips remove` guard counted the table entries of connections
/// long closed ("1017 connections would break"). It counts live ones: entries used within
/// the idle timeout (2 s here), and says so.
#[test]
fn vips_remove_counts_only_live_connections() {
    let c = start_with(XdpMode::Native, 1, 1, &["--tcp-idle-timeout-s", "2", "--no-health-checks"]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    let tally = connections(&c, tcp_target(false), 20);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    let live = |c: &Cluster| {
        let out = c.lbctl_output(&["vips", "remove", &vip]).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let (_, rest) = stderr.split_once("1 backends and ").unwrap_or_else(|| panic!("{stderr}"));
        assert!(rest.contains(" live connections (connection-table entries used in the last 2 s, the idle timeout)"), "{stderr}");
        rest.split(' ').next().unwrap().parse::<u64>().unwrap()
    };
    assert_eq!(live(&c), 20, "the connections just closed are within the idle timeout");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(live(&c), 0, "closed 4 s ago, past the 2 s idle timeout");
}

/// The guards against an operator's slip, with the real lbd and lbctl: each refusal says
/// what would break and how to force it, and changes nothing; forced, it goes through.
#[test]
fn operator_guards_refuse_what_would_break() {
    let c = start(XdpMode::Native, 2);
    let vip = tcp_vip(false);
    let (b1, b2) = (backend_addr(&c.topo.backends()[0], false), backend_addr(&c.topo.backends()[1], false));
    c.lbctl(&["vips", "add", &vip]).unwrap();
    c.lbctl(&["backends", "add", "--vip", &vip, &b1]).unwrap();
    wait_until(Duration::from_secs(10), "b1 healthy", || all_healthy(&c, &vip));
    let refused = |args: &[&str], needles: &[&str]| {
        let before = stable_view(&c, &vip);
        let out = c.lbctl_output(args).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "lbctl {args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "lbctl {args:?}: {stderr:?} does not mention {needle:?}");
        }
        assert_eq!(stable_view(&c, &vip), before, "lbctl {args:?} changed the state");
    };

    // A VIP on the balancer's own address (its SSH would go to the VIP), by lbctl and by file.
    refused(&["vips", "add", "10.0.0.2:22/tcp"], &["10.0.0.2 is an address of this balancer (eth0)", "drop_no_backend", "--force"]);
    let file = std::env::temp_dir().join(format!("spw-{}-guards.toml", std::process::id()));
    let exported = c.lbctl(&["export"]).unwrap();
    std::fs::write(&file, format!("{exported}\n[[vips]]\nvip = \"10.0.0.2:22/tcp\"\n")).unwrap();
    let path = file.to_str().unwrap();
    refused(
        &["apply", "-f", path],
        &[&format!("{path}:"), ": vips[1].vip: VIP 10.0.0.2:22/tcp: 10.0.0.2 is an address", "allow_local_address = true"],
    );
    let _ = std::fs::remove_file(&file);
    c.lbctl(&["vips", "add", "10.0.0.2:8080/tcp", "--force"]).unwrap();
    assert!(c.lbctl(&["export"]).unwrap().contains("vip = \"10.0.0.2:8080/tcp\"\nring_size = 65537\nallow_local_address = true\n"));
    // A checked VIP without backends has no budget (it showed BUDGET/S 1, none being set).
    let vips = c.lbctl_json(&["vips", "list"]).unwrap();
    let empty = vips["vips"].as_array().unwrap().iter().find(|v| v["vip"] == "10.0.0.2:8080/tcp").unwrap();
    assert!(empty.get("effective_budget").is_none_or(|b| b.is_null()), "{empty}");
    let table = c.lbctl(&["vips", "list"]).unwrap();
    let row = table.lines().find(|l| l.starts_with("10.0.0.2:8080/tcp")).unwrap();
    assert!(!row.contains(" 1 "), "BUDGET/S of a VIP without backends: {table}");
    c.lbctl(&["vips", "remove", "10.0.0.2:8080/tcp"]).unwrap();

    // Draining the last active backend: there is nowhere else for new flows.
    refused(&["backends", "drain", "--vip", &vip, &b1], &["last active backend", "new connections to the VIP fail", "--force"]);
    assert_eq!(connections(&c, tcp_target(false), 10).failures, 0);
    c.lbctl(&["backends", "add", "--vip", &vip, &b2]).unwrap();
    wait_until(Duration::from_secs(10), "b2 healthy", || all_healthy(&c, &vip));
    let drained = c.lbctl(&["backends", "drain", "--vip", &vip, &b1]).unwrap();
    assert!(drained.contains("new flows go elsewhere"), "{drained}");
    refused(&["backends", "drain", "--vip", &vip, &b2], &["last active backend"]);

    // Removing a VIP with backends, as apply refuses it: how many backends and connections.
    let flows = connections(&c, tcp_target(false), 10);
    assert_eq!(flows.failures, 0);
    refused(
        &["vips", "remove", &vip],
        &[&format!("VIP {vip} has 2 backends and "), " live connections (connection-table entries used in the last ", "--force"],
    );

    // Forced, the last backend drains and the VIP goes.
    let forced = c.lbctl(&["backends", "drain", "--vip", &vip, &b2, "--force"]).unwrap();
    assert!(forced.contains("fail if it has none"), "{forced}");
    c.lbctl(&["vips", "remove", &vip, "--force"]).unwrap();
    assert!(c.lbctl_json(&["vips", "list"]).unwrap()["vips"].as_array().unwrap().is_empty());

    // Without an IPv6 outer source, an IPv6 backend is refused, saying why.
    c.stop_lbd(spillway_harness::Signal::SIGTERM).unwrap();
    let lb6 = c.topo.lb().run(&["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"]).unwrap();
    let lb6 = lb6.split_whitespace().skip_while(|w| *w != "inet6").nth(1).unwrap().to_owned();
    c.topo.lb().run(&["ip", "-6", "addr", "del", &lb6, "dev", "eth0"]).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains("event=no_outer_src family=6"), "{}", c.lbd_log());
    c.lbctl(&["vips", "add", &vip]).unwrap();
    let b1v6 = backend_addr(&c.topo.backends()[0], true);
    refused(
        &["backends", "add", "--vip", &vip, &b1v6],
        &[
            &format!("backend {b1v6} of VIP {vip}: no IPv6 outer source is configured"),
            "--outer-src6",
            "the tunnel to an IPv6 backend needs one",
        ],
    );
}
