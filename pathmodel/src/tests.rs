use std::collections::BTreeMap;
use std::net::SocketAddr;

use spillway_common::{
    addr::to_words,
    types::{BACKEND_ACTIVE, BACKEND_F_NEW_FLOWS, BackendInfo, CFG_F_STATIC_NEXTHOP, FAMILY_V4, LbConfig, PROTO_TCP, Rate, Reason, VipKey},
};
use spillway_harness::frames;

use crate::{Action, MapState, Model, VipEntry, frame, limits::gcra};

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn backend(addr: &str, generation: u32) -> BackendInfo {
    let (addr, family) = to_words(addr.parse().unwrap());
    BackendInfo { addr, family, state: BACKEND_ACTIVE, flags: BACKEND_F_NEW_FLOWS, generation, vip_id: 1, ..BackendInfo::default() }
}

/// 10.200.1.1:80/tcp on a 13-slot table whose slots alternate between backends 1 and 2.
fn state() -> MapState {
    let key = VipKey { addr: to_words("10.200.1.1".parse().unwrap()).0, port: 80u16.to_be(), proto: PROTO_TCP, family: FAMILY_V4 };
    MapState {
        config: LbConfig { flags: CFG_F_STATIC_NEXTHOP, static_ifindex: 1, tcp_idle_timeout_s: 60, ..LbConfig::default() },
        vips: vec![VipEntry { key, id: 1, flags: 0, ring: (0..13).map(|i| 1 + i % 2).collect(), prior: Vec::new(), quic: None }],
        backends: BTreeMap::from([(1, backend("10.1.0.101", 1)), (2, backend("10.1.0.102", 1))]),
        table_buckets: 1024,
        ingress: 1,
        ..MapState::default()
    }
}

#[test]
fn a_bucket_admits_its_burst_and_one_then_one_an_interval() {
    let rate = Rate::new(2, 3);
    let mut tat = 0;
    let now = 10_000_000_000;
    assert_eq!((0..6).filter(|_| gcra(&mut tat, &rate, now)).count(), 4);
    assert!(!gcra(&mut tat, &rate, now + rate.interval_ns - 1));
    assert!(gcra(&mut tat, &rate, now + rate.interval_ns));
}

#[test]
fn the_parser_walks_four_extension_headers_and_no_more() {
    let tcp = frames::tcp(sock("[2001:db8::1]:1000"), sock("[2001:db8:100::1]:80"), true, &[]);
    let walked = frames::with_ipv6_extension_headers(&tcp, &[0, 60, 43, 60]);
    assert!(matches!(frame::parse(&walked), frame::Parsed::Flow { syn: true, .. }));
    let past = frames::with_ipv6_extension_headers(&tcp, &[0, 60, 43, 60, 60]);
    assert!(matches!(frame::parse(&past), frame::Parsed::Other(_)));
}

#[test]
fn a_known_flow_keeps_its_backend_until_that_backend_is_replaced() {
    let mut model = Model::new(state(), 1 << 40);
    let (client, vip) = (sock("192.168.0.1:1000"), sock("10.200.1.1:80"));
    let first = model.run(&frames::tcp(client, vip, true, &[])).unwrap();
    assert_eq!((first.action, first.reason), (Action::Tx, Reason::Tx));
    let placed = first.backend.unwrap();
    // Every slot moves to the other backend: the connection stays where it was.
    let other = 3 - placed;
    let mut moved = state();
    moved.vips[0].ring = vec![other; 13];
    model.set_state(moved.clone());
    assert_eq!(model.run(&frames::tcp(client, vip, false, b"x")).unwrap().backend, Some(placed));
    // Its backend's slot reused (a new generation): the flow follows the table again.
    moved.backends.insert(placed, backend(if placed == 1 { "10.1.0.101" } else { "10.1.0.102" }, 2));
    model.set_state(moved);
    assert_eq!(model.run(&frames::tcp(client, vip, false, b"x")).unwrap().backend, Some(other));
}

#[test]
fn an_echo_answer_is_the_request_turned_around_with_right_checksums() {
    let mut st = state();
    st.addresses.insert((FAMILY_V4, st.vips[0].key.addr), spillway_common::types::ADDR_F_VIP | spillway_common::types::ADDR_F_ECHO);
    st.echo = spillway_common::types::EchoConfig::new(1, 10);
    let mut model = Model::new(st, 1 << 40);
    let request = frames::echo_request("192.168.0.1".parse().unwrap(), "10.200.1.1".parse().unwrap(), 7, 1, &[0xa5; 40]);
    let answer = model.run(&request).unwrap();
    assert_eq!((answer.action, answer.reason), (Action::Tx, Reason::TxEchoReply));
    // Checked by an implementation of its own (etherparse), checksums included.
    frames::check_echo_reply(&answer.frame, &request, frames::ETH_LEN).unwrap();
    // One a second with a burst of one: one more now, then none.
    assert_eq!(model.run(&request).unwrap().reason, Reason::TxEchoReply);
    assert_eq!(model.run(&request).unwrap().reason, Reason::DropEchoLimited);
}
