//! Applying configuration files through the core: one change, all or nothing, the VIP
//! removal guard, export round trips, status.

use std::path::Path;

use super::*;
use crate::{
    store::{ConfigMark, StateFile},
    testing::vip,
};
use spillway_api::{Applied, Exported, Status};
use spillway_model::config::ChangeKind;

const FILE: &str = "\
[[vips]]
vip = \"10.100.0.1:80/tcp\"
ring_size = 251
[[vips.backends]]
address = \"10.0.0.1\"
[[vips.backends]]
address = \"10.0.0.2\"
weight = 50
zone = \"b\"

[[vips]]
vip = \"10.100.0.2:53/udp\"
ring_size = 13
[[vips.backends]]
address = \"10.0.0.3\"

[[rules]]
cidr = \"192.0.2.0/24\"
action = \"block\"
";

impl Fixture {
    fn apply(&mut self, text: &str, dry_run: bool, allow_vip_removal: bool) -> Result<Applied, CoreError> {
        let request = Request::Apply {
            config: text.to_owned(),
            source: "test.toml".to_owned(),
            dry_run,
            allow_vip_removal,
            allow_backend_removal: false,
        };
        self.core.handle(request).map(|reply| match reply {
            Reply::Applied(applied) => applied,
            other => panic!("{other:?}"),
        })
    }

