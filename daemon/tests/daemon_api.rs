//! The real `lbd` and `lbctl` without traffic: a veth pair in a fresh network namespace,
//! the control API driven through `lbctl`, refusals, a SIGKILL and a hitless restart, the
//! backend agent, and `lbd --cleanup`. Needs root.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::{Command, ExitStatus, Output},
    thread,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData, PerCpuArray, PerCpuValues},
    programs::links::{FdLink, PinnedLink},
};
use serde_json::Value;
use spillway_common::{
    limits::{PIN_VERSION, map_names},
    types::{Observed, Reason, RuleCounters, RuleSlot},
};
use spillway_harness::{Daemon, Lbctl, START_TIMEOUT, Sandbox, Signal};

const LBD: &str = env!("CARGO_BIN_EXE_lbd");
/// How long a signalled daemon may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const V4: &str = "10.100.0.1:80/tcp";
const V6: &str = "[fd00:100::1]:0/udp";

fn lbctl() -> std::path::PathBuf {
    spillway_harness::cluster::Binaries::beside(LBD).lbctl
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One test's namespace (with veth0 10.99.0.1/24 <-> veth1), pin directory and temp
/// directory (the harness's [`Sandbox`]), and the daemon running in it; all removed on
/// drop, panics included.
struct Env {
    sandbox: Sandbox,
    pin_dir: PathBuf,
    ctl: Lbctl,
    daemon: Option<Daemon>,
}

impl Env {
    fn new(tag: &str) -> Self {
        let sandbox = Sandbox::build(&format!("api-{tag}")).expect("building the namespace");
        let pin_dir = std::path::Path::new("/sys/fs/bpf").join(sandbox.netns().name());
        let ctl = Lbctl::new(lbctl(), sandbox.dir().join("api.sock"));
        let env = Env { sandbox, pin_dir, ctl, daemon: None };
        for args in [
            &["ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"][..],
            &["ip", "addr", "add", "10.99.0.1/24", "dev", "veth0"],
            &["ip", "link", "set", "veth0", "up"],
            &["ip", "link", "set", "veth1", "up"],
            &["ip", "link", "set", "lo", "up"],
        ] {
            env.ip(args);
        }
        env.set_forwarding("1");
        // World-traversable, so the unprivileged lbctl below meets the socket's own mode.
        fs::set_permissions(env.sandbox.dir(), fs::Permissions::from_mode(0o755)).unwrap();
        env
    }

    /// Runs `args` (program first) in the namespace; panics on a failure.
    fn ip(&self, args: &[&str]) -> String {
        self.sandbox.netns().run(args).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn socket(&self) -> PathBuf {
        self.sandbox.dir().join("api.sock")
    }

    /// Sets veth0's forwarding sysctls (both families), which lbd requires.
    fn set_forwarding(&self, value: &str) {
        for family in ["ipv4", "ipv6"] {
            self.sandbox.netns().sysctl(&format!("net.{family}.conf.veth0.forwarding"), value).unwrap_or_else(|e| panic!("{e:#}"));
        }
    }

    fn forwarding(&self, family: &str) -> String {
        self.ip(&["sysctl", "-n", &format!("net.{family}.conf.veth0.forwarding")]).trim().to_owned()
    }

    fn state_file(&self) -> PathBuf {
        self.sandbox.dir().join("state/state.json")
    }

    fn link_pin(&self) -> PathBuf {
        self.pin_dir.join(format!("v{PIN_VERSION}/links/veth0"))
    }

    /// Spawns `lbd args...` in the namespace, logging to a new file; returns the log path.
    fn spawn(&mut self, args: &[&str]) -> PathBuf {
        assert!(self.daemon.is_none(), "a daemon is already running");
        let daemon = self.sandbox.netns().spawn(&[&[LBD][..], args].concat()).unwrap_or_else(|e| panic!("{e:#}"));
        let log = daemon.log_path().to_owned();
        self.daemon = Some(daemon);
        log
    }

    /// The daemon's command line for this environment.
    fn lbd_args(&self) -> Vec<String> {
        let path = |p: PathBuf| p.to_str().unwrap().to_owned();
        // The backends here are addresses nobody answers on: health checks (tested end to end
        // elsewhere) would only make the listings change over time.
        // veth0 has no IPv6 address: the IPv6 backends need an outer source of their family.
        let mut args: Vec<String> =
            ["--iface", "veth0", "--xdp-mode", "generic", "--no-health-checks", "--outer-src6", "fd00:99::1"].map(String::from).into();
        args.extend(["--api".into(), path(self.socket()), "--state-dir".into(), path(self.sandbox.dir().join("state"))]);
        args.extend(["--pin-dir".into(), path(self.pin_dir.clone())]);
        args
    }

    /// Starts `lbd` and waits until its API answers; returns its log path.
    fn start_lbd(&mut self) -> PathBuf {
        let args = self.lbd_args();
        let log = self.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let daemon = self.daemon.as_ref().unwrap();
        self.ctl.wait_for_lbd(&|| daemon.is_running(), &|| daemon.log()).unwrap_or_else(|e| panic!("{e:#}"));
        log
    }

    fn wait_until(&mut self, log: &std::path::Path, ready: impl Fn(&Env) -> bool) {
        let started = Instant::now();
        while !ready(self) {
            if let Some(status) = self.daemon.as_ref().and_then(|d| d.wait_with_timeout(Duration::ZERO).unwrap()) {
                panic!("daemon exited ({status}) while starting:\n{}", fs::read_to_string(log).unwrap_or_default());
            }
            assert!(started.elapsed() < START_TIMEOUT, "daemon not ready:\n{}", fs::read_to_string(log).unwrap_or_default());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the daemon to exit by itself.
    fn exited(&mut self) -> ExitStatus {
        let daemon = self.daemon.take().expect("no daemon running");
        daemon.wait_with_timeout(EXIT_TIMEOUT).unwrap().unwrap_or_else(|| panic!("daemon still running:\n{}", daemon.log()))
    }

    /// Sends `signal` to the daemon and waits for it to exit.
    fn stop(&mut self, signal: Signal) -> ExitStatus {
        self.daemon.as_ref().expect("no daemon running").signal(signal).unwrap();
        self.exited()
    }

    fn lbctl(&self, args: &[&str]) -> Output {
        self.ctl.output(args).unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.lbctl(args);
        assert!(out.status.success(), "lbctl {args:?} failed: {}", stderr(&out));
        stdout(&out)
    }

    fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(&[args, &["-o", "json"][..]].concat());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("lbctl {args:?}: {e}: {text}"))
    }

    /// Runs lbctl expecting failure; returns its stderr.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.lbctl(args);
        assert!(!out.status.success(), "lbctl {args:?} succeeded: {}", stdout(&out));
        assert!(out.stdout.is_empty(), "lbctl {args:?} printed {}", stdout(&out));
        stderr(&out)
    }

    /// What the daemon's API and state file say: compared across refusals and restarts.
    fn snapshot(&self) -> (Value, Vec<Value>, Vec<u8>) {
        let vips = self.json(&["vips", "list"]);
        let backends = vips["vips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| self.json(&["backends", "list", "--vip", v["vip"].as_str().unwrap()]))
            .collect();
        (vips, backends, fs::read(self.state_file()).unwrap())
    }

    /// `(link id, program id)` of the pinned balancer link, as the kernel reports them.
    fn pinned_link(&self) -> (u32, u32) {
        let link = FdLink::from(PinnedLink::from_pin(self.link_pin()).expect("opening the pinned link"));
        let info = link.info().expect("the pinned link's info");
        (info.id(), info.program_id())
    }

    fn xdp_on(&self, iface: &str) -> bool {
        self.ip(&["ip", "link", "show", iface]).contains("xdp")
    }

    fn cleanup_pins(&self) -> Output {
        Command::new(LBD).args(["--cleanup", "--pin-dir"]).arg(&self.pin_dir).output().unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // The daemon first (the sandbox stops what is left of it and removes the namespace
        // and directory after this), then what it pinned.
        if let Some(daemon) = self.daemon.take() {
            let _ = daemon.signal(Signal::SIGKILL);
            let _ = daemon.wait_with_timeout(EXIT_TIMEOUT);
        }
        if self.pin_dir.exists() {
            let _ = self.cleanup_pins();
            let _ = fs::remove_dir_all(&self.pin_dir);
        }
    }
}

fn backends_of(list: &Value) -> Vec<(String, u64, String)> {
    list["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["address"].as_str().unwrap().to_owned(), b["weight"].as_u64().unwrap(), b["state"].as_str().unwrap().to_owned()))
        .collect()
}

fn b(address: &str, weight: u64, state: &str) -> (String, u64, String) {
    (address.to_owned(), weight, state.to_owned())
}

#[test]
fn lbctl_drives_lbd_which_survives_a_kill_and_cleans_up() {
    let mut env = Env::new("e2e");
    env.start_lbd();

    // Adding.
    assert_eq!(env.ok(&["vips", "add", V4, "--ring-size", "251"]), format!("added VIP {V4}\n"));
    env.ok(&["vips", "add", V6, "--ring-size", "13", "--encap", "gue"]);
    env.ok(&["backends", "add", "--vip", V4, "10.99.0.2"]);
    env.ok(&["backends", "add", "--vip", V4, "10.99.0.3", "--weight", "50"]);
    env.ok(&["backends", "add", "--vip", V6, "fd00::2"]);
    let mut vips = env.json(&["vips", "list"]);
    for vip in vips["vips"].as_array_mut().unwrap() {
        let digest = vip.as_object_mut().unwrap().remove("table_digest").unwrap();
        assert!(digest.as_str().is_some_and(|d| d.len() == 16 && d.bytes().all(|b| b.is_ascii_hexdigit())), "{digest}");
    }
    assert_eq!(
        vips,
        serde_json::json!({"vips": [
            {"vip": V4, "ring_size": 251, "encap": "ipip", "hash": "5-tuple", "backends": 2},
            {"vip": V6, "ring_size": 13, "encap": "gue", "hash": "5-tuple", "backends": 1},
        ]})
    );
    let list = env.json(&["backends", "list", "--vip", V4]);
    assert_eq!(list["vip"], V4);
    assert_eq!(backends_of(&list), [b("10.99.0.2", 100, "active"), b("10.99.0.3", 50, "active")]);
    let table = env.ok(&["vips", "list"]);
    assert!(table.starts_with("VIP ") && table.contains("10.100.0.1:80/tcp"), "{table}");

    // Refusals name the problem, exit non-zero and change nothing.
    let before = env.snapshot();
    for (args, problem) in [
        (&["vips", "add", "10.100.0.9:80/sctp"][..], "expected <IP>:<PORT>/<tcp|udp>"),
        (&["vips", "add", V4], "already exists"),
        (&["vips", "add", "10.100.0.9:80/tcp", "--ring-size", "100"], "ring size 100"),
        (&["vips", "remove", "10.100.0.9:80/tcp"], "unknown VIP 10.100.0.9:80/tcp"),
        (&["backends", "add", "--vip", "10.100.0.9:80/tcp", "10.99.0.4"], "unknown VIP"),
        (&["backends", "add", "--vip", V4, "10.99.0.2"], "backend 10.99.0.2 already exists"),
        (&["backends", "add", "--vip", V4, "10.99.0.4", "--weight", "0"], "1..=1000000"),
        (&["backends", "add", "--vip", V4, "10.99.0.4", "--weight", "1000001"], "1..=1000000"),
        (&["backends", "add", "--vip", V4, "10.99.0"], "invalid value"),
        (&["backends", "add", "--vip", V6, "10.99.0.4"], "needs an IPv6 backend"),
        (&["backends", "remove", "--vip", V4, "10.99.0.9"], "backend 10.99.0.9 is not in VIP"),
        (&["backends", "drain", "--vip", V4, "10.99.0.9"], "is not in VIP"),
        (&["backends", "list", "--vip", "10.100.0.9:80/tcp"], "unknown VIP"),
        (&["vips", "encap", "10.100.0.9:80/tcp", "gue"], "unknown VIP"),
        (&["vips", "add", "10.100.0.9:80/tcp", "--encap", "gre"], "invalid value 'gre' for '--encap <ENCAP>'"),
        (&["backends", "options", "--vip", V4, "10.99.0.2", "--encap", "vxlan"], "--encap"),
    ] {
        let err = env.refused(args);
        assert!(err.contains(problem), "lbctl {args:?}: {err:?} lacks {problem:?}");
    }
    assert_eq!(env.snapshot(), before, "a refused request changed something");

    // Draining, reweighting, removing.
    let drained = env.ok(&["backends", "drain", "--vip", V4, "10.99.0.3"]);
    assert!(drained.contains("existing flows stay"), "{drained}");
    assert_eq!(backends_of(&env.json(&["backends", "list", "--vip", V4]))[1], b("10.99.0.3", 0, "draining"));
    env.ok(&["backends", "set-weight", "--vip", V4, "10.99.0.3", "20"]);
    assert_eq!(backends_of(&env.json(&["backends", "list", "--vip", V4]))[1], b("10.99.0.3", 20, "active"));
    env.ok(&["backends", "drain", "--vip", V4, "10.99.0.3"]);
    env.ok(&["backends", "remove", "--vip", V4, "10.99.0.2"]);
    // A VIP that still has a backend goes only with --force, and the refusal says so.
    let err = env.refused(&["vips", "remove", V6]);
    assert!(err.contains("has 1 backends and 0 live connections") && err.contains("--force"), "{err}");
    env.ok(&["vips", "remove", V6, "--force"]);
    assert_eq!(backends_of(&env.json(&["backends", "list", "--vip", V4])), [b("10.99.0.3", 0, "draining")]);
    assert_eq!(env.json(&["vips", "list"])["vips"].as_array().unwrap().len(), 1);

    // Stats: every VIP and backend, every reason under its label.
    let stats = env.json(&["stats"]);
    assert_eq!(stats["vips"][0]["vip"], V4);
    assert_eq!(stats["vips"][0]["backends"][0]["address"], "10.99.0.3");
    assert!(stats["vips"][0]["packets"].is_u64() && stats["vips"][0]["bytes"].is_u64());
    let reasons: Vec<&str> = stats["reasons"].as_array().unwrap().iter().map(|r| r["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, Reason::ALL.iter().map(|r| r.label()).collect::<Vec<_>>());

    // Only root gets in: by the socket's mode, and by the peer check behind it.
    let as_nobody = |env: &Env| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(lbctl())
            .args(["vips", "list"])
            .env("SPILLWAY_API", env.socket())
            .output()
            .unwrap();
        assert!(!out.status.success(), "an unprivileged lbctl got in: {}", stdout(&out));
        stderr(&out)
    };
    assert!(as_nobody(&env).contains("you must be root"));
    fs::set_permissions(env.socket(), fs::Permissions::from_mode(0o666)).unwrap();
    let refused = as_nobody(&env);
    assert!(refused.contains("root only") && refused.contains("you must be root"), "{refused}");
    fs::set_permissions(env.socket(), fs::Permissions::from_mode(0o600)).unwrap();

    // Killed: forwarding state stays pinned and attached while nothing runs.
    let before = env.snapshot();
    let (link_id, prog_id) = env.pinned_link();
    env.stop(Signal::SIGKILL);
    assert_eq!(env.pinned_link(), (link_id, prog_id), "the link changed while lbd was down");
    assert!(env.xdp_on("veth0"), "the program was detached when lbd died");
    let down = env.refused(&["vips", "list"]);
    assert_eq!(down, format!("lbctl: lbd is not running (no socket at {})\n", env.socket().display()));

    // Restarted: takes the same link over with a new program, writes no slot, same state.
    let log = env.start_lbd();
    let log = fs::read_to_string(log).unwrap();
    assert!(log.contains("event=took_over "), "{log}");
    assert!(log.contains("slots_written=0 tables_flipped=0"), "{log}");
    let (new_link_id, new_prog_id) = env.pinned_link();
    assert_eq!(new_link_id, link_id, "the restart replaced the link instead of taking it over");
    assert_ne!(new_prog_id, prog_id, "the restart did not load its own program");
    assert_eq!(env.snapshot(), before);

    // Its first neighbour upkeep round made the kernel resolve the (silent) backend.
    let started = Instant::now();
    while env.ip(&["ip", "neigh", "show", "10.99.0.3"]).trim().is_empty() {
        assert!(started.elapsed() < START_TIMEOUT, "no neighbour entry for backend 10.99.0.3");
        thread::sleep(Duration::from_millis(50));
    }

    // Stopped cleanly: the socket goes, forwarding stays.
    assert!(env.stop(Signal::SIGTERM).success());
    assert!(!env.socket().exists());
    assert_eq!(env.pinned_link().0, link_id);
    assert!(env.xdp_on("veth0"));

    // Cleanup detaches and removes every pin.
    let out = env.cleanup_pins();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!env.pin_dir.exists());
    assert!(!env.xdp_on("veth0"));
}

#[test]
fn agent_pins_its_link_and_takes_it_over() {
    let mut env = Env::new("agent");
    let pins = env.pin_dir.clone();
    let args = ["agent", "--iface", "veth1", "--xdp-mode", "generic", "--pin-dir", pins.to_str().unwrap(), "--allow-from", "10.99.0.0/24"];
    let link = pins.join("agent/link");
    let log = env.spawn(&args);
    env.wait_until(&log, |env| fs::read_to_string(&log).is_ok_and(|l| l.contains("ready")) && env.xdp_on("veth1"));
    assert!(fs::read_to_string(&log).unwrap().contains("event=local_addr_added addr=10.99.0.1"));
    assert!(env.stop(Signal::SIGTERM).success());
    assert!(link.exists() && env.xdp_on("veth1"), "the agent detached on exit");

    let log = env.spawn(&args);
    env.wait_until(&log, |_| fs::read_to_string(&log).is_ok_and(|l| l.contains("ready")));
    assert!(fs::read_to_string(&log).unwrap().contains("event=agent_took_over "));
    env.stop(Signal::SIGKILL);
    assert!(env.xdp_on("veth1"));

    assert!(env.cleanup_pins().status.success());
    assert!(!pins.exists() && !env.xdp_on("veth1"));
}

#[test]
fn corrupt_state_file_is_refused_and_nothing_is_attached() {
    let mut env = Env::new("corrupt");
    fs::create_dir_all(env.state_file().parent().unwrap()).unwrap();
    fs::write(env.state_file(), "{\"vips\": {").unwrap();
    let args = env.lbd_args();
    let log = env.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let status = env.exited();
    assert!(!status.success());
    let log = fs::read_to_string(log).unwrap();
    assert!(log.contains(&format!("state file {} is corrupt", env.state_file().display())), "{log}");
    assert_eq!(fs::read_to_string(env.state_file()).unwrap(), "{\"vips\": {");
    assert!(!env.xdp_on("veth0") && !env.link_pin().exists());
}

#[test]
fn an_interface_that_does_not_forward_is_refused_unless_lbd_may_enable_it() {
    let mut env = Env::new("fwd");
    env.set_forwarding("0");
    let args = env.lbd_args();
    let log = env.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let status = env.exited();
    assert!(!status.success());
    let log = fs::read_to_string(log).unwrap();
    for needle in ["net.ipv4.conf.veth0.forwarding = 0", "net.ipv6.conf.veth0.forwarding = 0", "--enable-forwarding"] {
        assert!(log.contains(needle), "the refusal names {needle}: {log}");
    }
    assert!(!env.xdp_on("veth0") && !env.link_pin().exists(), "a refused start changes nothing");
    assert_eq!((env.forwarding("ipv4"), env.forwarding("ipv6")), ("0".into(), "0".into()));

    // Allowed to, lbd turns forwarding on, says so, and runs.
    let mut args = env.lbd_args();
    args.push("--enable-forwarding".into());
    let log = env.spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    env.wait_until(&log, |env| env.lbctl(&["vips", "list"]).status.success());
    assert_eq!((env.forwarding("ipv4"), env.forwarding("ipv6")), ("1".into(), "1".into()));
    assert!(fs::read_to_string(&log).unwrap().contains("event=forwarding_enabled iface=veth0"));
    assert!(env.json(&["vips", "list"]).get("alerts").is_none());

    // Switched off while running: an alert in lbctl, one log line; gone once it is back.
    env.set_forwarding("0");
    let alerted = |env: &Env| {
        let (vips, stats) = (env.ok(&["vips", "list"]), env.ok(&["stats"]));
        vips.starts_with("ALERT: forwarding is disabled")
            && stats.starts_with("ALERT: forwarding is disabled")
            && stats.contains("drop_forwarding_disabled")
    };
    env.wait_until(&log, alerted);
    let json = env.json(&["stats"]);
    assert!(json["alerts"][0].as_str().unwrap().contains("net.ipv4.conf.veth0.forwarding = 0"), "{json}");
    env.set_forwarding("1");
    env.wait_until(&log, |env| !env.ok(&["vips", "list"]).contains("ALERT"));
    let log = fs::read_to_string(&log).unwrap();
    assert_eq!(log.matches("event=forwarding_disabled").count(), 1, "{log}");
    assert!(log.contains("event=forwarding_restored"), "{log}");
}

#[test]
fn a_full_vip_refuses_another_backend() {
    let mut env = Env::new("full");
    // 1024 backends (the per-VIP limit), restored from the state file at start.
    let backends: serde_json::Map<String, Value> =
        (0..1024).map(|i| (format!("10.98.{}.{}", i / 256, i % 256), serde_json::json!({"weight": 1}))).collect();
    let state = serde_json::json!({"vips": {V4: {"ring_size": 65537, "backends": backends}}});
    fs::create_dir_all(env.state_file().parent().unwrap()).unwrap();
    fs::write(env.state_file(), state.to_string()).unwrap();
    env.start_lbd();
    assert_eq!(env.json(&["vips", "list"])["vips"][0]["backends"], 1024);
    let err = env.refused(&["backends", "add", "--vip", V4, "10.99.0.2"]);
    assert!(err.contains("too many backends in VIP"), "{err}");
}

impl Env {
    /// The limits, rules and state file: compared across refusals and restarts.
    fn limits_snapshot(&self) -> (Value, Value, Vec<u8>) {
        (self.json(&["ratelimit", "list"]), self.json(&["rules", "list"]), fs::read(self.state_file()).unwrap())
    }

    fn pinned_map(&self, name: &str) -> PathBuf {
        self.pin_dir.join(format!("v{PIN_VERSION}/maps/{name}"))
    }
}

/// The pinned map `name`, opened as the data path sees it.
fn pinned_map(env: &Env, name: &str) -> Map {
    Map::from_map_data(MapData::from_pin(env.pinned_map(name)).unwrap_or_else(|e| panic!("opening pinned map {name}: {e}"))).unwrap()
}

fn rule_row(rule: &Value) -> (String, String, String, u64, u64) {
    let s = |k: &str| rule[k].as_str().unwrap().to_owned();
    (s("cidr"), s("vip"), s("action"), rule["hits"].as_u64().unwrap(), rule["dropped"].as_u64().unwrap())
}

#[test]
fn rate_limits_and_rules_round_trip_refuse_bad_input_and_survive_a_restart() {
    let mut env = Env::new("limits");
    env.start_lbd();
    env.ok(&["vips", "add", V4, "--ring-size", "251"]);
    env.ok(&["vips", "add", V6, "--ring-size", "13"]);
    env.ok(&["backends", "add", "--vip", V4, "10.99.0.2"]);

    // Setting.
    assert_eq!(
        env.ok(&["ratelimit", "set", "--default", "--per-source", "100", "--burst", "200"]),
        "set the per-source limit of the default (every VIP without its own) to 100/s burst 200 per /32 (IPv4) or /64 (IPv6) source prefix\n"
    );
    env.ok(&["ratelimit", "budget", "--vip", V4, "--new-flows", "5000", "--observe"]);
    env.ok(&["ratelimit", "set", "--vip", V6, "--per-source", "10", "--source-prefix-v6", "48"]);
    env.ok(&["rules", "add", "192.0.2.0/24", "--block"]);
    env.ok(&["rules", "add", "10.20.0.0/16", "--vip", V4, "--limit", "500", "--observe"]);
    env.ok(&["rules", "add", "2001:db8::/32", "--vip", V6, "--exempt"]);

    // Listing.
    let default_per_source = serde_json::json!({"rate": {"per_s": 100, "burst": 200}, "source_prefix_v4": 32, "source_prefix_v6": 64,
                                                "observe": false, "from": "default"});
    assert_eq!(
        env.json(&["ratelimit", "list"]),
        serde_json::json!({
            "default": {"per_source": default_per_source, "vip_budget": null},
            "vips": [
                {"vip": V4, "per_source": default_per_source,
                 "vip_budget": {"rate": {"per_s": 5000, "burst": 5000}, "observe": true, "from": "vip"}},
                {"vip": V6, "per_source": {"rate": {"per_s": 10, "burst": 10}, "source_prefix_v4": 32, "source_prefix_v6": 48,
                                           "observe": false, "from": "vip"},
                 "vip_budget": null},
            ],
        })
    );
    let rules = env.json(&["rules", "list"]);
    assert_eq!(
        rules["rules"][0],
        serde_json::json!({"cidr": "10.20.0.0/16", "vip": V4, "action": "limit", "rate": {"per_s": 500, "burst": 500},
                           "observe": true, "hits": 0, "dropped": 0, "would_drop": 0})
    );
    let rows: Vec<_> = rules["rules"].as_array().unwrap().iter().map(rule_row).collect();
    assert_eq!(
        rows,
        [
            ("10.20.0.0/16".into(), V4.into(), "limit".into(), 0, 0),
            ("192.0.2.0/24".into(), "*".into(), "block".into(), 0, 0),
            ("2001:db8::/32".into(), V6.into(), "exempt".into(), 0, 0),
        ]
    );
    let table = env.ok(&["rules", "list"]);
    let global = table.lines().find(|l| l.starts_with("192.0.2.0/24 ")).map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert!(table.starts_with("CIDR ") && global.is_some_and(|cells| cells[1..3] == ["*", "block"]), "{table}");
    assert_eq!(env.json(&["top-sources", "--vip", V4]), serde_json::json!({"vip": V4, "tracked": 0, "sources": []}));
    let stats = env.json(&["stats"]);
    let observed: Vec<&str> = stats["observed"].as_array().unwrap().iter().map(|o| o["reason"].as_str().unwrap()).collect();
    assert_eq!(observed, Observed::ALL.iter().map(|o| o.label()).collect::<Vec<_>>());

    // The kernel's rule index holds one slot per rule.
    let rules: Array<_, RuleSlot> = Array::try_from(pinned_map(&env, map_names::RULES)).unwrap();
    assert_eq!(rules.iter().filter(|slot| slot.as_ref().unwrap().key.family != 0).count(), 3);

    // Refusals name the problem, exit non-zero and change nothing.
    let before = env.limits_snapshot();
    for (args, problem) in [
        (&["ratelimit", "set", "--vip", V4, "--per-source=-5"][..], "a rate must be at least 1 new flow per second"),
        (&["ratelimit", "set", "--vip", V4, "--per-source", "0"], "at least 1"),
        (&["ratelimit", "budget", "--vip", V4, "--new-flows", "-1"], "at least 1"),
        (&["ratelimit", "set", "--vip", "10.100.0.9:80/tcp", "--per-source", "5"], "unknown VIP 10.100.0.9:80/tcp"),
        (&["ratelimit", "set", "--default", "--per-source", "5", "--source-prefix-v4", "33"], "1..=32"),
        (&["ratelimit", "set", "--default", "--per-source", "5", "--source-prefix-v6", "0"], "1..=128"),
        (&["ratelimit", "set", "--per-source", "5"], "--vip <VIP>|--default"),
        (&["ratelimit", "clear", "--vip", "10.100.0.9:80/tcp"], "unknown VIP"),
        (&["rules", "add", "10.0.0.1/8", "--block"], "did you mean 10.0.0.0/8?"),
        (&["rules", "add", "10.0.0/8", "--block"], "expected <IP>/<LEN>"),
        (&["rules", "add", "10.0.0.0/8", "--limit", "0"], "at least 1"),
        (&["rules", "add", "2001:db8::/32", "--vip", V4, "--block"], "an IPv6 CIDR never matches clients of the IPv4 VIP"),
        (&["rules", "add", "10.0.0.0/8", "--vip", "10.100.0.9:80/tcp", "--block"], "unknown VIP"),
        (&["rules", "remove", "10.0.0.0/8"], "no rule for 10.0.0.0/8 on every VIP"),
        (&["top-sources", "--vip", "10.100.0.9:80/tcp"], "unknown VIP"),
    ] {
        let err = env.refused(args);
        assert!(err.contains(problem), "lbctl {args:?}: {err:?} lacks {problem:?}");
    }
    assert_eq!(env.limits_snapshot(), before, "a refused request changed something");

    // Counters of a rule (as the data path would leave them) survive a restart: its id is
    // adopted back from the rule index. 192.0.2.0/24 was the first rule added: id 0.
    let mut counters: PerCpuArray<_, RuleCounters> = PerCpuArray::try_from(pinned_map(&env, map_names::RULE_COUNTERS)).unwrap();
    let mut per_cpu = vec![RuleCounters::default(); aya::util::nr_cpus().unwrap().get() as usize];
    per_cpu[0] = RuleCounters { hits: 7, dropped: 3 };
    counters.set(0, PerCpuValues::try_from(per_cpu).unwrap(), 0).unwrap();
    // Its would-drops (observe mode's) live in a map of their own, pinned too.
    let mut would: PerCpuArray<_, u64> = PerCpuArray::try_from(pinned_map(&env, map_names::RULE_WOULD_DROP)).unwrap();
    let mut per_cpu = vec![0u64; aya::util::nr_cpus().unwrap().get() as usize];
    per_cpu[0] = 4;
    would.set(0, PerCpuValues::try_from(per_cpu).unwrap(), 0).unwrap();
    let counted = |env: &Env| {
        let rule = &env.json(&["rules", "list"])["rules"][1];
        (rule_row(rule), rule["would_drop"].as_u64().unwrap())
    };
    assert_eq!(counted(&env), (("192.0.2.0/24".into(), "*".into(), "block".into(), 7, 3), 4));
    let before = env.limits_snapshot();
    assert!(env.stop(Signal::SIGTERM).success());
    let log = fs::read_to_string(env.start_lbd()).unwrap();
    assert!(log.contains("slots_written=0 tables_flipped=0 limits_written=0 rules_written=0"), "{log}");
    assert_eq!(env.limits_snapshot(), before);
    env.stop(Signal::SIGKILL);
    env.start_lbd();
    assert_eq!(env.limits_snapshot(), before);

    // Changing a rule keeps its counters; removing a VIP removes its rules and limits.
    env.ok(&["rules", "add", "192.0.2.0/24", "--limit", "5"]);
    assert_eq!(counted(&env), (("192.0.2.0/24".into(), "*".into(), "limit".into(), 7, 3), 4));
    env.ok(&["vips", "remove", V6]);
    let rows: Vec<_> = env.json(&["rules", "list"])["rules"].as_array().unwrap().iter().map(rule_row).collect();
    assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["10.20.0.0/16", "192.0.2.0/24"]);
    assert_eq!(env.json(&["ratelimit", "list"])["vips"].as_array().unwrap().len(), 1);
    env.ok(&["rules", "remove", "10.20.0.0/16", "--vip", V4]);
    assert_eq!(
        env.ok(&["ratelimit", "clear", "--default"]),
        "cleared the per-source limit and the new-flow budget of the default (every VIP without its own)\n"
    );
    let limits = env.json(&["ratelimit", "list"]);
    assert_eq!(limits["default"], serde_json::json!({"per_source": null, "vip_budget": null}));
    assert_eq!(limits["vips"][0]["vip_budget"]["from"], "vip");
    let state: Value = serde_json::from_slice(&fs::read(env.state_file()).unwrap()).unwrap();
    assert_eq!(state["rules"], serde_json::json!({"192.0.2.0/24": {"action": {"limit": {"per_s": 5, "burst": 5}}, "observe": false}}));
    assert!(state.get("default_limits").is_none(), "{state}");
}
