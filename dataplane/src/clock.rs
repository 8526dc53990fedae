//! The data path's clock (`xdp-ebpf/src/bin/lb/clock.rs`): jiffies, which the verifier
//! inlines into one load, scaled to read as CLOCK_MONOTONIC_COARSE, the clock userspace
//! compares entries and buckets with. Both advance once a tick (jiffies count the ticks of
//! the monotonic clock), so one reading of each, taken within one tick, ties them together
//! to within a tick for as long as the machine runs.

use aya::programs::{TestRun, TestRunOptions, Xdp};

use super::DataplaneError;

/// `LbConfig::ns_per_jiffy` and `clock_offset_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calibration {
    pub ns_per_jiffy: u64,
    pub offset_ns: u64,
}

/// Readings taken until one falls within a tick (the coarse clock the same before and
/// after); the second almost always does, as a test run takes microseconds.
const ATTEMPTS: usize = 8;

/// Ties jiffies, read by test-running `program` (`spillway_clock`), to the coarse clock.
pub fn calibrate(program: &Xdp) -> Result<Calibration, DataplaneError> {
    // The coarse clocks' resolution is the tick (TICK_NSEC), the length of a jiffy.
    let ns_per_jiffy = coarse_resolution_ns();
    let mut offset_ns = 0;
    for _ in 0..ATTEMPTS {
        let before = coarse_now_ns();
        let jiffies = read_jiffies(program)?;
        let after = coarse_now_ns();
        offset_ns = before.wrapping_sub(jiffies.wrapping_mul(ns_per_jiffy));
        if before == after {
            break;
        }
    }
    Ok(Calibration { ns_per_jiffy, offset_ns })
}

/// Now on the clock the data path reads (CLOCK_MONOTONIC_COARSE).
pub fn coarse_now_ns() -> u64 {
    coarse(libc::clock_gettime)
}

fn coarse_resolution_ns() -> u64 {
    coarse(libc::clock_getres)
}

/// `call` (`clock_gettime` or `clock_getres`) of CLOCK_MONOTONIC_COARSE, in nanoseconds.
fn coarse(call: unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC_COARSE always exists on Linux.
    unsafe { call(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Smallest frame an XDP test run takes (an Ethernet header); the program writes 8 bytes.
const FRAME: usize = 14;

fn read_jiffies(program: &Xdp) -> Result<u64, DataplaneError> {
    let frame = [0u8; FRAME];
    let mut out = [0u8; FRAME];
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(&frame);
    opts.data_out = Some(&mut out);
    program.test_run(opts).map_err(|source| DataplaneError::Program { name: "test_run", source })?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&out[..8]);
    Ok(u64::from_ne_bytes(word))
}
