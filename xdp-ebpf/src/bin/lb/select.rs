//! Backend choice: the connection table for established flows, Maglev for new ones.
//!
//! The connection table is an array of buckets of four 32-byte entries, and a flow lives in
//! one of its two buckets (`hash::flow_buckets`): one inlined array access per bucket, keys
//! compared as four words. A CPU claims an entry by compare-and-swap of its tag before
//! writing it and publishes it by storing the tag last, so two CPUs never interleave writes
//! to one entry; a reader that sees the tag unchanged around its reads saw a whole entry.
//!
//! Flood-proof by construction: an insert takes the way already holding the flow, a free or
//! expired way, else the stalest *unconfirmed* one (no packet after its first), else the
//! stalest confirmed one idle past `FLOW_HOLD_TICKS`. Spoofed SYNs, however many, only churn
//! each other; a blind sender can confirm entries too (its second packet does), but holds
//! one only while it keeps sending on it. When all eight candidate ways are held, the new
//! flow goes unremembered (counted: `spw_flows_full`), and its next packet tries again
//! (Maglev sends it to the same backend while the table holds).

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use spillway_common::{
    hash::flow_buckets,
    limits::{FLOW_HOLD_TICKS, FLOW_TICK_SHIFT, FLOW_TOUCH_TICKS, FLOW_WAYS},
    types::{
        BACKEND_ACTIVE, BACKEND_F_NEW_FLOWS, BackendInfo, FLOW_CONFIRMED, FLOW_TAG_BUSY, FLOW_TAG_LIVE, FLOW_TAG_UDP, FlowEntry, FlowKey,
        LbConfig, PROTO_UDP, RingRef,
    },
};
use xdp_ebpf::atomic::cmpxchg_u64;

use crate::maps::{BACKENDS, FLOWS, RINGS, flow_bucket_mask};

const NS_PER_S: u64 = 1_000_000_000;
/// Ticks are 31 bits; differences wrap within them.
const TICK_MASK: u32 = !FLOW_CONFIRMED;

/// What the path needs of a VIP (see `VipMeta`).
#[derive(Clone, Copy)]
pub struct Vip {
    pub id: u32,
    pub flags: u32,
    /// Its active Maglev table.
    pub ring: RingRef,
    /// Its second-chance table (size 0: none).
    pub prior: RingRef,
    /// Its QUIC-LB configuration (`VIP_F_QUIC`), as `QuicLbConfig::to_word`.
    pub quic: u32,
}

pub struct Choice {
    pub id: u32,
    pub backend: BackendInfo,
    /// The flow hash (the outer header's entropy).
    pub hash: u32,
}

/// A flow as the connection table knows it: its tag, its source (read from its key when
/// compared: a copy would take 16 bytes of the balancer's frame) and its two buckets.
pub struct Flow<'a> {
    hash: u32,
    tag: u64,
    key: &'a FlowKey,
    buckets: (u32, u32),
}

