//! The path every frame takes, top to bottom: parse, pre-filter, VIP, connection table,
//! limits, Maglev, next hop, encapsulation. Returns the [`Verdict`] the entry point counts.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX},
    programs::XdpContext,
};
use core::ptr::{addr_of, read_volatile};

use spillway_common::{
    hash::{flow_hash, maglev_hash, vip_addr_hash, vip_filter_slot, vip_home},
    types::{
        ADDR_F_ECHO, AddrKey, BackendInfo, CFG_F_STATIC_NEXTHOP, ENCAP_GUE, FAMILY_V4, FlowKey, LbConfig, PROTO_TCP, Reason, RingRef,
        VIP_F_QUIC, VipKey,
    },
};
use xdp_ebpf::{
    encap::{self, Macs, Tunnel},
    fib::NextHop,
    headers::{ETH_LEN, EthHdr},
    packet,
    parse::{Layout, Parsed, parse_family},
};

use crate::{
    clock, echo, family, fragment, limits,
    maps::{self, CONFIG, SecondChanceHandover, TX_PORTS, VIP_ADDRS, VIP_FILTER, VIPS, vip_slot_mask},
    nexthop, pass_to, ptb, quic, second_chance, select,
    select::{Choice, Flow, Remembered, Vip},
    stats,
    verdict::Verdict,
};

/// The stages of the path, in order. The balancer runs them all; the bench-only object
/// (`lb_stages.rs`) also builds the path cut short after each one, which is how the bench
/// measures each stage's share. Comparisons with the constant fold away at compile time.
pub mod stage {
    pub const PARSE: u8 = 1;
    /// The VIP pre-filter, the config and the clock.
    pub const FILTER: u8 = 2;
    pub const VIP: u8 = 3;
    /// The flow hash and the connection-table lookup (a hit includes reading its backend;
    /// a SYN skips the lookup).
    pub const TABLE: u8 = 4;
    /// The Maglev hash and the limits.
    pub const LIMITS: u8 = 5;
    /// The Maglev slot read.
    pub const SLOT: u8 = 6;
    pub const BACKEND: u8 = 7;
    pub const INSERT: u8 = 8;
    pub const NEXT_HOP: u8 = 9;
    /// Everything, encapsulation included; the entry point then counts the verdict.
    pub const ALL: u8 = u8::MAX;
}

/// Ends a cut-short build after `$stage`, keeping what it computed alive.
macro_rules! cut {
    ($stop:ident, $stage:ident $(, $keep:expr)*) => {
        if $stop == stage::$stage {
            $(core::hint::black_box($keep);)*
            return Cut::CUT;
        }
    };
}

/// What a cut-short build returns: XDP_TX, never counted.
trait Cut {
    const CUT: Self;
}

impl Cut for Verdict {
    const CUT: Self =
        Verdict { action: XDP_TX, reason: Reason::Tx, vip: None, backend: None, bytes: 0, new_flow: false, second_chance: false };
}

impl Cut for (u32, Reason) {
    const CUT: Self = (XDP_TX, Reason::Tx);
}

/// What the path does beside its own steps: for a packet of the path ([`Packet`]), parse its
/// frame and nothing more; for a first fragment (`fragment_program.rs`), take the flow its
/// program parsed, charge its source, and record where it went. Everything here is inlined:
/// a packet of the path pays nothing for the hooks.
pub trait Placement {
    /// Frames are handed to the other programs (IPv6, QUIC, fragments).
    const HANDS_OVER: bool;
    /// Why a packet to a VIP address that no VIP serves on its port is dropped.
    const UNSERVED: Reason;
    /// The frame, parsed for the path.
    fn parse<const FAMILY: u8>(&self, ctx: &XdpContext) -> Parsed;
    /// Once the VIP is known, before the connection table: `Err` refuses the packet.
    fn admit(&self, key: &FlowKey, now_ns: u64) -> Result<(), Reason>;
    /// Once the backend is chosen, before the packet is sent.
    fn placed(&self, key: &FlowKey, vip: &Vip, choice: &Choice, now: u32);
}

/// A packet of the path, placed as its flow. `QUIC`: the path of the QUIC programs
/// (`quic.rs`) for the packets their connection id does not place, which hands nothing over.
pub struct Packet<const QUIC: bool>;

