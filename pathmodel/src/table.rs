//! The connection table as its contract states it: a flow (source, ports, VIP, UDP or not)
//! keeps the backend it was placed on while that backend's slot holds the same generation, is
//! in use, and the flow has not been idle past its protocol's timeout. The model keeps no
//! ways: it only counts each bucket's entries, so that an insert the table would have to make
//! room for (evicting a flow, a choice of time and position) is reported instead of guessed.

use std::collections::HashMap;

use spillway_common::{
    hash::flow_buckets,
    limits::{FLOW_TICK_SHIFT, FLOW_TOUCH_TICKS, FLOW_WAYS},
    types::{BACKEND_ACTIVE, BACKEND_F_NEW_FLOWS, BackendInfo, FLOW_CONFIRMED, FlowKey, PROTO_UDP},
};

use crate::{ModelError, state::MapState};

const TICK_MASK: u32 = !FLOW_CONFIRMED;
/// Free ways the first bucket keeps before an insert looks at the second.
const ROOMY: u32 = 3;

/// What identifies a flow's entry (the destination is the VIP's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Identity {
    src: [u32; 4],
    sport: u16,
    dport: u16,
    vip_id: u16,
    udp: bool,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    backend_id: u32,
    generation: u16,
    /// Tick of the last refresh, and `FLOW_CONFIRMED`.
    touched: u32,
    bucket: u32,
}

#[derive(Default)]
pub(crate) struct Table {
    entries: HashMap<Identity, Entry>,
    /// Entries per bucket.
    occupied: HashMap<u32, u32>,
}

/// The table's clock.
pub(crate) fn ticks(now_ns: u64) -> u32 {
    (now_ns >> FLOW_TICK_SHIFT) as u32 & TICK_MASK
}

fn identity(key: &FlowKey, vip_id: u32) -> Identity {
    Identity { src: key.src, sport: key.sport, dport: key.dport, vip_id: vip_id as u16, udp: key.proto == PROTO_UDP }
}

/// What [`Table::remember`] did.
pub(crate) enum Remembered {
    Placed,
    /// A live entry for the flow's tuple kept its backend.
    Kept(u32, BackendInfo),
}

impl Table {
    /// The backend of the flow's live entry; a packet of the flow itself (`refresh`)
    /// confirms the entry and keeps it fresh.
    pub(crate) fn established(
        &mut self,
        state: &MapState,
        key: &FlowKey,
        vip_id: u32,
        now: u32,
        refresh: bool,
    ) -> Option<(u32, BackendInfo)> {
        let entry = self.entries.get_mut(&identity(key, vip_id))?;
        let (backend, idle) = valid(state, entry, key.proto, now)?;
        if refresh && (entry.touched & FLOW_CONFIRMED == 0 || idle > FLOW_TOUCH_TICKS) {
            entry.touched = now | FLOW_CONFIRMED;
        }
        Some((entry.backend_id, backend))
    }

    /// Places a new flow, unconfirmed, unless its tuple's entry is live and its backend
    /// takes new flows.
    pub(crate) fn remember(
        &mut self,
        state: &MapState,
        key: &FlowKey,
        vip_id: u32,
        hash: u32,
        (id, backend): (u32, &BackendInfo),
        now: u32,
    ) -> Result<Remembered, ModelError> {
        let who = identity(key, vip_id);
        let placed = Entry { backend_id: id, generation: backend.generation as u16, touched: now, bucket: 0 };
        if let Some(entry) = self.entries.get_mut(&who) {
            if let Some((kept, _)) = valid(state, entry, key.proto, now)
                && kept.flags & BACKEND_F_NEW_FLOWS != 0
            {
                return Ok(Remembered::Kept(entry.backend_id, kept));
            }
            *entry = Entry { bucket: entry.bucket, ..placed };
            return Ok(Remembered::Placed);
        }
        let (first, second) = flow_buckets(hash, state.table_buckets - 1);
        let free = |b: u32| FLOW_WAYS - self.occupied.get(&b).copied().unwrap_or(0);
        let bucket = if free(first) >= ROOMY || free(first) >= free(second) { first } else { second };
        if free(bucket) == 0 {
            return Err(ModelError::TableCrowded { buckets: (first, second) });
        }
        *self.occupied.entry(bucket).or_default() += 1;
        self.entries.insert(who, Entry { bucket, ..placed });
        Ok(Remembered::Placed)
    }
}

/// The entry's backend and idle ticks, if it is live.
fn valid(state: &MapState, entry: &Entry, proto: u8, now: u32) -> Option<(BackendInfo, u32)> {
    let backend = *state.backends.get(&entry.backend_id)?;
    if backend.state != BACKEND_ACTIVE || backend.generation as u16 != entry.generation {
        return None;
    }
    let idle = now.wrapping_sub(entry.touched) & TICK_MASK;
    let timeout_s = if proto == PROTO_UDP { state.config.udp_idle_timeout_s } else { state.config.tcp_idle_timeout_s };
    ((idle as u64) << FLOW_TICK_SHIFT <= timeout_s as u64 * 1_000_000_000).then_some((backend, idle))
}
