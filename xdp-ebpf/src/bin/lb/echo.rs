//! Ping a VIP: an ICMP or ICMPv6 echo request to a VIP address is answered while a VIP at
//! that address has a backend taking new flows (`ADDR_F_ECHO`, which the reconciler keeps
//! in `spw_vip_addrs` as backends come and go), so a ping says whether the service can be
//! reached. Anything else to a VIP address that is not TCP or UDP stays dropped
//! (`drop_no_service`).
//!
//! The answer goes to the request's source, which may be spoofed: it is the request turned
//! around in place, never bigger (MACs and addresses swapped, the type and the TTL or hop
//! limit rewritten, checksums updated incrementally), and rate-limited per source and in
//! all (`lbd --echo-per-source`, `--echo-total`; `drop_echo_limited`). Only a plain request
//! is answered: IPv4 without options, IPv6 without extension headers, from an address a host
//! may have; a fragment never reaches here (`drop_fragment`).
//!
//! A program of its own (`echo_program.rs`), tail-called only for frames of other protocols
//! to an answering VIP address: a TCP or UDP packet's path gains no instruction.

use aya_ebpf::{bindings::xdp_action::XDP_DROP, programs::XdpContext};
use spillway_common::types::{ADDR_F_ECHO, AddrKey, Reason};

use crate::{maps::ECHO_PROGRAM, pass_to, path, verdict::Verdict};

/// A frame of another protocol than TCP or UDP to `addr`: passed if no VIP uses the
/// address, handed to the echo program if the address answers echo requests (`hands_over`),
/// else dropped (`drop_no_service`, as the echo program drops what it does not answer).
#[inline(always)]
pub fn not_served(ctx: &XdpContext, addr: &AddrKey, hands_over: bool) -> Verdict {
    let flags = path::vip_address_flags(&addr.addr, addr.family);
    if flags == 0 {
        return pass_to::passed(ctx, Reason::PassNotVip);
    }
    if hands_over && flags & ADDR_F_ECHO != 0 {
        // SAFETY: the program it calls runs next, on this CPU; it returns only if it cannot.
        unsafe {
            let _ = ECHO_PROGRAM.tail_call(ctx, 0);
        }
    }
    Verdict::ended(XDP_DROP, Reason::DropNoService)
}
