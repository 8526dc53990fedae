//! Fragmented datagrams through the live balancer: 4,000-byte UDP datagrams leave the
//! clients over their 1,500-byte links in fragments (both families, several clients and
//! many ports). Each is answered by one backend's echo, which sees it only once that
//! backend's kernel has reassembled it; the backends' reassembly counters show every
//! fragment reached the backend that reassembled its datagram; and the datagrams spread
//! over the backends as small ones do. Then an attacker floods fragments with random
//! identifications while honest clients send: their datagrams and TCP connections are
//! unaffected, and the flood is counted as `drop_fragment_unmatched`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use spillway_harness::cluster::{Cluster, UDP_PORT, XdpMode};
use spillway_harness::rng::Rng;
use spillway_harness::{Host, Stream, Tally, VIP4, VIP6, frames, run_connections, send_frames, udp_ask_with};

use crate::in_both_modes;
use crate::support::*;

/// Three fragments on a 1,500-byte link.
const DATAGRAM: usize = 4000;
/// Datagrams of each size per client and family: 180 per family over three backends.
const PER_CLIENT: usize = 60;
/// Between one client's datagrams.
const PACE: Duration = Duration::from_millis(1);
/// The attacker's frames, in batches small enough for the veth queues.
const FLOOD_FRAMES: u32 = 20_000;
const BATCH: u32 = 250;

fn udp_vip_of(v6: bool) -> String {
    if v6 { format!("[{VIP6}]:{UDP_PORT}/udp") } else { udp_vip() }
}

fn udp_target(v6: bool) -> SocketAddr {
    SocketAddr::new(if v6 { IpAddr::from(VIP6) } else { IpAddr::from(VIP4) }, UDP_PORT)
}

/// `count` datagrams of `size` bytes from `client`, each on a fresh socket (a new flow),
/// `PACE` apart: the clients share an IPv6 /64, whose fragmented datagrams the balancer
/// records at `FRAGMENT_SOURCE_PER_S` (one exchange after the other would come close).
fn datagrams(client: &Host, target: SocketAddr, size: usize, count: usize) -> Tally {
    let payload = vec![b'x'; size];
    client.in_netns(|| {
        let mut tally = Tally::default();
        for _ in 0..count {
            tally.record(udp_ask_with(target, &payload, CONNECT_TIMEOUT));
            std::thread::sleep(PACE);
        }
        tally
    })
}

fn merged(tallies: impl IntoIterator<Item = Tally>) -> Tally {
    let mut all = Tally::default();
    for t in tallies {
        for (name, n) in t.by_backend {
            *all.by_backend.entry(name).or_default() += n;
        }
        all.failures += t.failures;
        all.errors.extend(t.errors);
    }
    all
}

/// A backend kernel's reassembly counters, both families: (fragments received, datagrams
/// reassembled).
fn reassembly(host: &Host) -> (u64, u64) {
    let snmp = host.run(&["cat", "/proc/net/snmp"]).unwrap();
    let mut ip = snmp.lines().filter(|l| l.starts_with("Ip: "));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let v4 = |field: &str| {
        let at = names.split_whitespace().position(|n| n == field).unwrap();
        values.split_whitespace().nth(at).unwrap().parse::<u64>().unwrap()
    };
    let snmp6 = host.run(&["cat", "/proc/net/snmp6"]).unwrap();
    let v6 = |field: &str| snmp6.lines().find_map(|l| l.strip_prefix(field)).map(|n| n.trim().parse::<u64>().unwrap()).unwrap();
    (v4("ReasmReqds") + v6("Ip6ReasmReqds"), v4("ReasmOKs") + v6("Ip6ReasmOKs"))
}

