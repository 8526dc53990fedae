use std::fs;

use super::*;
use spillway_harness::tempdir::TempDir;

use crate::RateSpec;
use crate::testing::vip;

const EXAMPLE: &str = include_str!("../../../deploy/spillway.toml");

fn parse(text: &str) -> Result<DesiredState, ConfigError> {
    Document::parse("test.toml", text.to_owned())?.desired_state()
}

/// Three VIPs, the last with `backend` (a `[[vips.backends]]` body) as its first backend.
fn with_backend(backend: &str) -> String {
    format!(
        "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n\n[[vips]]\nvip = \"10.0.0.2:80/tcp\"\n\n\
         [[vips]]\nvip = \"10.0.0.3:80/tcp\"\n[[vips.backends]]\n{backend}\n"
    )
}

#[test]
fn the_example_declares_what_it_says() {
    let state = parse(EXAMPLE).unwrap();
    let web = &state.vips[&vip("192.0.2.10:443/tcp")];
    assert_eq!(web.backends.len(), 2);
    let drained = &web.backends[&"10.0.1.12".parse().unwrap()];
    assert_eq!((drained.weight, drained.drain_deadline_unix_ms), (0, Some(1_893_456_000_000)));
    assert_eq!(web.limits.unwrap().vip_budget, Some(RateSpec { per_s: 20000, burst: 5000 }));
    assert_eq!(state.default_limits.unwrap().per_source, Some(RateSpec { per_s: 50, burst: 100 }));
    assert_eq!(state.default_limits.unwrap().vip_budget, Some(RateSpec { per_s: 100_000, burst: 100_000 }));
    assert_eq!(state.rules.len(), 2);
    let dns = &state.vips[&vip("192.0.2.20:53/udp")];
    assert_eq!(dns.backends.values().next().unwrap().weight, 100);
    assert_eq!((dns.hash, dns.source_prefix), (crate::HashMode::Source, Some(32)));
    let quic = &state.vips[&vip("192.0.2.30:443/udp")];
    assert_eq!(quic.quic, Some(crate::QuicConfig::default()));
    assert_eq!(crate::server_ids(quic).values().map(ToString::to_string).collect::<Vec<_>>(), ["031f"]);
    let doc = Document::parse("example", EXAMPLE.to_owned()).unwrap();
    assert_eq!(doc.lbd().unwrap()["iface"].as_str(), Some("eth0"));
    assert_eq!(doc.agent().unwrap()["iface"].as_str(), Some("eth0"));
}

#[test]
fn encap_is_read_per_vip_and_backend_and_exported() {
    let text = "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nencap = \"gue\"\n\n[[vips.backends]]\naddress = \"10.0.1.1\"\n\n\
                [[vips.backends]]\naddress = \"10.0.1.2\"\nencap = \"ipip\"\n\n[[vips]]\nvip = \"10.0.0.2:80/tcp\"\n\n\
                [[vips.backends]]\naddress = \"10.0.1.3\"\nencap = \"gue\"\n";
    let state = parse(text).unwrap();
    let (web, other) = (&state.vips[&vip("10.0.0.1:80/tcp")], &state.vips[&vip("10.0.0.2:80/tcp")]);
    use crate::Encap::{Gue, Ipip};
    assert_eq!((web.encap, other.encap), (Gue, Ipip), "a VIP without encap is ipip");
    let of = |config: &crate::VipConfig, b: &str| config.encap_of(&config.backends[&b.parse().unwrap()]);
    assert_eq!([of(web, "10.0.1.1"), of(web, "10.0.1.2"), of(other, "10.0.1.3")], [Gue, Ipip, Gue]);
    let exported = export(&state, None);
    assert_eq!(parse(&exported).unwrap(), state, "{exported}");
}

