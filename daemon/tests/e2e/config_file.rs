//! The configuration file with the real `lbd` and `lbctl` and real traffic: `lbd --config`
//! on a first start, `lbctl diff`/`apply`/`export`, bad files refused whole and changing
//! nothing, SIGHUP, restarts that keep `lbctl` edits unless the file changed, and systemd's
//! readiness protocol with only the capabilities and system calls the unit grants.

use std::{collections::BTreeMap, os::unix::net::UnixDatagram, path::PathBuf, time::Duration};

use spillway_harness::{Signal, backend4, cluster::XdpMode, unit};

use crate::support::*;

/// A configuration file of the test's own, removed at the end.
struct File(PathBuf);

impl File {
    fn new(label: &str) -> Self {
        Self(std::env::temp_dir().join(format!("spw-{}-{label}.toml", std::process::id())))
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.0, text).unwrap();
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The TCP VIP with backends b<n> of the given weights.
fn declaring(backends: &[(usize, u32)]) -> String {
    let mut text = format!("[[vips]]\nvip = \"{}\"\nring_size = 4099\n", tcp_vip(false));
    for (n, weight) in backends {
        text.push_str(&format!("\n[[vips.backends]]\naddress = \"{}\"\nweight = {weight}\n", backend4(*n)));
    }
    text
}

fn shares(pairs: &[(&'static str, f64)]) -> BTreeMap<&'static str, f64> {
    pairs.iter().copied().collect()
}

fn backend_weights(c: &spillway_harness::cluster::Cluster) -> Vec<(String, u64)> {
    let list = c.lbctl_json(&["backends", "list", "--vip", &tcp_vip(false)]).unwrap();
    list["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["address"].as_str().unwrap().to_owned(), b["weight"].as_u64().unwrap()))
        .collect()
}

#[test]
fn lbd_starts_from_the_file_and_lbctl_diffs_applies_and_exports() {
    let file = File::new("config-apply");
    file.write(&declaring(&[(1, 100), (2, 100)]));
    let c = start_with(XdpMode::Native, 3, 1, &["--config", file.path()]);
    let vip = tcp_vip(false);
    assert!(
        c.lbd_log().contains(&format!("event=config_used source=file file={} reason=no_persisted_state", file.path())),
        "{}",
        c.lbd_log()
    );
    let log = c.lbd_log();
    assert!(log.contains("event=state_from_file vips=1") && !log.contains("event=state_restored"), "nothing was restored: {log}");
    wait_until(Duration::from_secs(10), "b1 and b2 healthy", || all_healthy(&c, &vip));
    assert_shares(&connections(&c, tcp_target(false), 60), &shares(&[("b1", 0.5), ("b2", 0.5)]), 60);

    // In sync: diff says so, with exit status 0.
    let out = c.lbctl_output(&["diff", "-f", file.path()]).unwrap();
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (Some(0), "no changes\n"));

    // A new backend and a new weight: diff lists them (exit 1) and changes nothing.
    file.write(&declaring(&[(1, 200), (2, 100), (3, 100)]));
    let out = c.lbctl_output(&["diff", "-f", file.path()]).unwrap();
    let (b1, b3) = (backend4(1), backend4(3));
    // The new backend would start now (its slow start's start, `started_at`).
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(lines[0], format!("~ backend {b1} in {vip}: weight 100 -> 200"));
    let added = format!("+ backend {b3} in {vip}: address=\"{b3}\", started_at=\"");
    assert!(lines[1].starts_with(&added) && lines[1].ends_with("Z\", weight=100"), "{stdout}");
    assert_eq!(lines[2], "2 changes would be applied (nothing was changed)");
    assert!(!std::fs::read_to_string(file.path()).unwrap().contains("started_at"), "diff wrote into the file");
    let out = c.lbctl_output(&["diff", "-f", file.path(), "-o", "json"]).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((json["applied"].as_bool(), json["changes"].as_array().map(Vec::len)), (Some(false), Some(2)), "{json}");
    assert_eq!(backend_weights(&c).len(), 2, "diff changed the state");

    // Apply: one change, then traffic follows the new weights.
    let applied = c.lbctl(&["apply", "-f", file.path()]).unwrap();
    assert!(applied.starts_with(&format!("~ backend {b1} in {vip}: weight 100 -> 200\n")), "{applied}");
    assert!(applied.contains("\napplied 2 changes (slots_written="), "{applied}");
    // The start lbd gave the new backend is in the file now, for the other balancers.
    assert!(applied.contains(&format!("wrote started_at of 1 backends into {}", file.path())), "{applied}");
    let written = std::fs::read_to_string(file.path()).unwrap();
    assert!(written.contains(&format!("address = \"{b3}\"\nstarted_at = ")), "{written}");
    assert_eq!(backend_weights(&c), [(b1.to_string(), 200), (backend4(2).to_string(), 100), (b3.to_string(), 100)]);
    wait_until(Duration::from_secs(10), "b3 healthy", || all_healthy(&c, &vip));
    assert_shares(&connections(&c, tcp_target(false), 200), &shares(&[("b1", 0.5), ("b2", 0.25), ("b3", 0.25)]), 200);

    // export | apply changes nothing; an lbctl edit shows in the export and in a diff.
    let exported = c.lbctl(&["export"]).unwrap();
    let out = c.lbctl_with_input(&["apply", "-f", "-"], &exported).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "no changes\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(exported.contains("[lbd]\n") && exported.contains("\niface = \"eth0\"\n"), "{exported}");
    c.lbctl(&["backends", "set-weight", "--vip", &vip, &backend4(2).to_string(), "50"]).unwrap();
    let exported = c.lbctl(&["export"]).unwrap();
    assert!(exported.contains(&format!("address = \"{}\"\nweight = 50", backend4(2))), "{exported}");
    let out = c.lbctl_output(&["diff", "-f", file.path()]).unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&format!("~ backend {} in {vip}: weight 50 -> 100\n", backend4(2))));

