//! Second chance: a TCP packet without a table entry whose slot the VIP's last change moved
//! goes to its new backend inside a tunnel to its old one; the backend keeps it when it has
//! the connection and sends the inner tunnel back to the hop it came from otherwise.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use aya::maps::{HashMap, PerCpuArray};
use spillway::{dataplane::test_run, reconcile::vip_key};
use spillway_common::{
    addr::to_words,
    hash::{FLOW_SEED, flow_hash},
    limits::map_names,
    types::{AddrKey, DecapReason, PROTO_TCP, PROTO_UDP, Reason},
};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

/// The backend the VIP's second-chance table gives `key` (`None`: there is none).
fn prior_backend(env: &Env, v: &spillway::model::Vip, key: &spillway_common::types::FlowKey) -> Option<IpAddr> {
    let prior = env.balancer.maps.vips.get(&vip_key(v)).unwrap().prior;
    env.balancer.maps.rings.choice(prior, flow_hash(key, FLOW_SEED)).map(|id| env.backend_addr(id))
}

fn second_chance_packets(env: &Env) -> u64 {
    env.balancer.maps.second_chance_packets().unwrap()
}

/// CHECK of a second-chance frame: a tunnel to `first` holding a tunnel to `second` holding
/// the input's IP packet, untouched.
fn expect_nested(out: &[u8], input: &[u8], first: IpAddr, second: IpAddr) {
    let outer_len = if first.is_ipv4() { 20 } else { 40 };
    // Seen from the first backend, the middle tunnel is the inner packet...
    let as_first_sees: Vec<u8> = [&out[..14], &out[14 + outer_len..]].concat();
    frames::check_encap(out, &as_first_sees, 14, first, None).unwrap_or_else(|e| panic!("outer tunnel: {e:#}"));
    // ... and the middle tunnel carries the client's packet to the second.
    frames::check_encap(&as_first_sees, input, 14, second, None).unwrap_or_else(|e| panic!("middle tunnel: {e:#}"));
}

#[test]
fn a_moved_flow_without_an_entry_carries_both_candidates() {
    with_env(|env| {
        env.reconciler.set_second_chance_settle(Duration::ZERO);
        let v = vip("10.200.1.1:80/tcp");
        env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
        let d = sock("10.200.1.1:80");
        let key = |port: u16| flow_key(sock(&format!("192.168.10.20:{port}")), d, PROTO_TCP);
        assert_eq!(prior_backend(env, &v, &key(1)), None, "no change yet, no second chance");
        env.update(|s| s.add_backend(&v, packet_lab::backend4(104).into(), 100).unwrap());

        let moved = (40000..41000).find(|&p| prior_backend(env, &v, &key(p)) != Some(env.predicted_backend(&v, &key(p)))).unwrap();
        let kept = (40000..41000).find(|&p| prior_backend(env, &v, &key(p)) == Some(env.predicted_backend(&v, &key(p)))).unwrap();
        let (now, before) = (env.predicted_backend(&v, &key(moved)), prior_backend(env, &v, &key(moved)).unwrap());
        let client = sock(&format!("192.168.10.20:{moved}"));

        // Not a SYN, no entry, moved: to the new backend inside a tunnel to the old one,
        // remembered by nobody, counted as sent.
        let ack = frames::tcp(client, d, false, b"data");
        let sent = second_chance_packets(env);
        let out = env.expect(&ack, XDP_TX, Reason::Tx);
        expect_nested(&out.frame, &ack, now, before);
        assert_eq!(env.pinned_backend(&key(moved)), None, "a second-chance flow must not be pinned to either");
        assert_eq!(second_chance_packets(env), sent + 1);
        // Every packet of it does the same.
        expect_nested(&env.expect(&ack, XDP_TX, Reason::Tx).frame, &ack, now, before);

        // A SYN is a new connection: the new backend only, remembered.
        let syn = frames::tcp(client, d, true, &[]);
        expect_encap(&env.expect(&syn, XDP_TX, Reason::Tx).frame, &syn, 14, now, None);
        assert_eq!(env.pinned_backend(&key(moved)), Some(now));
        // With an entry, the flow's packets go where it says.
        expect_encap(&env.expect(&ack, XDP_TX, Reason::Tx).frame, &ack, 14, now, None);

        // A flow whose slot did not move, and UDP, are placed as always.
        let still = frames::tcp(sock(&format!("192.168.10.20:{kept}")), d, false, b"data");
        expect_encap(&env.expect(&still, XDP_TX, Reason::Tx).frame, &still, 14, env.predicted_backend(&v, &key(kept)), None);
        let u = vip("10.200.1.1:53/udp");
        env.add_vip(u, &[packet_lab::backend4(101).into(), packet_lab::backend4(102).into()]);
        env.update(|s| s.add_backend(&u, packet_lab::backend4(103).into(), 100).unwrap());
        let dns = sock("10.200.1.1:53");
        let moved_udp = (40000..41000)
            .map(|p| flow_key(sock(&format!("192.168.10.20:{p}")), dns, PROTO_UDP))
            .find(|k| prior_backend(env, &u, k) != Some(env.predicted_backend(&u, k)))
            .unwrap();
        let q = frames::udp(sock(&format!("192.168.10.20:{}", u16::from_be(moved_udp.sport))), dns, b"q");
        expect_encap(&env.expect(&q, XDP_TX, Reason::Tx).frame, &q, 14, env.predicted_backend(&u, &moved_udp), None);
        assert_eq!(second_chance_packets(env), sent + 2);
    });
}

