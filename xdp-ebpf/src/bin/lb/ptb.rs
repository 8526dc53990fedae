//! "Packet too big": a packet that would exceed the egress MTU once encapsulated is
//! answered, so the client's path MTU discovery learns the size that fits instead of its
//! transfer stalling: ICMP "fragmentation needed" for IPv4 with DF, ICMPv6 "packet too big"
//! (`xdp_ebpf::icmp`), from the VIP the client sent to, advising the egress MTU less the
//! encapsulation's overhead.
//!
//! The answer goes to the packet's source, which may be spoofed: it is a reflection, so it
//! is never bigger than the packet (fixed-length quotes of packets at least that long), it
//! is rate-limited per source and in all (`PTB_*` in `spillway_common::limits`), and it is
//! never sent for an ICMP error, a fragment (the balancer drops those before), IPv4 without
//! DF (its sender did not ask for path MTU discovery, and fragmenting belongs to no XDP
//! program: dropped as before), a source no host has (multicast, loopback, unspecified), or
//! an MTU below the family's minimum (an underlay that cannot carry it is misconfigured).
//!
//! A program of its own (`ptb_program.rs`), tail-called: the answer's work does not fit on
//! the balancer's stack, nor its states in the balancer's verifier budget.

use aya_ebpf::{bindings::xdp_action::XDP_DROP, programs::XdpContext};
use spillway_common::types::Reason;

use crate::maps::{PTB_HANDOVER, PTB_PROGRAM, PtbHandover};

/// Tail-calls the "packet too big" program for the packet that is `overhead` bytes short of
/// fitting an egress MTU of `egress_mtu`. Returns (drop, as before it existed) only if it
/// cannot run.
#[inline(always)]
pub fn hand_over(ctx: &XdpContext, vip_id: u32, egress_mtu: u32, overhead: usize) -> (u32, Reason) {
    if let Some(slot) = PTB_HANDOVER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; the program it calls runs next, on this CPU.
        unsafe {
            *slot = PtbHandover { vip_id, mtu: egress_mtu.saturating_sub(overhead as u32) };
            let _ = PTB_PROGRAM.tail_call(ctx, 0);
        }
    }
    (XDP_DROP, Reason::DropOversize)
}
