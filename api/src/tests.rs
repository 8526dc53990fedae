//! The wire format is a public interface: these pin its exact JSON.

use serde_json::json;

use super::*;
use spillway_model::Cidr;
use spillway_model::testing::{ip, vip};

/// The VIP of these tests.
const VIP: &str = "10.0.0.1:80/tcp";

#[test]
fn requests_have_stable_names() {
    let cases = [
        (Request::ListVips, json!({"op": "list_vips"})),
        (
            Request::AddVip {
                vip: vip(VIP),
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
            json!({"op": "add_vip", "vip": "10.0.0.1:80/tcp"}),
        ),
        (
            Request::AddVip {
                vip: vip(VIP),
                ring_size: Some(251),
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
            json!({"op": "add_vip", "vip": "10.0.0.1:80/tcp", "ring_size": 251}),
        ),
        (
            Request::AddVip {
                vip: vip(VIP),
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::Source,
                source_prefix: Some(24),
            },
            json!({"op": "add_vip", "vip": "10.0.0.1:80/tcp", "hash": "source", "source_prefix": 24}),
        ),
        (Request::RemoveVip { vip: vip(VIP), force: false }, json!({"op": "remove_vip", "vip": "10.0.0.1:80/tcp"})),
        (Request::ListBackends { vip: vip(VIP) }, json!({"op": "list_backends", "vip": "10.0.0.1:80/tcp"})),
        (
            Request::AddBackend { vip: vip(VIP), backend: ip("fd00::1"), weight: Some(5), options: Default::default() },
            json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "fd00::1", "weight": 5}),
        ),
        (
            Request::AddBackend { vip: vip(VIP), backend: ip("10.0.1.1"), weight: None, options: Default::default() },
            json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::RemoveBackend { vip: vip(VIP), backend: ip("10.0.1.1") },
            json!({"op": "remove_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.1.1"), deadline_s: None, force: false },
            json!({"op": "drain_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::SetWeight { vip: vip(VIP), backend: ip("10.0.1.1"), weight: 3 },
            json!({"op": "set_weight", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1", "weight": 3}),
        ),
        (Request::Stats, json!({"op": "stats"})),
    ];
    for (request, wire) in cases {
        assert_eq!(serde_json::to_value(&request).unwrap(), wire, "{request:?}");
        assert_eq!(serde_json::from_value::<Request>(wire).unwrap(), request);
    }
}

#[test]
fn malformed_requests_are_refused() {
    for bad in [
        json!({"op": "add_vip", "vip": "10.0.0.1:80/sctp"}),
        json!({"op": "add_vip"}),
        json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1", "wieght": 5}),
        json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1"}),
        json!({"op": "launch"}),
        json!({"vip": "10.0.0.1:80/tcp"}),
    ] {
        assert!(serde_json::from_value::<Request>(bad.clone()).is_err(), "{bad} accepted");
    }
}

#[test]
fn responses_have_stable_names() {
    let cases = [
        (
            Response::Ok(Reply::Done { slots_written: 7, tables_flipped: 1 }),
            json!({"ok": {"type": "done", "slots_written": 7, "tables_flipped": 1}}),
        ),
        (
            Response::Ok(Reply::Vips(VipList {
                vips: vec![VipEntry {
                    vip: vip(VIP),
                    ring_size: 13,
                    encap: Encap::Ipip,
                    hash: HashMode::Source,
                    source_prefix: Some(24),
                    backends: 1,
                    health: None,
                    effective_budget: None,
                    announcement: None,
                    table_digest: None,
                }],
                alerts: vec![],
            })),
            json!({"ok": {"type": "vips", "vips": [{"vip": "10.0.0.1:80/tcp", "ring_size": 13, "encap": "ipip", "hash": "source",
                "source_prefix": 24, "backends": 1}]}}),
        ),
        (
            Response::Ok(Reply::Backends(BackendList {
                vip: vip(VIP),
                backends: vec![BackendEntry::configured(ip("10.0.1.1"), 0)],
                alerts: vec![],
            })),
            json!({"ok": {"type": "backends", "vip": "10.0.0.1:80/tcp",
                          "backends": [{"address": "10.0.1.1", "weight": 0, "state": "draining", "encap": "ipip"}]}}),
        ),
        (
            Response::Ok(Reply::Stats(Stats {
                vips: vec![VipStats {
                    vip: vip(VIP),
                    packets: 2,
                    bytes: 200,
                    backends: vec![BackendStats { address: ip("10.0.1.1"), packets: 2, bytes: 200 }],
                }],
                reasons: vec![ReasonCount { reason: "tx".into(), packets: 2 }],
                observed: vec![ReasonCount { reason: "would_drop_vip_budget".into(), packets: 1 }],
                quic: vec![ReasonCount { reason: "quic_fallback".into(), packets: 3 }],
                alerts: vec![],
            })),
            json!({"ok": {"type": "stats",
                          "vips": [{"vip": "10.0.0.1:80/tcp", "packets": 2, "bytes": 200,
                                    "backends": [{"address": "10.0.1.1", "packets": 2, "bytes": 200}]}],
                          "reasons": [{"reason": "tx", "packets": 2}],
                          "observed": [{"reason": "would_drop_vip_budget", "packets": 1}],
                          "quic": [{"reason": "quic_fallback", "packets": 3}]}}),
        ),
        (
            Response::Error(ApiError { kind: ErrorKind::Invalid, message: "unknown VIP 10.0.0.1:80/tcp".into() }),
            json!({"error": {"kind": "invalid", "message": "unknown VIP 10.0.0.1:80/tcp"}}),
        ),
    ];
    for (response, wire) in cases {
        assert_eq!(serde_json::to_value(&response).unwrap(), wire, "{response:?}");
        assert_eq!(serde_json::from_value::<Response>(wire).unwrap(), response);
    }
    for (kind, name) in [
        (ErrorKind::BadRequest, "bad_request"),
        (ErrorKind::Invalid, "invalid"),
        (ErrorKind::PermissionDenied, "permission_denied"),
        (ErrorKind::Internal, "internal"),
    ] {
        assert_eq!(serde_json::to_value(kind).unwrap(), json!(name));
    }
}

#[test]
fn limit_and_rule_requests_have_stable_names() {
    let cidr = |s: &str| s.parse::<Cidr>().unwrap();
    let cases = [
        (
            Request::SetRateLimit {
                scope: Scope::Default,
                per_s: 100,
                burst: None,
                source_prefix_v4: None,
                source_prefix_v6: None,
                observe: false,
            },
            json!({"op": "set_rate_limit", "scope": "default", "per_s": 100, "observe": false}),
        ),
        (
            Request::SetRateLimit {
                scope: Scope::Vip(vip(VIP)),
                per_s: 5,
                burst: Some(50),
                source_prefix_v4: Some(24),
                source_prefix_v6: Some(48),
                observe: true,
            },
            json!({"op": "set_rate_limit", "scope": "10.0.0.1:80/tcp", "per_s": 5, "burst": 50,
                   "source_prefix_v4": 24, "source_prefix_v6": 48, "observe": true}),
        ),
        (
            Request::SetBudget { scope: Scope::Vip(vip(VIP)), per_s: 20000, burst: Some(1), observe: true },
            json!({"op": "set_budget", "scope": "10.0.0.1:80/tcp", "per_s": 20000, "burst": 1, "observe": true}),
        ),
        (
            Request::ClearRateLimit { scope: Scope::Default, part: LimitPart::PerSource },
            json!({"op": "clear_rate_limit", "scope": "default", "part": "per_source"}),
        ),
        (
            Request::ClearRateLimit { scope: Scope::Vip(vip(VIP)), part: LimitPart::All },
            json!({"op": "clear_rate_limit", "scope": "10.0.0.1:80/tcp", "part": "all"}),
        ),
        (Request::ListRateLimits, json!({"op": "list_rate_limits"})),
        (
            Request::SetRule {
                cidr: cidr("10.0.0.0/8"),
                vip: None,
                action: RuleActionKind::Block,
                per_s: None,
                burst: None,
                observe: false,
            },
            json!({"op": "set_rule", "cidr": "10.0.0.0/8", "action": "block", "observe": false}),
        ),
        (
            Request::SetRule {
                cidr: cidr("2001:db8::/32"),
                vip: Some(vip(VIP)),
                action: RuleActionKind::Limit,
                per_s: Some(10),
                burst: Some(20),
                observe: true,
            },
            json!({"op": "set_rule", "cidr": "2001:db8::/32", "vip": "10.0.0.1:80/tcp", "action": "limit", "per_s": 10, "burst": 20, "observe": true}),
        ),
        (
            Request::RemoveRule { cidr: cidr("10.0.0.0/8"), vip: Some(vip(VIP)) },
            json!({"op": "remove_rule", "cidr": "10.0.0.0/8", "vip": "10.0.0.1:80/tcp"}),
        ),
        (Request::ListRules, json!({"op": "list_rules"})),
        (Request::TopSources { vip: vip(VIP), limit: Some(5) }, json!({"op": "top_sources", "vip": "10.0.0.1:80/tcp", "limit": 5})),
    ];
    for (request, wire) in cases {
        assert_eq!(serde_json::to_value(&request).unwrap(), wire, "{request:?}");
        assert_eq!(serde_json::from_value::<Request>(wire).unwrap(), request);
    }
    // Optional fields may be left out.
    assert_eq!(
        serde_json::from_value::<Request>(json!({"op": "clear_rate_limit", "scope": "default"})).unwrap(),
        Request::ClearRateLimit { scope: Scope::Default, part: LimitPart::All }
    );
    for bad in [
        json!({"op": "set_rate_limit", "scope": "default", "per_s": -5}),
        json!({"op": "set_rate_limit", "per_s": 5}),
        json!({"op": "set_rate_limit", "scope": "everything", "per_s": 5}),
        json!({"op": "set_rate_limit", "scope": "default", "per_s": 5, "source_prefix_v4": 300}),
        json!({"op": "set_budget", "scope": "default", "per_s": 5, "brust": 1}),
        json!({"op": "clear_rate_limit", "scope": "default", "part": "both"}),
        json!({"op": "set_rule", "cidr": "10.0.0.1/8", "action": "block"}),
        json!({"op": "set_rule", "cidr": "10.0.0.0/8", "action": "drop"}),
        json!({"op": "set_rule", "cidr": "10.0.0.0/8"}),
        json!({"op": "top_sources", "vip": "10.0.0.1:80/tcp", "limit": -1}),
    ] {
        assert!(serde_json::from_value::<Request>(bad.clone()).is_err(), "{bad} accepted");
    }
}

#[test]
fn limit_and_rule_replies_have_stable_names() {
    let rate = |per_s, burst| spillway_model::RateSpec { per_s, burst };
    let per_source =
        PerSourceLimit { rate: rate(100, 200), source_prefix_v4: 24, source_prefix_v6: 64, observe: false, from: LimitOrigin::Default };
    let cases = [
        (
            Reply::RateLimits(RateLimitList {
                default: ScopeLimits { per_source: Some(per_source.clone()), vip_budget: None },
                vips: vec![VipLimits {
                    vip: vip(VIP),
                    effective: ScopeLimits {
                        per_source: Some(per_source),
                        vip_budget: Some(BudgetLimit { rate: rate(5, 5), observe: true, from: LimitOrigin::Vip }),
                    },
                }],
            }),
            json!({"type": "rate_limits",
                   "default": {"per_source": {"rate": {"per_s": 100, "burst": 200}, "source_prefix_v4": 24, "source_prefix_v6": 64,
                                              "observe": false, "from": "default"},
                               "vip_budget": null},
                   "vips": [{"vip": "10.0.0.1:80/tcp",
                             "per_source": {"rate": {"per_s": 100, "burst": 200}, "source_prefix_v4": 24, "source_prefix_v6": 64,
                                            "observe": false, "from": "default"},
                             "vip_budget": {"rate": {"per_s": 5, "burst": 5}, "observe": true, "from": "vip"}}]}),
        ),
        (
            Reply::Rules(RuleList {
                rules: vec![
                    RuleEntry {
                        cidr: "10.0.0.0/8".parse().unwrap(),
                        vip: None,
                        action: RuleActionKind::Block,
                        rate: None,
                        observe: true,
                        hits: 3,
                        dropped: 0,
                        would_drop: 3,
                    },
                    RuleEntry {
                        cidr: "10.1.0.0/16".parse().unwrap(),
                        vip: Some(vip(VIP)),
                        action: RuleActionKind::Limit,
                        rate: Some(rate(7, 7)),
                        observe: false,
                        hits: 9,
                        dropped: 2,
                        would_drop: 0,
                    },
                ],
            }),
            json!({"type": "rules", "rules": [
                {"cidr": "10.0.0.0/8", "vip": "*", "action": "block", "rate": null, "observe": true, "hits": 3, "dropped": 0,
                 "would_drop": 3},
                {"cidr": "10.1.0.0/16", "vip": "10.0.0.1:80/tcp", "action": "limit", "rate": {"per_s": 7, "burst": 7},
                 "observe": false, "hits": 9, "dropped": 2, "would_drop": 0},
            ]}),
        ),
        (
            Reply::TopSources(TopSourceList {
                vip: vip(VIP),
                tracked: 2,
                sources: vec![SourceEntry { prefix: "198.51.100.0/24".parse().unwrap(), admitted: 4, dropped: 9, estimated: false }],
            }),
            json!({"type": "top_sources", "vip": "10.0.0.1:80/tcp", "tracked": 2,
                   "sources": [{"prefix": "198.51.100.0/24", "admitted": 4, "dropped": 9, "estimated": false}]}),
        ),
    ];
    for (reply, wire) in cases {
        assert_eq!(serde_json::to_value(&reply).unwrap(), wire, "{reply:?}");
        assert_eq!(serde_json::from_value::<Reply>(wire).unwrap(), reply);
    }
    // A reply from an lbd without observed counters still reads.
    let old = json!({"type": "stats", "vips": [], "reasons": []});
    assert_eq!(
        serde_json::from_value::<Reply>(old).unwrap(),
        Reply::Stats(Stats { vips: vec![], reasons: vec![], observed: vec![], quic: vec![], alerts: vec![] })
    );
}

#[test]
fn decode_takes_one_request_line_and_refuses_anything_else_as_a_bad_request() {
    assert_eq!(Request::decode(b"{\"op\":\"list_vips\"}\n"), Ok(Request::ListVips));
    let long = [b"{\"op\":\"list_vips\"}".as_slice(), &vec![b' '; MAX_REQUEST_BYTES]].concat();
    for (line, says) in [
        (long.as_slice(), "longer than"),
        (b"{\"op\":\"apply\",\"config\":\"\xff\",\"source\":\"x\"}\n".as_slice(), "bad request"),
        (b"{\"op\":\"list_vips\"} {\"op\":\"stats\"}\n", "bad request"),
        (b"", "bad request"),
    ] {
        let refusal = Request::decode(line).unwrap_err();
        assert_eq!(refusal.kind, ErrorKind::BadRequest, "{line:?}");
        assert!(refusal.message.contains(says), "{}", refusal.message);
    }
}