    fn export(&mut self) -> String {
        match self.core.handle(Request::Export).unwrap() {
            Reply::Exported(Exported { config }) => config,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_file_is_applied_as_one_change_and_persisted() {
    let mut f = Fixture::new();
    let applied = f.apply(FILE, false, false).unwrap();
    assert!(applied.applied);
    // Two VIPs, three backends, one rule: six items added, in one change (one flip per VIP).
    assert_eq!(applied.changes.len(), 6, "{:?}", applied.changes);
    assert!(applied.changes.iter().all(|c| c.change == ChangeKind::Added));
    assert_eq!((applied.slots_written, applied.tables_flipped), (251 + 13, 2));
    let state = f.core.state().clone();
    assert_eq!(state.vips[&vip("10.100.0.1:80/tcp")].backends.len(), 2);
    assert_eq!(f.saved().as_ref(), Some(&state));
    // The same file again changes nothing.
    let again = f.apply(FILE, false, false).unwrap();
    assert_eq!((again.changes.len(), again.slots_written, again.tables_flipped), (0, 0, 0));
}

#[test]
fn export_then_apply_changes_nothing_and_lbctl_edits_show() {
    let mut f = Fixture::new();
    f.apply(FILE, false, false).unwrap();
    let v = vip("10.100.0.1:80/tcp");
    f.core.handle(Request::SetWeight { vip: v, backend: "10.0.0.2".parse().unwrap(), weight: 70 }).unwrap();
    f.core.handle(Request::DrainBackend { vip: v, backend: "10.0.0.1".parse().unwrap(), deadline_s: Some(600), force: false }).unwrap();
    let exported = f.export();
    assert!(exported.contains("weight = 70") && exported.contains("drain = true") && exported.contains("drain_deadline = "), "{exported}");
    let before = f.core.state().clone();
    let applied = f.apply(&exported, false, false).unwrap();
    assert_eq!(applied.changes, [], "{exported}");
    assert_eq!(f.core.state(), &before);
    // The original file now differs by exactly those edits.
    let diff = f.apply(FILE, true, false).unwrap();
    let lines: Vec<String> = diff.changes.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("~ backend 10.0.0.1 in 10.100.0.1:80/tcp: drain true -> -, drain_deadline "), "{lines:?}");
    assert_eq!(lines[1], "~ backend 10.0.0.2 in 10.100.0.1:80/tcp: weight 70 -> 50");
}

#[test]
fn a_backend_new_here_gets_a_start_that_the_same_file_again_keeps_and_a_given_one_replaces() {
    let mut f = Fixture::new();
    let applied = f.apply(FILE, false, false).unwrap();
    let (v, b1) = (vip("10.100.0.1:80/tcp"), "10.0.0.1".parse().unwrap());
    assert_eq!(applied.started.len(), 3, "every backend is new here: {:?}", applied.started);
    let given = f.core.state().vips[&v].backends[&b1].started_at_unix_ms;
    assert_eq!(given, Some(applied.started[0].started_at_unix_ms));
    // The same file again (still without starts) restarts nothing, and reports the starts
    // kept, for lbctl to write into the file: once applied, the file is whole.
    let again = f.apply(FILE, false, false).unwrap();
    assert_eq!(again.changes.len(), 0, "{:?}", again.changes);
    assert_eq!(again.started, applied.started);
    // A file with the start another balancer gave: that one.
    let other = FILE.replacen("address = \"10.0.0.1\"", "address = \"10.0.0.1\"\nstarted_at = 2026-11-30T08:00:00Z", 1);
    let applied = f.apply(&other, false, false).unwrap();
    let lines: Vec<String> = applied.changes.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("started_at ") && lines[0].ends_with(" -> \"2026-11-30T08:00:00Z\""), "{lines:?}");
    assert_eq!(f.core.state().vips[&v].backends[&b1].started_at_unix_ms, Some(1_796_025_600_000));
    // The export carries every start: another balancer given it starts none of its own.
    let exported = f.export();
    let mut g = Fixture::new();
    assert_eq!(g.apply(&exported, false, false).unwrap().started, []);
    assert_eq!(g.core.state(), f.core.state());
    // A drain forgets the start; a weight again is a new start.
    f.core.handle(Request::DrainBackend { vip: v, backend: b1, deadline_s: None, force: false }).unwrap();
    assert_eq!(f.core.state().vips[&v].backends[&b1].started_at_unix_ms, None);
    f.core.handle(Request::SetWeight { vip: v, backend: b1, weight: 100 }).unwrap();
    assert!(f.core.state().vips[&v].backends[&b1].started_at_unix_ms.is_some_and(|t| t > 1_796_025_600_000));
}

#[test]
fn a_dry_run_reports_and_changes_nothing() {
    let mut f = Fixture::new();
    let applied = f.apply(FILE, true, false).unwrap();
    assert!(!applied.applied);
    assert_eq!(applied.changes.len(), 6);
    assert_eq!(f.core.state(), &DesiredState::default());
    assert_eq!(f.saved(), None);
    assert!(f.core.maps().vips.is_empty());
}

#[test]
fn bad_files_change_nothing() {
    let mut f = Fixture::new();
    f.apply(FILE, false, false).unwrap();
    let before = (f.core.state().clone(), f.saved(), f.core.maps().vips.clone());
    let bad_weight = FILE.replace("weight = 50", "weight = 0");
    let unknown_setting = format!("[lbd]\nifac = \"eth0\"\n{FILE}");
    for (text, message) in [
        (bad_weight.as_str(), "test.toml:8:10: vips[0].backends[1].weight: weight 0 is out of range"),
        ("", "test.toml: declares nothing"),
        ("[[vips]\n", "test.toml:1:"),
        (unknown_setting.as_str(), "test.toml:2:8: lbd.ifac: unknown setting of lbd"),
    ] {
        let err = f.apply(text, false, false).unwrap_err();
        assert!(err.to_string().contains(message), "{err} lacks {message:?}");
        assert_eq!(err.to_api().kind, ErrorKind::Invalid);
        assert_eq!((f.core.state().clone(), f.saved(), f.core.maps().vips.clone()), before);
    }
}

#[test]
fn removing_a_vip_that_has_backends_is_refused_unless_allowed() {
    let mut f = Fixture::new();
    f.apply(FILE, false, false).unwrap();
    const UDP: &str = "[[vips]]\nvip = \"10.100.0.2:53/udp\"\nring_size = 13\n[[vips.backends]]\naddress = \"10.0.0.3\"\n";
    let without_udp = &FILE.replace(UDP, "");
    let before = f.core.state().clone();
    let err = f.apply(without_udp, false, false).unwrap_err().to_string();
    assert_eq!(
        err,
        "test.toml: removes VIP 10.100.0.2:53/udp (1 backends), whose connections would break; remove or drain its \
         backends first, or apply with --allow-vip-removal"
    );
    assert_eq!(f.core.state(), &before);
    // A dry run shows the whole diff, with what apply would refuse marked.
    let dry = f.apply(&without_udp.replace("weight = 50", "weight = 60"), true, false).unwrap();
    let lines: Vec<String> = dry.changes.iter().map(ToString::to_string).collect();
    let why = " (refused: the VIP has 1 backends, whose connections would break: needs --allow-vip-removal)";
    assert_eq!(
        lines,
        [
            "~ backend 10.0.0.2 in 10.100.0.1:80/tcp: weight 50 -> 60".to_owned(),
            format!("- vip 10.100.0.2:53/udp{why}"),
            format!("- backend 10.0.0.3 in 10.100.0.2:53/udp{why}"),
        ]
    );
    assert_eq!(f.core.state(), &before);
    assert!(f.apply(without_udp, true, true).unwrap().changes.iter().all(|c| c.refused.is_none()));
    // With its backends drained and gone first, the VIP goes without asking.
    let drained = FILE.replace("address = \"10.0.0.3\"\n", "address = \"10.0.0.3\"\ndrain = true\n");
    f.apply(&drained, false, false).unwrap();
    let emptied = FILE.replace(UDP, "[[vips]]\nvip = \"10.100.0.2:53/udp\"\nring_size = 13\n");
    f.apply(&emptied, false, false).unwrap();
    f.apply(without_udp, false, false).unwrap();
    assert!(!f.core.state().vips.contains_key(&vip("10.100.0.2:53/udp")));
    // Or at once, when allowed.
    f.apply(FILE, false, false).unwrap();
    let applied = f.apply(without_udp, false, true).unwrap();
    let removed: Vec<String> = applied.changes.iter().map(ToString::to_string).collect();
    assert_eq!(removed, ["- vip 10.100.0.2:53/udp", "- backend 10.0.0.3 in 10.100.0.2:53/udp"]);
}

#[test]
fn removing_a_serving_backend_is_refused_unless_drained_first_or_allowed() {
    let mut f = Fixture::new();
    f.apply(FILE, false, false).unwrap();
    const B2: &str = "[[vips.backends]]\naddress = \"10.0.0.2\"\nweight = 50\nzone = \"b\"\n";
    let without_b2 = FILE.replace(B2, "");
    let before = f.core.state().clone();
    let err = f.apply(&without_b2, false, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.toml: removes backend 10.0.0.2 of 10.100.0.1:80/tcp, which still serves and whose connections would break; \
         drain it first (lbctl backends drain, or weight = 0 in the file), or apply with --allow-backend-removal"
    );
    assert_eq!(err.to_api().kind, ErrorKind::Invalid);
    assert_eq!(f.core.state(), &before);
    // A dry run marks it.
    let lines: Vec<String> = f.apply(&without_b2, true, false).unwrap().changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        ["- backend 10.0.0.2 in 10.100.0.1:80/tcp (refused: the backend still serves, its connections would break: drain it \
          first, or needs --allow-backend-removal)"]
    );
    // Drained first (by lbctl), it goes without asking.
    f.core
        .handle(Request::DrainBackend {
            vip: vip("10.100.0.1:80/tcp"),
            backend: "10.0.0.2".parse().unwrap(),
            deadline_s: None,
            force: false,
        })
        .unwrap();
    f.apply(&without_b2, false, false).unwrap();
    assert_eq!(f.core.state().vips[&vip("10.100.0.1:80/tcp")].backends.len(), 1);
    // Or at once, when allowed.
    f.apply(FILE, false, false).unwrap();
    let request = Request::Apply {
        config: without_b2,
        source: "test.toml".to_owned(),
        dry_run: false,
        allow_vip_removal: false,
        allow_backend_removal: true,
    };
    f.core.handle(request).unwrap();
    assert_eq!(f.core.state().vips[&vip("10.100.0.1:80/tcp")].backends.len(), 1);
}