impl<const QUIC: bool> Placement for Packet<QUIC> {
    const HANDS_OVER: bool = !QUIC;
    const UNSERVED: Reason = Reason::DropNoService;

    #[inline(always)]
    fn parse<const FAMILY: u8>(&self, ctx: &XdpContext) -> Parsed {
        parse_family::<FAMILY>(ctx)
    }

    #[inline(always)]
    fn admit(&self, _key: &FlowKey, _now_ns: u64) -> Result<(), Reason> {
        Ok(())
    }

    #[inline(always)]
    fn placed(&self, _key: &FlowKey, _vip: &Vip, _choice: &Choice, _now: u32) {}
}

/// The path for frames of `FAMILY` (`FAMILY_V4`: IPv6 frames are handed to their own
/// program, `family.rs`; `FAMILY_V6`: the program they are handed to). `QUIC`: the path of
/// the QUIC programs (`quic.rs`) for the packets their connection id does not place, which
/// hands nothing over. A fragment is handed to the fragment program (`fragment.rs`).
#[inline(always)]
pub fn balance<const STOP: u8, const FAMILY: u8, const QUIC: bool>(ctx: &XdpContext) -> Verdict {
    place::<STOP, FAMILY, _>(ctx, &Packet::<QUIC>)
}

/// The path for a frame of `FAMILY` as `placement` parses and places it (see [`Placement`]).
#[inline(always)]
pub fn place<const STOP: u8, const FAMILY: u8, P: Placement>(ctx: &XdpContext, placement: &P) -> Verdict {
    let (key, layout, icmp_error, syn) = match placement.parse::<FAMILY>(ctx) {
        Parsed::Flow { key, layout, icmp_error, syn } => (key, layout, icmp_error, syn),
        Parsed::NotIp => return pass_to::passed(ctx, Reason::PassNotIp),
        Parsed::Malformed => return pass_to::passed(ctx, Reason::PassMalformed),
        // Other protocols: an echo request to a serving VIP address is answered (`echo.rs`).
        Parsed::Other(addr) => return other_protocol(ctx, &addr, P::HANDS_OVER),
        Parsed::OtherFamily => {
            if FAMILY == FAMILY_V4 && P::HANDS_OVER {
                family::hand_over_v6(ctx);
            }
            // Only if the IPv6 program is not there (it always is once `lbd` has loaded the
            // balancer): the kernel gets the frame, as it gets every frame for no VIP.
            return pass_to::passed(ctx, Reason::PassNotVip);
        }
        Parsed::Fragment(addr) => {
            if P::HANDS_OVER {
                fragment::hand_over::<FAMILY>(ctx);
            }
            // Only if the fragment program cannot run: dropped, as before it existed.
            return not_served(ctx, &addr.addr, addr.family, Reason::DropFragment);
        }
    };
    cut!(STOP, PARSE, &key, &layout, &icmp_error, &syn);
    let addr_hash = vip_addr_hash(&key.dst);
    if !maybe_vip(addr_hash) {
        return pass_to::passed(ctx, Reason::PassNotVip);
    }
    // Slot 0 of an array always exists; the check is for the verifier.
    let Some(cfg) = CONFIG.get(0) else {
        return pass_to::passed(ctx, Reason::PassNotVip);
    };
    let bytes = packet::len(ctx) as u32;
    // Tick-resolution time is enough for second-scale timeouts and costs no clocksource read.
    let now_ns = clock::now_ns(cfg);
    let now = select::ticks(now_ns);
    cut!(STOP, FILTER, &now_ns, cfg);
    let Some(vip) = find_vip(&key, addr_hash) else {
        return not_served(ctx, &key.dst, key.family, P::UNSERVED);
    };
    cut!(STOP, VIP, &vip);
    if P::HANDS_OVER && vip.flags & VIP_F_QUIC != 0 {
        quic::hand_over::<FAMILY>(ctx, &vip, &layout, icmp_error);
    }
    if let Err(reason) = placement.admit(&key, now_ns) {
        return Verdict { action: XDP_DROP, reason, vip: Some(vip.id), backend: None, bytes, new_flow: false, second_chance: false };
    }
    // The table's buckets and the outer header's entropy hash with this host's secret seed,
    // so nobody outside can aim at buckets; a changed fleet seed moves no entry. Only a
    // packet of the flow itself (no SYN, no ICMP error about it) confirms and refreshes.
    let flow = Flow::new(&key, vip.id, flow_hash(&key, cfg.table_seed));
    // A SYN is a new connection even on a known tuple (a client reusing a port after a
    // reset), so it skips the lookup and goes through the limits; its insert then finds the
    // tuple's entry, and keeps it if it is live.
    let known = if syn { None } else { select::established(&flow, now, cfg, !icmp_error) };
    cut!(STOP, TABLE, &known);
    let (choice, new_flow) = match known {
        Some(choice) => (choice, false),
        None => {
            // Maglev hashes with the fleet's seed: the 5-tuple, or the source for affinity.
            // Before the limits: computed after them, the VIP's flags stayed live across
            // them and the frame outgrew the verifier's 512 bytes.
            let hash = maglev_hash(&key, vip.flags, cfg.flow_seed);
            let refused = |reason| Verdict {
                action: XDP_DROP,
                reason,
                vip: Some(vip.id),
                backend: None,
                bytes,
                new_flow: false,
                second_chance: false,
            };
            // A TCP packet past the handshake without an entry began elsewhere, and an ICMP
            // error belongs to an existing flow: neither is a new flow, so neither is
            // charged to a limit (a flood of them buys nothing honest traffic then lacks);
            // only a block drops them.
            let midstream = !syn && key.proto == PROTO_TCP;
            let admitted = limits::admit(&key, &vip, now_ns, !midstream && !icmp_error, flow.hash());
            cut!(STOP, LIMITS, &admitted);
            if let Err(reason) = admitted {
                return refused(reason);
            }
            // If the VIP's last change moved the slot of a connection that began elsewhere,
            // it may belong to either backend.
            if midstream
                && !icmp_error
                && let Some((first, second)) = second_chance::candidates(&vip, hash)
            {
                second_chance::hand_over(ctx, SecondChanceHandover { vip_id: vip.id, first, second, flow_hash: flow.hash() });
            }
            let Some(mut id) = select::maglev_slot(vip.ring, hash) else {
                return refused(Reason::DropNoBackend);
            };
            cut!(STOP, SLOT, &id);
            let Some(mut backend) = select::active_backend(id) else {
                return refused(Reason::DropNoBackend);
            };
            cut!(STOP, BACKEND, &backend);
            // ICMP errors read the table but never create entries.
            if !icmp_error {
                match select::remember(&flow, id, &backend, now, cfg) {
                    Remembered::Placed => {}
                    Remembered::Full => stats::unremembered(),
                    // A SYN on a tuple whose entry is live goes where the entry says (an
                    // off-path sender's SYN must not move a connection).
                    Remembered::Kept(kept, b) => (id, backend) = (kept, *b),
                }
            }
            cut!(STOP, INSERT);
            (Choice { id, backend, hash: flow.hash() }, !icmp_error)
        }
    };
    placement.placed(&key, &vip, &choice, now);
    let (action, reason) = forward::<STOP>(ctx, key.family, &layout, &choice, None, cfg, now_ns);
    let backend = is_sent(reason).then_some(choice.id);
    Verdict { action, reason, vip: Some(vip.id), backend, bytes, new_flow, second_chance: false }
}

