//! More than one `lbd` on a host, and starts that fail: each instance's probe path is its own
//! (another's cleanup leaves it alone), a running `lbd` restores its probe path when it is
//! removed under it, and a start that fails says why and leaves nothing behind. Native mode
//! only: these are `lbd`'s, not the XDP program's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_dataplane::vip_path::ProbeNames;
use spillway_harness::cluster::{Cluster, XdpMode};

use crate::support::*;

/// A cluster whose IPv4 TCP VIP is on all `backends`, once every one is healthy.
fn healthy_cluster(backends: usize) -> (Cluster, String) {
    let c = start(XdpMode::Native, backends);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(15), "backends healthy", || all_healthy(&c, &vip));
    (c, vip)
}

fn probe_device(c: &Cluster) -> String {
    ProbeNames::for_pin_dir(&c.lbd_pin_dir().unwrap()).device
}

/// The interface index of `device` on the balancer (`None`: no such device).
fn ifindex(c: &Cluster, device: &str) -> Option<String> {
    let line = c.topo.lb().run(&["ip", "-o", "link", "show", "dev", device]).ok()?;
    line.split(':').next().map(|i| i.trim().to_owned())
}

/// A second instance's directories beside the cluster's `lbd`.
fn other_instance(c: &Cluster) -> (PathBuf, PathBuf) {
    (c.topo.pin_dir().unwrap().join("other"), c.topo.tempdir().join("other"))
}

/// The health checks tell the truth: b1's server stops, and b1 leaves the table.
fn a_dead_server_goes_down(c: &Cluster, vip: &str) {
    let addr = c.topo.backends()[0].ipv4().to_string();
    c.stop_echo(0).unwrap();
    wait_until(DETECTION_BOUND, "b1 down after its server stopped", || backend_json(c, vip, &addr)["effective_weight"] == 0);
    let other = c.topo.backends()[1].ipv4().to_string();
    assert_eq!(backend_json(c, vip, &other)["health"], "healthy");
}

/// What the last `event=probe_path_restored` line restored.
fn restored(c: &Cluster) -> Vec<String> {
    let log = c.lbd_log();
    let line = log.lines().rev().find(|l| l.contains("event=probe_path_restored")).unwrap_or_default();
    let list = line.split(' ').find_map(|kv| kv.strip_prefix("restored=")).unwrap_or_default();
    list.split(',').map(str::to_owned).collect()
}

fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path().display().to_string()).collect()).unwrap_or_default()
}