#[test]
fn a_backend_past_its_drain_deadline_stays_removed() {
    let mut f = Fixture::new();
    let past = FILE.replace("weight = 50\n", "drain = true\ndrain_deadline = 2001-01-01T00:00:00Z\n");
    let applied = f.apply(&past, false, false).unwrap();
    assert!(!f.core.state().vips[&vip("10.100.0.1:80/tcp")].backends.contains_key(&"10.0.0.2".parse().unwrap()));
    assert_eq!(applied.changes.len(), 5);
    assert_eq!(f.apply(&past, true, false).unwrap().changes, []);
}

#[test]
fn the_config_file_s_mark_is_kept_once_applied() {
    let mut f = Fixture::new();
    let doc = Document::parse("test.toml", FILE.to_owned()).unwrap();
    let path = Path::new("/etc/spillway/spillway.toml");
    f.core.apply_file(&doc, ApplyOptions { mark_as: Some(path.to_owned()), ..ApplyOptions::default() }).unwrap();
    let mark = StateFile::open(f.tmp.path()).unwrap().load_config_mark();
    assert_eq!(mark, Some(ConfigMark::of(path, &doc.desired_state().unwrap())));
    // lbctl apply does not touch it.
    f.apply("vips = []\n", false, true).unwrap();
    assert_eq!(StateFile::open(f.tmp.path()).unwrap().load_config_mark(), mark);
}