/// A packet to `addr` that no VIP serves: dropped as `reason` when the address is a VIP's
/// (the balancer does not own it, so the kernel would route the packet back to the router
/// that sent it here, and the router here again), passed otherwise.
#[inline(always)]
pub fn not_served(ctx: &XdpContext, addr: &[u32; 4], family: u8, reason: Reason) -> Verdict {
    if vip_address(addr, family) { Verdict::ended(XDP_DROP, reason) } else { pass_to::passed(ctx, Reason::PassNotVip) }
}

/// A frame of another protocol than TCP or UDP to `addr`: passed if no VIP uses the address,
/// handed to the echo program if the address answers echo requests (`hands_over`), else
/// dropped (`drop_no_service`, as the echo program drops what it does not answer).
#[inline(always)]
fn other_protocol(ctx: &XdpContext, addr: &AddrKey, hands_over: bool) -> Verdict {
    let flags = vip_address_flags(&addr.addr, addr.family);
    if flags == 0 {
        return pass_to::passed(ctx, Reason::PassNotVip);
    }
    if hands_over && flags & ADDR_F_ECHO != 0 {
        echo::hand_over(ctx);
    }
    Verdict::ended(XDP_DROP, Reason::DropNoService)
}

/// Some VIP uses `addr`.
#[inline(always)]
pub fn vip_address(addr: &[u32; 4], family: u8) -> bool {
    vip_address_flags(addr, family) != 0
}