#[test]
fn the_hash_is_read_per_vip_exported_and_diffed() {
    let text = "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n\n[[vips]]\nvip = \"10.0.0.2:80/tcp\"\nhash = \"5-tuple\"\n\n\
                [[vips]]\nvip = \"10.0.0.3:80/udp\"\nhash = \"source\"\n\n\
                [[vips]]\nvip = \"[fd00::1]:80/tcp\"\nhash = \"source\"\nsource_prefix = 64\n";
    let state = parse(text).unwrap();
    let of = |v: &str| (state.vips[&vip(v)].hash, state.vips[&vip(v)].source_prefix_len(&vip(v)));
    use crate::HashMode::{FiveTuple, Source};
    assert_eq!(of("10.0.0.1:80/tcp"), (FiveTuple, None), "a VIP without hash is 5-tuple");
    assert_eq!(of("10.0.0.2:80/tcp"), (FiveTuple, None));
    assert_eq!(of("10.0.0.3:80/udp"), (Source, Some(32)));
    assert_eq!(of("[fd00::1]:80/tcp"), (Source, Some(64)));
    let exported = export(&state, None);
    assert!(exported.contains("hash = \"source\"\nsource_prefix = 64"), "{exported}");
    assert_eq!(parse(&exported).unwrap(), state, "{exported}");
    // Changing the hash is a change of the VIP like any other.
    let mut changed = state.clone();
    changed.set_hash(&vip("10.0.0.1:80/tcp"), Source, Some(24)).unwrap();
    let changes: Vec<String> = diff(&state, &changed).iter().map(ToString::to_string).collect();
    assert_eq!(changes, ["~ vip 10.0.0.1:80/tcp: hash - -> \"source\", source_prefix - -> 24"]);
}

#[test]
fn the_example_uses_every_field() {
    // A state with every optional part set: every key its export holds must appear in the
    // example (documented there once).
    let state = parse(EXAMPLE).unwrap();
    let mut full = state.clone();
    let web = full.vips.get_mut(&vip("192.0.2.10:443/tcp")).unwrap();
    let mut policy = web.health.as_ref().unwrap().policy.clone();
    policy.fall = 9; // exported only when it differs from the default
    web.health.as_mut().unwrap().policy = policy;
    web.allow_local_address = true;
    web.encap = crate::Encap::Gue;
    full.vips.get_mut(&vip("192.0.2.30:443/udp")).unwrap().quic.as_mut().unwrap().self_len = true;
    let exported = export(&full, None);
    let file: toml::Table = toml::from_str(&exported).unwrap();
    fn keys(value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Table(t) => t.iter().for_each(|(k, v)| {
                out.push(k.clone());
                keys(v, out);
            }),
            toml::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    keys(&toml::Value::Table(file), &mut all);
    let example: toml::Table = toml::from_str(EXAMPLE).unwrap();
    let mut documented = Vec::new();
    keys(&toml::Value::Table(example), &mut documented);
    for field in all {
        assert!(documented.contains(&field), "{field} is not in deploy/spillway.toml");
    }
    for field in [
        "interval_ms",
        "timeout_ms",
        "rise",
        "jitter",
        "max_ejection_fraction",
        "panic_threshold",
        "fail_closed",
        "slow_start_ms",
        "slow_start_floor",
        "hold_down_base_ms",
        "hold_down_max_ms",
        "flap_window_ms",
        "slow_factor",
        "slow_margin_ms",
        "slow_min_peers",
        "slow_step",
        "slow_floor",
        "spare_fraction",
    ] {
        assert!(documented.iter().any(|d| d == field), "health.policy.{field} is not in the example");
    }
}

#[test]
fn export_then_parse_is_the_same_state_and_no_change() {
    let state = parse(EXAMPLE).unwrap();
    let text = export(&state, None);
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, state, "{text}");
    assert_eq!(diff(&state, &back), []);
    // Policy fields at their defaults are left out of the export.
    assert!(!text.contains("slow_factor"), "{text}");
    assert!(text.contains("drain = true") && text.contains("drain_deadline = 2030-01-01T00:00:00Z"), "{text}");
    // An empty state exports as a file that declares it.
    assert_eq!(parse(&export(&DesiredState::default(), None)).unwrap(), DesiredState::default());
    let lbd = toml::Table::from_iter([("iface".to_owned(), toml::Value::from("eth0"))]);
    let doc = Document::parse("x", export(&state, Some(lbd.clone()))).unwrap();
    assert_eq!(doc.lbd(), Some(&lbd));
}

