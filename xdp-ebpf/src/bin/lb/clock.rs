//! The data path's clock: jiffies scaled to nanoseconds by the loader's calibration
//! (`LbConfig::ns_per_jiffy`, `clock_offset_ns`), so it reads as CLOCK_MONOTONIC_COARSE,
//! which stamps entries and buckets and which userspace reads back. The verifier inlines
//! `bpf_jiffies64` into a load; `bpf_ktime_get_coarse_ns` is a helper call, ~4 ns a packet.

use aya_ebpf::helpers::bpf_jiffies64;
use spillway_common::types::LbConfig;

/// Now, in nanoseconds of the calibrated clock (tick resolution).
#[inline(always)]
pub fn now_ns(cfg: &LbConfig) -> u64 {
    // SAFETY: a helper without arguments.
    let jiffies = unsafe { bpf_jiffies64() };
    jiffies.wrapping_mul(cfg.ns_per_jiffy).wrapping_add(cfg.clock_offset_ns)
}
