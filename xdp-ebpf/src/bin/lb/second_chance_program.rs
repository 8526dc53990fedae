//! The second-chance program (`second_chance.rs`): the balancer tail-calls it with a
//! packet's two candidates, and it sends the packet to the first with a tunnel to the second
//! inside. Only the balancer's object has it (the bench's stage builds fall back to the
//! new-flow path, which is what an empty program slot does).

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    programs::XdpContext,
};
use spillway_common::types::Reason;
use xdp_ebpf::{
    packet,
    parse::{Parsed, parse},
};

use crate::{
    clock,
    maps::{CONFIG, SECOND_CHANCE_HANDOVER},
    path::{self, stage},
    select::{self, Choice},
    verdict::Verdict,
};

/// Re-parses the packet (the balancer has) and sends it with both candidates.
#[inline(always)]
pub fn send(ctx: &XdpContext) -> Verdict {
    let Parsed::Flow { key, layout, .. } = parse(ctx) else {
        return Verdict::ended(XDP_PASS, Reason::PassMalformed);
    };
    // Slot 0 of an array always exists; the checks are for the verifier.
    let (Some(cfg), Some(handover)) = (CONFIG.get(0), SECOND_CHANCE_HANDOVER.get(0)) else {
        return Verdict::ended(XDP_PASS, Reason::PassMalformed);
    };
    let handover = *handover;
    let bytes = packet::len(ctx) as u32;
    // Both were in use a moment ago; a change in between drops the packet as a VIP without
    // a backend would.
    let (Some(first), Some(second)) = (select::active_backend(handover.first), select::active_backend(handover.second)) else {
        // Rare (a race with a change), and off the balancer's path: logged (aya-log; `lbd`
        // writes it as its own line). See ARCHITECTURE.md, "Dependencies and why".
        aya_log_ebpf::warn!(
            ctx,
            "event=second_chance_candidate_gone vip_id={} first_backend_id={} second_backend_id={}",
            handover.vip_id,
            handover.first,
            handover.second
        );
        return Verdict { vip: Some(handover.vip_id), bytes, ..Verdict::ended(XDP_DROP, Reason::DropNoBackend) };
    };
    let now_ns = clock::now_ns(cfg);
    let choice = Choice { id: handover.first, backend: first, hash: handover.flow_hash };
    let (action, reason) = path::forward::<{ stage::ALL }>(ctx, key.family, &layout, &choice, Some(&second), cfg, now_ns);
    let sent = path::is_sent(reason);
    Verdict {
        action,
        reason,
        vip: Some(handover.vip_id),
        backend: sent.then_some(handover.first),
        bytes,
        new_flow: false,
        second_chance: sent,
    }
}