fn fragmented_datagrams_reach_one_backend_whole(mode: XdpMode) {
    let c = start_with(mode, 3, 3, &["--max-fragments", "4096"]);
    let status = c.lbctl_json(&["status"]).unwrap();
    let records = status["maps"].as_array().unwrap().iter().find(|m| m["name"] == "spw_frags").expect("spw_frags in lbctl status");
    assert_eq!(records["max_entries"].as_u64(), Some(4096), "the record table as --max-fragments sized it");
    let log = c.lbd_log();
    let line = log.lines().find(|l| l.contains("event=map_memory map=spw_frags")).expect("the record table's memory line");
    assert!(line.contains("entries=4096"), "the kernel's map as --max-fragments sized it: {line}");
    for v6 in [false, true] {
        vip_with_all_backends(&c, &udp_vip_of(v6), v6);
    }
    vip_with_all_backends(&c, &tcp_vip(false), false);
    // UDP VIPs are not probed; the TCP one tells when the backends are in service.
    wait_until(Duration::from_secs(15), "backends healthy", || all_healthy(&c, &tcp_vip(false)));
    // Neighbours resolved on every path first (the first packets to an unresolved one wait
    // in the kernel's small queue), so what is counted below is the balancer's doing.
    for (client, v6) in c.topo.clients().iter().flat_map(|client| [(client, false), (client, true)]) {
        let answered = (0..5).any(|_| datagrams(client, udp_target(v6), 64, 1).failures == 0);
        assert!(answered, "{}: no answer from {}", client.name(), udp_target(v6));
    }
    let backends = c.topo.backends();
    let names = even(&["b1", "b2", "b3"]);
    let before: Vec<(u64, u64)> = backends.iter().map(reassembly).collect();

    for v6 in [false, true] {
        let target = udp_target(v6);
        let large = merged(c.topo.clients().iter().map(|client| datagrams(client, target, DATAGRAM, PER_CLIENT)));
        let small = merged(c.topo.clients().iter().map(|client| datagrams(client, target, 64, PER_CLIENT)));
        let total = PER_CLIENT * c.topo.clients().len();
        println!("{target}: {DATAGRAM}-byte datagrams by backend {:?}, small ones {:?}", large.by_backend, small.by_backend);
        assert_shares(&large, &names, total);
        assert_shares(&small, &names, total);
    }
    // Every fragment reached the backend that reassembled its datagram: each backend
    // received three fragments per datagram it reassembled, and nothing else fragmented.
    let total = 2 * PER_CLIENT as u64 * c.topo.clients().len() as u64;
    let mut reassembled = 0;
    for (b, (reqds0, oks0)) in backends.iter().zip(&before) {
        let (reqds, oks) = reassembly(b);
        assert_eq!(reqds - reqds0, 3 * (oks - oks0), "{}: {} fragments for {} datagrams", b.name(), reqds - reqds0, oks - oks0);
        reassembled += oks - oks0;
    }
    assert_eq!(reassembled, total, "each datagram reassembled once");

    honest_traffic_survives_a_fragment_flood(&c);
}
in_both_modes!(fragmented_datagrams_reach_one_backend_whole);

/// An attacker (the third client) floods later fragments with random identifications from
/// spoofed sources, and first fragments with random identifications from its own address,
/// while the other two clients send large datagrams and open TCP connections and an
/// established connection keeps talking.
fn honest_traffic_survives_a_fragment_flood(c: &Cluster) {
    let [honest @ .., attacker] = c.topo.clients() else { unreachable!("three clients") };
    let mut established = honest[0].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).expect("a long-lived connection");
    established.ping().expect("a first exchange");
    let macs = (c.topo.lb().netns().mac("eth0").unwrap(), attacker.netns().mac("eth0").unwrap());
    let own = attacker.ipv4();
    let unmatched = reason_count(c, "drop_fragment_unmatched");

    let (udp, tcp) = std::thread::scope(|s| {
        let flood = s.spawn(|| {
            let mut rng = Rng::new(0xf1a9);
            let mut frame = |n: u32| {
                let id = rng.next_u64() as u32;
                let (from, which) = if n.is_multiple_of(20) {
                    (SocketAddr::new(own.into(), 4000), 0)
                } else {
                    let [_, b, c, d] = (rng.next_u64() as u32).to_be_bytes();
                    (SocketAddr::from((Ipv4Addr::new(172, 16 + (b & 15), c, d), 4000)), 1)
                };
                let mut f = frames::udp_fragments(from, udp_target(false), &[0x5a; DATAGRAM - 8], 1400, id).swap_remove(which);
                f[..6].copy_from_slice(&macs.0);
                f[6..12].copy_from_slice(&macs.1);
                f
            };
            let mut sent = 0;
            for batch in 0..FLOOD_FRAMES / BATCH {
                let frames: Vec<Vec<u8>> = (batch * BATCH..(batch + 1) * BATCH).map(&mut frame).collect();
                sent += attacker.in_netns(|| send_frames("eth0", frames.into_iter())).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            sent
        });
        let udp = s.spawn(|| merged(honest.iter().map(|client| datagrams(client, udp_target(false), DATAGRAM, PER_CLIENT / 2))));
        let tcp = s.spawn(|| honest[1].in_netns(|| run_connections(tcp_target(false), 60, Duration::ZERO, CONNECT_TIMEOUT)));
        let sent = flood.join().unwrap();
        println!("the attacker sent {sent} fragments");
        (udp.join().unwrap(), tcp.join().unwrap())
    });
    assert_eq!(udp.failures, 0, "honest datagrams lost during the flood: {:?}", udp.errors);
    assert_eq!(tcp.failures, 0, "TCP connections failed during the flood: {:?}", tcp.errors);
    established.ping().expect("the established connection after the flood");
    let dropped = reason_count(c, "drop_fragment_unmatched") - unmatched;
    assert!(dropped > u64::from(FLOOD_FRAMES) / 2, "only {dropped} of the flood's later fragments were dropped unmatched");
}
