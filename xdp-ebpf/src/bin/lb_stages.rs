//! Bench only: the balancer's path cut short after each stage (see `lb/path.rs`), from the
//! same modules, so `cargo xtask bench` can measure what each stage costs. Shares its maps
//! with the balancer through pins; never loaded by `lbd`. IPv4 only, as the balancer's own
//! program is (`lb/family.rs`): the bench sends IPv4.
#![no_std]
#![no_main]

#[path = "lb/clock.rs"]
mod clock;
#[path = "lb/echo.rs"]
mod echo;
#[path = "lb/family.rs"]
mod family;
#[path = "lb/fragment.rs"]
mod fragment;
#[path = "lb/limits.rs"]
mod limits;
#[path = "lb/maps.rs"]
mod maps;
#[path = "lb/nexthop.rs"]
mod nexthop;
#[path = "lb/pass_to.rs"]
mod pass_to;
#[path = "lb/path.rs"]
mod path;
#[path = "lb/ptb.rs"]
mod ptb;
#[path = "lb/quic.rs"]
mod quic;
#[path = "lb/second_chance.rs"]
mod second_chance;
#[path = "lb/select.rs"]
mod select;
#[path = "lb/stats.rs"]
mod stats;
#[path = "lb/verdict.rs"]
mod verdict;

use aya_ebpf::{macros::xdp, programs::XdpContext};
use path::{balance, stage};
use spillway_common::types::FAMILY_V4;

/// One program per stage, named after the last stage it runs.
macro_rules! cut_after {
    ($($name:ident => $stage:expr,)+) => {$(
        #[xdp]
        pub fn $name(ctx: XdpContext) -> u32 {
            balance::<{ $stage }, FAMILY_V4, false>(&ctx).action
        }
    )+};
}

cut_after!(
    lb_to_parse => stage::PARSE,
    lb_to_filter => stage::FILTER,
    lb_to_vip => stage::VIP,
    lb_to_table => stage::TABLE,
    lb_to_limits => stage::LIMITS,
    lb_to_slot => stage::SLOT,
    lb_to_backend => stage::BACKEND,
    lb_to_insert => stage::INSERT,
    lb_to_next_hop => stage::NEXT_HOP,
    lb_to_encap => stage::ALL,
);

/// The whole balancer, counters included: the same program `lbd` loads.
#[xdp]
pub fn lb_all(ctx: XdpContext) -> u32 {
    let verdict = balance::<{ stage::ALL }, FAMILY_V4, false>(&ctx);
    stats::count(&verdict);
    verdict.action
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
