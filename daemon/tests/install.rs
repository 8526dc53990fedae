//! The install path (`deploy/install.sh`, what `./x install` runs) into a temporary prefix
//! and a staging root, with the real binaries: every file in place, the units verified by
//! `systemd-analyze verify` (their man pages found where they were installed) and scored
//! by `systemd-analyze security` (at most 3.0, the agent's --all-netns drop-in too), the bash
//! completion a valid script, the man pages rendered by `man`, the example configuration
//! valid and naming the install's configuration directory, and an operator's configuration
//! never replaced.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use spillway_model::config::Document;

struct Dir(PathBuf);

impl Dir {
    fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!("spw-{}-{label}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn install(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/install.sh");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lbd")).parent().unwrap().to_owned();
    let out = Command::new(script).arg("--bin-dir").arg(bin_dir).args(args).env_remove("DESTDIR").output().unwrap();
    assert!(out.status.success(), "install.sh {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The most `systemd-analyze security` may score a shipped unit ("OK" goes up to 4.9).
const MAX_EXPOSURE: f64 = 3.0;

/// `systemd-analyze security --offline`'s overall exposure of the unit `args` name.
fn exposure(args: &[&str]) -> f64 {
    let out = Command::new("systemd-analyze").args(["security", "--offline=yes", "--no-pager"]).args(args).output().unwrap();
    assert!(out.status.success(), "systemd-analyze security {args:?}: {}", text(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    let line =
        report.lines().find(|l| l.contains("Overall exposure level for ")).unwrap_or_else(|| panic!("no overall exposure:\n{report}"));
    let score = line.split(": ").nth(1).and_then(|rest| rest.split_whitespace().next()).and_then(|n| n.parse().ok());
    score.unwrap_or_else(|| panic!("unparsable: {line}"))
}

#[test]
fn installs_into_a_prefix_and_the_units_verify() {
    let dir = Dir::new("install");
    let prefix = dir.0.to_str().unwrap();
    let etc = format!("{prefix}/etc");
    // --prefix alone: everything in the prefix, the configuration too.
    let out = install(&["--prefix", prefix]);
    assert!(!text(&out).contains("installed /etc/"), "{}", text(&out));
    let p = |rel: &str| dir.0.join(rel);
    for (file, mode) in [
        ("bin/lbd", 0o755),
        ("bin/lbctl", 0o755),
        ("lib/systemd/system/spillway.service", 0o644),
        ("lib/systemd/system/spillway-agent.service", 0o644),
        // The balancer's file holds the fleet's secret seed.
        ("etc/spillway/spillway.toml", 0o600),
        ("etc/spillway/agent.toml", 0o600),
        ("share/doc/spillway/spillway.toml", 0o644),
        ("share/doc/spillway/spillway-agent-all-netns.conf", 0o644),
        ("share/bash-completion/completions/lbctl", 0o644),
        ("share/bash-completion/completions/lbd", 0o644),
        ("share/zsh/site-functions/_lbctl", 0o644),
        ("share/fish/vendor_completions.d/lbctl.fish", 0o644),
        ("share/man/man8/lbd.8", 0o644),
        ("share/man/man8/lbd-agent.8", 0o644),
        ("share/man/man8/lbctl.8", 0o644),
        ("share/man/man8/lbctl-apply.8", 0o644),
        ("share/man/man8/lbd-check.8", 0o644),
        ("share/man/man5/spillway.toml.5", 0o644),
    ] {
        let meta = fs::metadata(p(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
    }

    // The units name the installed binary and configuration, and systemd accepts them as
    // they are: no warning at all.
    let unit = fs::read_to_string(p("lib/systemd/system/spillway.service")).unwrap();
    assert!(unit.contains(&format!("ExecStart={prefix}/bin/lbd --config {etc}/spillway/spillway.toml")), "{unit}");
    // The file is checked before every start and reload, and a reload only signals after it passed.
    let check = format!("{prefix}/bin/lbd check -f {etc}/spillway/spillway.toml");
    assert!(unit.contains(&format!("\nExecStartPre=-{check}\n")), "{unit}");
    assert!(unit.contains(&format!("\nExecReload={check}\nExecReload=/bin/kill -HUP $MAINPID\n")), "{unit}");
    let agent = fs::read_to_string(p("lib/systemd/system/spillway-agent.service")).unwrap();
    assert!(agent.contains(&format!("{etc}/spillway/agent.toml")), "{agent}");
    // `@NAME@` (`@system-service` is a system call group).
    let placeholder = |text: &str| {
        let between: Vec<&str> = text.split('@').collect();
        between[1..between.len().saturating_sub(1).max(1)]
            .iter()
            .any(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
    };
    assert!(!placeholder(&unit) && !placeholder(&agent), "an unfilled placeholder:\n{unit}\n{agent}");
    let units = [p("lib/systemd/system/spillway.service"), p("lib/systemd/system/spillway-agent.service")];
    let verify = Command::new("systemd-analyze").arg("verify").args(&units).env("MANPATH", p("share/man")).output().unwrap();
    assert!(verify.status.success() && text(&verify).is_empty(), "systemd-analyze verify: {}", text(&verify));
    // Sandboxed: every exposure left is commented in the unit.
    for unit in &units {
        let score = exposure(&[unit.to_str().unwrap()]);
        assert!(score <= MAX_EXPOSURE, "{}: exposure {score} > {MAX_EXPOSURE}", unit.display());
    }
    // The agent with its --all-netns drop-in, as an operator installs them.
    let root = Dir::new("install-security");
    let system = root.0.join("etc/systemd/system");
    fs::create_dir_all(system.join("spillway-agent.service.d")).unwrap();
    fs::copy(p("lib/systemd/system/spillway-agent.service"), system.join("spillway-agent.service")).unwrap();
    fs::copy(p("share/doc/spillway/spillway-agent-all-netns.conf"), system.join("spillway-agent.service.d/all-netns.conf")).unwrap();
    let with_drop_in = exposure(&[&format!("--root={}", root.0.display()), "spillway-agent.service"]);
    assert!(with_drop_in > exposure(&[units[1].to_str().unwrap()]), "the drop-in was not read");
    assert!(with_drop_in <= MAX_EXPOSURE, "spillway-agent.service with all-netns.conf: exposure {with_drop_in} > {MAX_EXPOSURE}");

    let bash = Command::new("bash").arg("-n").arg(p("share/bash-completion/completions/lbctl")).output().unwrap();
    assert!(bash.status.success(), "{}", text(&bash));
    let man = Command::new("man")
        .arg("-l")
        .arg(p("share/man/man8/lbd.8"))
        .env("MANWIDTH", "100")
        .env("MAN_KEEP_FORMATTING", "0")
        .output()
        .unwrap();
    assert!(man.status.success(), "{}", text(&man));
    let page = String::from_utf8_lossy(&man.stdout).replace(['\u{8}', '_'], "");
    assert!(page.contains("config") && page.contains("agent"), "{page}");

    let man = Command::new("man").args(["-l"]).arg(p("share/man/man5/spillway.toml.5")).env("MANWIDTH", "100").output().unwrap();
    let page = String::from_utf8_lossy(&man.stdout).replace(['\u{8}', '_'], "");
    assert!(man.status.success() && page.contains("[vips.health.policy]") && page.contains("SEE ALSO"), "{page}");

    let config = Document::read(&p("etc/spillway/spillway.toml")).unwrap();
    config.desired_state().unwrap();
    assert_eq!(config.lbd().unwrap()["iface"].as_str(), Some("eth0"));
    // The agent's file names the key where this install keeps its configuration.
    let agent_file = Document::read(&p("etc/spillway/agent.toml")).unwrap();
    let key = format!("{etc}/spillway/report.key");
    assert_eq!(agent_file.agent().unwrap()["report_key"].as_str(), Some(key.as_str()));
    let installed = fs::read_to_string(p("etc/spillway/spillway.toml")).unwrap();
    assert!(installed.contains(&format!("# report_key = \"{key}\"")) && !installed.contains("\"/etc/spillway/"), "{installed}");
    // A random fleet seed, never the public default, different on every install.
    let seed = |dir: &Path| Document::read(&dir.join("etc/spillway/spillway.toml")).unwrap().lbd().unwrap()["flow_hash_seed"].clone();
    let first = seed(&dir.0);
    assert!(first.as_str().is_some_and(|s| s.starts_with("0x") && s.len() == 10 && s != "0x5370696c"), "{first:?}");
    let other = Dir::new("install-seed");
    install(&["--prefix", other.0.to_str().unwrap()]);
    assert_ne!(seed(&other.0), first, "two installs wrote the same seed");
    let version = Command::new(p("bin/lbctl")).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("lbctl "), "{}", text(&version));

    // Installing again keeps the operator's configuration.
    fs::write(p("etc/spillway/spillway.toml"), "vips = []\n").unwrap();
    let again = install(&["--prefix", prefix]);
    assert!(text(&again).contains(&format!("kept {etc}/spillway/spillway.toml")), "{}", text(&again));
    assert_eq!(fs::read_to_string(p("etc/spillway/spillway.toml")).unwrap(), "vips = []\n");
}

#[test]
fn stages_under_a_destdir_with_the_final_paths() {
    let dir = Dir::new("install-destdir");
    let out = install(&["--destdir", dir.0.to_str().unwrap()]);
    assert!(text(&out).contains("installed /usr/local/bin/lbd"), "{}", text(&out));
    let unit = fs::read_to_string(dir.0.join("usr/local/lib/systemd/system/spillway.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/lbd --config /etc/spillway/spillway.toml"), "{unit}");
    assert!(dir.0.join("usr/local/bin/lbctl").exists() && dir.0.join("etc/spillway/spillway.toml").exists());
    // A system prefix keeps /etc/spillway, in the files too.
    let agent = fs::read_to_string(dir.0.join("etc/spillway/agent.toml")).unwrap();
    assert!(agent.contains("report_key = \"/etc/spillway/report.key\""), "{agent}");
    assert!(dir.0.join("usr/local/share/man/man8/lbctl-status.8").exists());
}

#[test]
fn sysconfdir_wins_over_the_prefix_and_system_prefixes_keep_etc() {
    let dir = Dir::new("install-sysconfdir");
    let root = dir.0.to_str().unwrap();
    let (prefix, etc) = (format!("{root}/opt"), format!("{root}/conf"));
    install(&["--prefix", &prefix, "--sysconfdir", &etc]);
    let unit = fs::read_to_string(dir.0.join("opt/lib/systemd/system/spillway.service")).unwrap();
    assert!(unit.contains(&format!("ExecStart={prefix}/bin/lbd --config {etc}/spillway/spillway.toml")), "{unit}");
    assert!(dir.0.join("conf/spillway/spillway.toml").exists() && !dir.0.join("opt/etc").exists());
    // A package's /usr keeps the configuration in /etc (staged here under the destdir).
    let staged = dir.0.join("pkg");
    install(&["--prefix", "/usr", "--destdir", staged.to_str().unwrap()]);
    let unit = fs::read_to_string(staged.join("usr/lib/systemd/system/spillway.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/lbd --config /etc/spillway/spillway.toml"), "{unit}");
    assert!(staged.join("etc/spillway/spillway.toml").exists());
}