#[test]
fn a_second_candidate_that_left_the_vip_is_no_candidate() {
    with_env(|env| {
        env.reconciler.set_second_chance_settle(Duration::ZERO);
        let v = vip("10.200.1.1:80/tcp");
        let b = |n| IpAddr::from(packet_lab::backend4(n));
        env.add_vip(v, &[b(101), b(102), b(103)]);
        env.update(|s| s.add_backend(&v, b(104), 100).unwrap());
        let d = sock("10.200.1.1:80");
        let key = |port: u16| flow_key(sock(&format!("192.168.10.20:{port}")), d, PROTO_TCP);
        let prior = |env: &Env| env.balancer.maps.vips.get(&vip_key(&v)).unwrap().prior;
        let prior_id = |env: &Env, port| env.balancer.maps.rings.choice(prior(env), flow_hash(&key(port), FLOW_SEED)).unwrap();
        // A flow the change moved away from 10.0.0.103, which then leaves the VIP within
        // the same episode: its id stays in the second-chance table.
        let gone = env.reconciler.backend_id(&v, &b(103)).unwrap();
        let port = (40000..42000).find(|&p| prior_id(env, p) == gone && env.predicted_backend(&v, &key(p)) != b(103)).unwrap();
        env.reconciler.set_second_chance_settle(Duration::from_secs(3600));
        env.update(|s| s.remove_backend(&v, b(103)).unwrap());
        assert_eq!(prior_id(env, port), gone, "the episode keeps its second-chance table");
        // Its id, freed, goes to a backend of another VIP.
        let w = vip("10.200.1.9:80/tcp");
        env.add_vip(w, &[b(109)]);
        assert_eq!(env.reconciler.backend_id(&w, &b(109)), Some(gone), "the freed id must be reused for this test to mean anything");

        // Not the other VIP's backend: the packet goes as a new flow does.
        let ack = frames::tcp(sock(&format!("192.168.10.20:{port}")), d, false, b"data");
        let sent = second_chance_packets(env);
        let out = env.expect(&ack, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &ack, 14, env.predicted_backend(&v, &key(port)), None);
        assert_eq!(second_chance_packets(env), sent);
    });
}

fn decap_reasons(env: &Env) -> Vec<u64> {
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(env.decap.map(map_names::DECAP_REASONS).unwrap()).unwrap();
    DecapReason::ALL.iter().map(|r| map.get(&(*r as u32), 0).unwrap().iter().sum()).collect()
}

/// Runs the decapsulator on `frame`: its action, and that only `reason` was counted.
fn decap(env: &Env, frame: &[u8], action: u32, reason: DecapReason) -> Vec<u8> {
    let program = env.decap.program("spillway_decap").unwrap();
    let program: &aya::programs::Xdp = program.try_into().unwrap();
    let before = decap_reasons(env);
    let out = test_run::run(program, frame, env.ingress).unwrap();
    let after = decap_reasons(env);
    let counted: Vec<_> = DecapReason::ALL.iter().filter(|r| after[**r as usize] > before[**r as usize]).collect();
    assert_eq!(counted, [&reason]);
    assert_eq!(out.action, action, "{}", reason.label());
    out.frame
}