#[test]
fn bad_files_are_refused_with_place_field_and_reason() {
    let cases: Vec<(String, &str, &str)> = vec![
        // Unknown fields, wrong types.
        (with_backend("address = \"10.0.1.1\"\nwieght = 3"), "test.toml:11:1: vips[2].backends[0].wieght: unknown field `wieght`", ""),
        (with_backend("address = \"10.0.1.1\"\nweight = \"x\""), "test.toml:11:10: vips[2].backends[0].weight: invalid type: string", ""),
        (with_backend("address = \"10.0.1.1\"\nweight = -1"), "vips[2].backends[0].weight: invalid value: integer `-1`, expected u32", ""),
        (with_backend("address = \"10.0.1.x\""), "test.toml:10:11: vips[2].backends[0].address: invalid IP address syntax", ""),
        (with_backend("weight = 5"), "test.toml:9:1: vips[2].backends[0]: missing field `address`", ""),
        ("[[vips]]\nvip = \"10.0.0.1:80\"\n".into(), "test.toml:2:7: vips[0].vip: VIP \"10.0.0.1:80\": expected", ""),
        (
            "[lbd]\niface = \"eth0\"\n[[vip]]\nvip = \"10.0.0.1:80/tcp\"\n".into(),
            "test.toml:3:3: vip: unknown field `vip`, expected one of",
            "",
        ),
        (
            "[limits]\nper_source = { per_s = 5, burts = 1 }\n".into(),
            "test.toml:2:27: limits.per_source.burts: unknown field `burts`, expected `per_s` or `burst`",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nhealth = { probe = { kind = \"icmp\" } }\n".into(),
            "vips[0].health.probe.kind: unknown variant `icmp`",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[vips.health.policy]\nfal = 3\n".into(),
            "test.toml:4:1: vips[0].health.policy.fal: unknown field `fal`",
            "",
        ),
        // Out of range: the model's checks, placed on the field.
        (
            with_backend("address = \"10.0.1.1\"\nweight = 0"),
            "test.toml:11:10: vips[2].backends[0].weight: weight 0 is out of range (1..=1000000)",
            "drain = true",
        ),
        (with_backend("address = \"10.0.1.1\"\nweight = 1000001"), "vips[2].backends[0].weight: weight 1000001 is out of range", ""),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nring_size = 100\n".into(),
            "test.toml:3:13: vips[0].ring_size: ring size 100 must be a prime",
            "",
        ),
        (
            with_backend("address = \"10.0.1.1\"\ncapacity_per_s = 0"),
            "vips[2].backends[0].capacity_per_s: backend 10.0.1.1 capacity_per_s: 0 new flows",
            "",
        ),
        (
            with_backend("address = \"10.0.1.1\"\ncapacity_per_s = 5\nspare_per_s = 6"),
            "test.toml:12:15: vips[2].backends[0].spare_per_s: backend 10.0.1.1 spare_per_s: 6 exceeds",
            "",
        ),
        (with_backend("address = \"10.0.1.1\"\nzone = \"Zone A\""), "vips[2].backends[0].zone: zone \"Zone A\"", ""),
        (
            with_backend("address = \"10.0.1.1\"\nencap = \"vxlan\""),
            "test.toml:11:9: vips[2].backends[0].encap: unknown variant `vxlan`, expected `ipip` or `gue`",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nencap = \"GUE\"\n".into(),
            "test.toml:3:9: vips[0].encap: unknown variant `GUE`, expected `ipip` or `gue`",
            "",
        ),
        ("[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nencap = 4\n".into(), "test.toml:3:9: vips[0].encap: wanted string or table", ""),
        (with_backend("address = \"10.0.1.1\"\nprobe_target = \"10.0.1.1:0\""), "vips[2].backends[0].probe_target:", ""),
        (with_backend("address = \"fd00::1\""), "", ""),
        (
            with_backend("address = \"10.0.1.1\"\ndrain_deadline = 2030-01-01T00:00:00Z"),
            "vips[2].backends[0].drain_deadline: backend 10.0.1.1 drain_deadline: only a draining backend",
            "",
        ),
        (
            with_backend("address = \"10.0.1.1\"\ndrain = true\nstarted_at = 2026-12-01T10:00:00Z"),
            "vips[2].backends[0].started_at: backend 10.0.1.1 started_at: only a serving backend has one",
            "",
        ),
        (
            with_backend("address = \"10.0.1.1\"\nstarted_at = 2026-12-01"),
            "vips[2].backends[0].started_at: 2026-12-01 is not a date and time with a UTC offset",
            "",
        ),
        (
            with_backend("address = \"10.0.1.1\"\ndrain = true\ndrain_deadline = 2030-01-01T00:00:00"),
            "vips[2].backends[0].drain_deadline: 2030-01-01T00:00:00 is not a date and time with a UTC offset",
            "",
        ),
        (
            "[[vips]]\nvip = \"[fd00::1]:80/tcp\"\n[[vips.backends]]\naddress = \"10.0.1.1\"\n".into(),
            "test.toml:4:11: vips[0].backends[0].address: backend 10.0.1.1: an IPv6 VIP needs an IPv6 backend",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[vips.health.policy]\nfall = 0\n".into(),
            "test.toml:4:8: vips[0].health.policy.fall: health fall: 0 is out of range (1..=100)",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[vips.health.policy]\ntimeout_ms = 2000\n".into(),
            "vips[0].health.policy.timeout_ms: health timeout_ms 2000 exceeds interval_ms 1000",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[vips.health]\nprobe = { kind = \"http\", path = \"x\" }\n".into(),
            "vips[0].health.probe.path: probe path: must start with '/'",
            "",
        ),
        (
            "[limits]\nper_source = { per_s = 0 }\n".into(),
            "test.toml:2:24: limits.per_source.per_s: the default: per_source: 0 new flows per second is out of range",
            "",
        ),
        (
            "[limits]\nper_source = { per_s = 5 }\nsource_prefix_v4 = 33\n".into(),
            "test.toml:3:20: limits.source_prefix_v4: the default: source_prefix_v4: prefix length 33",
            "",
        ),
        ("[limits]\nobserve_source = true\n".into(), "test.toml:1:1: limits: limits of the default: nothing to set", ""),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[vips.limits]\nvip_budget = { per_s = 1000000001 }\n".into(),
            "vips[0].limits.vip_budget.per_s: VIP 10.0.0.1:80/tcp: vip_budget:",
            "",
        ),
        (
            "vips = []\n[[rules]]\ncidr = \"10.0.0.1/8\"\naction = \"block\"\n".into(),
            "test.toml:3:8: rules[0].cidr: CIDR 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?",
            "",
        ),
        (
            "vips = []\n[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"block\"\nper_s = 5\n".into(),
            "test.toml:5:9: rules[0].per_s: rule 10.0.0.0/8 on every VIP: only a limit takes a rate",
            "",
        ),
        (
            "vips = []\n[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\n".into(),
            "test.toml:2:1: rules[0].per_s: rule 10.0.0.0/8 on every VIP: a limit needs a rate",
            "",
        ),
        ("vips = []\n[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"drop\"\n".into(), "rules[0].action: unknown variant `drop`", ""),
        (
            "vips = []\n[[rules]]\ncidr = \"10.0.0.0/8\"\nvip = \"10.9.9.9:80/tcp\"\naction = \"block\"\n".into(),
            "test.toml:4:7: rules[0].vip: unknown VIP 10.9.9.9:80/tcp",
            "",
        ),
        // Client affinity.
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nhash = \"client\"\n".into(),
            "test.toml:3:8: vips[0].hash: unknown variant `client`, expected `5-tuple` or `source`",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nhash = \"source\"\nsource_prefix = 33\n".into(),
            "test.toml:4:17: vips[0].source_prefix: VIP 10.0.0.1:80/tcp source_prefix: 33 is out of range for an IPv4 VIP (1..=32)",
            "",
        ),
        (
            "[[vips]]\nvip = \"[fd00::1]:80/tcp\"\nhash = \"source\"\nsource_prefix = 0\n".into(),
            "vips[0].source_prefix: VIP [fd00::1]:80/tcp source_prefix: 0 is out of range for an IPv6 VIP (1..=128)",
            "",
        ),
        (
            "[[vips]]\nvip = \"[fd00::1]:80/tcp\"\nsource_prefix = 64\n".into(),
            "test.toml:3:17: vips[0].source_prefix: VIP [fd00::1]:80/tcp source_prefix: only a VIP with hash \"source\" has one",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nhash = \"source\"\nsource_prefix = 300\n".into(),
            "vips[0].source_prefix: invalid value: integer `300`",
            "",
        ),
        // Duplicates.
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n".into(),
            "test.toml:4:7: vips[1].vip: VIP 10.0.0.1:80/tcp is declared twice (first in vips[0])",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n[[vips.backends]]\naddress = \"10.0.1.1\"\n[[vips.backends]]\naddress = \"10.0.1.1\"\n"
                .into(),
            "test.toml:6:11: vips[0].backends[1].address: backend 10.0.1.1 is declared twice in VIP 10.0.0.1:80/tcp (first in backends[0])",
            "",
        ),
        (
            "vips = []\n[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"block\"\n[[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"exempt\"\n"
                .into(),
            "test.toml:6:8: rules[1].cidr: rule 10.0.0.0/8 on every VIP is declared twice (first in rules[0])",
            "",
        ),
        ("[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nvip = \"10.0.0.2:80/tcp\"\n".into(), "test.toml:3:1: duplicate key `vip`", ""),
        // QUIC VIPs.
        ("[[vips]]\nvip = \"10.0.0.1:443/tcp\"\nquic = {}\n".into(), "vips[0].quic: VIP 10.0.0.1:443/tcp: quic needs a UDP VIP", ""),
        (
            "[[vips]]\nvip = \"10.0.0.1:443/udp\"\nquic = { nonce_len = 3 }\n".into(),
            "vips[0].quic: VIP 10.0.0.1:443/udp quic: nonce_len 3 is below the minimum of 4",
            "",
        ),
        (
            "[[vips]]\nvip = \"10.0.0.1:443/udp\"\nquic = { server_id_len = 1 }\n\
             [[vips.backends]]\naddress = \"10.0.1.5\"\n[[vips.backends]]\naddress = \"10.0.2.5\"\n"
                .into(),
            "vips[0].backends[1].address: VIP 10.0.0.1:443/udp: backends 10.0.1.5 and 10.0.2.5 would both have QUIC server id 05",
            "a longer server_id_len",
        ),
        // Syntax.
        ("[[vips]]\nvip = \n".into(), "test.toml:2:7: string values must be quoted", ""),
        ("[[vips]\n".into(), "test.toml:1:", ""),
        ("[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nhealth = { probe = { kind = \"tcp\" }\n".into(), "test.toml:3:", ""),
        // Empty.
        (String::new(), "test.toml: declares nothing", "vips = []"),
        ("# nothing but comments\n\n".into(), "test.toml: declares nothing", ""),
        // Bounded.
        (format!("vips = []\n#{}\n", "x".repeat(MAX_CONFIG_BYTES)), "test.toml: larger than the 4 MiB a configuration may be", ""),
    ];
    for (text, message, hint) in cases {
        let Err(err) = parse(&text) else {
            if message.is_empty() {
                continue; // an IPv4 VIP takes an IPv6 backend (4-in-6)
            }
            panic!("accepted:\n{text}");
        };
        let shown = err.to_string();
        assert!(!message.is_empty(), "refused {text:?}: {shown}");
        assert!(shown.contains(message), "{text:?}\n  refused with {shown:?}\n  expected {message:?}");
        assert!(shown.contains(hint), "{shown} lacks {hint:?}");
    }
}

