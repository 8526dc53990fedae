//! `lbctl` parsing, the requests commands send, and the rendering of replies.

use clap::{CommandFactory, error::ErrorKind};

use super::*;
use spillway_api::{BackendEntry, BackendList, BackendStats, ReasonCount, Reply, Stats, VipEntry, VipList, VipStats};
use spillway_model::testing::{ip, vip};

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("lbctl").chain(args.iter().copied()))
}

fn request(args: &[&str]) -> Request {
    parse(args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .command
        .request()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .expect("a request")
}

#[test]
fn commands_map_to_requests() {
    let v = vip("10.0.0.1:80/tcp");
    let cases: Vec<(&[&str], Request)> = vec![
        (
            &["vips", "add", "10.0.0.1:80/tcp"],
            Request::AddVip {
                vip: v,
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (
            &["vips", "add", "[fd00::1]:0/udp", "--ring-size", "4099"],
            Request::AddVip {
                vip: vip("[fd00::1]:0/udp"),
                ring_size: Some(4099),
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (&["vips", "list"], Request::ListVips),
        (&["vips", "list", "-o", "json"], Request::ListVips),
        (&["vips", "remove", "10.0.0.1:80/tcp"], Request::RemoveVip { vip: v, force: false }),
        (&["vips", "remove", "10.0.0.1:80/tcp", "--force"], Request::RemoveVip { vip: v, force: true }),
        (
            &["vips", "add", "10.0.0.1:80/tcp", "--force"],
            Request::AddVip {
                vip: v,
                ring_size: None,
                force: true,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (
            &["vips", "add", "10.0.0.3:443/udp", "--quic", "--quic-nonce-len", "8", "--quic-self-len"],
            Request::AddVip {
                vip: vip("10.0.0.3:443/udp"),
                ring_size: None,
                force: false,
                quic: Some(spillway_model::QuicConfig { nonce_len: 8, self_len: true, ..Default::default() }),
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (
            &["vips", "add", "10.0.0.1:80/tcp", "--encap", "gue"],
            Request::AddVip {
                vip: v,
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Gue,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (&["vips", "encap", "10.0.0.1:80/tcp", "ipip"], Request::SetVipEncap { vip: v, encap: Encap::Ipip }),
        (&["vips", "quic-retire", "10.0.0.1:80/tcp"], Request::RetireQuic { vip: v }),
        (
            &["vips", "add", "10.0.0.3:443/udp", "--quic", "--quic-config-id", "1", "--quic-key-file", "/etc/spillway/quic-1.key"],
            Request::AddVip {
                vip: vip("10.0.0.3:443/udp"),
                ring_size: None,
                force: false,
                quic: Some(spillway_model::QuicConfig {
                    config_id: 1,
                    key_file: Some("/etc/spillway/quic-1.key".into()),
                    ..Default::default()
                }),
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (
            &["vips", "quic-next", "10.0.0.1:80/tcp", "--quic-config-id", "2", "--quic-key-file", "/etc/spillway/quic-2.key"],
            Request::SetQuicNext {
                vip: v,
                next: Some(spillway_model::QuicConfig {
                    config_id: 2,
                    key_file: Some("/etc/spillway/quic-2.key".into()),
                    ..Default::default()
                }),
            },
        ),
        (
            &["vips", "add", "10.0.0.1:80/tcp", "--hash", "source"],
            Request::AddVip {
                vip: v,
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::Source,
                source_prefix: None,
            },
        ),
        (
            &["vips", "add", "[fd00::1]:443/tcp", "--hash", "source", "--source-prefix", "64"],
            Request::AddVip {
                vip: vip("[fd00::1]:443/tcp"),
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::Source,
                source_prefix: Some(64),
            },
        ),
        (
            &["vips", "add", "10.0.0.1:80/tcp", "--hash", "5-tuple"],
            Request::AddVip {
                vip: v,
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        ),
        (
            &["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1"],
            Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(DEFAULT_WEIGHT), options: Default::default() },
        ),
        (
            &["backends", "add", "10.0.1.1", "--vip", "10.0.0.1:80/tcp", "--weight", "1000000"],
            Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(1_000_000), options: Default::default() },
        ),
        (&["backends", "list", "--vip", "10.0.0.1:80/tcp", "-o", "json"], Request::ListBackends { vip: v }),
        (&["backends", "remove", "--vip", "10.0.0.1:80/tcp", "fd00::2"], Request::RemoveBackend { vip: v, backend: ip("fd00::2") }),
        (
            &["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1"],
            Request::DrainBackend { vip: v, backend: ip("10.0.1.1"), deadline_s: None, force: false },
        ),
        (
            &["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--force"],
            Request::DrainBackend { vip: v, backend: ip("10.0.1.1"), deadline_s: None, force: true },
        ),
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
        (&["vips", "add", "10.0.0.1:80/tcp", "--encap", "vxlan"], ErrorKind::InvalidValue, "--encap <ENCAP>"),
        (&["vips", "add", "10.0.0.1:80/tcp", "--hash", "client"], ErrorKind::InvalidValue, "[possible values: 5-tuple, source]"),
        (
            &["vips", "add", "10.0.0.1:80/tcp", "--hash", "source", "--source-prefix", "300"],
            ErrorKind::ValueValidation,
            "--source-prefix <N>",
        ),
        (&["vips", "encap", "10.0.0.1:80/tcp", "gre"], ErrorKind::InvalidValue, "[possible values: ipip, gue]"),
        (&["backends", "options", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--encap", "GUE!"], ErrorKind::InvalidValue, "--encap"),
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
    assert_eq!(
        seen, 39,
        "lbctl, vips (7), backends (6), stats, ratelimit (4), rules (3), top-sources, top, flows (3), ports, apply, diff, export, \
         status, completions, man"
    );
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
        observed: vec![ReasonCount { reason: "would_drop_source_limit".into(), packets: 4 }],
        quic: vec![
            ReasonCount { reason: "quic_by_connection_id".into(), packets: 20 },
            ReasonCount { reason: "quic_fallback".into(), packets: 2 },
        ],
        alerts: vec![],
    }
}

#[test]
fn a_source_prefix_is_refused_before_lbd_is_asked() {
    let refused = |args: &[&str]| parse(args).unwrap().command.request().unwrap_err().to_string();
    assert_eq!(
        refused(&["vips", "add", "10.0.0.1:80/tcp", "--hash", "source", "--source-prefix", "33"]),
        "VIP 10.0.0.1:80/tcp source_prefix: 33 is out of range for an IPv4 VIP (1..=32)"
    );
    assert_eq!(
        refused(&["vips", "add", "[fd00::1]:80/tcp", "--source-prefix", "64"]),
        "VIP [fd00::1]:80/tcp source_prefix: only a VIP with hash \"source\" has one"
    );
}

#[test]
fn tables() {
    let entry = |v: &str, hash, source_prefix| VipEntry {
        vip: vip(v),
        ring_size: 65537,
        encap: Encap::Gue,
        hash,
        source_prefix,
        backends: 2,
        health: None,
        effective_budget: None,
        announcement: None,
        table_digest: None,
    };
    let vips = VipList {
        vips: vec![
            entry("10.0.0.1:80/tcp", HashMode::FiveTuple, None),
            entry("10.0.0.2:80/udp", HashMode::Source, None),
            entry("[fd00::1]:80/tcp", HashMode::Source, Some(64)),
        ],
        alerts: vec![],
    };
    assert_eq!(
        rendered(&["vips", "list"], Reply::Vips(vips)),
        "VIP               RING_SIZE  ENCAP  HASH       BACKENDS  PROBE  HEALTHY_WEIGHT  PANIC  BUDGET/S  SPILL/S  ANNOUNCED\n\
         10.0.0.1:80/tcp       65537  gue    5-tuple           2  -                   -  -             -        -  -\n\
         10.0.0.2:80/udp       65537  gue    source            2  -                   -  -             -        -  -\n\
         [fd00::1]:80/tcp      65537  gue    source/64         2  -                   -  -             -        -  -\n"
    );
    let backends = BackendList {
        vip: vip("10.0.0.1:80/tcp"),
        backends: vec![
            BackendEntry {
                health: Some("unhealthy".to_owned()),
                effective_weight: Some(0),
                encap: Encap::Gue,
                ..BackendEntry::configured(ip("10.0.1.1"), 100)
            },
            BackendEntry::configured(ip("fd00::2"), 0),
        ],
        alerts: vec![],
    };
    assert_eq!(
        rendered(&["backends", "list", "--vip", "10.0.0.1:80/tcp"], Reply::Backends(backends)),
        "BACKEND   WEIGHT  STATE     HEALTH     EFFECTIVE  ZONE  ENCAP  LATENCY_MS  PORTS  FOR_S  REASON\n\
         10.0.1.1     100  active    unhealthy          0  -     gue             -  -          -  -\n\
         fd00::2        0  draining  -                  -  -     ipip            -  -          -  -\n"
    );
    // A QUIC VIP's backends show their server ids.
    let quic = BackendList {
        vip: vip("10.0.0.3:443/udp"),
        backends: vec![BackendEntry { server_id: Some("0101".to_owned()), ..BackendEntry::configured(ip("10.0.1.1"), 100) }],
        alerts: vec![],
    };
    assert_eq!(
        rendered(&["backends", "list", "--vip", "10.0.0.3:443/udp"], Reply::Backends(quic)),
        "BACKEND   WEIGHT  STATE   HEALTH  EFFECTIVE  ZONE  ENCAP  LATENCY_MS  PORTS  FOR_S  SERVER_ID  REASON\n\
         10.0.1.1     100  active  -               -  -     ipip            -  -          -  0101       -\n"
    );
    assert_eq!(
        rendered(&["stats"], Reply::Stats(sample_stats())),
        "VIP              PACKETS  BYTES\n10.0.0.1:80/tcp       12   3400\n\n\
         VIP              BACKEND   PACKETS  BYTES\n10.0.0.1:80/tcp  10.0.1.1       12   3400\n\n\
         REASON        PACKETS\ntx                 12\npass_not_vip        3\n\n\
         OBSERVED                 PACKETS\nwould_drop_source_limit        4\n\n\
         QUIC                   PACKETS\nquic_by_connection_id       20\nquic_fallback                2\n"
    );
    // An agent that stopped answering is in the PORTS column, whatever it reported last.
    let unreachable = BackendList {
        vip: vip("10.0.0.1:80/tcp"),
        backends: vec![BackendEntry {
            pressure: Some("none".to_owned()),
            agent_unreachable_s: Some(6),
            ..BackendEntry::configured(ip("10.0.1.1"), 100)
        }],
        alerts: vec![],
    };
    let out = rendered(&["backends", "list", "--vip", "10.0.0.1:80/tcp"], Reply::Backends(unreachable));
    assert!(out.lines().nth(1).is_some_and(|row| row.contains("  agent unreachable  ")), "{out}");
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
            "observed": [{"reason": "would_drop_source_limit", "packets": 4}],
            "quic": [{"reason": "quic_by_connection_id", "packets": 20}, {"reason": "quic_fallback", "packets": 2}],
        })
    );
    let list = BackendList { vip: vip("10.0.0.1:80/tcp"), backends: vec![BackendEntry::configured(ip("10.0.1.1"), 0)], alerts: vec![] };
    let out = rendered(&["backends", "list", "--vip", "10.0.0.1:80/tcp", "-o", "json"], Reply::Backends(list));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!({"vip": "10.0.0.1:80/tcp", "backends": [{"address": "10.0.1.1", "weight": 0, "state": "draining", "encap": "ipip"}]})
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

// --- ratelimit, rules, top-sources ---

use spillway_api::{
    BudgetLimit, LimitOrigin, LimitPart, PerSourceLimit, RateLimitList, RuleActionKind, RuleEntry, RuleList, Scope, ScopeLimits,
    SourceEntry, TopSourceList, VipLimits,
};
use spillway_model::RateSpec;

#[test]
fn limit_and_rule_commands_map_to_requests() {
    let v = vip("10.0.0.1:80/tcp");
    let cidr = |s: &str| s.parse::<Cidr>().unwrap();
    let cases: Vec<(&[&str], Request)> = vec![
        (
            &["ratelimit", "set", "--default", "--per-source", "100"],
            Request::SetRateLimit {
                scope: Scope::Default,
                per_s: 100,
                burst: None,
                source_prefix_v4: None,
                source_prefix_v6: None,
                observe: false,
            },
        ),
        (
            &[
                "ratelimit",
                "set",
                "--vip",
                "10.0.0.1:80/tcp",
                "--per-source=50",
                "--burst",
                "0",
                "--source-prefix-v4",
                "24",
                "--source-prefix-v6",
                "128",
                "--observe",
            ],
            Request::SetRateLimit {
                scope: Scope::Vip(v),
                per_s: 50,
                burst: Some(0),
                source_prefix_v4: Some(24),
                source_prefix_v6: Some(128),
                observe: true,
            },
        ),
        (
            &["ratelimit", "budget", "--vip", "10.0.0.1:80/tcp", "--new-flows", "20000"],
            Request::SetBudget { scope: Scope::Vip(v), per_s: 20000, burst: None, observe: false },
        ),
        (
            &["ratelimit", "budget", "--default", "--new-flows", "7", "--burst", "70", "--observe"],
            Request::SetBudget { scope: Scope::Default, per_s: 7, burst: Some(70), observe: true },
        ),
        (&["ratelimit", "clear", "--vip", "10.0.0.1:80/tcp"], Request::ClearRateLimit { scope: Scope::Vip(v), part: LimitPart::All }),
        (
            &["ratelimit", "clear", "--default", "--per-source"],
            Request::ClearRateLimit { scope: Scope::Default, part: LimitPart::PerSource },
        ),
        (&["ratelimit", "clear", "--default", "--budget"], Request::ClearRateLimit { scope: Scope::Default, part: LimitPart::Budget }),
        (&["ratelimit", "list", "-o", "json"], Request::ListRateLimits),
        (
            &["rules", "add", "10.0.0.0/8", "--block"],
            Request::SetRule {
                cidr: cidr("10.0.0.0/8"),
                vip: None,
                action: RuleActionKind::Block,
                per_s: None,
                burst: None,
                observe: false,
            },
        ),
        (
            &["rules", "add", "203.0.113.7", "--exempt", "--vip", "10.0.0.1:80/tcp", "--observe"],
            Request::SetRule {
                cidr: cidr("203.0.113.7/32"),
                vip: Some(v),
                action: RuleActionKind::Exempt,
                per_s: None,
                burst: None,
                observe: true,
            },
        ),
        (
            &["rules", "add", "2001:db8::/32", "--limit", "500", "--burst", "1000"],
            Request::SetRule {
                cidr: cidr("2001:db8::/32"),
                vip: None,
                action: RuleActionKind::Limit,
                per_s: Some(500),
                burst: Some(1000),
                observe: false,
            },
        ),
        (&["rules", "remove", "10.0.0.0/8"], Request::RemoveRule { cidr: cidr("10.0.0.0/8"), vip: None }),
        (&["rules", "remove", "10.0.0.0/8", "--vip", "10.0.0.1:80/tcp"], Request::RemoveRule { cidr: cidr("10.0.0.0/8"), vip: Some(v) }),
        (&["rules", "list"], Request::ListRules),
        (&["top-sources", "--vip", "10.0.0.1:80/tcp"], Request::TopSources { vip: v, limit: Some(20) }),
        (&["top-sources", "--vip", "10.0.0.1:80/tcp", "--limit", "5", "-o", "json"], Request::TopSources { vip: v, limit: Some(5) }),
    ];
    for (args, want) in cases {
        assert_eq!(request(args), want, "{args:?}");
    }
}

#[test]
fn bad_limits_and_rules_are_refused_before_reaching_lbd() {
    let v = "10.0.0.1:80/tcp";
    let cases: &[(&[&str], ErrorKind, &str)] = &[
        (&["ratelimit", "set", "--vip", v, "--per-source=-5"], ErrorKind::ValueValidation, "a rate must be at least 1 new flow per second"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "-5"], ErrorKind::ValueValidation, "invalid value '-5' for '--per-source <N>'"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "0"], ErrorKind::ValueValidation, "at least 1"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "1000000001"], ErrorKind::ValueValidation, "at most 1000000000"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "lots"], ErrorKind::ValueValidation, "expected a number"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "5", "--burst", "-1"], ErrorKind::ValueValidation, "'--burst <B>'"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "5", "--source-prefix-v4", "33"], ErrorKind::ValueValidation, "1..=32"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "5", "--source-prefix-v4", "0"], ErrorKind::ValueValidation, "1..=32"),
        (&["ratelimit", "set", "--vip", v, "--per-source", "5", "--source-prefix-v6", "129"], ErrorKind::ValueValidation, "1..=128"),
        (&["ratelimit", "set", "--per-source", "5"], ErrorKind::MissingRequiredArgument, "--vip <VIP>|--default"),
        (&["ratelimit", "set", "--vip", v, "--default", "--per-source", "5"], ErrorKind::ArgumentConflict, "cannot be used with"),
        (&["ratelimit", "set", "--vip", v], ErrorKind::MissingRequiredArgument, "--per-source"),
        (&["ratelimit", "set", "--vip", "10.0.0.1:80", "--per-source", "5"], ErrorKind::ValueValidation, "expected <IP>:<PORT>/<tcp|udp>"),
        (&["ratelimit", "budget", "--vip", v, "--new-flows", "0"], ErrorKind::ValueValidation, "at least 1"),
        (&["ratelimit", "budget", "--vip", v], ErrorKind::MissingRequiredArgument, "--new-flows"),
        (&["ratelimit", "clear", "--vip", v, "--per-source", "--budget"], ErrorKind::ArgumentConflict, "cannot be used with"),
        (&["ratelimit", "clear"], ErrorKind::MissingRequiredArgument, "--vip <VIP>|--default"),
        (&["rules", "add", "10.0.0.1/8", "--block"], ErrorKind::ValueValidation, "did you mean 10.0.0.0/8?"),
        (&["rules", "add", "10.0.0/8", "--block"], ErrorKind::ValueValidation, "expected <IP>/<LEN>"),
        (&["rules", "add", "10.0.0.0/40", "--block"], ErrorKind::ValueValidation, "0..=32"),
        (&["rules", "add", "10.0.0.0/8"], ErrorKind::MissingRequiredArgument, "--limit <N>|--block|--exempt"),
        (&["rules", "add", "10.0.0.0/8", "--block", "--exempt"], ErrorKind::ArgumentConflict, "cannot be used with"),
        (&["rules", "add", "10.0.0.0/8", "--limit", "0"], ErrorKind::ValueValidation, "at least 1"),
        (&["rules", "add", "10.0.0.0/8", "--limit=-3"], ErrorKind::ValueValidation, "at least 1"),
        (&["rules", "add", "10.0.0.0/8", "--block", "--burst", "5"], ErrorKind::ArgumentConflict, "cannot be used with"),
        (&["rules", "remove"], ErrorKind::MissingRequiredArgument, "<CIDR>"),
        (&["top-sources"], ErrorKind::MissingRequiredArgument, "--vip"),
        (&["top-sources", "--vip", v, "--limit", "0"], ErrorKind::ValueValidation, "0 is not in 1.."),
        (&["rules", "list", "-o", "yaml"], ErrorKind::InvalidValue, "yaml"),
    ];
    for (args, kind, text) in cases {
        let err = parse(args).map(|_| ()).expect_err(&format!("{args:?} accepted"));
        assert_eq!(err.kind(), *kind, "{args:?}: {err}");
        assert!(err.to_string().contains(text), "{args:?}: {err} lacks {text:?}");
    }
}

fn sample_limits() -> RateLimitList {
    let per_source = PerSourceLimit {
        rate: RateSpec::new(100, Some(200)),
        source_prefix_v4: 24,
        source_prefix_v6: 64,
        observe: false,
        from: LimitOrigin::Default,
    };
    RateLimitList {
        default: ScopeLimits { per_source: Some(per_source.clone()), vip_budget: None },
        vips: vec![
            VipLimits {
                vip: vip("10.0.0.1:80/tcp"),
                effective: ScopeLimits {
                    per_source: Some(per_source.clone()),
                    vip_budget: Some(BudgetLimit { rate: RateSpec::new(5000, None), observe: true, from: LimitOrigin::Vip }),
                },
            },
            VipLimits { vip: vip("10.0.0.2:80/tcp"), effective: ScopeLimits { per_source: None, vip_budget: None } },
        ],
    }
}

fn sample_rules() -> RuleList {
    RuleList {
        rules: vec![
            RuleEntry {
                cidr: "10.20.0.0/16".parse().unwrap(),
                vip: Some(vip("10.0.0.1:80/tcp")),
                action: RuleActionKind::Limit,
                rate: Some(RateSpec::new(500, None)),
                observe: true,
                hits: 1200,
                dropped: 2,
                would_drop: 33,
            },
            RuleEntry {
                cidr: "192.0.2.0/24".parse().unwrap(),
                vip: None,
                action: RuleActionKind::Block,
                rate: None,
                observe: false,
                hits: 7,
                dropped: 7,
                would_drop: 0,
            },
        ],
    }
}

fn sample_top() -> TopSourceList {
    TopSourceList {
        vip: vip("10.0.0.1:80/tcp"),
        tracked: 812,
        sources: vec![
            SourceEntry { prefix: "198.51.100.0/24".parse().unwrap(), admitted: 1500, dropped: 9000, estimated: false },
            SourceEntry { prefix: "2001:db8::/64".parse().unwrap(), admitted: 32, dropped: 0, estimated: true },
        ],
    }
}

#[test]
fn limit_and_rule_tables() {
    assert_eq!(
        rendered(&["ratelimit", "list"], Reply::RateLimits(sample_limits())),
        "SCOPE            PER_SOURCE                 SOURCE_PREFIX  BUDGET\n\
         default          100/s burst 200            /24 /64        -\n\
         10.0.0.1:80/tcp  100/s burst 200 (default)  /24 /64        5000/s burst 5000 observe\n\
         10.0.0.2:80/tcp  -                          -              -\n"
    );
    assert_eq!(
        rendered(&["rules", "list"], Reply::Rules(sample_rules())),
        "CIDR          VIP              ACTION  RATE             OBSERVE  HITS  DROPPED  WOULD-DROP\n\
         10.20.0.0/16  10.0.0.1:80/tcp  limit   500/s burst 500  yes      1200        2          33\n\
         192.0.2.0/24  *                block   -                no          7        7           0\n"
    );
    assert_eq!(
        rendered(&["top-sources", "--vip", "10.0.0.1:80/tcp"], Reply::TopSources(sample_top())),
        "PREFIX           ADMITTED  DROPPED\n198.51.100.0/24      1500     9000\n2001:db8::/64         ~32       ~0\n"
    );
}

#[test]
fn limit_and_rule_json_has_the_documented_fields() {
    let json = |args: &[&str], reply| serde_json::from_str::<serde_json::Value>(&rendered(args, reply)).unwrap();
    assert_eq!(
        json(&["rules", "list", "-o", "json"], Reply::Rules(sample_rules())),
        serde_json::json!({"rules": [
            {"cidr": "10.20.0.0/16", "vip": "10.0.0.1:80/tcp", "action": "limit", "rate": {"per_s": 500, "burst": 500},
             "observe": true, "hits": 1200, "dropped": 2, "would_drop": 33},
            {"cidr": "192.0.2.0/24", "vip": "*", "action": "block", "rate": null, "observe": false, "hits": 7, "dropped": 7,
             "would_drop": 0},
        ]})
    );
    assert_eq!(
        json(&["top-sources", "--vip", "10.0.0.1:80/tcp", "-o", "json"], Reply::TopSources(sample_top())),
        serde_json::json!({"vip": "10.0.0.1:80/tcp", "tracked": 812, "sources": [
            {"prefix": "198.51.100.0/24", "admitted": 1500, "dropped": 9000, "estimated": false},
            {"prefix": "2001:db8::/64", "admitted": 32, "dropped": 0, "estimated": true},
        ]})
    );
    let limits = json(&["ratelimit", "list", "-o", "json"], Reply::RateLimits(sample_limits()));
    assert_eq!(
        limits["default"],
        serde_json::json!({"per_source": {"rate": {"per_s": 100, "burst": 200}, "source_prefix_v4": 24, "source_prefix_v6": 64,
                                          "observe": false, "from": "default"}, "vip_budget": null})
    );
    assert_eq!(
        limits["vips"][0]["vip_budget"],
        serde_json::json!({"rate": {"per_s": 5000, "burst": 5000}, "observe": true, "from": "vip"})
    );
    assert_eq!(limits["vips"][1], serde_json::json!({"vip": "10.0.0.2:80/tcp", "per_source": null, "vip_budget": null}));
}

#[test]
fn limit_and_rule_changes_print_a_confirmation() {
    let done = || Reply::Done { slots_written: 0, tables_flipped: 0 };
    let v = "10.0.0.1:80/tcp";
    for (args, line) in [
        (
            &["ratelimit", "set", "--default", "--per-source", "100"][..],
            "set the per-source limit of the default (every VIP without its own) to 100/s burst 100 per /32 (IPv4) or /64 (IPv6) source prefix",
        ),
        (
            &["ratelimit", "set", "--vip", v, "--per-source", "5", "--burst", "9", "--source-prefix-v4", "24", "--observe"],
            "set the per-source limit of VIP 10.0.0.1:80/tcp to 5/s burst 9 per /24 (IPv4) or /64 (IPv6) source prefix \
             (observe: counted, nothing dropped)",
        ),
        (
            &["ratelimit", "budget", "--vip", v, "--new-flows", "20000"],
            "set the new-flow budget of VIP 10.0.0.1:80/tcp to 20000/s burst 20000",
        ),
        (&["ratelimit", "clear", "--vip", v], "cleared the per-source limit and the new-flow budget of VIP 10.0.0.1:80/tcp"),
        (&["ratelimit", "clear", "--default", "--budget"], "cleared the new-flow budget of the default (every VIP without its own)"),
        (&["rules", "add", "10.0.0.0/8", "--block"], "rule 10.0.0.0/8 on every VIP: block"),
        (
            &["rules", "add", "10.0.0.0/8", "--vip", v, "--limit", "3", "--observe"],
            "rule 10.0.0.0/8 on VIP 10.0.0.1:80/tcp: limit to 3/s burst 3 (observe: counted, nothing dropped)",
        ),
        (&["rules", "add", "10.0.0.0/8", "--exempt"], "rule 10.0.0.0/8 on every VIP: exempt"),
        (&["rules", "remove", "10.0.0.0/8"], "removed the rule 10.0.0.0/8 on every VIP"),
    ] {
        assert_eq!(rendered(args, done()), format!("{line}\n"), "{args:?}");
    }
    let cli = parse(&["rules", "list"]).unwrap();
    assert!(matches!(render::reply(&cli.command, done(), &mut Vec::new()), Err(CliError::UnexpectedReply)));
}

#[test]
fn health_zone_and_ports_commands_send_their_requests() {
    let v = vip("10.0.0.1:80/tcp");
    let r = request(&["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--zone", "b", "--capacity", "500", "--spare", "50"]);
    let options =
        spillway_model::BackendOptions { zone: Some("b".into()), capacity_per_s: Some(500), spare_per_s: Some(50), ..Default::default() };
    assert_eq!(r, Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(DEFAULT_WEIGHT), options: options.clone() });
    let r = request(&["backends", "options", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--probe-target", "10.0.1.1:8080"]);
    let options = spillway_model::BackendOptions { probe_target: Some("10.0.1.1:8080".parse().unwrap()), ..Default::default() };
    assert_eq!(r, Request::SetBackendOptions { vip: v, backend: ip("10.0.1.1"), options });
    let r = request(&["backends", "options", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--probe-path", "direct"]);
    let options = spillway_model::BackendOptions { probe_path: Some(spillway_model::ProbePath::Direct), ..Default::default() };
    assert_eq!(r, Request::SetBackendOptions { vip: v, backend: ip("10.0.1.1"), options });
    let r = request(&["backends", "add", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--encap", "gue"]);
    let options = spillway_model::BackendOptions { encap: Some(Encap::Gue), ..Default::default() };
    assert_eq!(r, Request::AddBackend { vip: v, backend: ip("10.0.1.1"), weight: Some(DEFAULT_WEIGHT), options: options.clone() });
    let r = request(&["backends", "options", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--encap", "gue"]);
    assert_eq!(r, Request::SetBackendOptions { vip: v, backend: ip("10.0.1.1"), options });
    let err = parse(&["backends", "options", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--probe-path", "sideways"]).unwrap_err().to_string();
    assert!(err.contains("--probe-path") && err.contains("direct") && err.contains("tunnel"), "{err}");
    let Request::SetHealth { probe_path, probe: None, .. } = request(&["vips", "health", "10.0.0.1:80/tcp", "--probe-path", "tunnel"])
    else {
        panic!("not a health request")
    };
    assert_eq!(probe_path, Some(spillway_model::ProbePath::Tunnel));
    assert_eq!(
        request(&["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--deadline", "15m"]),
        Request::DrainBackend { vip: v, backend: ip("10.0.1.1"), deadline_s: Some(900), force: false }
    );
    let Request::SetHealth { probe, policy, reset, .. } = request(&[
        "vips",
        "health",
        "10.0.0.1:80/tcp",
        "--probe",
        "http",
        "--path",
        "/healthz",
        "--set",
        "fall=3",
        "--set",
        "fail_closed=true",
    ]) else {
        panic!("not a SetHealth");
    };
    assert_eq!(probe, Some(spillway_model::ProbeSpec::Http { path: "/healthz".into(), expect_status: 200, host: None, tls: false }));
    assert_eq!(policy, [("fail_closed".to_owned(), serde_json::json!(true)), ("fall".to_owned(), serde_json::json!(3))].into());
    assert!(!reset);
    assert_eq!(request(&["ports"]), Request::Ports { host: None });
    assert_eq!(request(&["ports", "--host", "10.0.1.1"]), Request::Ports { host: Some(ip("10.0.1.1")) });
}

#[test]
fn bad_health_options_are_refused_by_name() {
    for (args, needle) in [
        (&["vips", "health", "10.0.0.1:80/tcp", "--probe", "tcp", "--path", "/"][..], "path"),
        (&["vips", "health", "10.0.0.1:80/tcp", "--path", "/"][..], "need --probe"),
        (&["vips", "health", "10.0.0.1:80/tcp", "--probe", "gopher"][..], "gopher"),
    ] {
        let err = parse(args).unwrap().command.request().unwrap_err();
        assert!(err.to_string().contains(needle), "{args:?}: {err}");
    }
    for args in [
        &["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--deadline", "0s"][..],
        &["backends", "drain", "--vip", "10.0.0.1:80/tcp", "10.0.1.1", "--deadline", "5d"][..],
        &["vips", "health", "10.0.0.1:80/tcp", "--set", "fall"][..],
        &["ports", "--host", "nope"][..],
    ] {
        assert!(parse(args).is_err(), "{args:?} accepted");
    }
}

#[test]
fn health_panic_budget_and_alerts_are_shown() {
    let vips = VipList {
        vips: vec![VipEntry {
            vip: vip("10.0.0.1:80/tcp"),
            ring_size: 13,
            encap: Encap::Ipip,
            hash: HashMode::FiveTuple,
            source_prefix: None,
            backends: 3,
            health: Some(spillway_api::VipHealthView {
                probe: spillway_model::ProbeSpec::default(),
                probe_path: spillway_model::ProbePath::Tunnel,
                vip_path_failed: 2,
                panic: true,
                panics_entered: 1,
                fail_closed: false,
                ejection_capped: false,
                healthy_weight: 100,
                total_weight: 300,
                ejected_weight: 0,
                spill_per_s: 0,
                policy: spillway_model::HealthConfig::default(),
            }),
            effective_budget: Some(spillway_model::RateSpec::new(200, Some(20))),
            announcement: Some(spillway_api::announce::AnnouncementView {
                address: ip("10.0.0.1"),
                state: "degraded".into(),
                reason: "program_detached".into(),
                for_s: 12,
                peers: Some(0),
                floor: 1,
                held: true,
            }),
            table_digest: Some("0123456789abcdef".into()),
        }],
        alerts: vec!["ALERT: this balancer cannot open probe sockets".into()],
    };
    let out = rendered(&["vips", "list"], Reply::Vips(vips));
    assert!(out.starts_with("ALERT: this balancer cannot open probe sockets\n"), "{out}");
    assert!(out.contains("PANIC (fail open; 2 vip_path_failed)") && out.contains("100/300") && out.contains(" 200 "), "{out}");
    assert!(out.contains(" tcp/tunnel "), "{out}");
    assert!(out.contains("DEGRADED (program_detached, held: 0/1 peers)"), "{out}");
}

#[test]
fn ports_show_destinations_failures_and_leak_suspects() {
    use spillway_model::ports_report::{
        DestinationUsage, Dropped, LeakSuspect, Level, Mode, Part, PortsReport, ProcessFailures, Thresholds, WatcherStatus,
    };
    let report = PortsReport {
        thresholds: Thresholds::default(),
        destinations: vec![DestinationUsage {
            netns: 1,
            protocol: "tcp".into(),
            local: ip("10.0.1.1"),
            remote: ip("10.9.0.1"),
            remote_port: 5432,
            active: 92,
            time_wait: 3,
            in_use: 95,
            failures: 7,
            opened: 100,
            port_range: None,
            usable_ports: Some(100),
            utilisation: Some(0.95),
            level: Level::Critical,
        }],
        failures: vec![ProcessFailures {
            netns: 1,
            local: ip("10.0.1.1"),
            remote: ip("10.9.0.1"),
            remote_port: 5432,
            pid: 42,
            comm: "\x1b[31mapp".into(),
            cgroup_id: 1,
            failures: 7,
            protocol: "tcp".into(),
            call: "connect".into(),
            errno: "EADDRNOTAVAIL".into(),
        }],
        dropped: Dropped::default(),
        leak_suspects: vec![LeakSuspect {
            netns: 1,
            pid: Some(77),
            comm: Some("leaky\x1b]0;x\x07".into()),
            cgroup_id: 1,
            count: 20,
            oldest_age_secs: 45,
            local_ports: vec![8080],
        }],
        watcher: Some(WatcherStatus {
            mode: Mode::Tracepoint,
            watching: vec![Part { what: "tcp ports".into(), how: "tracepoint/sock/inet_sock_set_state".into() }],
            not_watched: vec![Part { what: "bind/udp connect failures".into(), how: "no syscall tracepoints".into() }],
            refused: vec![],
        }),
    };
    let view = spillway_api::PortsView { host: "10.0.1.1".into(), report: Some(report), error: None, age_s: 1, stale: None };
    let out = rendered(&["ports", "--host", "10.0.1.1"], Reply::Ports(Box::new(view.clone())));
    let watcher = "watcher mode tracepoint; watching with: tcp ports (tracepoint/sock/inet_sock_set_state); \
                   not watched: bind/udp connect failures (no syscall tracepoints)\n";
    assert!(out.starts_with(&format!("host 10.0.1.1 (report 1 s old)\n{watcher}level critical\n")), "{out}");
    for needle in ["10.9.0.1:5432", "95%", "critical", "\\x1b[31mapp", "leaky\\x1b]0;x\\x07", "8080", "over 30 s"] {
        assert!(out.contains(needle), "{needle} missing:\n{out}");
    }
    // Process names come from the host's processes: none reaches the terminal as a control.
    assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    // A report kept while later answers are ignored says why it is old.
    let stale =
        spillway_api::PortsView { age_s: 42, stale: Some("last good report 42 s ago; since then: answers ignored, x".into()), ..view };
    let out = rendered(&["ports", "--host", "10.0.1.1"], Reply::Ports(Box::new(stale)));
    assert!(
        out.starts_with("host 10.0.1.1 (report 42 s old)\nstale: last good report 42 s ago; since then: answers ignored, x\n"),
        "{out}"
    );
    let hostile =
        spillway_api::PortsView { host: "10.0.1.2".into(), report: None, error: Some("bad\x1b[2Jreply".into()), age_s: 0, stale: None };
    let out = rendered(&["ports", "--host", "10.0.1.2"], Reply::Ports(Box::new(hostile.clone())));
    assert!(out.contains("no report: bad\\x1b[2Jreply"), "{out}");
    // No report is no success: scripts see it in the exit status.
    let cli = parse(&["ports", "--host", "10.0.1.2"]).unwrap();
    assert_eq!(render::reply(&cli.command, Reply::Ports(Box::new(hostile)), &mut Vec::new()).unwrap(), Outcome::NoReport);
}

#[test]
fn apply_and_diff_send_the_file_and_status_and_export_ask() {
    let tmp = spillway_harness::tempdir::TempDir::new("cli-apply");
    let path = tmp.path().join("spillway.toml");
    std::fs::write(&path, "vips = []\n").unwrap();
    let file = path.to_str().unwrap();
    assert_eq!(
        request(&["apply", "-f", file]),
        Request::Apply {
            config: "vips = []\n".into(),
            source: file.into(),
            dry_run: false,
            allow_vip_removal: false,
            allow_backend_removal: false
        }
    );
    assert_eq!(
        request(&["diff", "--file", file, "--allow-vip-removal", "-o", "json"]),
        Request::Apply {
            config: "vips = []\n".into(),
            source: file.into(),
            dry_run: true,
            allow_vip_removal: true,
            allow_backend_removal: false
        }
    );
    assert_eq!(request(&["export"]), Request::Export);
    assert_eq!(request(&["status", "-o", "json"]), Request::Status);
    assert_eq!(parse(&["completions", "bash"]).unwrap().command.request().unwrap(), None);
    assert_eq!(parse(&["apply"]).map(|_| ()).unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
    let missing = tmp.path().join("missing.toml");
    let err = parse(&["apply", "-f", missing.to_str().unwrap()]).unwrap().command.request().unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}: reading it:", missing.display())), "{err}");
    std::fs::write(&path, vec![b'#'; spillway_model::config::MAX_CONFIG_BYTES + 1]).unwrap();
    let err = parse(&["apply", "-f", file]).unwrap().command.request().unwrap_err().to_string();
    assert_eq!(err, format!("{file}: larger than the 4 MiB a configuration may be"));
}

#[test]
fn apply_writes_the_starts_lbd_gave_into_the_file_and_diff_does_not() {
    let tmp = spillway_harness::tempdir::TempDir::new("cli-starts");
    let path = tmp.path().join("spillway.toml");
    let text = "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[[vips.backends]]\naddress = \"10.0.1.1\"\n";
    std::fs::write(&path, text).unwrap();
    let file = path.to_str().unwrap();
    let started =
        vec![spillway_api::Started { vip: vip("10.0.0.1:80/tcp"), backend: ip("10.0.1.1"), started_at_unix_ms: 1_796_025_600_000 }];
    let applied = spillway_api::Applied {
        applied: true,
        changes: vec![],
        notes: vec![],
        slots_written: 0,
        tables_flipped: 0,
        started: started.clone(),
    };
    let dry = spillway_api::Applied { applied: false, ..applied.clone() };
    rendered(&["diff", "-f", file], Reply::Applied(dry));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "a dry run writes nothing");
    let out = rendered(&["apply", "-f", file], Reply::Applied(applied.clone()));
    assert!(out.contains("wrote started_at of 1 backends into"), "{out}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{text}started_at = 2026-11-30T08:00:00Z\n"));
    // Standard input cannot be written: the lines to add are shown.
    let out = rendered(&["apply", "-f", "-"], Reply::Applied(applied));
    assert!(out.contains("the file is standard input") && out.contains("10.0.1.1: started_at = 2026-11-30T08:00:00Z"), "{out}");
}

#[test]
fn apply_and_diff_print_one_line_per_change() {
    let old = spillway_model::DesiredState::default();
    let new = spillway_model::config::Document::parse("f", "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nring_size = 13\n".into())
        .unwrap()
        .desired_state()
        .unwrap();
    let changes = spillway_model::config::diff(&old, &new);
    let applied = spillway_api::Applied {
        applied: true,
        changes: changes.clone(),
        notes: vec!["lbd.zone: ...".into()],
        slots_written: 13,
        tables_flipped: 1,
        started: vec![],
    };
    assert_eq!(
        rendered(&["apply", "-f", "x"], Reply::Applied(applied.clone())),
        "+ vip 10.0.0.1:80/tcp: ring_size=13, vip=\"10.0.0.1:80/tcp\"\n~ lbd.zone: ...\napplied 1 changes \
         (slots_written=13 tables_flipped=1); 1 settings of [lbd] differ: they take effect at the next start of lbd\n"
    );
    let dry = spillway_api::Applied { applied: false, ..applied.clone() };
    let cli = parse(&["diff", "-f", "x"]).unwrap();
    let mut out = Vec::new();
    assert_eq!(render::reply(&cli.command, Reply::Applied(dry.clone()), &mut out).unwrap(), Outcome::Differs);
    assert!(String::from_utf8(out).unwrap().contains("\n1 changes would be applied (nothing was changed); 1 settings of [lbd] differ"));
    // Settings that differ are differences, not "no changes".
    let settings = spillway_api::Applied { changes: vec![], ..dry.clone() };
    assert_eq!(render::reply(&cli.command, Reply::Applied(settings.clone()), &mut Vec::new()).unwrap(), Outcome::Differs);
    assert_eq!(
        rendered(&["diff", "-f", "x"], Reply::Applied(settings)),
        "~ lbd.zone: ...\nno changes to the desired state; 1 settings of [lbd] differ: they take effect at the next start of lbd\n"
    );
    // A change apply would refuse: the whole diff, that one marked, and its own exit status.
    let mut removal = spillway_model::config::diff(&new, &old);
    removal[0].refused = Some("needs --allow-vip-removal".into());
    let refused = spillway_api::Applied { changes: removal, notes: vec![], ..dry.clone() };
    assert_eq!(render::reply(&cli.command, Reply::Applied(refused.clone()), &mut Vec::new()).unwrap(), Outcome::Refused);
    assert_eq!(
        rendered(&["diff", "-f", "x"], Reply::Applied(refused)),
        "- vip 10.0.0.1:80/tcp (refused: needs --allow-vip-removal)\n\
         1 changes, 1 of which apply would refuse (marked refused; nothing was changed)\n"
    );
    let none = spillway_api::Applied { changes: vec![], notes: vec![], ..dry };
    assert_eq!(render::reply(&cli.command, Reply::Applied(none.clone()), &mut Vec::new()).unwrap(), Outcome::Done);
    assert_eq!(rendered(&["diff", "-f", "x"], Reply::Applied(none)), "no changes\n");
    let json: serde_json::Value = serde_json::from_str(&rendered(&["apply", "-f", "x", "-o", "json"], Reply::Applied(applied))).unwrap();
    assert_eq!(json["changes"][0]["item"], "vip");
    assert_eq!(json["changes"][0]["change"], "added");
    let exported = spillway_api::Exported { config: "vips = []\n".into() };
    assert_eq!(rendered(&["export"], Reply::Exported(exported)), "vips = []\n");
}

#[test]
fn status_fits_one_screen() {
    let status = spillway_api::Status {
        version: "0.1.0".into(),
        uptime_s: 3725,
        interfaces: vec![
            spillway_api::InterfaceStatus {
                name: "eth0".into(),
                xdp_mode: "native".into(),
                attachment: "took_over".into(),
                state: "up".into(),
                forwarding_off: None,
                error: None,
            },
            spillway_api::InterfaceStatus {
                name: "eth1".into(),
                xdp_mode: "native".into(),
                attachment: "-".into(),
                state: "gone".into(),
                forwarding_off: Some("net.ipv4.conf.eth1.forwarding = 0".into()),
                error: None,
            },
        ],
        entry_program: None,
        pass_to: None,
        pin_dir: "/sys/fs/bpf/spillway".into(),
        state_dir: "/var/lib/spillway".into(),
        health_checks: true,
        zone: Some("a".into()),
        config: Some(spillway_api::ConfigStatus {
            file: "/etc/spillway/spillway.toml".into(),
            last: "refused on SIGHUP; kept the running state".into(),
            error: Some("f:1:1: nope".into()),
        }),
        vips: 2,
        backends: 5,
        rules: 1,
        maps: vec![
            spillway_api::MapUsage { name: "spw_vips".into(), max_entries: 64, used: Some(2), bytes: Some(8192) },
            spillway_api::MapUsage { name: "spw_flows".into(), max_entries: 1_048_576, used: Some(524_288), bytes: Some(125_829_120) },
            spillway_api::MapUsage { name: "spw_rules".into(), max_entries: 1024, used: None, bytes: None },
        ],
        watcher: spillway_api::WatcherSummary { state: "not_loaded".into(), mode: None, summary: None, error: Some("no tracefs".into()) },
        announcements: spillway_api::AnnouncementsStatus {
            state: "degraded".into(),
            reason: Some("program_detached".into()),
            addresses: [("announced".to_owned(), 1), ("degraded".to_owned(), 1)].into(),
        },
        alerts: vec!["ALERT: something".into()],
    };
    let text = rendered(&["status"], Reply::Status(Box::new(status.clone())));
    assert_eq!(
        text,
        "lbd 0.1.0, up 1h 2m
interfaces    eth0: up (native XDP, took over)
              eth1: gone (native XDP, -), forwarding off: net.ipv4.conf.eth1.forwarding = 0
pins          /sys/fs/bpf/spillway
state         /var/lib/spillway: 2 VIPs, 5 backends, 1 rules
health checks on, zone a
config        /etc/spillway/spillway.toml: refused on SIGHUP; kept the running state
              error: f:1:1: nope
port watcher  not_loaded: no tracefs
announcements degraded (program_detached): 1 announced, 1 degraded

MAP          USED      MAX  USE     MEMORY
spw_vips        2       64   3%    0.0 MiB
spw_flows  524288  1048576  50%  120.0 MiB
spw_rules       -     1024    -          -

ALERT: something
"
    );
    assert!(text.lines().count() < 25);
    let json: serde_json::Value =
        serde_json::from_str(&rendered(&["status", "-o", "json"], Reply::Status(Box::new(status.clone())))).unwrap();
    assert_eq!((json["watcher"]["state"].as_str(), json["announcements"]["state"].as_str()), (Some("not_loaded"), Some("degraded")));
    assert!(json.get("entry_program").is_none() && json.get("pass_to").is_none(), "absent unless set: {json}");
    // Beside other XDP programs: where the entry program is pinned, and where frames go on to.
    let beside = spillway_api::Status {
        entry_program: Some("/sys/fs/bpf/spillway/v8/prog".into()),
        pass_to: Some("/sys/fs/bpf/edge/after".into()),
        ..status
    };
    let text = rendered(&["status"], Reply::Status(Box::new(beside)));
    assert!(text.contains("entry program /sys/fs/bpf/spillway/v8/prog (for your root program's program array)\n"), "{text}");
    assert!(text.contains("pass to       /sys/fs/bpf/edge/after (frames the balancer does not serve)\n"), "{text}");
    assert_eq!(
        (json["announcements"]["reason"].as_str(), json["announcements"]["addresses"]["degraded"].as_u64()),
        (Some("program_detached"), Some(1))
    );
}

/// The long help of the subcommand at `path` (e.g. `["vips", "list"]`).
fn long_help(path: &[&str]) -> String {
    let mut command = Cli::command();
    for name in path {
        command = command.find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {path:?}")).clone();
    }
    command.render_long_help().to_string()
}

#[test]
fn every_table_column_and_state_is_named_in_its_commands_help() {
    use super::{config_file::MAP_COLUMNS, flows::FLOW_COLUMNS, render::*, render_health::*, top::*};
    use spillway_policy::{announce as policy, health as backend};

    use spillway_api::BackendState;
    use spillway_model::ports_report::Level;

    type Columns = &'static [(&'static str, table::Align)];
    let tables: &[(&[&str], &[Columns])] = &[
        (&["vips", "list"], &[VIPS_COLUMNS]),
        (&["backends", "list"], &[BACKENDS_COLUMNS]),
        (&["ports"], &[DESTINATION_COLUMNS, FAILURE_COLUMNS, LEAK_COLUMNS]),
        (&["stats"], &[STATS_VIP_COLUMNS, STATS_BACKEND_COLUMNS, STATS_REASON_COLUMNS, STATS_OBSERVED_COLUMNS, STATS_QUIC_COLUMNS]),
        (&["ratelimit", "list"], &[RATE_LIMIT_COLUMNS]),
        (&["rules", "list"], &[RULE_COLUMNS]),
        (&["top-sources"], &[TOP_SOURCE_COLUMNS]),
        (&["flows", "list"], &[FLOW_COLUMNS]),
        (&["top"], &[TOP_VIP_COLUMNS, TOP_BACKEND_COLUMNS]),
        (&["status"], &[MAP_COLUMNS]),
    ];
    for (path, columns) in tables {
        let help = long_help(path);
        for (name, _) in columns.iter().copied().flatten() {
            assert!(help.contains(name.trim()), "lbctl {} --help does not name column {name}:\n{help}", path.join(" "));
        }
    }

    // The words a cell can hold, where a column has a vocabulary of its own.
    let vips = long_help(&["vips", "list"]);
    let announcement_reasons =
        [policy::Reason::Serving, policy::Reason::NoBackends, policy::Reason::NoVip, policy::Reason::Restored].into_iter().chain(
            [policy::Fault::ProgramDetached, policy::Fault::InterfaceDown, policy::Fault::ForwardingDisabled].map(policy::Reason::Fault),
        );
    for word in ["yes", "DEGRADED", "held", "no (reason)", "PANIC", "fail open", "fail closed", "ejection capped", "vip_path_failed"]
        .into_iter()
        .map(str::to_owned)
        .chain(announcement_reasons.map(|r| r.label().to_owned()))
    {
        assert!(vips.contains(&word), "vips list --help does not name {word:?}");
    }
    let backends = long_help(&["backends", "list"]);
    let words = backend::State::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(backend::Pressure::ALL.iter().map(|p| p.as_str()))
        .chain([BackendState::Active, BackendState::Draining].map(BackendState::label))
        .chain(["kept in", "unknown", "removed in"]);
    for word in words {
        assert!(backends.contains(word), "backends list --help does not name {word:?}");
    }
    let reasons = [
        backend::Reason::Added,
        backend::Reason::ConsecutiveFailures { failures: 3, last: "timeout".into() },
        backend::Reason::VipPathFailed { failures: 3, tunnel: "timeout".into() },
        backend::Reason::ConsecutiveSuccesses { successes: 2 },
        backend::Reason::SlowStartComplete,
        backend::Reason::Flapping { flaps: 2, hold_ms: 1 },
        backend::Reason::HoldDownExpired,
        backend::Reason::SlowerThanPeers { latency_ms: 9, peer_median_ms: 1 },
        backend::Reason::LatencyRecovered,
        backend::Reason::OperatorDrain,
        backend::Reason::OperatorUndrain,
        backend::Reason::Restored,
    ];
    for reason in reasons {
        let kind = reason.to_string().split(' ').next().unwrap().to_owned();
        assert!(backends.contains(&kind), "backends list --help does not name reason {kind}");
    }
    let ports = long_help(&["ports"]);
    for level in [Level::Unknown, Level::Ok, Level::Warn, Level::Critical] {
        let word = format!("{level:?}").to_lowercase();
        assert!(ports.contains(&word), "ports --help does not name level {word}");
    }
    let rules = long_help(&["rules", "list"]);
    for word in ["limit", "block", "exempt", "yes", "no", "*"] {
        assert!(rules.contains(word), "rules list --help does not name {word:?}");
    }
}

#[test]
fn every_argument_of_every_command_is_described() {
    // The help and the man pages show an argument without a description as a bare `<N>`.
    fn undescribed(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        let path = format!("{path} {}", command.get_name());
        for arg in command.get_arguments().filter(|a| !matches!(a.get_id().as_str(), "help" | "version")) {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                found.push(format!("{path}: {}", arg.get_id()));
            }
        }
        for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
            undescribed(sub, &path, found);
        }
    }
    let mut command = Cli::command();
    command.build();
    let mut found = Vec::new();
    undescribed(&command, "", &mut found);
    assert!(found.is_empty(), "arguments without a description: {found:#?}");
}