#[test]
fn lbctl_apply_of_lbd_s_own_file_takes_it_in_and_no_other_file_does() {
    let mut f = Fixture::new();
    let own = f.tmp.path().join("spillway.toml");
    std::fs::write(&own, FILE).unwrap();
    f.core.set_own_config(own.clone(), None);
    let dir = f.tmp.path().to_owned();
    let mark = || StateFile::open(&dir).unwrap().load_config_mark();
    // Another file (or a dry run of this one): lbd's own file is not taken in.
    f.apply(&FILE.replace("weight = 50", "weight = 60"), false, false).unwrap();
    f.apply(FILE, true, false).unwrap();
    assert_eq!(mark(), None);
    // The same declarations, from any path (a comment more does not count): taken in, so a
    // SIGHUP or a restart finds the file unchanged and keeps what lbctl changes after.
    f.apply(&format!("# edited\n{FILE}"), false, false).unwrap();
    let declared = Document::parse("own", FILE.to_owned()).unwrap();
    assert_eq!(mark(), Some(ConfigMark::of(&own, &declared.desired_state().unwrap())));
    assert!(f.core.own_config_unchanged(&declared));
    // The starts lbctl then writes into the file do not make it a changed file.
    let started = FILE.replacen("address = \"10.0.0.1\"", "address = \"10.0.0.1\"\nstarted_at = 2026-11-30T08:00:00Z", 1);
    assert!(f.core.own_config_unchanged(&Document::parse("own", started).unwrap()));
    let edited = FILE.replace("weight = 50", "weight = 40");
    assert!(!f.core.own_config_unchanged(&Document::parse("own", edited).unwrap()));
}

#[test]
fn status_shows_the_daemon_and_its_maps() {
    let mut f = Fixture::new();
    f.apply(FILE, false, false).unwrap();
    f.core.set_info(DaemonInfo { watcher: Err("tracefs is not mounted".into()), ..DaemonInfo::default() });
    let Reply::Status(status) = f.core.handle(Request::Status).unwrap() else { panic!("not a status") };
    let Status { version, vips, backends, rules, maps, watcher, announcements, health_checks, config, .. } = *status;
    assert_eq!((version.as_str(), vips, backends, rules), (env!("CARGO_PKG_VERSION"), 2, 3, 1));
    assert!(!health_checks);
    assert_eq!(config, None);
    assert_eq!((watcher.state.as_str(), watcher.error.as_deref()), ("not_loaded", Some("tracefs is not mounted")));
    assert_eq!(announcements.state, "off");
    let used = |name: &str| maps.iter().find(|m| m.name == name).and_then(|m| m.used);
    assert_eq!((used("spw_vips"), used("spw_backends")), (Some(2), Some(3)));
}

fn uplink(name: &str, driven: Driven, running: bool) -> UplinkState {
    UplinkState { name: name.into(), driven, running, forwarding_off: None, tx_drops: None }
}