/// The `ADDR_F_*` flags of `addr` (0: no VIP uses it).
#[inline(always)]
pub fn vip_address_flags(addr: &[u32; 4], family: u8) -> u32 {
    if maybe_vip(vip_addr_hash(addr)) { vip_addr_flags(addr, family) } else { 0 }
}

/// A subprogram of its own: its key lives in its frame, not in the balancer's.
#[inline(never)]
fn vip_addr_flags(addr: &[u32; 4], family: u8) -> u32 {
    // SAFETY: a live map value, one aligned word the reconciler replaces whole.
    VIP_ADDRS.get_ptr(&AddrKey { addr: *addr, family, _pad: [0; 3] }).map_or(0, |flags| unsafe { read_volatile(flags) })
}

/// The packet left towards its backend (from here or through the kernel).
#[inline(always)]
pub fn is_sent(reason: Reason) -> bool {
    matches!(reason, Reason::Tx | Reason::Redirect | Reason::KernelNoNeigh | Reason::KernelNoTxPort)
}

/// False only for addresses no VIP uses (one inlined array read).
#[inline(always)]
fn maybe_vip(addr_hash: u32) -> bool {
    let (word, bit) = vip_filter_slot(addr_hash);
    VIP_FILTER.get(word).is_some_and(|w| w & bit != 0)
}

/// Exact (address, port, protocol) first, then the address's "any port" VIP.
#[inline(always)]
fn find_vip(key: &FlowKey, addr_hash: u32) -> Option<Vip> {
    let mut vip = VipKey { addr: key.dst, port: key.dport, proto: key.proto, family: key.family };
    if let Some(meta) = indexed_vip(&vip, addr_hash) {
        return Some(meta);
    }
    vip.port = 0;
    indexed_vip(&vip, addr_hash)
}

/// `vip` in the VIP index: at most its home slot's `probes` slots from there. The loader
/// writes slots while packets read them: a slot's family is published last (and cleared
/// first), and a table flip is one 8-byte store, so volatile reads in this order see either
/// a whole VIP or none.
#[inline(always)]
fn indexed_vip(vip: &VipKey, addr_hash: u32) -> Option<Vip> {
    let mask = vip_slot_mask();
    let home = vip_home(addr_hash, vip.port, vip.proto, mask);
    // SAFETY (both): live map values.
    let slot = maps::probe(&VIPS, home, mask, |slot| unsafe {
        read_volatile(addr_of!((*slot).key.family)) == vip.family && read_volatile(addr_of!((*slot).key)) == *vip
    })?;
    let table = |word: u64| RingRef { base: word as u32, size: (word >> 32) as u32 };
    unsafe {
        let meta = addr_of!((*slot).meta);
        Some(Vip {
            id: read_volatile(addr_of!((*meta).id)),
            flags: read_volatile(addr_of!((*meta).flags)),
            ring: table(read_volatile(addr_of!((*meta).active).cast::<u64>())),
            prior: table(read_volatile(addr_of!((*meta).prior).cast::<u64>())),
            quic: read_volatile(addr_of!((*meta).quic).cast::<u32>()),
        })
    }
}

