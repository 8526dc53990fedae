//! 100,000 random and mutated frames: never XDP_ABORTED, every one counted under exactly
//! one reason.

use spillway_common::types::Reason;
use spillway_harness::{frames, packet_lab, rng::Rng};

use crate::support::*;

const FRAMES: usize = 100_000;
const SEED: u64 = 0x5eed_5a11_0000_0001;

fn seeds() -> Vec<Vec<u8>> {
    let c4 = sock("192.168.10.20:40000");
    let c6 = sock("[2001:db8::20]:40000");
    let v4 = sock("10.200.1.1:80");
    let v6 = sock("[2001:db8:100::1]:80");
    let syn4 = frames::tcp(c4, v4, true, &[]);
    vec![
        syn4.clone(),
        frames::tcp(c4, v4, false, b"data"),
        frames::udp(c4, sock("10.200.1.1:53"), b"query"),
        frames::tcp(c6, v6, true, &[]),
        frames::udp(c6, sock("[2001:db8:100::1]:53"), b"query"),
        frames::icmp_frag_needed(ip("192.168.1.1"), v4, c4, 1400),
        frames::icmp6_packet_too_big(ip("2001:db8::1"), v6, c6, 1280),
        frames::with_vlan(&syn4, 5),
        frames::with_ipv4_options(&syn4, 3),
        frames::as_ipv4_fragment(&syn4, true, 0),
        frames::as_ipv6_fragment(&frames::tcp(c6, v6, true, &[])),
        frames::arp_request([10, 1, 0, 9], [10, 1, 0, 1]),
        frames::neighbour_solicitation(ip("fe80::1"), "fd01::1".parse().unwrap()),
        frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &syn4[14..]),
    ]
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(4) {
        // At least an Ethernet header's worth: the kernel hands XDP nothing shorter.
        0 => (0..frames::ETH_LEN + rng.index(128)).map(|_| rng.next_u64() as u8).collect(),
        _ => {
            let mut f = seeds[rng.index(seeds.len())].clone();
            for _ in 0..1 + rng.below(4) {
                if f.is_empty() {
                    break;
                }
                let i = rng.index(f.len());
                // Bias mutations towards the headers, where the parser branches.
                let i = if rng.below(2) == 0 { i.min(60) } else { i };
                f[i] = rng.next_u64() as u8;
            }
            match rng.below(4) {
                0 => f.truncate(frames::ETH_LEN + rng.index(f.len().saturating_sub(frames::ETH_LEN) + 1)),
                1 => f.extend((0..rng.index(64)).map(|_| rng.next_u64() as u8)),
                _ => {}
            }
            f
        }
    }
}

#[test]
fn random_and_mutated_frames_are_never_aborted_and_always_counted() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into(), packet_lab::backend6(102).into()]);
        env.add_vip(vip("10.200.1.1:53/udp"), &[packet_lab::backend4(103).into()]);
        env.add_vip(vip("[2001:db8:100::1]:0/tcp"), &[packet_lab::backend6(101).into()]);
        env.add_vip(vip("[2001:db8:100::1]:53/udp"), &[packet_lab::UNRESOLVED6.into()]);
        let seeds = seeds();
        let mut rng = Rng::new(SEED);
        let before: u64 = env.reasons().iter().sum();
        let mut by_action = [0usize; 5];
        for n in 0..FRAMES {
            let frame = mutate(&mut rng, &seeds);
            let out = env.run(&frame);
            assert!((1..=4).contains(&out.action), "frame {n} ({frame:02x?}): action {}", out.action);
            by_action[out.action as usize] += 1;
        }
        let after: u64 = env.reasons().iter().sum();
        assert_eq!(after - before, FRAMES as u64, "every frame counted exactly once");
        // The mix must reach the interesting outcomes, or the test proves little.
        assert!(by_action[1] > 0 && by_action[2] > 0 && by_action[3] > 0, "{by_action:?}");
        let reasons = env.reasons();
        for r in [Reason::Tx, Reason::PassMalformed, Reason::PassNotIp, Reason::PassNotVip, Reason::DropFragment, Reason::KernelNoNeigh] {
            assert!(reasons[r as usize] > 0, "no frame reached {}", r.label());
        }
    });
}