    // Bad files are refused whole, naming file, line, column and field, and change nothing.
    let bad = File::new("config-bad");
    let good = declaring(&[(1, 200), (2, 50), (3, 100)]);
    let before = stable_view(&c, &vip);
    let huge = format!("{good}#{}\n", "x".repeat(5 << 20));
    let cases = [
        (good.replace("weight = 200", "wieght = 200"), ":7:1: vips[0].backends[0].wieght: unknown field `wieght`"),
        (good.replace("weight = 200", "weight = \"heavy\""), ":7:10: vips[0].backends[0].weight: invalid type: string"),
        (good.replace("weight = 200", "weight = 0"), ":7:10: vips[0].backends[0].weight: weight 0 is out of range (1..=1000000)"),
        (good.replace("ring_size = 4099", "ring_size = 4096"), ":3:13: vips[0].ring_size: ring size 4096 must be a prime"),
        (
            good.replace(&backend4(3).to_string(), &backend4(1).to_string()),
            ":14:11: vips[0].backends[2].address: backend 10.0.0.101 is declared twice",
        ),
        (format!("{good}[[vips]]\nvip = \"{vip}\"\n"), ":17:7: vips[1].vip: VIP 10.100.0.1:80/tcp is declared twice"),
        (good.replace("ring_size = 4099", "ring_size = "), ":3:13: "),
        (String::new(), ": declares nothing"),
        (huge, ": larger than the 4 MiB a configuration may be"),
    ];
    for (text, message) in cases {
        bad.write(&text);
        for command in ["apply", "diff"] {
            let out = c.lbctl_output(&[command, "-f", bad.path()]).unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(if command == "diff" { 2 } else { 1 }), "{command} {message}: {stderr}");
            assert!(stderr.contains(&format!("{}{message}", bad.path())), "{command}: {stderr}\n  lacks {message:?}");
        }
        assert_eq!(stable_view(&c, &vip), before, "{message}: the state changed");
    }

    // Removing a VIP that has backends: apply refuses; diff shows the whole diff with the
    // removal marked refused, and says so by its exit status (3).
    bad.write(&format!("{}\n[[vips]]\nvip = \"{}\"\n", "[limits.per_source]\nper_s = 100", udp_vip()));
    let out = c.lbctl_output(&["apply", "-f", bad.path()]).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("removes VIP 10.100.0.1:80/tcp (3 backends), whose connections would break"));
    let out = c.lbctl_output(&["diff", "-f", bad.path()]).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let why = "(refused: the VIP has 3 backends, whose connections would break: needs --allow-vip-removal)";
    for line in ["+ default limits: observe_budget=false", &format!("- vip {vip} {why}"), &format!("- backend {b1} in {vip} {why}")] {
        assert!(stdout.lines().any(|l| l.starts_with(line)), "{line:?} missing:\n{stdout}");
    }
    assert!(stdout.lines().any(|l| l.starts_with(&format!("+ vip {}", udp_vip()))), "{stdout}");
    assert!(stdout.ends_with("changes, 4 of which apply would refuse (marked refused; nothing was changed)\n"), "{stdout}");
    let out = c.lbctl_output(&["diff", "-f", bad.path(), "--allow-vip-removal"]).unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));

    // [lbd] settings that differ from the running ones are differences (exit 1), not "no changes".
    let exported = c.lbctl(&["export"]).unwrap();
    bad.write(&exported.replace("[lbd]\n", "[lbd]\nzone = \"b\"\n"));
    let out = c.lbctl_output(&["diff", "-f", bad.path()]).unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()),
        (
            Some(1),
            "~ lbd.zone: the file says b, lbd runs with its default: takes effect when lbd restarts\n\
             no changes to the desired state; 1 settings of [lbd] differ: they take effect at the next start of lbd\n"
        )
    );
    assert_eq!(stable_view(&c, &vip), before, "diff changed the state");
    assert_eq!(connections(&c, tcp_target(false), 20).failures, 0);
}