/// Encapsulates a packet of `family` towards `choice` (with a second candidate's tunnel
/// inside, when `second`) and sends.
#[inline(always)]
pub fn forward<const STOP: u8>(
    ctx: &XdpContext,
    family: u8,
    layout: &Layout,
    choice: &Choice,
    second: Option<&BackendInfo>,
    cfg: &LbConfig,
    now: u64,
) -> (u32, Reason) {
    let be = &choice.backend;
    let hash = choice.hash;
    let inner_family = second.map_or(family, |s| s.family);
    if !encap::supported(be.family, inner_family) || !encap::supported(inner_family, family) {
        return (XDP_DROP, Reason::DropEncapFailed);
    }
    let Some(eth) = packet::at::<EthHdr>(ctx, 0) else {
        return (XDP_PASS, Reason::PassMalformed);
    };
    // The frame arrived addressed to us: these MACs make the kernel accept it if we must
    // hand the encapsulated packet over.
    let arrived = unsafe { Macs { src: (*eth).src, dst: (*eth).dst } };
    let src = cfg.outer_source(be.family, hash);
    // Each tunnel as its backend's agent takes it: IPIP, or GUE on the fleet's port.
    let gue_port = |b: &BackendInfo| (b.encap == ENCAP_GUE).then_some(cfg.gue_port);
    let inner_len = layout.l3_len + second.map_or(0, |s| encap::outer_len(s.family, s.encap == ENCAP_GUE));
    let outer_len = (encap::outer_len(be.family, be.encap == ENCAP_GUE) + inner_len) as u16;
    let hop = if cfg.flags & CFG_F_STATIC_NEXTHOP != 0 {
        NextHop::Resolved { ifindex: cfg.static_ifindex, macs: Macs { src: cfg.static_src_mac, dst: cfg.static_dst_mac } }
    } else {
        nexthop::resolve(ctx, choice.id, be, &src, outer_len, now)
    };
    // Kept as plain fields: the unused payload of another variant is undefined, and the
    // verifier refuses a program that stores it.
    cut!(
        STOP,
        NEXT_HOP,
        &match &hop {
            NextHop::Resolved { ifindex, macs } => (*ifindex, macs.src, macs.dst),
            _ => (0, [0; 6], [0; 6]),
        }
    );
    let (macs, egress) = match hop {
        // Answered with the MTU that fits (`ptb.rs`); the overhead is what encapsulation adds.
        NextHop::FragNeeded { mtu } => return ptb::hand_over(ctx, be.vip_id, mtu, outer_len as usize - layout.l3_len),
        NextHop::NoRoute => return (XDP_DROP, Reason::DropNoRoute),
        NextHop::ForwardingDisabled => return (XDP_DROP, Reason::DropForwardingDisabled),
        NextHop::NoNeigh => (Macs { src: arrived.src, dst: arrived.dst }, None),
        NextHop::Resolved { ifindex, macs } => (macs, Some(ifindex)),
    };
    // Second chance: the tunnel to the second candidate goes on first, as any tunnel does;
    // the one to the backend then goes around it. One tunnel lives at a time (the stack).
    let mut l2_len = layout.l2_len;
    if let Some(s) = second {
        let middle = Tunnel {
            family: s.family,
            src: cfg.outer_source(s.family, hash),
            dst: s.addr,
            inner_family: family,
            inner_len: layout.l3_len,
            tos: layout.tos,
            flow_hash: hash,
            gue_port: gue_port(s),
        };
        if encap::push(ctx, l2_len, &middle, &macs).is_err() {
            return (XDP_DROP, Reason::DropEncapFailed);
        }
        l2_len = ETH_LEN;
    }
    let tunnel =
        Tunnel { family: be.family, src, dst: be.addr, inner_family, inner_len, tos: layout.tos, flow_hash: hash, gue_port: gue_port(be) };
    if encap::push(ctx, l2_len, &tunnel, &macs).is_err() {
        return (XDP_DROP, Reason::DropEncapFailed);
    }
    let Some(ifindex) = egress else {
        return (XDP_PASS, Reason::KernelNoNeigh);
    };
    if ifindex as usize == ctx.ingress_ifindex() {
        return (XDP_TX, Reason::Tx);
    }
    match TX_PORTS.redirect(ifindex, XDP_PASS as u64) {
        Ok(_) => (XDP_REDIRECT, Reason::Redirect),
        Err(_) => hand_to_kernel(ctx, &arrived),
    }
}

/// The egress is not in the redirect map: restore the MACs the frame arrived with so the
/// kernel accepts and forwards the encapsulated packet.
#[inline(always)]
fn hand_to_kernel(ctx: &XdpContext, arrived: &Macs) -> (u32, Reason) {
    match packet::at_mut::<EthHdr>(ctx, 0) {
        Some(eth) => {
            unsafe {
                (*eth).src = arrived.src;
                (*eth).dst = arrived.dst;
            }
            (XDP_PASS, Reason::KernelNoTxPort)
        }
        None => (XDP_DROP, Reason::DropEncapFailed),
    }
}
