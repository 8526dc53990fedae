//! Every snippet of the documentation, run as written with the real tools (how each kind is
//! marked and checked: `spillway_harness::snippets`), and the shipped `deploy/spillway.toml`
//! and `deploy/agent.toml` the same way: a snippet that rots, or a new one nobody checks,
//! fails here. Needs root (network namespaces) and BIRD 2.

use std::{
    ffi::OsString,
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use clap::{CommandFactory, Parser};
use spillway_announce::include;
use spillway_cli::Cli;
use spillway_daemon::args::LbdArgs;
use spillway_harness::{
    TempDir,
    cluster::Binaries,
    snippets::{BALANCER4, BALANCER6, Kind, Snippet, SnippetHosts, extract, invocations},
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown files whose snippets are checked: the README, ARCHITECTURE.md, and every
/// document under `docs/` (the design notes too) and `bench/`.
fn documents() -> Vec<PathBuf> {
    fn markdown_under(dir: &Path, found: &mut Vec<PathBuf>) {
        for path in fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()) {
            if path.is_dir() {
                markdown_under(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    let mut files = vec![repo().join("README.md"), repo().join("ARCHITECTURE.md")];
    markdown_under(&repo().join("docs"), &mut files);
    markdown_under(&repo().join("bench"), &mut files);
    files
}

/// Every snippet of every document; a fence without a marker fails here.
fn snippets() -> Vec<Snippet> {
    let mut all = Vec::new();
    for file in documents() {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().unwrap().to_string_lossy();
        all.extend(extract(&name, &text).unwrap_or_else(|e| panic!("{e:#}")));
    }
    all
}

fn of_kind(kind: &Kind) -> Vec<Snippet> {
    snippets().into_iter().filter(|s| &s.kind == kind).collect()
}

fn text_of(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `words` (`lbd ...` or `lbctl ...`) parsed by the real command line: every subcommand,
/// flag and value exists and is valid.
fn parses(words: &[String]) -> Result<(), String> {
    let argv = words.iter().map(OsString::from);
    let parsed = match words[0].as_str() {
        "lbd" => LbdArgs::try_parse_from(argv).map(drop),
        _ => Cli::try_parse_from(argv).map(drop),
    };
    parsed.map_err(|e| e.render().to_string())
}

/// ARCHITECTURE.md is a map a newcomer reads in one sitting: what grows past it belongs in
/// docs/design/.
const ARCHITECTURE_MAX_LINES: usize = 600;

#[test]
fn the_architecture_map_stays_a_map() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= ARCHITECTURE_MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, at most {ARCHITECTURE_MAX_LINES}: move detail to docs/design/"
    );
}

#[test]
fn every_fence_is_marked_and_every_command_parses() {
    let all = snippets();
    assert!(all.iter().any(|s| s.kind == Kind::Shell) && all.iter().any(|s| s.kind == Kind::SpillwayToml), "no snippets found");
    let mut commands = 0;
    for snippet in all.iter().filter(|s| matches!(s.kind, Kind::Shell | Kind::ShellInNetns | Kind::Transcript)) {
        if snippet.kind != Kind::Transcript {
            let out = Command::new("bash").arg("-n").arg("-c").arg(&snippet.text).output().unwrap();
            assert!(out.status.success(), "{}: bash -n: {}\n{}", snippet.place, text_of(&out), snippet.text);
        }
        for words in invocations(snippet) {
            parses(&words).unwrap_or_else(|e| panic!("{}: `{}`:\n{e}", snippet.place, words.join(" ")));
            commands += 1;
        }
    }
    assert!(commands > 30, "only {commands} lbd/lbctl commands found in the shell snippets");
}

#[test]
fn network_settings_snippets_run_on_a_balancer_in_a_namespace() {
    let hosts = SnippetHosts::create().unwrap();
    let snippets = of_kind(&Kind::ShellInNetns);
    assert!(!snippets.is_empty(), "no shell-netns snippet found");
    for snippet in snippets {
        hosts.run_shell(&snippet.text).unwrap_or_else(|e| panic!("{}: {e:#}\n{}", snippet.place, snippet.text));
    }
}

#[test]
fn prometheus_snippets_pass_promtool() {
    let dir = tempdir("prometheus");
    for (i, snippet) in of_kind(&Kind::Prometheus).iter().enumerate() {
        let file = dir.path().join(format!("prometheus-{i}.yml"));
        fs::write(&file, &snippet.text).unwrap();
        let out = Command::new("promtool").args(["check", "config"]).arg(&file).output().unwrap();
        assert!(out.status.success(), "{}: promtool check config: {}", snippet.place, text_of(&out));
    }
}

/// `lbd check -f FILE` on the README's balancer (`eth0`, 10.0.0.2 and fd00::2).
fn lbd_check(hosts: &SnippetHosts, file: &Path, env: &[(String, String)]) -> Output {
    let mut cmd = hosts.balancer().cmd(env!("CARGO_BIN_EXE_lbd"));
    cmd.args(["check", "-f"]).arg(file).envs(env.iter().map(|(k, v)| (k, v)));
    cmd.output().unwrap()
}

#[test]
fn configuration_snippets_and_shipped_files_pass_lbd_check() {
    let hosts = SnippetHosts::create().unwrap();
    let mut files: Vec<(String, PathBuf)> =
        ["deploy/spillway.toml", "deploy/agent.toml"].iter().map(|f| (f.to_string(), repo().join(f))).collect();
    let snippets: Vec<Snippet> = snippets().into_iter().filter(|s| matches!(s.kind, Kind::SpillwayToml | Kind::AgentToml)).collect();
    assert!(snippets.iter().any(|s| s.kind == Kind::SpillwayToml), "no spillway.toml snippet found");
    for (i, snippet) in snippets.iter().enumerate() {
        let file = hosts.tempdir().join(format!("snippet-{i}.toml"));
        fs::write(&file, &snippet.text).unwrap();
        files.push((snippet.place.clone(), file));
    }
    for (place, file) in &files {
        let out = lbd_check(&hosts, file, &[]);
        assert!(out.status.success(), "{place}: lbd check -f: {}", text_of(&out));
        assert!(text_of(&out).contains(": valid ("), "{place}: {}", text_of(&out));
    }
}

#[test]
fn lbd_check_checks_an_agent_file_as_the_agent_would() {
    let hosts = SnippetHosts::create().unwrap();
    let file = hosts.tempdir().join("agent.toml");
    let check = |text: &str| {
        fs::write(&file, text).unwrap();
        let out = lbd_check(&hosts, &file, &[]);
        (out.status.code(), text_of(&out))
    };
    let path = file.display().to_string();
    let agent = "[agent]\niface = \"eth0\"\nallow_from = [\"10.0.0.2/32\"]\n";
    assert_eq!(check(agent), (Some(0), format!("{path}: valid (lbd agent on eth0)\n")));
    // With a balancer's part, both are checked; the agent's interface is a backend's.
    let both = format!("vips = []\n[lbd]\niface = \"eth0\"\n\n{}", agent.replace("eth0", "eth7"));
    assert_eq!(check(&both), (Some(0), format!("{path}: valid (0 VIPs, 0 backends, 0 rules; lbd agent on eth7)\n")));
    for (text, message) in [
        (agent.replace("iface = \"eth0\"\n", ""), format!("{path}: agent: no iface: set iface in [agent]")),
        (agent.replace("eth0", "eth9"), "no interface named \"eth9\"".to_owned()),
        (agent.replace("allow_from = [\"10.0.0.2/32\"]\n", ""), format!("{path}: agent: refusing to start without --allow-from")),
        (format!("{agent}zone = \"a\"\n"), format!("{path}:4:8: agent.zone: unknown setting of agent")),
        (both.replace("allow_from = [\"10.0.0.2/32\"]\n", ""), format!("{path}: agent: refusing to start without --allow-from")),
        (both.replace("[lbd]\niface = \"eth0\"\n", "[lbd]\n"), format!("{path}: lbd: no iface: set iface in [lbd]")),
    ] {
        let (status, output) = check(&text);
        assert_eq!(status, Some(1), "{text:?}: {output}");
        assert!(output.starts_with("lbd check: ") && output.contains(&message), "{text:?}: {output}\n  lacks {message:?}");
    }
}

/// The BGP protocols of a BIRD configuration (`protocol bgp NAME ...`) whose line holds
/// `filter` (a neighbour, say); every one when `filter` is empty.
fn bgp_protocols<'a>(config: &'a str, filter: &[&str]) -> Vec<&'a str> {
    let lines = config.lines().filter(|l| filter.is_empty() || filter.iter().any(|f| l.contains(f)));
    lines.filter_map(|l| l.trim_start().strip_prefix("protocol bgp ")?.split_whitespace().next()).collect()
}

#[test]
fn bird_snippets_parse_and_announce_a_vip_from_balancer_to_router() {
    let hosts = SnippetHosts::create().unwrap();
    let (routers, balancers) = (of_kind(&Kind::BirdRouter), of_kind(&Kind::BirdBalancer));
    assert!(!routers.is_empty() && !balancers.is_empty(), "a router's and a balancer's BIRD snippet");
    for (i, snippet) in routers.iter().chain(&balancers).enumerate() {
        hosts.bird_parses(&format!("parse-{i}.conf"), &snippet.text).unwrap_or_else(|e| panic!("{}: {e:#}", snippet.place));
    }
    // Started as written, but for lbd's include directory: one of the test's, holding what
    // lbd writes there to announce a VIP of each family.
    let include_dir = hosts.tempdir().join("spillway-bird");
    fs::create_dir(&include_dir).unwrap();
    let vips: [IpAddr; 2] = ["192.0.2.10".parse().unwrap(), "2001:db8::10".parse().unwrap()];
    fs::write(include_dir.join("vips.conf"), include::render(&vips.map(|vip| (vip, false)))).unwrap();
    for router in &routers {
        for balancer in &balancers {
            let config = balancer.text.replace("/run/spillway-bird", &include_dir.display().to_string());
            let to_balancer = bgp_protocols(&router.text, &[&format!("neighbor {BALANCER4} "), &format!("neighbor {BALANCER6} ")]);
            let uplinks = bgp_protocols(&balancer.text, &[]);
            assert!(
                !to_balancer.is_empty() && !uplinks.is_empty(),
                "{} and {}: no BGP sessions between them",
                router.place,
                balancer.place
            );
            let started = hosts.start_bird_pair(&router.text, &config, (&to_balancer, &uplinks));
            let daemons = started.unwrap_or_else(|e| panic!("{} with {}: {e:#}", router.place, balancer.place));
            // The announcement reaches the router's kernel, as ECMP would use it.
            for prefix in ["192.0.2.10/32", "2001:db8::10/128"] {
                hosts.wait_for_router_route(prefix).unwrap_or_else(|e| panic!("{} with {}: {e:#}", router.place, balancer.place));
            }
            drop(daemons);
        }
    }
}

#[test]
fn systemd_drop_ins_verify_with_their_units() {
    let drop_ins: Vec<Snippet> = snippets().into_iter().filter(|s| matches!(s.kind, Kind::SystemdDropIn(_))).collect();
    assert!(!drop_ins.is_empty(), "no systemd drop-in snippet found");
    let lbd_envs: Vec<String> =
        LbdArgs::command().get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect();
    for (i, snippet) in drop_ins.iter().enumerate() {
        let Kind::SystemdDropIn(unit) = &snippet.kind else { unreachable!() };
        let dir = tempdir(&format!("drop-in-{i}"));
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_lbd")).parent().unwrap().display().to_string();
        let shipped =
            fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap_or_else(|e| panic!("{}: {unit}: {e}", snippet.place));
        let filled = shipped.replace("@BINDIR@", &bin_dir).replace("@SYSCONFDIR@", &dir.path().display().to_string());
        fs::write(dir.path().join(unit), filled).unwrap();
        fs::create_dir(dir.path().join(format!("{unit}.d"))).unwrap();
        fs::write(dir.path().join(format!("{unit}.d/snippet.conf")), &snippet.text).unwrap();
        // The unit's Documentation= pages, where man finds them.
        let man8 = dir.path().join("man/man8");
        fs::create_dir_all(&man8).unwrap();
        let bins = Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
        for bin in [&bins.lbd, &bins.lbctl] {
            let out = Command::new(bin).args(["man", "--dir"]).arg(&man8).output().unwrap();
            assert!(out.status.success(), "{} man: {}", bin.display(), text_of(&out));
        }
        let verify =
            Command::new("systemd-analyze").arg("verify").arg(dir.path().join(unit)).env("MANPATH", dir.path().join("man")).output();
        let out = verify.unwrap();
        assert!(out.status.success() && text_of(&out).is_empty(), "{}: systemd-analyze verify: {}", snippet.place, text_of(&out));
        // Every lbd variable it sets is one lbd reads.
        for line in snippet.text.lines() {
            let Some(name) = line.strip_prefix("Environment=").and_then(|a| a.split('=').next()) else { continue };
            assert!(lbd_envs.iter().any(|e| e == name), "{}: lbd reads no {name}; it reads {}", snippet.place, lbd_envs.join(", "));
        }
    }
}

/// A directory of this test's (`spw-<pid>-...`, so a killed run's is swept), removed on drop.
fn tempdir(label: &str) -> TempDir {
    TempDir::create(std::env::temp_dir().join(format!("spw-{}-snippets-{label}", std::process::id()))).unwrap()
}