/// The rule of which state wins (README, "Which state wins"): an operator's changes made
/// with lbctl after `lbctl apply -f` of lbd's own file (which also writes starts into the
/// file) survive SIGTERM and SIGKILL restarts and reloads, until the file changes.
#[test]
fn lbctl_changes_survive_restarts_and_reloads_until_the_file_changes() {
    let file = File::new("config-rule");
    file.write(&declaring(&[(1, 100), (2, 100)]));
    let c = start_with(XdpMode::Native, 3, 1, &["--config", file.path()]);
    let vip = tcp_vip(false);
    let (b1, b2, b3) = (backend4(1).to_string(), backend4(2).to_string(), backend4(3).to_string());
    // The operator edits the file and applies it by hand (lbctl writes the new backend's
    // start into it).
    file.write(&declaring(&[(1, 100), (2, 200), (3, 100)]));
    let applied = c.lbctl(&["apply", "-f", file.path()]).unwrap();
    assert!(applied.contains("wrote started_at of 1 backends"), "{applied}");
    // Then changes every kind of thing by lbctl: a drain, a weight, the tunnel, a rule, a
    // removed backend.
    c.lbctl(&["backends", "drain", "--vip", &vip, &b3]).unwrap();
    c.lbctl(&["backends", "set-weight", "--vip", &vip, &b2, "150"]).unwrap();
    c.lbctl(&["vips", "encap", &vip, "gue"]).unwrap();
    c.lbctl(&["rules", "add", "192.0.2.0/24", "--block"]).unwrap();
    c.lbctl(&["backends", "remove", "--vip", &vip, &b1]).unwrap();
    let edited = c.lbctl(&["export"]).unwrap();
    for part in [
        format!("address = \"{b3}\"\ndrain = true"),
        format!("address = \"{b2}\"\nweight = 150"),
        "encap = \"gue\"".into(),
        "cidr = \"192.0.2.0/24\"".into(),
    ] {
        assert!(edited.contains(&part), "{part:?} missing from the export:\n{edited}");
    }
    assert!(!edited.contains(&format!("address = \"{b1}\"")), "{edited}");

    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        c.stop_lbd(signal).unwrap();
        c.start_lbd().unwrap();
        assert!(c.lbd_log().contains("reason=file_unchanged"), "after {signal}: {}", c.lbd_log());
        assert_eq!(c.lbctl(&["export"]).unwrap(), edited, "after {signal}, a restart undid lbctl changes");
    }
    // A reload of the unchanged file keeps them too, and says so.
    c.signal_lbd(Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the reload", || c.lbd_log().contains("event=config_unchanged"));
    assert_eq!(c.lbctl(&["export"]).unwrap(), edited, "a reload undid lbctl changes");
    let status = c.lbctl_json(&["status"]).unwrap();
    assert!(status["config"]["last"].as_str().unwrap_or_default().starts_with("unchanged on SIGHUP"), "{status}");

    // The file changes: it is newer than the lbctl changes, and wins, each change logged.
    file.write(&declaring(&[(1, 100), (2, 300), (3, 100)]));
    c.signal_lbd(Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the reload", || c.lbd_log().contains("trigger=SIGHUP changes="));
    assert_eq!(backend_weights(&c), [(b1, 100), (b2, 300), (b3, 100)]);
    assert!(c.lbd_log().contains("event=config_change source="), "{}", c.lbd_log());
}

/// `lbd check -f FILE` in the balancer's namespace, with no lbd needed: exit status and output.
fn lbd_check(c: &spillway_harness::cluster::Cluster, file: &File) -> (Option<i32>, String) {
    let out = c.lbd_once(&["check", "-f", file.path()]).unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn lbd_check_checks_a_file_as_a_start_would() {
    let c = start(XdpMode::Native, 2);
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let file = File::new("config-check");
    let path = file.path();
    let good = format!("[lbd]\niface = \"eth0\"\n\n{}", declaring(&[(1, 100), (2, 100)]));
    file.write(&good);
    assert_eq!(lbd_check(&c, &file), (Some(0), format!("{path}: valid (1 VIPs, 2 backends, 0 rules)\n")));
    let cases = [
        (good.replace("weight = 100", "wieght = 100"), format!("{path}:10:1: vips[0].backends[0].wieght: unknown field `wieght`")),
        (good.replace("iface", "ifac"), format!("{path}:2:8: lbd.ifac: unknown setting of lbd")),
        (good.replace("iface = \"eth0\"", "iface = \"eth9\""), "no interface named \"eth9\"".to_owned()),
        (good.replace("iface = \"eth0\"\n", ""), format!("{path}: lbd: no iface: set iface in [lbd]")),
        (good.replace("weight = 100", "weight = 0"), format!("{path}:10:10: vips[0].backends[0].weight: weight 0 is out of range")),
        (
            format!("{good}\n[[vips]]\nvip = \"10.0.0.2:22/tcp\"\n"),
            format!("{path}:17:7: vips[1].vip: VIP 10.0.0.2:22/tcp: 10.0.0.2 is an address of this balancer (eth0)"),
        ),
    ];
    for (text, message) in cases {
        file.write(&text);
        let (status, output) = lbd_check(&c, &file);
        assert_eq!(status, Some(1), "{output}");
        assert!(output.starts_with("lbd check: ") && output.contains(&message), "{output}\n  lacks {message:?}");
    }
    // Allowed on purpose, the VIP on the balancer's own address passes.
    file.write(&format!("{good}\n[[vips]]\nvip = \"10.0.0.2:22/tcp\"\nallow_local_address = true\n"));
    assert_eq!(lbd_check(&c, &file).0, Some(0));
}

fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    // A signal to this process (a child of another test exiting, when something handles
    // SIGCHLD) interrupts the wait; it is no answer from lbd, so the wait goes on.
    let n = loop {
        match socket.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            received => break received.expect("a notification from lbd within the timeout"),
        }
    };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn sighup_restarts_and_readiness_under_the_unit_s_capabilities() {
    let file = File::new("config-reload");
    file.write(&declaring(&[(1, 100), (2, 100)]));
    let c = start_with(XdpMode::Native, 3, 1, &["--config", file.path()]);
    let vip = tcp_vip(false);
    let (b1, b2, b3) = (backend4(1).to_string(), backend4(2).to_string(), backend4(3).to_string());

    // An lbctl edit survives a restart while the file stays as it was.
    c.lbctl(&["backends", "set-weight", "--vip", &vip, &b2, "50"]).unwrap();
    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains("event=config_used source=state") && c.lbd_log().contains("reason=file_unchanged"), "{}", c.lbd_log());
    assert_eq!(backend_weights(&c), [(b1.clone(), 100), (b2.clone(), 50)]);

    // SIGHUP applies the changed file like lbctl apply.
    file.write(&declaring(&[(1, 100), (2, 100), (3, 100)]));
    c.signal_lbd(Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the reload", || {
        c.lbd_log().contains("event=config_applied") && c.lbd_log().contains("trigger=SIGHUP")
    });
    assert_eq!(backend_weights(&c), [(b1.clone(), 100), (b2.clone(), 100), (b3.clone(), 100)]);
    let status = c.lbctl_json(&["status"]).unwrap();
    assert_eq!(status["config"]["last"], "applied on SIGHUP", "{status}");

    // A bad file on SIGHUP is refused whole: logged, shown by status, nothing changed.
    let before = stable_view(&c, &vip);
    file.write(&declaring(&[(1, 100), (2, 0), (3, 100)]));
    c.signal_lbd(Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the refusal", || c.lbd_log().contains("event=config_refused"));
    let status = c.lbctl_json(&["status"]).unwrap();
    let error = status["config"]["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains(&format!("{}:11:10: vips[0].backends[1].weight: weight 0", file.path())), "{status}");
    assert_eq!(stable_view(&c, &vip), before);

    // A restart with the file as last applied keeps the state; a changed file is applied.
    file.write(&declaring(&[(1, 100), (2, 100), (3, 100)]));
    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains("reason=file_unchanged"), "{}", c.lbd_log());
    // A file that drops a backend still serving (b2) is refused on SIGHUP, as a removed VIP
    // with backends is: its connections would break.
    file.write(&declaring(&[(1, 100), (3, 300)]));
    let before = stable_view(&c, &vip);
    c.signal_lbd(Signal::SIGHUP).unwrap();
    let refusal = format!("removes backend {b2} of {vip}, which still serves");
    wait_until(Duration::from_secs(10), "the refusal", || c.lbd_log().contains(&refusal));
    let status = c.lbctl_json(&["status"]).unwrap();
    let error = status["config"]["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains(&refusal), "{status}");
    assert_eq!(stable_view(&c, &vip), before);
    // Drained first, it goes with the file at the next start.
    c.lbctl(&["backends", "drain", "--vip", &vip, &b2]).unwrap();
    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains("reason=file_changed") && c.lbd_log().contains("event=config_applied"), "{}", c.lbd_log());
    assert_eq!(backend_weights(&c), [(b1.clone(), 100), (b3.clone(), 300)]);

    // Readiness: from nothing attached (cleanup), READY=1 comes once the program is attached
    // and the state restored, with only the unit's capabilities and system calls.
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let cleanup =
        std::process::Command::new(env!("CARGO_BIN_EXE_lbd")).arg("--cleanup").arg("--pin-dir").arg(c.lbd_pin_dir().unwrap()).output();
    assert!(cleanup.unwrap().status.success());
    assert!(!c.topo.lb().run(&["ip", "link", "show", "eth0"]).unwrap().contains("xdp"), "still attached after cleanup");
    let socket_path = c.topo.tempdir().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.spawn_lbd_as_unit(&[unit::deploy_file("spillway.service")], &[("NOTIFY_SOCKET", socket_path.as_os_str())]).unwrap();
    let ready = receive(&socket);
    assert_eq!(ready, "READY=1\nSTATUS=serving vips=1 backends=2", "{}", c.lbd_log());
    // At that moment, with no retry: attached, and the API answers with the state.
    assert!(c.topo.lb().run(&["ip", "link", "show", "eth0"]).unwrap().contains("xdp"), "READY before the program was attached");
    let out = c.lbctl_output(&["vips", "list", "-o", "json"]).unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&vip), "READY before the API answered: {out:?}");
    c.wait_for_lbd().unwrap();
    assert_eq!(c.lbctl_json(&["status"]).unwrap()["interfaces"][0]["attachment"], "attached");
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    // 200 connections: a quarter share is then 50 ± 6 (the check allows ±21; at 40 a flake).
    assert_shares(&connections(&c, tcp_target(false), 200), &shares(&[("b1", 0.25), ("b3", 0.75)]), 200);

    // A reload says RELOADING=1 (with the monotonic time), then READY=1; a stop STOPPING=1.
    c.signal_lbd(Signal::SIGHUP).unwrap();
    let reloading = receive(&socket);
    assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading}");
    assert_eq!(receive(&socket), "READY=1\nSTATUS=serving vips=1 backends=2");
    c.stop_lbd(Signal::SIGTERM).unwrap();
    assert_eq!(receive(&socket), "STOPPING=1");
}
