//! QUIC VIPs (`VIP_F_QUIC`): a short-header packet goes to the backend whose server id its
//! destination connection id carries (QUIC-LB, `spillway_common::quic_lb`), whatever its
//! 5-tuple, so a connection survives the client's address changing. Long headers (Initial,
//! 0-RTT, Handshake, Retry, version negotiation) are placed as any UDP packet is: table and
//! Maglev. So is a short header whose id does not decode to a backend of the VIP (counted,
//! `QuicRouting::Fallback`): a wrong guess costs that one connection, a drop would cost more.
//!
//! The balancer hands a QUIC VIP's packets, with what it parsed of them, to a program of its
//! own (`spillway_lb_quic`, and `_v6`; `quic_program.rs`), which sends short headers by
//! connection id and tail-calls the rest to the UDP program (`spillway_lb_udp`, `_v6`): the
//! balancer's path, built without hand-overs. Neither the balancer's stack nor its verifier
//! budget has room for the step, merged into one path the two choices took the stack of
//! both, and VIPs without QUIC do not pay for it.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::FAMILY_V4;
use xdp_ebpf::parse::Layout;

use crate::{
    maps::{self, QUIC_PROGRAM},
    select::Vip,
};

/// Slots of the program array of the QUIC programs (those of the UDP programs, 2 and 3:
/// `quic_program.rs`).
const QUIC_V4: u32 = 0;
const QUIC_V6: u32 = 1;

/// Tail-calls the QUIC program of `FAMILY` with where the packet's headers are and `vip`'s
/// configuration in this CPU's `QuicHandover`. Returns only if it cannot run (not loaded, or
/// the bench's stage builds): the packet then goes on as any UDP VIP's. No test here of what
/// the packet is: a branch before the tail call nearly doubles the balancer's verifier walk
/// (70k to 125k instructions), the QUIC program tells long headers and ICMP errors apart.
#[inline(always)]
pub fn hand_over<const FAMILY: u8>(ctx: &XdpContext, vip: &Vip, layout: &Layout, icmp_error: bool) {
    let slot = if FAMILY == FAMILY_V4 { QUIC_V4 } else { QUIC_V6 };
    if let Some(handover) = maps::quic_handover() {
        // SAFETY: this CPU's slot; the program it calls runs next, on this CPU. The slots of
        // the program array hold XDP programs of the balancer's object, or nothing. Field by
        // field: the counts are the QUIC program's.
        unsafe {
            (*handover).vip_id = vip.id;
            (*handover).l3_len = layout.l3_len as u32;
            (*handover).quic = vip.quic;
            (*handover).l4 = layout.l4;
            // 14, or 18 with a VLAN tag.
            (*handover).l2_len = layout.l2_len as u8;
            (*handover).tos = layout.tos;
            (*handover).family = FAMILY;
            (*handover).icmp_error = icmp_error as u8;
            let _ = QUIC_PROGRAM.tail_call(ctx, slot);
        }
    }
}
