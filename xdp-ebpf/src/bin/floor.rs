//! The benchmark's floor: the cheapest program that sends the frame back out.
#![no_std]
#![no_main]

use aya_ebpf::{bindings::xdp_action::XDP_TX, macros::xdp, programs::XdpContext};

#[xdp]
pub fn spillway_floor(_ctx: XdpContext) -> u32 {
    XDP_TX
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
