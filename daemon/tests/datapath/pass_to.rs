//! `lbd --pass-to`: the frames the balancer does not serve are counted, then tail-called to
//! the operator's program (`operator_count` of the example object); VIP packets never are;
//! with the program gone they pass, counted as `pass_to_missing` when the option asked for one.

use aya::maps::PerCpuHashMap;
use spillway_common::types::{CFG_F_PASS_TO, LbConfig, Reason};
use spillway_dataplane::{load_simple, objects, pass_to::Followed, pass_to::PassTo};
use spillway_harness::{frames, packet_lab::PacketLab};

use crate::support::*;

/// Every frame the counting program saw, over all keys and CPUs.
fn seen(operator: &aya::Ebpf) -> u64 {
    let seen: PerCpuHashMap<_, u32, u64> = PerCpuHashMap::try_from(operator.map("op_seen").unwrap()).unwrap();
    seen.iter().flatten().map(|(_, cpus)| cpus.iter().sum::<u64>()).sum()
}

#[test]
fn frames_not_served_go_to_the_operators_program_once_counted() {
    let lab = PacketLab::build().unwrap();
    let pin = lab.pin_dir().unwrap().join("operator_count");
    with_env_in(&lab, |env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[ip("10.1.0.101")]);
        let mut operator = load_simple(objects::OPERATOR_EXAMPLE, "spillway-operator-example", "operator_count").unwrap();
        spillway_dataplane::xdp(&mut operator, "operator_count").unwrap().pin(&pin).unwrap();
        let mut pass_to = PassTo::take(&mut env.balancer, Some(&pin)).unwrap();
        pass_to.fill().unwrap();
        env.balancer.maps.set_config(&LbConfig { flags: CFG_F_PASS_TO, ..default_config() }).unwrap();

        let not_served = [
            ("ARP", frames::arp_request([10, 1, 0, 9], [10, 1, 0, 1]), Reason::PassNotIp),
            ("non-VIP TCP", frames::tcp(sock("192.168.10.20:40000"), sock("10.1.0.1:22"), true, &[]), Reason::PassNotVip),
            ("non-VIP UDP v6", frames::udp(sock("[2001:db8::20]:5000"), sock("[fd01::1]:53"), b"q"), Reason::PassNotVip),
            ("truncated", frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[])[..30].to_vec(), Reason::PassMalformed),
        ];
        for (name, frame, reason) in &not_served {
            let before = seen(&operator);
            env.expect(frame, XDP_PASS, *reason);
            assert_eq!(seen(&operator), before + 1, "{name}: the operator's program did not see it");
        }
        let before = seen(&operator);
        let out = env.run(&frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]));
        assert_ne!(out.action, XDP_PASS, "the VIP's SYN was forwarded");
        assert_eq!(seen(&operator), before, "the operator's program saw a VIP packet");
        assert_eq!(env.balancer.maps.pass_to_missing().unwrap(), 0);

        // Unpinned: the slot empties, and the frames pass, counted.
        std::fs::remove_file(&pin).unwrap();
        assert_eq!(pass_to.follow().unwrap(), Followed::Gone);
        let before = seen(&operator);
        for (_, frame, reason) in &not_served {
            env.expect(frame, XDP_PASS, *reason);
        }
        assert_eq!(seen(&operator), before);
        assert_eq!(env.balancer.maps.pass_to_missing().unwrap(), not_served.len() as u64);
        // Without the option nothing is missing.
        env.balancer.maps.set_config(&default_config()).unwrap();
        env.expect(&not_served[0].1, XDP_PASS, Reason::PassNotIp);
        assert_eq!(env.balancer.maps.pass_to_missing().unwrap(), not_served.len() as u64);
    });
}
