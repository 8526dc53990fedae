//! The wire format is a public interface: these pin its exact JSON.

use serde_json::json;

use super::*;

fn vip() -> Vip {
    "10.0.0.1:80/tcp".parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn requests_have_stable_names() {
    let cases = [
        (Request::ListVips, json!({"op": "list_vips"})),
        (Request::AddVip { vip: vip(), ring_size: None }, json!({"op": "add_vip", "vip": "10.0.0.1:80/tcp"})),
        (Request::AddVip { vip: vip(), ring_size: Some(251) }, json!({"op": "add_vip", "vip": "10.0.0.1:80/tcp", "ring_size": 251})),
        (Request::RemoveVip { vip: vip() }, json!({"op": "remove_vip", "vip": "10.0.0.1:80/tcp"})),
        (Request::ListBackends { vip: vip() }, json!({"op": "list_backends", "vip": "10.0.0.1:80/tcp"})),
        (
            Request::AddBackend { vip: vip(), backend: ip("fd00::1"), weight: Some(5) },
            json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "fd00::1", "weight": 5}),
        ),
        (
            Request::AddBackend { vip: vip(), backend: ip("10.0.1.1"), weight: None },
            json!({"op": "add_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::RemoveBackend { vip: vip(), backend: ip("10.0.1.1") },
            json!({"op": "remove_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::DrainBackend { vip: vip(), backend: ip("10.0.1.1") },
            json!({"op": "drain_backend", "vip": "10.0.0.1:80/tcp", "backend": "10.0.1.1"}),
        ),
        (
            Request::SetWeight { vip: vip(), backend: ip("10.0.1.1"), weight: 3 },
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
            Response::Ok(Reply::Vips(VipList { vips: vec![VipEntry { vip: vip(), ring_size: 13, backends: 1 }] })),
            json!({"ok": {"type": "vips", "vips": [{"vip": "10.0.0.1:80/tcp", "ring_size": 13, "backends": 1}]}}),
        ),
        (
            Response::Ok(Reply::Backends(BackendList {
                vip: vip(),
                backends: vec![BackendEntry { address: ip("10.0.1.1"), weight: 0, state: BackendState::Draining }],
            })),
            json!({"ok": {"type": "backends", "vip": "10.0.0.1:80/tcp",
                          "backends": [{"address": "10.0.1.1", "weight": 0, "state": "draining"}]}}),
        ),
        (
            Response::Ok(Reply::Stats(Stats {
                vips: vec![VipStats {
                    vip: vip(),
                    packets: 2,
                    bytes: 200,
                    backends: vec![BackendStats { address: ip("10.0.1.1"), packets: 2, bytes: 200 }],
                }],
                reasons: vec![ReasonCount { reason: "tx".into(), packets: 2 }],
            })),
            json!({"ok": {"type": "stats",
                          "vips": [{"vip": "10.0.0.1:80/tcp", "packets": 2, "bytes": 200,
                                    "backends": [{"address": "10.0.1.1", "packets": 2, "bytes": 200}]}],
                          "reasons": [{"reason": "tx", "packets": 2}]}}),
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
