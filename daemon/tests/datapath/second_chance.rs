//! Second chance: a TCP packet without a table entry whose slot the VIP's last change moved
//! goes to its new backend inside a tunnel to its old one; the backend keeps it when it has
//! the connection and sends the inner tunnel back to the hop it came from otherwise.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use aya::maps::PerCpuArray;
use spillway_common::{
    hash::{FLOW_SEED, flow_hash},
    limits::map_names,
    types::{DecapReason, PROTO_TCP, PROTO_UDP, Reason},
};
use spillway_dataplane::test_run;
use spillway_harness::{frames, packet_lab};
use spillway_reconcile::vip_key;

use crate::support::*;

/// The backend the VIP's second-chance table gives `key` (`None`: there is none).
fn prior_backend(env: &Env, v: &spillway_model::Vip, key: &spillway_common::types::FlowKey) -> Option<IpAddr> {
    let prior = env.balancer.maps.vips.get(&vip_key(v)).unwrap().prior;
    env.balancer.maps.rings.choice(prior, flow_hash(key, FLOW_SEED)).map(|id| env.backend_addr(id))
}

fn second_chance_packets(env: &Env) -> u64 {
    env.balancer.maps.second_chance_packets().unwrap()
}

/// CHECK of a second-chance frame: a tunnel to `first` holding a tunnel to `second` holding
/// the input's IP packet, untouched.
pub fn expect_nested(out: &[u8], input: &[u8], first: IpAddr, second: IpAddr) {
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

/// The host (its address, both families) and the balancer 10.9.0.1 / fd09::1 it trusts.
fn backend_host(env: &mut Env) -> (IpAddr, IpAddr) {
    env.decap_local(&[packet_lab::LOCAL4.into(), packet_lab::LOCAL6.into()]);
    env.decap_allow(&["10.9.0.1/32", "fd09::1/128"]);
    (IpAddr::from([10, 9, 0, 1]), ip("fd09::1"))
}

/// The middle tunnel as a router would send it on: one hop less (IPv4: checksum updated).
pub(crate) fn one_hop_less(middle: &[u8]) -> Vec<u8> {
    let mut m = middle.to_vec();
    if m[14] >> 4 == 4 {
        m[22] -= 1;
        m[24..26].fill(0);
        let sum = frames::ipv4_checksum(&m[14..34]);
        m[24..26].copy_from_slice(&sum.to_be_bytes());
    } else {
        m[21] -= 1;
    }
    m
}

/// `frame` with the middle header's TTL (hop limit) set to `ttl` (IPv4 outer, checksum kept
/// valid).
fn with_middle_ttl(frame: &[u8], ttl: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[34 + 8] = ttl;
    f[34 + 10..34 + 12].fill(0);
    let sum = frames::ipv4_checksum(&f[34..54]);
    f[34 + 10..34 + 12].copy_from_slice(&sum.to_be_bytes());
    f
}

#[test]
fn the_first_backend_keeps_its_connections_and_sends_the_others_on() {
    with_env(|env| {
        let (lb, _) = backend_host(env);
        // A connection this host has, to its own address (the lookup is this namespace's).
        let listener = TcpListener::bind(SocketAddr::new(packet_lab::LOCAL4.into(), 0)).unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let _accepted = listener.accept().unwrap();
        let other = IpAddr::from(packet_lab::backend4(102));
        let nested = |from: SocketAddr, syn: bool| {
            let inner = frames::tcp(from, server, syn, b"data");
            let middle = frames::tunnel(lb, other, &inner[14..]);
            (inner, middle.clone(), frames::tunnel(lb, packet_lab::LOCAL4.into(), &middle[14..]))
        };

        let (inner, _, frame) = nested(client.local_addr().unwrap(), false);
        let out = decap(env, &frame, XDP_PASS, DecapReason::SecondChanceLocal);
        assert_eq!(out, [&frame[..12], &inner[12..]].concat(), "both tunnels stripped, MACs kept");

        // No connection (only the listener), and no socket at all: on to the other backend,
        // back to the hop the frame came from, as a router would (one hop less).
        for from in [SocketAddr::new(server.ip(), 1), sock("192.168.10.20:2")] {
            let (_, middle, frame) = nested(from, false);
            let out = decap(env, &frame, XDP_TX, DecapReason::SecondChanceForwarded);
            assert_eq!(out[..6], frame[6..12], "to the sender's MAC");
            assert_eq!(out[6..12], frame[..6], "from ours");
            assert_eq!(out[12..], one_hop_less(&middle)[12..], "the tunnel to the other backend, TTL 63");
            assert_eq!(frames::ipv4_checksum(&out[14..34]), 0, "a valid checksum");
        }
        // A SYN is a new connection: kept.
        let (inner, _, frame) = nested(sock("192.168.10.20:3"), true);
        assert_eq!(decap(env, &frame, XDP_PASS, DecapReason::SecondChanceLocal)[12..], inner[12..]);
        // A plain tunnel is decapsulated as always.
        let plain = frames::tunnel(lb, packet_lab::LOCAL4.into(), &inner[14..]);
        assert_eq!(decap(env, &plain, XDP_PASS, DecapReason::Decapsulated)[12..], inner[12..]);
    });
}

#[test]
fn only_what_a_balancer_built_is_sent_on() {
    with_env(|env| {
        let (lb, lb6) = backend_host(env);
        let (here, here6) = (IpAddr::from(packet_lab::LOCAL4), IpAddr::from(packet_lab::LOCAL6));
        let victim = ip("198.51.100.80");
        let ack = frames::tcp(sock("192.168.10.20:40000"), SocketAddr::new(here, 80), false, b"data");
        let nested = |outer_src: IpAddr, outer_dst: IpAddr, middle_src: IpAddr, middle_dst: IpAddr, inner: &[u8]| {
            let middle = frames::tunnel(middle_src, middle_dst, &inner[14..]);
            frames::tunnel(outer_src, outer_dst, &middle[14..])
        };

        // Spoofed from anywhere: reflected to the victim without these checks.
        let spoofed = nested(ip("203.0.113.7"), here, ip("203.0.113.7"), victim, &ack);
        decap(env, &spoofed, XDP_DROP, DecapReason::DropNotAllowed);
        // From the balancer's address (spoofed or not), but a middle header it did not write.
        let forged = nested(lb, here, victim, ip("10.1.0.102"), &ack);
        decap(env, &forged, XDP_DROP, DecapReason::DropSecondChanceSource);
        let forged = nested(lb6, here6, victim, ip("10.1.0.102"), &ack);
        decap(env, &forged, XDP_DROP, DecapReason::DropSecondChanceSource);
        // A connection's packet for somebody else: not this VIP's, nobody's to send on.
        let elsewhere = frames::tcp(sock("192.168.10.20:40000"), SocketAddr::new(victim, 80), false, b"data");
        decap(env, &nested(lb, here, lb, ip("10.1.0.102"), &elsewhere), XDP_DROP, DecapReason::DropInnerNotLocal);

        // Nested tunnels bounce no further than their TTL: the last hop is dropped.
        let good = nested(lb, here, lb, ip("10.1.0.102"), &ack);
        decap(env, &with_middle_ttl(&good, 1), XDP_DROP, DecapReason::DropSecondChanceTtl);
        decap(env, &with_middle_ttl(&good, 0), XDP_DROP, DecapReason::DropSecondChanceTtl);
        let out = decap(env, &with_middle_ttl(&good, 2), XDP_TX, DecapReason::SecondChanceForwarded);
        assert_eq!((out[22], frames::ipv4_checksum(&out[14..34])), (1, 0), "TTL 1, checksum valid");

        // IPv6 middle headers lose a hop too; one of the other family than the outer header
        // must come from a balancer.
        let ack6 = frames::tcp(sock("[2001:db8::20]:40000"), SocketAddr::new(here6, 80), false, b"data");
        let middle = frames::tunnel(lb6, ip("fd01::102"), &ack6[14..]);
        let out = decap(env, &frames::tunnel(lb6, here6, &middle[14..]), XDP_TX, DecapReason::SecondChanceForwarded);
        assert_eq!(out[12..], one_hop_less(&middle)[12..], "hop limit 63");
        decap(env, &nested(lb6, here6, lb, ip("10.1.0.102"), &ack), XDP_TX, DecapReason::SecondChanceForwarded);
        decap(env, &nested(lb6, here6, ip("10.9.0.2"), ip("10.1.0.102"), &ack), XDP_DROP, DecapReason::DropSecondChanceSource);
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
        let mut reader = spillway_dataplane::logs::reader(env.balancer.ebpf_mut(), captured.clone()).unwrap();
        reader.flush();
        let records = captured.0.lock().unwrap().clone();
        assert_eq!(
            records,
            [(log::Level::Warn, "event=second_chance_candidate_gone vip_id=0 first_backend_id=0 second_backend_id=0".to_owned())]
        );
        // One line of lbd's own format.
        let pairs = spillway_logging::parse(&records[0].1).unwrap();
        assert_eq!(pairs[0], ("event".to_owned(), "second_chance_candidate_gone".to_owned()));
    });
}
