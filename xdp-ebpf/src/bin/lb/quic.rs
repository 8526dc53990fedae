//! QUIC VIPs (`VIP_F_QUIC`): a short-header packet goes to the backend whose server id its
//! destination connection id carries (QUIC-LB, `spillway_common::quic_lb`), whatever its
//! 5-tuple, so a connection survives the client's address changing. Long headers (Initial,
//! 0-RTT, Handshake, Retry, version negotiation) are placed as any UDP packet is: table and
//! Maglev. So is a short header whose id does not decode to a backend of the VIP (counted,
//! `QuicRouting::Fallback`): a wrong guess costs that one connection, a drop would cost more.
//!
//! The balancer hands a QUIC VIP's packets to a program of its own (`spillway_lb_quic`, and
//! `_v6`; `quic_program.rs`), which sends short headers by connection id and tail-calls the
//! rest to the UDP program (`spillway_lb_udp`, `_v6`): the balancer's path, built without
//! hand-overs. Neither the balancer's stack nor its verifier budget has room for the step,
//! merged into one path the two choices took the stack of both, and VIPs without QUIC do
//! not pay for it.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::FAMILY_V4;

use crate::maps::{QUIC_HANDOVER, QUIC_PROGRAM};

/// What the balancer hands its QUIC programs: the packet's VIP and where its UDP header is.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Handover {
    pub vip_id: u32,
    pub l4: u32,
}

/// Slots of the program array of the QUIC programs (those of the UDP programs, 2 and 3:
/// `quic_program.rs`).
const QUIC_V4: u32 = 0;
const QUIC_V6: u32 = 1;

/// Tail-calls the QUIC program of `FAMILY`. Returns only if it cannot run (not loaded, or
/// the bench's stage builds): the packet then goes on as any UDP VIP's.
#[inline(always)]
pub fn hand_over<const FAMILY: u8>(ctx: &XdpContext, vip_id: u32, l4: u16) {
    let slot = if FAMILY == FAMILY_V4 { QUIC_V4 } else { QUIC_V6 };
    if let Some(handover) = QUIC_HANDOVER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; the program it calls runs next, on this CPU. The slots of
        // the program array hold XDP programs of the balancer's object, or nothing.
        unsafe {
            *handover = Handover { vip_id, l4: l4 as u32 };
            let _ = QUIC_PROGRAM.tail_call(ctx, slot);
        }
    }
}
