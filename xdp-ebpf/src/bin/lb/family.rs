//! IPv6 frames go through a program of their own (`spillway_lb_v6`), tail-called by the
//! balancer, which builds the path for IPv4 frames only: the verifier walks each family's
//! path apart. Built into one program, every branch on the family split every state the
//! parse left, and the IPv6 half alone took two thirds of the balancer's verifier budget
//! (ARCHITECTURE.md, "verifier budget"). A tail call is a jump, not a call: no return to pay
//! for (a BPF-to-BPF call and its return cost ~20 ns here), and IPv4 frames do not make it.

use aya_ebpf::programs::XdpContext;

use crate::maps::V6_PROGRAM;

/// Tail-calls the IPv6 program. Returns only if it cannot run (not loaded yet, or the
/// bench's stage builds, which share the balancer's maps but are only sent IPv4).
#[inline(always)]
pub fn hand_over_v6(ctx: &XdpContext) {
    // SAFETY: slot 0 holds an XDP program of the balancer's object, or nothing.
    let _ = unsafe { V6_PROGRAM.tail_call(ctx, 0) };
}
