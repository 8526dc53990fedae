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

use aya_ebpf::programs::XdpContext;

use crate::maps::ECHO_PROGRAM;

/// Tail-calls the echo program for a frame of another protocol than TCP or UDP to a VIP
/// address that answers echo requests. Returns (the frame is then dropped as no service)
/// only if it cannot run.
#[inline(always)]
pub fn hand_over(ctx: &XdpContext) {
    // SAFETY: the program it calls runs next, on this CPU; it returns only if it cannot.
    unsafe {
        let _ = ECHO_PROGRAM.tail_call(ctx, 0);
    }
}
