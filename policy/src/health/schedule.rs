//! When to probe: each backend has its own phase within the interval and each probe a
//! bounded jitter, both from a seeded hash, so probes are spread and never synchronised
//! (across backends of one LB, and across LBs with different seeds) yet reproducible.

use std::net::IpAddr;

use spillway_model::{HealthConfig, Proto, Vip};

/// What a probe schedule is keyed by: the VIP (its port may be the probe's) and the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeKey {
    pub vip: Vip,
    pub backend: IpAddr,
}

/// The next probe of `key` strictly after `now_ms`.
///
/// Probe `k` of a backend is due at `k × interval + phase + jitter_k`, where `phase` (in
/// `0..interval`) is fixed per backend and `jitter_k` (in `0..jitter × interval`) is drawn per
/// probe. Called with the time of the previous probe, the gap between two probes is therefore
/// within `interval × (1 ± jitter)`.
pub fn next_probe_at(config: &HealthConfig, seed: u64, key: &ProbeKey, now_ms: u64) -> u64 {
    let interval_ms = config.interval_ms.max(1);
    let jitter_span_ms = ((interval_ms as f64) * config.jitter) as u64;
    let base = key_hash(seed, key);
    let phase_ms = base % interval_ms;
    let due = |k: u64| {
        let jitter_ms = if jitter_span_ms == 0 { 0 } else { mix(base ^ mix(k)) % jitter_span_ms };
        (k * interval_ms + phase_ms).saturating_add(jitter_ms)
    };
    // The first slot whose due time is after `now_ms`: the one `now_ms` falls in, or the next
    // (jitter < interval, so the one after that is always late enough).
    let k = now_ms.saturating_sub(phase_ms) / interval_ms;
    if due(k) > now_ms { due(k) } else { due(k + 1) }
}

fn key_hash(seed: u64, key: &ProbeKey) -> u64 {
    let ProbeKey { vip: Vip { addr, port, proto }, backend } = *key;
    let mut h = mix(seed);
    for word in [addr_bits(addr), u128::from(port) << 8 | u128::from(proto_number(proto)), addr_bits(backend)] {
        h = mix(h ^ (word as u64));
        h = mix(h ^ ((word >> 64) as u64));
    }
    h
}

fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)) | 1 << 127,
        IpAddr::V6(a) => u128::from(a),
    }
}

const fn proto_number(proto: Proto) -> u8 {
    proto.number()
}

/// splitmix64's finaliser: a cheap, well-mixing, portable hash step (std's hashers are not
/// guaranteed stable across Rust versions, and the schedule should be).
pub(super) const fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
