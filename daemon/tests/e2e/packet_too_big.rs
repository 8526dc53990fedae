//! Path MTU discovery through the balancer: the underlay is as small as the client's link
//! (1500), so a full-size segment does not fit once encapsulated. With direct server return
//! only the client-to-server direction crosses the balancer, so it is an upload that needs
//! the balancer's "packet too big" answer: with it the client's stack lowers its path MTU
//! to the VIP and 1 MB goes through; without it (the answering program's slot emptied, as
//! before it existed) the transfer stalls.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use aya::maps::{Map, MapData, ProgramArray};
use spillway_common::limits::map_names;
use spillway_harness::Host;
use spillway_harness::cluster::{Cluster, XdpMode};

use crate::support::*;

const UPLOAD: usize = 1 << 20;
const UNDERLAY_MTU: &str = "1500";
/// Long enough for a transfer that works (milliseconds here), far too short for one whose
/// full-size segments are all lost.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(15);

/// Sends `UPLOAD` bytes to `target`'s echo server from `client` and returns how many came
/// back within `TRANSFER_TIMEOUT` (the echo returns directly, not through the balancer).
fn upload(client: &Host, target: SocketAddr) -> usize {
    client.in_netns(|| {
        let conn = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).expect("connecting to the VIP");
        conn.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        conn.set_write_timeout(Some(TRANSFER_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut greeting = String::new();
        reader.read_line(&mut greeting).expect("reading the greeting");
        let mut writer = conn.try_clone().unwrap();
        // Lines of 1 KiB, written while the echo is read (neither side's buffers fill).
        let sender = std::thread::spawn(move || {
            let line = [&[b'x'; 1023][..], b"\n"].concat();
            for _ in 0..UPLOAD / line.len() {
                if writer.write_all(&line).is_err() {
                    return;
                }
            }
        });
        let (started, mut echoed, mut buf) = (Instant::now(), 0, vec![0u8; 64 * 1024]);
        while echoed < UPLOAD && started.elapsed() < TRANSFER_TIMEOUT {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => echoed += n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading the echo: {e}"),
            }
        }
        let _ = conn.shutdown(std::net::Shutdown::Both);
        let _ = sender.join();
        echoed
    })
}

/// The MTU the client's stack uses to reach `target` (`ip route get`: `mtu N` once it
/// learned one).
fn route_mtu(client: &Host, target: SocketAddr) -> Option<u32> {
    let route = client.run(&["ip", "route", "get", &target.ip().to_string()]).unwrap();
    let words: Vec<&str> = route.split_whitespace().collect();
    words.windows(2).find(|w| w[0] == "mtu").map(|w| w[1].parse().unwrap())
}

/// Empties the balancer's slot for the "packet too big" program: oversize packets are then
/// dropped and counted, as before it existed.
fn stop_answering(c: &Cluster) {
    let pin = spillway_dataplane::pins::PinLayout::new(&c.lbd_pin_dir().unwrap()).balancer_maps().join(map_names::PTB_PROGRAM);
    let map = Map::ProgramArray(MapData::from_pin(&pin).unwrap());
    let mut programs: ProgramArray<MapData> = map.try_into().unwrap();
    programs.clear_index(&0).unwrap();
}

fn pmtu_discovery_through_the_balancer(mode: XdpMode) {
    let c = start_with(mode, 1, 2, &[]);
    for v6 in [false, true] {
        vip_with_all_backends(&c, &tcp_vip(v6), v6);
    }
    for client in c.topo.clients() {
        // No blackhole detection: without an answer, nothing else rescues the transfer.
        client.sysctl("net.ipv4.tcp_mtu_probing", "0").unwrap();
    }
    // The balancer's link (its egress to the backends) is the client's size.
    c.topo.lb().run(&["ip", "link", "set", "eth0", "mtu", UNDERLAY_MTU]).unwrap();
    c.topo.bridge().run(&["ip", "link", "set", "p-lb", "mtu", UNDERLAY_MTU]).unwrap();
    // The next-hop cache holds the old MTU for up to its TTL.
    std::thread::sleep(Duration::from_nanos(spillway_common::limits::NEXTHOP_CACHE_TTL_NS) + Duration::from_millis(200));
    wait_until(Duration::from_secs(15), "backends healthy", || (0..2).all(|v6| all_healthy(&c, &tcp_vip(v6 == 1))));

    let (answered, client) = (reason_count(&c, "tx_packet_too_big"), &c.topo.clients()[0]);
    for (v6, outer) in [(false, 20), (true, 40)] {
        let target = tcp_target(v6);
        assert_eq!(route_mtu(client, target), None, "nothing learned yet");
        let started = Instant::now();
        assert_eq!(upload(client, target), UPLOAD, "1 MB upload to {target}");
        println!("{target}: 1 MB up in {:?}", started.elapsed());
        assert_eq!(route_mtu(client, target), Some(1500 - outer), "the client learned the MTU that fits the tunnel to {target}");
    }
    assert!(reason_count(&c, "tx_packet_too_big") > answered, "answered");
    assert!(c.lbctl(&["stats"]).unwrap().contains("tx_packet_too_big"), "lbctl stats shows the answers");

    // Without the answer: a client that learned nothing stalls.
    stop_answering(&c);
    let (dropped, client) = (reason_count(&c, "drop_oversize"), &c.topo.clients()[1]);
    let target = tcp_target(false);
    let echoed = upload(client, target);
    assert!(echoed < UPLOAD, "the upload went through unanswered ({echoed} bytes)");
    assert_eq!(route_mtu(client, target), None);
    assert!(reason_count(&c, "drop_oversize") > dropped, "its full-size segments dropped as oversize");
    println!("unanswered: {echoed} of {UPLOAD} bytes in {TRANSFER_TIMEOUT:?}");
}

crate::in_both_modes!(pmtu_discovery_through_the_balancer);