#[test]
fn another_instances_cleanup_leaves_this_probe_path_alone() {
    let (c, vip) = healthy_cluster(2);
    let device = probe_device(&c);
    let before = ifindex(&c, &device).expect("the running lbd's probe device");
    let (other_pins, _) = other_instance(&c);
    assert_ne!(ProbeNames::for_pin_dir(&other_pins).device, device, "another pin directory, another device");

    let out = c.lbd_once(&["--cleanup", "--pin-dir", other_pins.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Long enough for the running lbd to have noticed and repaired a broken path.
    std::thread::sleep(spillway_daemon::probing::PATH_UPKEEP * 3);
    assert_eq!(ifindex(&c, &device).as_ref(), Some(&before), "the same device, never removed");
    let log = c.lbd_log();
    assert!(!log.contains("event=probe_path_broken"), "the other cleanup broke this lbd's probe path:\n{log}");
    a_dead_server_goes_down(&c, &vip);
}

#[test]
fn a_probe_device_deleted_under_a_running_lbd_is_restored_and_health_stays_true() {
    let (c, vip) = healthy_cluster(2);
    let device = probe_device(&c);
    let before = ifindex(&c, &device).unwrap();
    c.topo.lb().run(&["ip", "link", "del", "dev", &device]).unwrap();
    wait_until(Duration::from_secs(5), "the probe path restored", || c.lbd_log().contains("event=probe_path_restored"));
    let log = c.lbd_log();
    let broken = log.lines().find(|l| l.contains("event=probe_path_broken")).expect("the breakage is logged");
    assert!(broken.contains("ALERT") && broken.contains("device"), "{broken}");
    assert_ne!(ifindex(&c, &device), Some(before), "a new device");

    // The rule and the program's link are restored too, each on its own.
    let names = ProbeNames::for_pin_dir(&c.lbd_pin_dir().unwrap());
    let mark = format!("{:#x}/0xff000000", u32::from(names.mark) << 24);
    let restorations = || c.lbd_log().matches("event=probe_path_restored").count();
    let before = restorations();
    c.topo.lb().run(&["ip", "-4", "rule", "del", "fwmark", &mark, "table", &names.table.to_string()]).unwrap();
    wait_until(Duration::from_secs(5), "the rule restored", || restorations() > before);
    assert_eq!(restored(&c), ["routing"]);
    let before = restorations();
    let link = c.lbd_pin_dir().unwrap().join(format!("v{}", spillway_common::limits::PIN_VERSION)).join("probe_link");
    std::fs::remove_file(&link).unwrap();
    wait_until(Duration::from_secs(5), "the program attached again", || restorations() > before);
    assert_eq!(restored(&c), ["program"]);
    assert!(link.exists(), "its link pinned again");

    // And it works: backends stay healthy, and a dead one goes down.
    wait_until(Duration::from_secs(5), "every backend healthy", || all_healthy(&c, &vip));
    a_dead_server_goes_down(&c, &vip);
}

#[test]
fn a_start_on_a_missing_interface_names_it() {
    let c = start(XdpMode::Native, 1);
    let (pins, dir) = other_instance(&c);
    let (api, state) = (dir.join("api.sock"), dir.join("state"));
    let args = ["--iface", "eth9", "--pin-dir", pins.to_str().unwrap(), "--api", api.to_str().unwrap()];
    let out = c.lbd_once(&[&args[..], &["--state-dir", state.to_str().unwrap()]].concat()).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(r#"no interface named "eth9""#) && !stderr.contains("forwarding"), "{stderr}");
    assert!(!pins.exists(), "nothing pinned: {:?}", left_in(&pins));
}

#[test]
fn a_second_lbd_on_a_driven_interface_names_the_first_and_leaves_nothing() {
    let (c, vip) = healthy_cluster(2);
    let (pins, dir) = other_instance(&c);
    std::fs::create_dir_all(&dir).unwrap();
    let (api, state) = (dir.join("api.sock"), dir.join("state"));
    let out = c
        .lbd_once(&[
            "--iface",
            "eth0",
            "--pin-dir",
            pins.to_str().unwrap(),
            "--api",
            api.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--metrics-listen",
            "off",
        ])
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("the second lbd said: {stderr}");
    assert!(!out.status.success());
    let first = c.lbd_pin_dir().unwrap();
    assert!(stderr.contains("eth0 is driven by another XDP program") && !stderr.contains("Device or resource busy"), "{stderr}");
    assert!(stderr.contains(&format!("--pin-dir {}", first.display())), "names the first lbd's pin directory: {stderr}");
    assert!(left_in(&pins).is_empty(), "left behind: {:?}", left_in(&pins));
    let other_device = ProbeNames::for_pin_dir(&pins).device;
    assert_eq!(ifindex(&c, &other_device), None, "no probe device of the failed start");
    // The first lbd is unaffected: it serves, its probe path is whole, its checks tell the truth.
    assert_eq!(connections(&c, tcp_target(false), 40).failures, 0);
    assert!(!c.lbd_log().contains("event=probe_path_broken"));
    a_dead_server_goes_down(&c, &vip);
}

#[test]
fn cleanup_takes_the_pin_directory_from_the_configuration_file() {
    let c = start(XdpMode::Native, 1);
    let device = probe_device(&c);
    assert!(ifindex(&c, &device).is_some());
    c.stop_lbd(spillway_harness::Signal::SIGTERM).unwrap();
    let pins = c.lbd_pin_dir().unwrap();
    let file = c.topo.tempdir().join("cleanup.toml");
    std::fs::write(&file, format!("vips = []\n[lbd]\niface = \"eth0\"\npin_dir = \"{}\"\n", pins.display())).unwrap();
    let out = c.lbd_once(&["--cleanup", "--config", file.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!pins.exists(), "the file's pin directory is removed: {:?}", left_in(&pins));
    assert_eq!(ifindex(&c, &device), None, "and its probe device");
    assert!(!c.topo.lb().run(&["ip", "link", "show", "eth0"]).unwrap().contains("xdp"), "detached");
}
