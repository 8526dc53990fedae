//! The fragment programs (`fragment.rs`): a first fragment is placed by the balancer's path
//! and leaves its record; a later one follows the record.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    programs::XdpContext,
};
use spillway_common::{
    limits::{FRAGMENT_RECORD_TICKS, FRAGMENT_SOURCE_BURST, FRAGMENT_SOURCE_PER_S, FRAGMENT_SOURCE_PREFIX_V6},
    types::{FlowKey, FragmentKey, FragmentRecord, PROTO_UDP, Rate, Reason},
};
use xdp_ebpf::{
    fragment::{Fragmented, parse_fragment},
    packet,
    parse::{Layout, Parsed},
};

use crate::{
    clock,
    maps::{CONFIG, FRAGMENT_SOURCES, FRAGMENTS},
    path::{self, Placement, stage},
    select::{self, Choice, Vip},
    source_limit,
    verdict::Verdict,
};

const PER_SOURCE: Rate = Rate::new(FRAGMENT_SOURCE_PER_S, FRAGMENT_SOURCE_BURST);

/// Parses the fragment again (the balancer did) and places or follows it.
#[inline(always)]
pub fn send<const FAMILY: u8>(ctx: &XdpContext) -> Verdict {
    match parse_fragment::<FAMILY>(ctx) {
        Fragmented::Malformed => Verdict::ended(XDP_PASS, Reason::PassMalformed),
        Fragmented::Unplaceable(addr) => path::not_served(ctx, &addr.addr, addr.family, Reason::DropFragment),
        // TCP fragments are dropped as before: a TCP sender that does path MTU discovery
        // never sends one.
        Fragmented::First { key, .. } if key.proto != PROTO_UDP => path::not_served(ctx, &key.dst, key.family, Reason::DropFragment),
        Fragmented::Later { datagram, .. } if datagram.proto != PROTO_UDP => {
            path::not_served(ctx, &datagram.dst, datagram.family, Reason::DropFragment)
        }
        Fragmented::First { datagram, .. } => path::place::<{ stage::ALL }, FAMILY, _>(ctx, &FirstFragment { id: datagram.id }),
        Fragmented::Later { datagram, layout } => follow(ctx, &datagram, &layout),
    }
}

/// A first fragment: charged to its source's records, and recorded once placed.
struct FirstFragment {
    /// Its datagram's identification (the rest of the datagram's key is the flow's).
    id: u32,
}

impl Placement for FirstFragment {
    // Nothing to hand over: the frame is IPv4 or IPv6 as the program is, a fragment is
    // already here, and QUIC packets are never fragmented.
    const HANDS_OVER: bool = false;
    const UNSERVED: Reason = Reason::DropFragment;

    /// Parsed again rather than carried over from `send`: the stack has no room for both
    /// copies of the flow.
    #[inline(always)]
    fn parse<const FAMILY: u8>(&self, ctx: &XdpContext) -> Parsed {
        match parse_fragment::<FAMILY>(ctx) {
            Fragmented::First { key, layout, .. } => Parsed::Flow { key, layout, icmp_error: false, syn: false },
            _ => Parsed::Malformed,
        }
    }

    #[inline(always)]
    fn admit(&self, key: &FlowKey, now_ns: u64) -> Result<(), Reason> {
        if source_limit::admit(&FRAGMENT_SOURCES, &key.src, key.family, FRAGMENT_SOURCE_PREFIX_V6, &PER_SOURCE, now_ns) {
            Ok(())
        } else {
            Err(Reason::DropFragmentLimited)
        }
    }

    #[inline(always)]
    fn placed(&self, key: &FlowKey, vip: &Vip, choice: &Choice, now: u32) {
        let record = FragmentRecord {
            backend_id: choice.id,
            generation: choice.backend.generation,
            vip_id: vip.id,
            flow_hash: choice.hash,
            placed: now,
        };
        // A full table evicts its least recently used record; a failed insert leaves the
        // later fragments unmatched, which is what they would be without the record.
        let datagram = FragmentKey { src: key.src, dst: key.dst, id: self.id, proto: key.proto, family: key.family, _pad: [0; 2] };
        let _ = FRAGMENTS.insert(&datagram, &record, 0);
    }
}

/// A later fragment: sent where its datagram's first went, as a table hit is, if the record
/// is there, young enough, and its backend the same one.
#[inline(always)]
fn follow(ctx: &XdpContext, datagram: &FragmentKey, layout: &Layout) -> Verdict {
    if !path::vip_address(&datagram.dst, datagram.family) {
        return Verdict::ended(XDP_PASS, Reason::PassNotVip);
    }
    let unmatched = Verdict::ended(XDP_DROP, Reason::DropFragmentUnmatched);
    // Slot 0 of an array always exists; the check is for the verifier.
    let Some(cfg) = CONFIG.get(0) else {
        return unmatched;
    };
    let now_ns = clock::now_ns(cfg);
    let Some(record) = FRAGMENTS.get_ptr(datagram) else {
        return unmatched;
    };
    // SAFETY: a live map value; a first fragment rewriting it at once (the identification
    // reused) may mix two records, whose backend is then checked as any.
    let record = unsafe { *record };
    if select::elapsed(select::ticks(now_ns), record.placed) > FRAGMENT_RECORD_TICKS {
        return unmatched;
    }
    let Some(backend) = select::active_backend(record.backend_id).filter(|b| b.generation == record.generation) else {
        return Verdict { vip: Some(record.vip_id), ..unmatched };
    };
    let bytes = packet::len(ctx) as u32;
    let choice = Choice { id: record.backend_id, backend, hash: record.flow_hash };
    let (action, reason) = path::forward::<{ stage::ALL }>(ctx, datagram.family, layout, &choice, None, cfg, now_ns);
    let backend = path::is_sent(reason).then_some(choice.id);
    Verdict { action, reason, vip: Some(record.vip_id), backend, bytes, new_flow: false, second_chance: false }
}