#[test]
fn each_interface_has_its_state_and_its_alert_naming_the_others() {
    let mut f = Fixture::new();
    f.core.set_wanted_uplinks(vec!["eth0".into(), "eth1".into(), "eth2".into()]);
    let mut eth2 = uplink("eth2", Driven::Yes { how: "attached" }, false);
    eth2.forwarding_off = Some("net.ipv4.conf.eth2.forwarding = 0".into());
    f.core.set_uplinks(vec![uplink("eth0", Driven::Yes { how: "took_over" }, true), uplink("eth1", Driven::Gone, false), eth2]);
    let Reply::Status(status) = f.core.handle(Request::Status).unwrap() else { panic!("not a status") };
    let states: Vec<(&str, &str, &str)> =
        status.interfaces.iter().map(|i| (i.name.as_str(), i.state.as_str(), i.attachment.as_str())).collect();
    assert_eq!(states, [("eth0", "up", "took_over"), ("eth1", "gone", "-"), ("eth2", "down", "attached")]);
    assert_eq!(status.interfaces[2].forwarding_off.as_deref(), Some("net.ipv4.conf.eth2.forwarding = 0"));
    let alerts = status.alerts;
    assert!(alerts.iter().any(|a| a.starts_with("ALERT: interface eth1 is gone: VIP traffic goes on through eth0;")), "{alerts:?}");
    assert!(alerts.iter().any(|a| a.starts_with("ALERT: interface eth2 is down") && a.contains("through eth0")), "{alerts:?}");
    assert!(
        alerts.iter().any(|a| a.starts_with("ALERT: forwarding is disabled on eth2 (net.ipv4.conf.eth2.forwarding = 0)")),
        "{alerts:?}"
    );
    assert!(!alerts.iter().any(|a| a.contains("interface eth0")), "{alerts:?}");
    // The last carrier gone too: the alerts say nothing carries VIP traffic.
    f.core.set_uplinks(vec![uplink("eth0", Driven::No { why: "attaching XDP to eth0".into() }, true)]);
    let Reply::Status(status) = f.core.handle(Request::Status).unwrap() else { panic!("not a status") };
    assert_eq!(
        status.alerts,
        ["ALERT: the balancer does not drive eth0 (attaching XDP to eth0): no other interface carries VIP traffic; retried at each check"]
    );
    assert_eq!(status.interfaces[0].error.as_deref(), Some("attaching XDP to eth0"));
}

#[test]
fn a_file_naming_other_interfaces_moves_the_balancer_unless_the_command_line_named_them() {
    use crate::settings::RunningSettings;
    let running = |command_line: &[&str]| {
        let mut settings = RunningSettings::default();
        settings.effective.set("iface", vec!["eth0".into()]);
        if !command_line.is_empty() {
            settings.command_line.set("iface", command_line.iter().map(|s| (*s).to_owned()).collect());
        }
        settings
    };
    let file = |ifaces: &str| format!("{FILE}[lbd]\niface = {ifaces}\n");
    let mut f = Fixture::new();
    f.core.set_wanted_uplinks(vec!["eth0".into()]);
    f.core.set_info(DaemonInfo { settings: running(&[]), ..DaemonInfo::default() });
    // A dry run says what would happen and changes nothing.
    let diff = f.apply(&file(r#"["eth0", "eth1"]"#), true, false).unwrap();
    assert_eq!(diff.notes, ["lbd.iface: the balancer would move from eth0 to eth0,eth1 while running"]);
    assert_eq!(f.core.wanted_uplinks(), ["eth0"]);
    let applied = f.apply(&file(r#"["eth0", "eth1"]"#), false, false).unwrap();
    assert_eq!(applied.notes, ["lbd.iface: the balancer moves from eth0 to eth0,eth1 while running (lbctl status shows each interface)"]);
    assert_eq!(f.core.wanted_uplinks(), ["eth0", "eth1"]);
    // The same list again changes nothing; a single name is a list of one.
    assert!(f.apply(&file(r#"["eth0", "eth1"]"#), false, false).unwrap().notes.is_empty());
    f.apply(&file(r#""eth1""#), false, false).unwrap();
    assert_eq!(f.core.wanted_uplinks(), ["eth1"]);
    let exported = f.export();
    assert!(exported.contains(r#"iface = "eth1""#), "{exported}");
    // The command line wins, as for every setting: the file's list waits.
    let mut f = Fixture::new();
    f.core.set_wanted_uplinks(vec!["eth0".into()]);
    f.core.set_info(DaemonInfo { settings: running(&["eth0"]), ..DaemonInfo::default() });
    let applied = f.apply(&file(r#"["eth0", "eth1"]"#), false, false).unwrap();
    assert_eq!(applied.notes, ["lbd.iface: the file says eth0 eth1, but lbd's command line sets eth0 and wins"]);
    assert_eq!(f.core.wanted_uplinks(), ["eth0"]);
}
