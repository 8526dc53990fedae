//! `lbctl` parsing, the requests commands send, and the rendering of replies.

use clap::{CommandFactory, error::ErrorKind};

use super::*;
use crate::api::{BackendEntry, BackendList, BackendState, BackendStats, ReasonCount, Reply, Stats, VipEntry, VipList, VipStats};

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("lbctl").chain(args.iter().copied()))
}

fn request(args: &[&str]) -> Request {
    parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).command.request()
}

fn vip(s: &str) -> Vip {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn commands_map_to_requests() {
    let v = vip("10.0.0.1:80/tcp");
    let cases: Vec<(&[&str], Request)> = vec![
        (&["vips", "add", "10.0.0.1:80/tcp"], Request::AddVip { vip: v, ring_size: None }),
        (
            &["vips", "add", "[fd00::1]:0/udp", "--ring-size", "4099"],
            Request::AddVip { vip: vip("[fd00::1]:0/udp"), ring_size: Some(4099) },
        ),
        (&["vips", "list"], Request::ListVips),
        (&["vips", "list", "-o", "json"], Request::ListVips),
        (&["vips", "remove", "10.0.0.1:80/tcp"], Request::RemoveVip { vip: v }),
        (
            &["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1"],
            Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(DEFAULT_WEIGHT) },
        ),
        (
            &["backends", "add", "10.0.1.1", "--vip", "10.0.0.1:80/tcp", "--weight", "1000000"],
            Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(1_000_000) },
        ),
        (&["backends", "list", "--vip", "10.0.0.1:80/tcp", "-o", "json"], Request::ListBackends { vip: v }),
        (&["backends", "remove", "--vip", "10.0.0.1:80/tcp", "fd00::2"], Request::RemoveBackend { vip: v, backend: ip("fd00::2") }),
        (&["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1"], Request::DrainBackend { vip: v, backend: ip("10.0.1.1") }),
        (
            &["backends", "set-weight", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "7"],
            Request::SetWeight { vip: v, backend: ip("10.0.1.1"), weight: 7 },
        ),
        (&["stats"], Request::Stats),
        (&["stats", "--output", "json"], Request::Stats),
    ];
    for (args, want) in cases {
        assert_eq!(request(args), want, "{args:?}");
    }
}

#[test]
fn api_socket_defaults_and_is_global() {
    assert_eq!(parse(&["stats"]).unwrap().api, PathBuf::from("/run/spillway/api.sock"));
    assert_eq!(parse(&["--api", "/tmp/a.sock", "stats"]).unwrap().api, PathBuf::from("/tmp/a.sock"));
    assert_eq!(parse(&["vips", "list", "--api", "/tmp/b.sock"]).unwrap().api, PathBuf::from("/tmp/b.sock"));
}

#[test]
fn bad_input_is_refused_before_reaching_lbd() {
    let cases: &[(&[&str], ErrorKind, &str)] = &[
        (&["vips", "add", "10.0.0.1:80/sctp"], ErrorKind::ValueValidation, "expected <IP>:<PORT>/<tcp|udp>"),
        (&["vips", "add", "10.0.0.1/tcp"], ErrorKind::ValueValidation, "10.0.0.1/tcp"),
        (&["vips", "add", "fd00::1:80/tcp"], ErrorKind::ValueValidation, "[fd00::1]:443/tcp"),
        (&["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1"], ErrorKind::ValueValidation, "10.0.1"),
        (&["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--weight", "0"], ErrorKind::ValueValidation, "1..=1000000"),
        (&["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--weight", "1000001"], ErrorKind::ValueValidation, "1..=1000000"),
        (&["backends", "set-weight", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "0"], ErrorKind::ValueValidation, "1..=1000000"),
        (&["backends", "add", "10.0.1.1"], ErrorKind::MissingRequiredArgument, "--vip"),
        (&["backends", "list"], ErrorKind::MissingRequiredArgument, "--vip"),
        (&["stats", "-o", "yaml"], ErrorKind::InvalidValue, "yaml"),
        (&["vips"], ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand, "Usage"),
    ];
    for (args, kind, text) in cases {
        let err = parse(args).map(|_| ()).unwrap_err();
        assert_eq!(err.kind(), *kind, "{args:?}: {err}");
        assert!(err.to_string().contains(text), "{args:?}: {err} lacks {text:?}");
    }
}