impl<'a> Flow<'a> {
    #[inline(always)]
    pub fn new(key: &'a FlowKey, vip_id: u32, hash: u32) -> Flow<'a> {
        Flow {
            hash,
            tag: FlowEntry::tag_of(key.sport, key.dport, vip_id, key.proto == PROTO_UDP),
            key,
            buckets: flow_buckets(hash, flow_bucket_mask()),
        }
    }

    /// The source address as an entry holds it: two words.
    #[inline(always)]
    fn src(&self) -> [u64; 2] {
        let word = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
        let src = &self.key.src;
        [word(src[0], src[1]), word(src[2], src[3])]
    }

    #[inline(always)]
    pub fn hash(&self) -> u32 {
        self.hash
    }
}

/// The clock as the table counts it.
#[inline(always)]
pub fn ticks(now_ns: u64) -> u32 {
    (now_ns >> FLOW_TICK_SHIFT) as u32 & TICK_MASK
}

/// Ticks from `then` to `now` (both from [`ticks`]; they wrap within 31 bits).
#[inline(always)]
pub fn elapsed(now: u32, then: u32) -> u32 {
    now.wrapping_sub(then) & TICK_MASK
}

/// A known flow keeps its backend while that backend exists (draining included) and the
/// flow is not idle past its timeout. `refresh`: a packet of the flow itself (not an ICMP
/// error about it), which confirms the entry and keeps it fresh.
#[inline(always)]
pub fn established(flow: &Flow, now: u32, cfg: &LbConfig, refresh: bool) -> Option<Choice> {
    let (entry, found, backend, idle) = live(flow, now, cfg)?;
    let (id, backend) = (found.backend_id as u32, *backend);
    // Written rarely (confirmation, then about once a second), so a hit almost never
    // dirties a shared cache line.
    if refresh && (found.touched & FLOW_CONFIRMED == 0 || idle > FLOW_TOUCH_TICKS) {
        // SAFETY: a live map value; a racing writer of this entry only loses a timestamp.
        unsafe { write_volatile(addr_of_mut!((*entry).touched), now | FLOW_CONFIRMED) };
    }
    Some(Choice { id, backend, hash: flow.hash })
}

/// The flow's entry, what it holds, its backend and how long it has been idle, if it is
/// live (see [`valid`]).
#[inline(always)]
fn live(flow: &Flow, now: u32, cfg: &LbConfig) -> Option<(*mut FlowEntry, Found, &'static BackendInfo, u32)> {
    let (entry, found) = find(flow)?;
    let (backend, idle) = valid(&found, flow.tag, now, cfg)?;
    Some((entry, found, backend, idle))
}

/// An entry's backend and idle time, if that backend is the one it was placed on and the
/// entry has not expired.
#[inline(always)]
fn valid(found: &Found, tag: u64, now: u32, cfg: &LbConfig) -> Option<(&'static BackendInfo, u32)> {
    let backend = BACKENDS.get(found.backend_id as u32)?;
    if backend.state != BACKEND_ACTIVE || backend.generation as u16 != found.generation {
        return None;
    }
    let idle = elapsed(now, found.touched);
    if expired(tag, idle, cfg) {
        return None;
    }
    Some((backend, idle))
}

/// The backend id a flow's (Maglev) hash selects in a VIP's Maglev table `ring`.
#[inline(always)]
pub fn maglev_slot(ring: RingRef, hash: u32) -> Option<u32> {
    if ring.size == 0 {
        return None;
    }
    let slot = hash % ring.size;
    let word = *RINGS.get(ring.base + slot / 4)?;
    Some((word >> ((slot % 4) * 16)) as u16 as u32)
}

/// Backend `id`'s entry, if it is in use.
#[inline(always)]
pub fn active_backend(id: u32) -> Option<BackendInfo> {
    BACKENDS.get(id).filter(|b| b.state == BACKEND_ACTIVE).copied()
}

/// What [`remember`] did.
pub enum Remembered {
    /// The flow is in the table with the backend it was given (or another CPU's write won
    /// the way).
    Placed,
    /// Every candidate way was held: the flow goes unremembered.
    Full,
    /// The flow's own entry is live (a SYN on a known tuple): kept, with this backend.
    Kept(u32, &'static BackendInfo),
}

/// Remembers a new flow's backend, unconfirmed (see the module docs for which way it takes),
/// unless the flow's own entry is live.
#[inline(always)]
pub fn remember(flow: &Flow, id: u32, backend: &BackendInfo, now: u32, cfg: &LbConfig) -> Remembered {
    let Some((entry, seen, own)) = victim(flow, now, cfg) else {
        return Remembered::Full;
    };
    if own && let Some((id, backend)) = live_backend(entry, seen, now, cfg) {
        return Remembered::Kept(id, backend);
    }
    // SAFETY: `entry` is a live map value; only the CPU whose compare-and-swap succeeds
    // writes it until it publishes the tag.
    unsafe {
        // Lost to another CPU taking the way: not a full table.
        if cmpxchg_u64(addr_of_mut!((*entry).tag), seen, FLOW_TAG_BUSY) != seen {
            return Remembered::Placed;
        }
        write_volatile(addr_of_mut!((*entry).src).cast::<[u64; 2]>(), flow.src());
        write_volatile(addr_of_mut!((*entry).backend_id), id as u16);
        write_volatile(addr_of_mut!((*entry).generation), backend.generation as u16);
        write_volatile(addr_of_mut!((*entry).touched), now);
        write_volatile(addr_of_mut!((*entry).tag), flow.tag);
    }
    Remembered::Placed
}

/// The backend of `entry` (holding tag `tag` when found) if the entry is live (its backend
/// the one it was placed on, and not expired) and that backend still takes new flows.
#[inline(always)]
fn live_backend(entry: *mut FlowEntry, tag: u64, now: u32, cfg: &LbConfig) -> Option<(u32, &'static BackendInfo)> {
    // SAFETY: a live map value, read as `find_in` reads it.
    let found = unsafe {
        Found {
            backend_id: read_volatile(addr_of!((*entry).backend_id)),
            generation: read_volatile(addr_of!((*entry).generation)),
            touched: read_volatile(addr_of!((*entry).touched)),
        }
    };
    let (backend, _) = valid(&found, tag, now, cfg)?;
    (backend.flags & BACKEND_F_NEW_FLOWS != 0).then_some((found.backend_id as u32, backend))
}

/// What a lookup read from an entry.
struct Found {
    backend_id: u16,
    generation: u16,
    touched: u32,
}

/// The entry holding `flow`, and what it holds.
#[inline(always)]
fn find(flow: &Flow) -> Option<(*mut FlowEntry, Found)> {
    let (first, second) = flow.buckets;
    if let Some(found) = find_in(first, flow) {
        return Some(found);
    }
    if second == first {
        return None;
    }
    find_in(second, flow)
}

#[inline(always)]
fn find_in(bucket: u32, flow: &Flow) -> Option<(*mut FlowEntry, Found)> {
    let bucket = FLOWS.get_ptr_mut(bucket)?;
    for way in 0..FLOW_WAYS as usize {
        // SAFETY: `way` < FLOW_WAYS stays inside the bucket, a live map value. Volatile
        // reads, because other CPUs write entries while we read them.
        unsafe {
            let entry = addr_of_mut!((*bucket).ways[way]);
            let tag = read_volatile(addr_of!((*entry).tag));
            if tag != flow.tag || read_volatile(addr_of!((*entry).src).cast::<[u64; 2]>()) != flow.src() {
                continue;
            }
            let found = Found {
                backend_id: read_volatile(addr_of!((*entry).backend_id)),
                generation: read_volatile(addr_of!((*entry).generation)),
                touched: read_volatile(addr_of!((*entry).touched)),
            };
            // Rewritten for another flow while we read: not ours any more.
            if read_volatile(addr_of!((*entry).tag)) != tag {
                continue;
            }
            return Some((entry, found));
        }
    }
    None
}

/// Free ways a flow's first bucket must have for an insert to skip its second: almost as
/// even as always taking the emptier bucket (overflow at a full table 0.005% instead of
/// 0.001%), and most inserts read one bucket instead of two.
const ROOMY: u32 = 3;

/// The way a new flow takes, and the tag it holds now (for the compare-and-swap). Best
/// first: the flow's own entry; a free way of the first bucket while it is roomy, else of
/// the emptier of the two; an expired way; the unconfirmed one idle longest; the confirmed
/// one idle longest past the hold. Never a way another CPU is writing. (A stale copy of the flow left in
/// the second bucket is harmless: lookups try the first bucket first.)
#[inline(always)]
fn victim(flow: &Flow, now: u32, cfg: &LbConfig) -> Option<(*mut FlowEntry, u64, bool)> {
    let (first, second) = flow.buckets;
    // Passes rather than one loop remembering ways: counts are all that cross from one pass
    // to the next, which keeps the verifier's states few enough to prune.
    let mut free = [0u32; 2];
    for (b, index) in [first, second].into_iter().enumerate() {
        if b == 1 && free[0] >= ROOMY {
            break;
        }
        let bucket = FLOWS.get_ptr_mut(index)?;
        for way in 0..FLOW_WAYS as usize {
            // SAFETY: as in `find_in`.
            unsafe {
                let entry = addr_of_mut!((*bucket).ways[way]);
                let tag = read_volatile(addr_of!((*entry).tag));
                if tag == flow.tag && read_volatile(addr_of!((*entry).src).cast::<[u64; 2]>()) == flow.src() {
                    return Some((entry, tag, true));
                }
                if tag & (FLOW_TAG_LIVE | FLOW_TAG_BUSY) == 0 {
                    free[b] += 1;
                }
            }
        }
    }
    if free[0] + free[1] != 0 {
        let bucket = FLOWS.get_ptr_mut(if free[1] > free[0] { second } else { first })?;
        for way in 0..FLOW_WAYS as usize {
            // SAFETY: as in `find_in`.
            unsafe {
                let entry = addr_of_mut!((*bucket).ways[way]);
                let tag = read_volatile(addr_of!((*entry).tag));
                if tag & (FLOW_TAG_LIVE | FLOW_TAG_BUSY) == 0 {
                    return Some((entry, tag, false));
                }
            }
        }
    }
    const EXPIRED: u64 = u64::MAX;
    let mut best = None;
    let mut best_score = 0;
    for index in [first, second] {
        let bucket = FLOWS.get_ptr_mut(index)?;
        for way in 0..FLOW_WAYS as usize {
            // SAFETY: as in `find_in`.
            let (entry, tag, score) = unsafe {
                let entry = addr_of_mut!((*bucket).ways[way]);
                let tag = read_volatile(addr_of!((*entry).tag));
                let touched = read_volatile(addr_of!((*entry).touched));
                let idle = now.wrapping_sub(touched) & TICK_MASK;
                let score = if tag & FLOW_TAG_LIVE == 0 {
                    // Busy: another CPU is writing it.
                    0
                } else if expired(tag, idle, cfg) {
                    EXPIRED
                } else if touched & FLOW_CONFIRMED == 0 {
                    // Above every confirmed score (idle < 2^31); +1: even an unconfirmed
                    // entry touched this tick may go.
                    (1 << 32) + idle as u64 + 1
                } else if idle > FLOW_HOLD_TICKS {
                    (idle - FLOW_HOLD_TICKS) as u64
                } else {
                    0
                };
                (entry, tag, score)
            };
            if score > best_score {
                best_score = score;
                best = Some((entry, tag, false));
            }
        }
    }
    best
}

/// True when an entry idle for `idle` ticks has outlived its protocol's timeout.
#[inline(always)]
fn expired(tag: u64, idle: u32, cfg: &LbConfig) -> bool {
    let timeout_s = if tag & FLOW_TAG_UDP != 0 { cfg.udp_idle_timeout_s } else { cfg.tcp_idle_timeout_s };
    (idle as u64) << FLOW_TICK_SHIFT > timeout_s as u64 * NS_PER_S
}