#[test]
fn starts_written_into_a_file_keep_the_rest_and_declare_them() {
    let text = "# the fleet\n[[vips]]\nvip = \"10.0.0.1:80/tcp\"\n\n[[vips.backends]]\naddress = \"10.0.1.1\" # rack 4\nweight = 5\n\n\
                [[vips.backends]]\nstarted_at = 2026-11-30T08:00:00Z\naddress = \"10.0.1.2\"\n\n[[vips.backends]]\naddress = \"10.0.1.3\"\n";
    let (v, b1, b3) = (vip("10.0.0.1:80/tcp"), "10.0.1.1".parse().unwrap(), "10.0.1.3".parse().unwrap());
    let at = 1_764_633_600_250; // 2025-12-02T00:00:00.250Z
    let written = with_starts("test.toml", text, &[(v, b1, at), (v, b3, at + 1000)]).unwrap();
    assert!(written.starts_with("# the fleet\n"), "{written}");
    assert!(written.contains("address = \"10.0.1.1\" # rack 4\nstarted_at = 2025-12-02T00:00:00.25Z\nweight = 5\n"), "{written}");
    assert!(written.ends_with("address = \"10.0.1.3\"\nstarted_at = 2025-12-02T00:00:01.25Z\n"), "{written}");
    let state = parse(&written).unwrap();
    let starts: Vec<Option<u64>> = state.vips[&v].backends.values().map(|b| b.started_at_unix_ms).collect();
    assert_eq!(starts, [Some(at), Some(1_796_025_600_000), Some(at + 1000)]);
    // A backend that has one already, or that the file lacks: refused, nothing written.
    assert!(with_starts("test.toml", text, &[(v, "10.0.1.2".parse().unwrap(), at)]).is_err());
    assert!(with_starts("test.toml", text, &[(v, "10.0.1.9".parse().unwrap(), at)]).is_err());
    // Backends in an inline array: the line cannot be placed, refused.
    let inline = "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nbackends = [{ address = \"10.0.1.1\" }]\n";
    let refused = with_starts("test.toml", inline, &[(v, b1, at)]).unwrap_err();
    assert!(refused.contains("test.toml"), "{refused}");
}

