//! The balancer: parse, find the VIP, choose a backend, encapsulate, send (`path.rs`, top
//! to bottom); and, in the same object, the probe path's encapsulation (`probe.rs`).
//!
//! Every packet ends in exactly one [`Reason`](spillway_common::types::Reason), counted once
//! here. Anything that is not VIP traffic is XDP_PASS, so the host stays reachable;
//! XDP_ABORTED is never returned.
#![no_std]
#![no_main]

mod clock;
mod echo;
mod echo_program;
mod family;
mod fragment;
mod fragment_program;
mod limits;
mod maps;
mod nexthop;
mod pass_to;
mod path;
mod probe;
mod ptb;
mod ptb_program;
mod quic;
mod quic_crypto;
mod quic_header;
mod quic_program;
mod second_chance;
mod second_chance_program;
mod select;
mod source_limit;
mod stats;
mod verdict;

use aya_ebpf::{bindings::xdp_action::XDP_PASS, helpers::bpf_jiffies64, macros::xdp, programs::XdpContext};
use spillway_common::types::{FAMILY_V4, FAMILY_V6};
use xdp_ebpf::packet;

/// IPv4 frames; IPv6 ones are tail-called to `spillway_lb_v6` (`family.rs`).
#[xdp]
pub fn spillway_lb(ctx: XdpContext) -> u32 {
    let verdict = path::balance::<{ path::stage::ALL }, FAMILY_V4, false>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb` for IPv6 frames (`family.rs`).
#[xdp]
pub fn spillway_lb_v6(ctx: XdpContext) -> u32 {
    let verdict = path::balance::<{ path::stage::ALL }, FAMILY_V6, false>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb` for a QUIC VIP's IPv4 packets (`quic.rs`).
#[xdp]
pub fn spillway_lb_quic(ctx: XdpContext) -> u32 {
    let verdict = quic_program::send::<FAMILY_V4>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb_v6` for a QUIC VIP's IPv6 packets (`quic.rs`).
#[xdp]
pub fn spillway_lb_quic_v6(ctx: XdpContext) -> u32 {
    let verdict = quic_program::send::<FAMILY_V6>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb_quic` for a short header of an encrypted config id
/// (`quic_crypto.rs`).
#[xdp]
pub fn spillway_lb_quic_crypt(ctx: XdpContext) -> u32 {
    let verdict = quic_crypto::decode::<FAMILY_V4>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// `spillway_lb_quic_crypt` for IPv6.
#[xdp]
pub fn spillway_lb_quic_crypt_v6(ctx: XdpContext) -> u32 {
    let verdict = quic_crypto::decode::<FAMILY_V6>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb_quic` for the IPv4 packets their connection id does not
/// place: the balancer's path, handing nothing over.
#[xdp]
pub fn spillway_lb_udp(ctx: XdpContext) -> u32 {
    let verdict = path::balance::<{ path::stage::ALL }, FAMILY_V4, true>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// `spillway_lb_udp` for IPv6.
#[xdp]
pub fn spillway_lb_udp_v6(ctx: XdpContext) -> u32 {
    let verdict = path::balance::<{ path::stage::ALL }, FAMILY_V6, true>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb` for the packets second chance sends (`second_chance.rs`).
#[xdp]
pub fn spillway_lb_second(ctx: XdpContext) -> u32 {
    let verdict = second_chance_program::send(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Never attached: the loader test-runs it on a frame of at least 8 bytes, which it
/// overwrites with jiffies, to calibrate the data path's clock (`clock.rs`).
#[xdp]
pub fn spillway_clock(ctx: XdpContext) -> u32 {
    if let Some(out) = packet::at_mut::<[u8; 8]>(&ctx, 0) {
        // SAFETY: `at_mut` checked the 8 bytes are inside the frame; a helper without arguments.
        unsafe { *out = bpf_jiffies64().to_ne_bytes() };
    }
    XDP_PASS
}

/// Tail-called by the balancer's programs for a packet too big for the egress once
/// encapsulated (`ptb.rs`).
#[xdp]
pub fn spillway_lb_ptb(ctx: XdpContext) -> u32 {
    let verdict = ptb_program::send(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb` for an IPv4 fragment (`fragment.rs`).
#[xdp]
pub fn spillway_lb_frag(ctx: XdpContext) -> u32 {
    let verdict = fragment_program::send::<FAMILY_V4>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb_v6` for an IPv6 fragment (`fragment.rs`).
#[xdp]
pub fn spillway_lb_frag_v6(ctx: XdpContext) -> u32 {
    let verdict = fragment_program::send::<FAMILY_V6>(&ctx);
    stats::count(&verdict);
    verdict.action
}

/// Tail-called by `spillway_lb` and `spillway_lb_v6` for other traffic than TCP and UDP to
/// a VIP address that answers echo requests (`echo.rs`).
#[xdp]
pub fn spillway_lb_echo(ctx: XdpContext) -> u32 {
    let verdict = echo_program::send(&ctx);
    stats::count(&verdict);
    verdict.action
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: the program has no panicking paths (no indexing, unwrap or division by
    // a possibly-zero value), and the verifier would reject the loop below anyway.
    loop {}
}
