//! A pinned map is reused only when its shape matches this build's; otherwise loading is
//! refused with an error naming the map (never silently recreated or misread). Needs root.

use std::path::PathBuf;

use aya::EbpfLoader;
use spillway_common::limits::{Capacity, map_names};
use spillway_dataplane::objects;
use spillway_dataplane::{Balancer, LoadOptions};

/// A bpffs directory removed on drop, also when the test fails.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pin_dir(label: &str) -> PinDir {
    let dir = PathBuf::from(format!("/sys/fs/bpf/spw-{}-pins-{label}", std::process::id()));
    // Under the harness's lock: another test binary may be mounting it at the same moment.
    spillway_harness::bpffs::ensure_mounted().unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    PinDir(dir)
}

#[test]
fn maps_pinned_by_a_previous_load_are_reused() {
    let dir = pin_dir("reuse");
    let options = LoadOptions { map_pin_dir: Some(dir.0.clone()), ..LoadOptions::default() };
    let mut first = Balancer::load(&options).unwrap();
    first.maps.set_config(&spillway_common::types::LbConfig { tcp_idle_timeout_s: 77, ..Default::default() }).unwrap();
    let second = Balancer::load(&options).unwrap();
    assert_eq!(second.maps.config().unwrap().tcp_idle_timeout_s, 77, "the second load did not reuse the pinned config map");
}

#[test]
fn a_pinned_map_of_another_shape_is_refused_by_name() {
    let dir = pin_dir("shape");
    // Pin a map of the wrong shape where the VIP table belongs: the decap object's address
    // map has the VIP key's size (20 bytes) but a 4-byte value.
    let impostor = dir.0.join(map_names::VIPS);
    let _decap = EbpfLoader::new().map_pin_path(map_names::LOCAL_ADDRS, impostor.as_path()).load(objects::DECAP).unwrap();
    let err = match Balancer::load(&LoadOptions { map_pin_dir: Some(dir.0.clone()), ..LoadOptions::default() }) {
        Ok(_) => panic!("a pinned map of the wrong shape was accepted"),
        Err(err) => format!("{:?}", anyhow::Error::from(err)),
    };
    assert!(err.contains(map_names::VIPS) && err.contains("cannot reuse pinned map"), "{err}");
}

#[test]
fn maps_pinned_with_other_sizes_are_refused_by_name() {
    let dir = pin_dir("sizes");
    let pinned = |capacity| LoadOptions { map_pin_dir: Some(dir.0.clone()), capacity };
    let small = Capacity { vips: 8, backends: 64, flows: 4096, ring_slots: 8 * 2 * 4099, ..Capacity::DEFAULT };
    drop(Balancer::load(&pinned(small)).unwrap());
    Balancer::load(&pinned(small)).expect("the same sizes load again");
    // Each size, and every map sized by it (the maps are checked in no fixed order: any of
    // them may be the one the error names).
    for (changed, maps) in [
        (Capacity { flows: 8192, ..small }, &[map_names::FLOWS][..]),
        (
            Capacity { vips: 16, ..small },
            &[
                map_names::VIPS,
                map_names::VIP_ADDRS,
                map_names::VIP_STATS,
                map_names::LIMITS,
                map_names::BUDGET_STATE,
                map_names::RULE_LENS,
            ],
        ),
        (
            Capacity { backends: 128, ..small },
            &[map_names::BACKENDS, map_names::BACKEND_STATS, map_names::NEXTHOP_CACHE, map_names::PROBE_LAST, map_names::QUIC_SERVERS],
        ),
        (Capacity { ring_slots: 16 * 2 * 4099, ..small }, &[map_names::RINGS]),
    ] {
        let err = match Balancer::load(&pinned(changed)) {
            Ok(_) => panic!("maps pinned for {small:?} were reused for {changed:?}"),
            Err(err) => format!("{:?}", anyhow::Error::from(err)),
        };
        assert!(maps.iter().any(|m| err.contains(&format!("`{m}`"))) && err.contains("max_entries"), "{changed:?}: {err}");
    }
}

/// Runs `lbd` with `args` on `host` until it exits (at most 20 s: a daemon that started
/// is killed and reported); returns its stderr.
fn lbd_exits(host: &spillway_harness::Host, args: &[&str]) -> Result<String, String> {
    let mut child = host
        .cmd(env!("CARGO_BIN_EXE_lbd"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("lbd {} kept running", args.join(" ")));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "lbd {} exited 0: {stderr}", args.join(" "));
    Ok(stderr)
}

/// An unprivileged user who creates the pin directory before `lbd` does (bpffs roots are
/// often 1777) could later unlink its pins: `lbd` and `lbd agent` refuse such a directory,
/// saying why, and pin nothing there.
#[test]
fn a_pin_directory_an_unprivileged_user_made_first_is_refused() {
    use spillway_harness::{Topology, TopologyConfig};
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let dir = topology.pin_dir().unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("a nobody user");
    nix::unistd::chown(&dir, Some(nobody.uid), None).unwrap();
    let (api, state) = (topology.tempdir().join("api.sock"), topology.tempdir().join("state"));
    let pin_dir = dir.to_str().unwrap();
    let lbd = ["--iface", "eth0", "--xdp-mode", "generic", "--pin-dir", pin_dir, "--api", api.to_str().unwrap(), "--state-dir"];
    let lbd: Vec<&str> = lbd.into_iter().chain([state.to_str().unwrap()]).collect();
    let agent = ["agent", "--iface", "eth0", "--xdp-mode", "generic", "--pin-dir", pin_dir, "--allow-from", "10.0.0.2/32"];
    for (host, args) in [(topology.lb(), &lbd[..]), (&topology.backends()[0], &agent[..])] {
        let stderr = lbd_exits(host, args).unwrap_or_else(|e| panic!("{e}"));
        assert!(stderr.contains("refusing the pin directory") && stderr.contains(&format!("owned by uid {}", nobody.uid)), "{stderr}");
        let pinned: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
        assert!(pinned.iter().all(|p| std::fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(true)), "nothing pinned: {pinned:?}");
    }
}