#[test]
fn reading_a_file_is_bounded_and_names_it() {
    let tmp = TempDir::new("config-read");
    let path = tmp.path().join("huge.toml");
    fs::write(&path, vec![b'#'; MAX_CONFIG_BYTES + 10]).unwrap();
    let err = Document::read(&path).unwrap_err().to_string();
    assert_eq!(err, format!("{}: larger than the 4 MiB a configuration may be", path.display()));
    fs::write(&path, b"vips = []\n# caf\xe9\n").unwrap();
    let err = Document::read(&path).unwrap_err().to_string();
    assert_eq!(err, format!("{}:2:6: not UTF-8 text", path.display()));
    let err = Document::read(&tmp.path().join("missing.toml")).unwrap_err().to_string();
    assert!(err.contains("missing.toml: reading it: No such file"), "{err}");
    fs::write(&path, "vips = []\n").unwrap();
    assert_eq!(Document::read(&path).unwrap().desired_state().unwrap(), DesiredState::default());
}

#[test]
fn diff_lists_each_item_once_in_file_terms() {
    let old = parse(
        "[limits]\nper_source = { per_s = 5 }\n\
         [[vips]]\nvip = \"10.0.0.1:80/tcp\"\n\
         [[vips.backends]]\naddress = \"10.0.1.1\"\n\
         [[vips.backends]]\naddress = \"10.0.1.2\"\nweight = 50\n\
         [[vips]]\nvip = \"10.0.0.9:80/tcp\"\n\
         [[vips.backends]]\naddress = \"10.0.9.1\"\n\
         [[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"block\"\n",
    )
    .unwrap();
    let new = parse(
        "[[vips]]\nvip = \"10.0.0.1:80/tcp\"\nring_size = 4099\n[vips.health.policy]\nfall = 3\n\
         [[vips.backends]]\naddress = \"10.0.1.1\"\ndrain = true\n\
         [[vips.backends]]\naddress = \"10.0.1.3\"\nzone = \"b\"\n\
         [[rules]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\nper_s = 9\n\
         [[rules]]\ncidr = \"10.1.0.0/16\"\nvip = \"10.0.0.1:80/tcp\"\naction = \"exempt\"\n",
    )
    .unwrap();
    let lines: Vec<String> = diff(&old, &new).iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "- default limits",
            "~ vip 10.0.0.1:80/tcp: health.policy.fall - -> 3, health.probe.kind - -> \"tcp\", ring_size 65537 -> 4099",
            "~ backend 10.0.1.1 in 10.0.0.1:80/tcp: drain - -> true, weight 100 -> -",
            "- backend 10.0.1.2 in 10.0.0.1:80/tcp",
            "+ backend 10.0.1.3 in 10.0.0.1:80/tcp: address=\"10.0.1.3\", weight=100, zone=\"b\"",
            "- vip 10.0.0.9:80/tcp",
            "- backend 10.0.9.1 in 10.0.0.9:80/tcp",
            "~ rule 10.0.0.0/8: action \"block\" -> \"limit\", burst - -> 9, per_s - -> 9",
            "+ rule 10.1.0.0/16@10.0.0.1:80/tcp: action=\"exempt\", cidr=\"10.1.0.0/16\", vip=\"10.0.0.1:80/tcp\"",
        ]
    );
    let json = serde_json::to_value(&diff(&old, &new)[2]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"change": "changed", "item": "backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1",
                           "fields": [{"field": "drain", "to": true}, {"field": "weight", "from": 100}]})
    );
    assert_eq!(diff(&new, &new), []);
}

