//! An operator's own XDP programs, as the README shows them beside Spillway; never loaded by
//! `lbd` (the tests load them as an operator would).
//!
//! - `operator_root`: the root program attached to the interface. It drops IPv4 frames from a
//!   source in `op_blocked` and tail-calls slot 0 of its own program array, `op_chain`, where
//!   the operator puts Spillway's entry program (`lbd --xdp-attach none`); with the slot
//!   empty it passes.
//! - `operator_count`: counts the frames it sees by IPv4 destination (0: not IPv4), as a
//!   sampler would; the program `lbd --pass-to` hands the frames Spillway does not serve.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    macros::{map, xdp},
    maps::{HashMap, PerCpuHashMap, ProgramArray},
    programs::XdpContext,
};
use xdp_ebpf::{
    headers::{ETH_LEN, ETH_P_IPV4, EthHdr, Ipv4Hdr},
    packet,
};

/// IPv4 sources to drop (network order), the value unused.
#[map(name = "op_blocked")]
static BLOCKED: HashMap<u32, u8> = HashMap::with_max_entries(64, 0);

/// Slot 0: the program the root program hands every frame it keeps.
#[map(name = "op_chain")]
static CHAIN: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Frames seen, by IPv4 destination (network order; 0 for frames that are not IPv4).
#[map(name = "op_seen")]
static SEEN: PerCpuHashMap<u32, u64> = PerCpuHashMap::with_max_entries(256, 0);

#[xdp]
pub fn operator_root(ctx: XdpContext) -> u32 {
    if let Some(ip) = ipv4(&ctx) {
        // SAFETY: `ipv4` checked the header lies inside the frame.
        let src = unsafe { (*ip).src };
        if unsafe { BLOCKED.get(&src) }.is_some() {
            return XDP_DROP;
        }
    }
    // SAFETY: slot 0 holds an XDP program the operator put there, or nothing.
    let _ = unsafe { CHAIN.tail_call(&ctx, 0) };
    XDP_PASS
}

#[xdp]
pub fn operator_count(ctx: XdpContext) -> u32 {
    // SAFETY: `ipv4` checked the header lies inside the frame.
    let dst = ipv4(&ctx).map_or(0, |ip| unsafe { (*ip).dst });
    match SEEN.get_ptr_mut(&dst) {
        // SAFETY: this CPU's value; no other writer while we run.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = SEEN.insert(&dst, &1, 0);
        }
    }
    XDP_PASS
}

/// The IPv4 header of an untagged IPv4 frame.
#[inline(always)]
fn ipv4(ctx: &XdpContext) -> Option<*const Ipv4Hdr> {
    let eth = packet::at::<EthHdr>(ctx, 0)?;
    // SAFETY: `at` checked the Ethernet header lies inside the frame.
    if unsafe { (*eth).proto } != ETH_P_IPV4 {
        return None;
    }
    packet::at::<Ipv4Hdr>(ctx, ETH_LEN)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
