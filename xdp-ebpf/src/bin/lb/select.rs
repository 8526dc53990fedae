//! Backend choice: the connection table for established flows, Maglev for new ones.

use spillway_common::{
    limits::FLOW_TOUCH_INTERVAL_NS,
    types::{BACKEND_ACTIVE, BackendInfo, FlowKey, FlowValue, LbConfig, PROTO_TCP, VipMeta},
};

use crate::{
    maps::{BACKENDS, FLOWS, RINGS},
    stats,
};

const NS_PER_S: u64 = 1_000_000_000;

pub struct Choice {
    pub id: u32,
    pub backend: BackendInfo,
}

/// A new flow's backend, from the VIP's active Maglev table; the choice is remembered in the
/// connection table (ICMP errors read but never create entries).
#[inline(always)]
pub fn new_flow(key: &FlowKey, vip: &VipMeta, hash: u32, now: u64, icmp_error: bool) -> Option<Choice> {
    if vip.ring_size == 0 {
        return None;
    }
    let slot = VipMeta::ring_base(vip.id, vip.active_half) + hash % vip.ring_size;
    let id = *RINGS.get(slot)?;
    let backend = *BACKENDS.get(id)?;
    if backend.state != BACKEND_ACTIVE {
        return None;
    }
    if !icmp_error {
        let entry = FlowValue { backend_id: id, generation: backend.generation, touched_ns: now };
        // A full table evicts the least recently used flow; an error here only means this
        // flow is re-hashed on its next packet, to the same backend while the table holds.
        let _ = FLOWS.insert(key, &entry, 0);
        stats::new_flow(vip.id, id);
    }
    Some(Choice { id, backend })
}

/// A known flow keeps its backend while that backend exists (draining included) and the
/// flow is not idle past its timeout.
#[inline(always)]
pub fn established(key: &FlowKey, now: u64, cfg: &LbConfig, icmp_error: bool) -> Option<Choice> {
    let entry = FLOWS.get_ptr_mut(key)?;
    // SAFETY: the pointer is a live map value; racing writers only store timestamps.
    let entry = unsafe { &mut *entry };
    let backend = *BACKENDS.get(entry.backend_id)?;
    if backend.state != BACKEND_ACTIVE || backend.generation != entry.generation {
        return None;
    }
    let idle_s = if key.proto == PROTO_TCP { cfg.tcp_idle_timeout_s } else { cfg.udp_idle_timeout_s };
    let idle_ns = now.wrapping_sub(entry.touched_ns);
    if idle_ns > idle_s as u64 * NS_PER_S {
        return None;
    }
    // Refresh rarely, so a hit almost never writes a shared cache line.
    if !icmp_error && idle_ns > FLOW_TOUCH_INTERVAL_NS {
        entry.touched_ns = now;
    }
    Some(Choice { id: entry.backend_id, backend })
}