/// Every command and subcommand's `--help` carries an example.
#[test]
fn every_help_has_an_example() {
    fn walk(cmd: &clap::Command, path: &mut Vec<String>, seen: &mut usize) {
        let mut args: Vec<String> = path.clone();
        args.push("--help".into());
        let help = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        assert!(help.to_string().contains("Example"), "`lbctl {}` help lacks an example", path.join(" "));
        *seen += 1;
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            path.push(sub.get_name().to_owned());
            walk(sub, path, seen);
            path.pop();
        }
    }
    let mut seen = 0;
    walk(&Cli::command(), &mut Vec::new(), &mut seen);
    assert_eq!(seen, 12, "lbctl, vips (3), backends (5), stats");
}

fn rendered(args: &[&str], reply: Reply) -> String {
    let cli = parse(args).unwrap();
    let mut out = Vec::new();
    render::reply(&cli.command, reply, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn sample_stats() -> Stats {
    Stats {
        vips: vec![VipStats {
            vip: vip("10.0.0.1:80/tcp"),
            packets: 12,
            bytes: 3400,
            backends: vec![BackendStats { address: ip("10.0.1.1"), packets: 12, bytes: 3400 }],
        }],
        reasons: vec![ReasonCount { reason: "tx".into(), packets: 12 }, ReasonCount { reason: "pass_not_vip".into(), packets: 3 }],
    }
}

#[test]
fn tables() {
    let vips = VipList { vips: vec![VipEntry { vip: vip("10.0.0.1:80/tcp"), ring_size: 65537, backends: 2 }] };
    assert_eq!(
        rendered(&["vips", "list"], Reply::Vips(vips)),
        "VIP              RING_SIZE  BACKENDS\n10.0.0.1:80/tcp      65537         2\n"
    );
    let backends = BackendList {
        vip: vip("10.0.0.1:80/tcp"),
        backends: vec![
            BackendEntry { address: ip("10.0.1.1"), weight: 100, state: BackendState::Active },
            BackendEntry { address: ip("fd00::2"), weight: 0, state: BackendState::Draining },
        ],
    };
    assert_eq!(
        rendered(&["backends", "list", "--vip", "10.0.0.1:80/tcp"], Reply::Backends(backends)),
        "BACKEND   WEIGHT  STATE\n10.0.1.1     100  active\nfd00::2        0  draining\n"
    );
    assert_eq!(
        rendered(&["stats"], Reply::Stats(sample_stats())),
        "VIP              PACKETS  BYTES\n10.0.0.1:80/tcp       12   3400\n\n\
         VIP              BACKEND   PACKETS  BYTES\n10.0.0.1:80/tcp  10.0.1.1       12   3400\n\n\
         REASON        PACKETS\ntx                 12\npass_not_vip        3\n"
    );
}

#[test]
fn json_output_has_the_documented_fields() {
    let out = rendered(&["stats", "-o", "json"], Reply::Stats(sample_stats()));
    let value: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        value,
        serde_json::json!({
            "vips": [{"vip": "10.0.0.1:80/tcp", "packets": 12, "bytes": 3400,
                      "backends": [{"address": "10.0.1.1", "packets": 12, "bytes": 3400}]}],
            "reasons": [{"reason": "tx", "packets": 12}, {"reason": "pass_not_vip", "packets": 3}],
        })
    );
    let list = BackendList {
        vip: vip("10.0.0.1:80/tcp"),
        backends: vec![BackendEntry { address: ip("10.0.1.1"), weight: 0, state: BackendState::Draining }],
    };
    let out = rendered(&["backends", "list", "--vip", "10.0.0.1:80/tcp", "-o", "json"], Reply::Backends(list));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!({"vip": "10.0.0.1:80/tcp", "backends": [{"address": "10.0.1.1", "weight": 0, "state": "draining"}]})
    );
}

#[test]
fn changes_print_a_confirmation_and_odd_replies_are_errors() {
    let done = || Reply::Done { slots_written: 1, tables_flipped: 1 };
    assert_eq!(
        rendered(&["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1"], done()),
        "draining backend 10.0.1.1 of 10.0.0.1:80/tcp: existing flows stay, new flows go elsewhere\n"
    );
    assert_eq!(rendered(&["vips", "add", "10.0.0.1:80/tcp"], done()), "added VIP 10.0.0.1:80/tcp\n");
    let cli = parse(&["vips", "list"]).unwrap();
    assert!(matches!(render::reply(&cli.command, done(), &mut Vec::new()), Err(CliError::UnexpectedReply)));
}