#[test]
fn a_key_rotation_is_quic_and_quic_next_each_with_its_key_file_and_only_their_paths_are_exported() {
    let text = "[[vips]]\nvip = \"10.0.0.1:443/udp\"\nquic = { config_id = 1, key_file = \"/etc/spillway/quic-1.key\" }\n\
                quic_next = { config_id = 2, key_file = \"/etc/spillway/quic-2.key\" }\n";
    let state = parse(text).unwrap();
    let config = &state.vips[&vip("10.0.0.1:443/udp")];
    assert_eq!(config.quic.as_ref().unwrap().key_file(), Some(std::path::Path::new("/etc/spillway/quic-1.key")));
    assert_eq!(config.quic_next.as_ref().unwrap().config_id, 2);
    let exported = export(&state, None);
    assert!(exported.contains("key_file = \"/etc/spillway/quic-2.key\""), "{exported}");
    assert_eq!(parse(&exported).unwrap(), state);
    let mut retired = state.clone();
    retired.retire_quic(&vip("10.0.0.1:443/udp")).unwrap();
    assert_eq!(retired.vips[&vip("10.0.0.1:443/udp")].quic.as_ref().unwrap().config_id, 2);
    assert_eq!(retired.vips[&vip("10.0.0.1:443/udp")].quic_next, None);
}

#[test]
fn a_second_config_id_that_cannot_live_beside_the_first_is_refused_naming_quic_next() {
    for (next, said) in [
        ("{ config_id = 1 }", "vips[0].quic_next: VIP 10.0.0.1:443/udp quic: quic_next.config_id 1 is the current config id"),
        ("{ config_id = 2, server_id_len = 3 }", "vips[0].quic_next: VIP 10.0.0.1:443/udp quic: quic_next.server_id_len 3 differs"),
    ] {
        let text = format!("[[vips]]\nvip = \"10.0.0.1:443/udp\"\nquic = {{ config_id = 1 }}\nquic_next = {next}\n");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains(said), "{err}");
    }
}

#[test]
fn a_relative_key_file_is_refused_naming_its_vip() {
    for quic in ["quic = { key_file = \"quic-1.key\" }", "quic = {}\nquic_next = { config_id = 1, key_file = \"keys/quic-1.key\" }"] {
        let text = format!("[[vips]]\nvip = \"10.0.0.1:443/udp\"\n{quic}\n");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("VIP 10.0.0.1:443/udp") && err.contains("key_file must be an absolute path"), "{err}");
    }
}