#[test]
fn the_first_backend_keeps_its_connections_and_sends_the_others_on() {
    with_env(|env| {
        {
            let mut local: HashMap<_, AddrKey, u32> = HashMap::try_from(env.decap.map_mut(map_names::LOCAL_ADDRS).unwrap()).unwrap();
            let (addr, family) = to_words(packet_lab::LOCAL4.into());
            local.insert(&AddrKey { addr, family, _pad: [0; 3] }, &1, 0).unwrap();
        }
        // A connection this host has, over loopback (the lookup is this namespace's).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let _accepted = listener.accept().unwrap();
        let (lb, other) = (IpAddr::from([10, 9, 0, 1]), IpAddr::from(packet_lab::backend4(102)));
        let nested = |from: SocketAddr, syn: bool| {
            let inner = frames::tcp(from, server, syn, b"data");
            let middle = frames::tunnel(lb, other, &inner[14..]);
            (inner, middle.clone(), frames::tunnel(lb, packet_lab::LOCAL4.into(), &middle[14..]))
        };

        let (inner, _, frame) = nested(client.local_addr().unwrap(), false);
        let out = decap(env, &frame, XDP_PASS, DecapReason::SecondChanceLocal);
        assert_eq!(out, [&frame[..12], &inner[12..]].concat(), "both tunnels stripped, MACs kept");

        // No connection (only the listener), and no socket at all: on to the other backend,
        // back to the hop the frame came from.
        for from in [sock("127.0.0.1:1"), sock("127.0.0.2:2")] {
            let (_, middle, frame) = nested(from, false);
            let out = decap(env, &frame, XDP_TX, DecapReason::SecondChanceForwarded);
            assert_eq!(out[..6], frame[6..12], "to the sender's MAC");
            assert_eq!(out[6..12], frame[..6], "from ours");
            assert_eq!(out[12..], middle[12..], "the tunnel to the other backend, untouched");
        }
        // A SYN is a new connection: kept.
        let (inner, _, frame) = nested(sock("127.0.0.1:3"), true);
        assert_eq!(decap(env, &frame, XDP_PASS, DecapReason::SecondChanceLocal)[12..], inner[12..]);
        // A plain tunnel is decapsulated as always.
        let plain = frames::tunnel(lb, packet_lab::LOCAL4.into(), &inner[14..]);
        assert_eq!(decap(env, &plain, XDP_PASS, DecapReason::Decapsulated)[12..], inner[12..]);
    });
}

/// Captures log records (level and message), for reading the programs' log records.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<(log::Level, String)>>>);

impl log::Log for Captured {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

#[test]
fn a_candidate_gone_before_the_second_chance_program_runs_is_dropped_and_logged() {
    with_env(|env| {
        // The hand-over slot as no balancer run left it: backend ids 0, never in use, as if
        // both candidates were removed between the balancer's check and this program.
        let frame = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), false, b"data");
        let program = env.balancer.xdp_ref(spillway_common::limits::program_names::SECOND_CHANCE).unwrap();
        let before = env.reasons();
        assert_eq!(test_run::run(program, &frame, env.ingress).unwrap().action, XDP_DROP);
        assert_eq!(env.reasons()[Reason::DropNoBackend as usize], before[Reason::DropNoBackend as usize] + 1);

        let captured = Captured::default();
        let mut reader = spillway::dataplane::logs::reader(env.balancer.ebpf_mut(), captured.clone()).unwrap();
        reader.flush();
        let records = captured.0.lock().unwrap().clone();
        assert_eq!(
            records,
            [(log::Level::Warn, "event=second_chance_candidate_gone vip_id=0 first_backend_id=0 second_backend_id=0".to_owned())]
        );
        // One line of lbd's own format.
        let pairs = spillway::logging::parse(&records[0].1).unwrap();
        assert_eq!(pairs[0], ("event".to_owned(), "second_chance_candidate_gone".to_owned()));
    });
}
