//! Keys and values of the BPF maps, identical on both sides of the kernel boundary.
//!
//! Addresses are `[u32; 4]` words in network byte order exactly as they sit in the packet;
//! an IPv4 address uses word 0 and leaves the rest zero. Ports are in network byte order too.
//! Explicit padding fields keep every byte initialised (the kernel hashes whole keys).

use core::mem::size_of;

use crate::quic_lb::QuicLbConfig;

pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_IPIP: u8 = 4;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_IPV6: u8 = 41;
pub const PROTO_ICMPV6: u8 = 58;

/// A service: (address, port, protocol). Port 0 is the "any port" VIP of that address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    pub addr: [u32; 4],
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

/// A Maglev table in the ring pool: its first word and its size M (prime). Word `base + s / 4`
/// holds slot `s` in bits `16 * (s % 4)..`; the value is a backend id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RingRef {
    pub base: u32,
    pub size: u32,
}

impl RingRef {
    /// Words of the pool a table of `size` slots takes.
    pub const fn words(size: u32) -> u32 {
        size.div_ceil(crate::limits::RING_SLOTS_PER_WORD)
    }

    /// The reference as the one word userspace stores (atomically) into a VIP's slot.
    pub const fn to_word(self) -> u64 {
        self.base as u64 | ((self.size as u64) << 32)
    }
}

/// `VipMeta::flags`: some operator rule is scoped to this VIP (else new flows skip its trie
/// lookup).
pub const VIP_F_SCOPED_RULES: u32 = 1;
/// `VipMeta::flags`: a QUIC VIP (UDP). Its packets go to the QUIC program, which sends
/// short-header packets to the backend whose server id their destination connection id
/// carries (`quic_lb`), and everything else the way of any UDP VIP.
pub const VIP_F_QUIC: u32 = 2;
/// `VipMeta::flags`: client affinity. Maglev places the VIP's new flows by the hash of the
/// client's source address (its first [`vip_source_prefix`] bits) instead of the 5-tuple,
/// so every connection of a client goes to one backend (`hash::maglev_hash`).
pub const VIP_F_SOURCE_HASH: u32 = 4;
/// Bits 8..16 of `VipMeta::flags`: the source prefix length of `VIP_F_SOURCE_HASH`. In the
/// flags word, so one 4-byte store changes the hash mode and its prefix together.
const VIP_SOURCE_PREFIX_SHIFT: u32 = 8;
/// Every bit of the flags word that says how the VIP's flows are hashed.
pub const VIP_SOURCE_HASH_BITS: u32 = VIP_F_SOURCE_HASH | 0xff << VIP_SOURCE_PREFIX_SHIFT;

/// The flags bits of a VIP hashed by its clients' first `prefix_len` source address bits.
#[inline(always)]
pub const fn vip_source_hash_flags(prefix_len: u8) -> u32 {
    VIP_F_SOURCE_HASH | (prefix_len as u32) << VIP_SOURCE_PREFIX_SHIFT
}

/// How many leading source address bits a `VIP_F_SOURCE_HASH` VIP of `flags` hashes.
#[inline(always)]
pub const fn vip_source_prefix(flags: u32) -> u8 {
    (flags >> VIP_SOURCE_PREFIX_SHIFT) as u8
}

/// What the data path knows about a VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipMeta {
    /// Dense index (`0..Capacity::vips`): its counters, its limits slot, its flows' key.
    pub id: u32,
    /// `VIP_F_*` bits.
    pub flags: u32,
    /// The table packets read. The loader fills the standby table and then swaps the two
    /// with one 8-byte store, so a packet reads either the old table or the new one.
    pub active: RingRef,
    /// The other table: the next one being written, or the previous one.
    pub standby: RingRef,
    /// Second chance: the table in force before the VIP's last change episode (size 0:
    /// none). Written whole before this word names it, cleared before it is rewritten.
    pub prior: RingRef,
    /// A QUIC VIP's QUIC-LB configuration (`VIP_F_QUIC`; empty for other VIPs): in the slot
    /// the balancer reads anyway, so a short header's decoding reads no line of its own.
    /// Written before the flag, in one 4-byte store.
    pub quic: QuicLbConfig,
}

/// One slot of the VIP index, an array of `Capacity::vip_slots` slots: a VIP lives in the
/// first free slot at or after its home (`hash::vip_home`), within `VIP_PROBES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipSlot {
    /// `family` 0: the slot is free.
    pub key: VipKey,
    /// How many slots from here hold the VIPs whose home is this slot (0: none); a lookup
    /// scans no further.
    pub probes: u32,
    pub meta: VipMeta,
    pub _pad: u32,
}

/// An address that some VIP uses; lets the program tell VIP-bound fragments from the host's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddrKey {
    pub addr: [u32; 4],
    pub family: u8,
    pub _pad: [u8; 3],
}

/// `spw_vip_addrs` values: the address is a VIP's (always set), and
/// [`ADDR_F_ECHO`]: a VIP at the address has a backend taking new flows, so its echo
/// requests are answered (`spillway_lb_echo`). Computed by the reconciler from the tables.
pub const ADDR_F_VIP: u32 = 1;
pub const ADDR_F_ECHO: u32 = 1 << 1;

/// The echo answers' rate limits (`spw_echo_cfg`, written by `lbd` from `--echo-per-source`
/// and `--echo-total`): per source prefix and for all sources together. A zero rate in
/// either answers nothing (the all-zero map `lbd` has not written yet included).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EchoConfig {
    pub per_source: Rate,
    pub total: Rate,
}

impl EchoConfig {
    /// `per_source` and `total` answers a second, each with a burst of one second's worth.
    pub const fn new(per_source: u32, total: u32) -> EchoConfig {
        EchoConfig { per_source: Rate::new(per_source, per_source), total: Rate::new(total, total) }
    }
}

/// A fragmented datagram (`spw_frags`): what every fragment of it carries, the first
/// (which alone has the ports) and the later ones alike. `id`: the IPv4 identification (16
/// bits) or the IPv6 fragment header's (32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub id: u32,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

/// Where a datagram's first fragment went (`spw_frags`): its later fragments follow it
/// while the backend is the same one (id and generation) and the record is younger than
/// `limits::FRAGMENT_RECORD_TICKS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragmentRecord {
    pub backend_id: u32,
    pub generation: u32,
    pub vip_id: u32,
    /// The flow hash of the first fragment's 5-tuple: the outer headers' entropy, so every
    /// fragment's tunnel takes the same path.
    pub flow_hash: u32,
    /// When the first fragment was placed, in connection-table ticks.
    pub placed: u32,
}

/// The data of a key of the agent's allow-list (`spw_allow_from`, an LPM trie of the
/// balancers' outer sources, `lbd agent --allow-from`): the family first, so that one trie
/// holds both families and a prefix of `n` address bits is a key of
/// [`ALLOW_KEY_FAMILY_BITS`]` + n` bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllowKey {
    pub family: u8,
    pub _pad: [u8; 3],
    pub addr: [u32; 4],
}

/// Bits of an [`AllowKey`] before its address: every prefix covers the family.
pub const ALLOW_KEY_FAMILY_BITS: u32 = 32;

/// Key of the server-id index of QUIC VIPs: a VIP id and the server id of one of its
/// backends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuicServerKey {
    pub vip_id: u32,
    pub server_id: crate::quic_lb::ServerId,
}

/// What a server id names: a backend, and a copy of its entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicServer {
    pub backend_id: u32,
    /// `spw_backends[backend_id]` as the loader last wrote it (a key that is to name another
    /// backend is removed and inserted again, never rewritten in place).
    pub backend: BackendInfo,
}

/// A slot of the server-id index (`spw_quic_sids`), an array placed by the loader like the
/// VIP index: a key lives within `VIP_PROBES` slots of its home
/// ([`crate::hash::quic_server_home`]), and the home's `probes` says how far its keys reach,
/// so a packet's id (any value a sender likes) costs at most that many slot reads. Free
/// when the server id's length is 0 (a server id has at least one octet): the length is
/// published last and cleared first. One cache line: with the copy of the backend's entry
/// in it, a short header reads this line instead of the backend array's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicServerSlot {
    pub key: QuicServerKey,
    /// Slots from this home that hold keys homed here, at most (0: none).
    pub probes: u32,
    pub server: QuicServer,
    pub _pad: [u32; 2],
}

/// One CPU's slot of `spw_quic_hand` (by CPU id): what the balancer hands its QUIC program
/// for a QUIC VIP's packet (where its headers are and the VIP's configuration, so the QUIC
/// program reads only the connection id; a packet its id does not place goes to the UDP
/// program, which parses it again), and how that CPU's short headers were placed. The counts
/// live beside the hand-over, which both programs touch anyway: a short header reads and
/// writes no line of its own for them. One cache line, so that no two CPUs write one line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicHandover {
    pub vip_id: u32,
    pub l3_len: u32,
    /// The VIP's configuration ([`QuicLbConfig::to_word`]).
    pub quic: u32,
    /// Where the UDP header starts (the ICMP header's for an ICMP error).
    pub l4: u16,
    /// Bytes before the IP header (14, or 18 with a VLAN tag).
    pub l2_len: u8,
    pub tos: u8,
    pub family: u8,
    /// An ICMP error about a flow of the VIP.
    pub icmp_error: u8,
    pub _pad: [u8; 6],
    /// Short headers placed, per `QuicRouting`.
    pub placed: [u64; QuicRouting::COUNT as usize],
}

/// A key of `spw_quic_cids`, the cache of encrypted connection ids already decoded: the VIP
/// and the id's octets as the little-endian words the header's reading loads them as
/// (octets 0..8 `low`, 8..16 `high`, 16..20 `tail`), those past its configuration's length
/// zero. Words, not octets: built with three masks instead of a loop over 20 octets, which
/// cost a cached id about a tenth of its path.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuicCidKey {
    pub vip_id: u32,
    pub tail: u32,
    pub low: u64,
    pub high: u64,
}

/// One CPU's budget of encrypted connection ids decoded (`spw_quic_budget`): a credit of
/// nanoseconds that grows with time up to `max_credit_ns`, and that each decoding spends
/// `ns_per_miss` of. Written whole by the loader (`max_credit_ns` and `credit_ns` the
/// burst), then only by its CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecryptBudget {
    pub credit_ns: u64,
    pub last_ns: u64,
    pub ns_per_miss: u64,
    pub max_credit_ns: u64,
}

/// Backend slot states.
pub const BACKEND_FREE: u8 = 0;
pub const BACKEND_ACTIVE: u8 = 1;
/// `BackendInfo::flags`: the backend takes new flows (its effective weight is above 0). A
/// SYN on a live entry of such a backend goes where the entry says; one on an entry of a
/// drained or ejected backend is placed afresh.
pub const BACKEND_F_NEW_FLOWS: u8 = 1;

/// `BackendInfo::encap`: IPIP, IP6IP6 or IPv4-in-IPv6 (the outer protocol says which).
pub const ENCAP_IPIP: u8 = 0;
/// `BackendInfo::encap`: GUE variant 1 (RFC draft-ietf-intarea-gue): the same outer IP
/// header with a UDP header after it (destination `LbConfig::gue_port`, source from the
/// flow hash: `hash::gue_source_port`, checksum 0), then the inner IP header directly.
pub const ENCAP_GUE: u8 = 1;

/// One backend of one VIP, indexed by backend id in the backend array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendInfo {
    pub addr: [u32; 4],
    pub family: u8,
    /// [`BACKEND_FREE`] or [`BACKEND_ACTIVE`]. A draining backend stays active (weight 0 only
    /// removes it from the Maglev table), so its flows keep flowing.
    pub state: u8,
    /// [`BACKEND_F_NEW_FLOWS`].
    pub flags: u8,
    /// How packets are tunnelled to it: [`ENCAP_IPIP`] (0, so an entry written before the
    /// field existed reads as IPIP) or [`ENCAP_GUE`].
    pub encap: u8,
    /// Bumped whenever the slot is freed, so flows pinned to a removed backend re-hash even
    /// if the id is reused.
    pub generation: u32,
    /// The VIP (its ring id) this backend serves; lets a restarted loader adopt the maps.
    pub vip_id: u32,
}

/// A connection: the 5-tuple as the client sent it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: [u8; 2],
}

/// `FlowEntry::tag` bits above the ports and VIP id. An entry is usable only with `LIVE`
/// set; `BUSY` alone marks it claimed (by compare-and-swap) by a CPU writing it.
pub const FLOW_TAG_LIVE: u64 = 1 << 48;
pub const FLOW_TAG_BUSY: u64 = 1 << 49;
/// The flow is UDP (idle timeouts differ).
pub const FLOW_TAG_UDP: u64 = 1 << 50;
/// `FlowEntry::touched` bit: a packet after the first one was seen (a SYN's handshake
/// completed). Inserts never evict confirmed entries.
pub const FLOW_CONFIRMED: u32 = 1 << 31;

/// One connection in the connection table: who it is (its client address and ports, and its
/// VIP, which stands for the destination and protocol) and where it goes. 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry {
    /// Source port, destination port (network order, bits 0 and 16), VIP id (bit 32) and the
    /// `FLOW_TAG_*` bits: compared, claimed and published as one word.
    pub tag: u64,
    pub src: [u32; 4],
    pub backend_id: u16,
    /// The backend's generation (low 16 bits) when the flow was placed.
    pub generation: u16,
    /// Tick (`FLOW_TICK_SHIFT`) of the last refresh, in the low 31 bits; `FLOW_CONFIRMED`.
    pub touched: u32,
}

impl FlowEntry {
    /// The tag of a live entry for these ports (network order) and VIP.
    #[inline(always)]
    pub const fn tag_of(sport: u16, dport: u16, vip_id: u32, udp: bool) -> u64 {
        let udp = if udp { FLOW_TAG_UDP } else { 0 };
        sport as u64 | (dport as u64) << 16 | ((vip_id as u64 & 0xffff) << 32) | FLOW_TAG_LIVE | udp
    }
}

/// A connection-table entry, read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowInfo {
    pub backend_id: u32,
    /// Low 16 bits of the backend's generation when the flow was placed.
    pub generation: u16,
    /// A packet after the first one was seen (inserts never evict it).
    pub confirmed: bool,
    /// `FLOW_TICK_SHIFT` ticks of the last refresh (31 bits).
    pub touched_tick: u32,
}

impl FlowInfo {
    /// What `entry` says about its flow.
    pub fn of(entry: &FlowEntry) -> FlowInfo {
        FlowInfo {
            backend_id: entry.backend_id as u32,
            generation: entry.generation,
            confirmed: entry.touched & FLOW_CONFIRMED != 0,
            touched_tick: entry.touched & !FLOW_CONFIRMED,
        }
    }

    /// How long the flow has been idle at `now_ns` (the data path's clock), to
    /// the tick and as the data path counts it.
    pub fn idle_ns(&self, now_ns: u64) -> u64 {
        let now = (now_ns >> crate::limits::FLOW_TICK_SHIFT) as u32 & !FLOW_CONFIRMED;
        u64::from(now.wrapping_sub(self.touched_tick) & !FLOW_CONFIRMED) << crate::limits::FLOW_TICK_SHIFT
    }
}

/// A bucket of the connection table: two cache lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowBucket {
    pub ways: [FlowEntry; crate::limits::FLOW_WAYS as usize],
}

/// A CPU's cached `bpf_fib_lookup` result for one backend (kernel-side only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachedNextHop {
    /// `bpf_ktime_get_ns` after which the entry must be looked up again.
    pub expires_ns: u64,
    /// Egress interface; 0 = empty entry.
    pub ifindex: u32,
    /// The backend's generation when cached: a reused backend id never sees this entry.
    pub generation: u32,
    /// The egress device's MTU, for the oversize check the FIB would have done.
    pub mtu: u32,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
}

/// A rate as the data path enforces it: GCRA ("virtual scheduling"), one `u64` of state
/// per bucket updated with atomic adds only, so it stays exact when one source's packets
/// arrive on several CPUs. 0 `per_s` = no limit. Build it with [`Rate::new`], which works
/// out the two figures the data path uses, so a packet pays no division.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rate {
    /// Admitted new flows per second, sustained.
    pub per_s: u32,
    /// Extra new flows admitted at once after a quiet period.
    pub burst: u32,
    /// `1 s / per_s`: how far each admitted flow moves the bucket's clock.
    pub interval_ns: u64,
    /// `interval_ns * (burst + 1)`: how far ahead of now the clock may run.
    pub tolerance_ns: u64,
}

impl Rate {
    pub const fn new(per_s: u32, burst: u32) -> Rate {
        let interval_ns = if per_s == 0 { 0 } else { 1_000_000_000 / per_s as u64 };
        Rate { per_s, burst, interval_ns, tolerance_ns: interval_ns * (burst as u64 + 1) }
    }
}

/// `Limits::flags` and `RuleValue::flags`: count what would be dropped, drop nothing.
pub const LIMIT_F_OBSERVE_SOURCE: u32 = 1;
pub const LIMIT_F_OBSERVE_BUDGET: u32 = 1 << 1;

/// New-flow limits of one VIP (or, at `DEFAULT_LIMIT_SLOT`, of every VIP without its own).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Per source prefix (see `source_prefix_v4/v6`).
    pub per_source: Rate,
    /// For the whole VIP: the budget that sheds new flows above the backends' capacity.
    pub vip_budget: Rate,
    pub flags: u32,
    /// Source prefix lengths that share one bucket.
    pub source_prefix_v4: u8,
    pub source_prefix_v6: u8,
    /// Non-zero when this slot holds a configuration (the default slot may be empty).
    pub configured: u8,
    pub _pad: u8,
}

/// GCRA state of one bucket: the theoretical arrival time of the next admitted flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub tat_ns: u64,
}

/// A source prefix within a VIP (per-source buckets, `lbctl top-sources`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub vip_id: u32,
    pub family: u8,
    pub _pad: [u8; 3],
    /// Source address masked to the configured prefix.
    pub prefix: [u32; 4],
}

/// Per-source bucket and what it let through (updated with atomic adds).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    pub bucket: Bucket,
    pub admitted: u64,
    pub dropped: u64,
}

pub const RULE_LIMIT: u8 = 1;
pub const RULE_BLOCK: u8 = 2;
pub const RULE_EXEMPT: u8 = 3;

/// What a rule does, and its counters' slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleValue {
    /// For `RULE_LIMIT`: one bucket for everything the prefix matches (a client class).
    pub rate: Rate,
    pub id: u32,
    pub flags: u32,
    pub action: u8,
    /// The rule's address prefix length: the most specific of a scoped and a global match
    /// wins.
    pub addr_prefix_len: u8,
    pub _pad: [u8; 6],
}

/// A rule as the data path finds it: its scope (a VIP id, or `ANY_VIP`), family, prefix
/// length and address with the host bits cleared.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RuleSlotKey {
    pub scope: u32,
    /// 0: the slot is free.
    pub family: u8,
    pub prefix_len: u8,
    pub _pad: [u8; 2],
    pub addr: [u32; 4],
}

/// One slot of the rule index (`spw_rules`), placed like the VIP index (home slot by
/// `hash::rule_home`, `probes` at the home).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleSlot {
    pub key: RuleSlotKey,
    pub probes: u32,
    pub _pad: u32,
    pub value: RuleValue,
}

/// The prefix lengths a scope's rules use, so a lookup probes only those: per family, each
/// length plus one, longest first, 0 after the last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleLens {
    pub v4: [u8; crate::limits::MAX_RULE_LENGTHS],
    pub v6: [u8; crate::limits::MAX_RULE_LENGTHS],
}

impl RuleLens {
    /// The lengths of `family`, plus one each.
    pub fn of_mut(&mut self, family: u8) -> &mut [u8; crate::limits::MAX_RULE_LENGTHS] {
        if family == FAMILY_V4 { &mut self.v4 } else { &mut self.v6 }
    }
}

/// Per-rule counters (per CPU in the kernel; summed in userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleCounters {
    pub hits: u64,
    /// What the rule dropped (enforced); observe mode's would-drops are in `spw_rule_would`.
    pub dropped: u64,
}

/// What userspace reads for a rule: its class's bucket, and its counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleState {
    pub bucket: Bucket,
    pub hits: u64,
    pub dropped: u64,
    /// What it would have dropped while in observe mode.
    pub would_drop: u64,
}

/// Static next hop: set when the operator pins the egress instead of using the FIB.
pub const CFG_F_STATIC_NEXTHOP: u16 = 1;
/// `lbd --pass-to` is set: a frame Spillway does not serve that finds no program in
/// `spw_pass_to` is counted (`pass_to_missing`) before it passes.
pub const CFG_F_PASS_TO: u16 = 2;

/// Global settings, slot 0 of the config array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbConfig {
    /// Outer IPv4 source. Bits set in `outer_src_v4_hostmask` are taken from the flow hash,
    /// which spreads the backends' RSS queues.
    pub outer_src_v4: u32,
    pub outer_src_v4_hostmask: u32,
    /// Outer IPv6 source; `outer_src_v6_hostmask` applies to its last word.
    pub outer_src_v6: [u32; 4],
    pub outer_src_v6_hostmask: u32,
    /// `CFG_F_*` bits.
    pub flags: u16,
    /// The UDP destination port of GUE tunnels (network order; `lbd --gue-port`, which the
    /// agents decapsulate on). Beside `flags` so the config stays one cache line.
    pub gue_port: u16,
    pub tcp_idle_timeout_s: u32,
    pub udp_idle_timeout_s: u32,
    /// With [`CFG_F_STATIC_NEXTHOP`]: egress ifindex and the MACs to write.
    pub static_ifindex: u32,
    pub static_src_mac: [u8; 6],
    pub static_dst_mac: [u8; 6],
    /// Seed of the flow hash that picks a new flow's Maglev slot (`hash::flow_hash`).
    /// Fleet-wide: balancers that share it and the desired state send a flow to the same
    /// backend whichever of them ECMP picks.
    pub flow_seed: u32,
    /// This host's secret seed of the connection table's bucket hash and the outer header's
    /// entropy: random when the table is created, kept with it (the entries are local, so
    /// nobody outside can aim packets at chosen buckets; a changed fleet seed moves none).
    pub table_seed: u32,
    /// The data path's clock is `jiffies × ns_per_jiffy + clock_offset_ns` (wrapping), which
    /// reads as CLOCK_MONOTONIC_COARSE to within a tick: the verifier inlines the jiffies
    /// read, where the coarse-ns helper is a real call. The loader calibrates both whenever
    /// it writes the config.
    pub clock_offset_ns: u64,
    pub ns_per_jiffy: u64,
}

impl LbConfig {
    /// The outer source for `family`, with the host bits of a configured prefix taken from the
    /// flow hash. One function for the data path and the probe path, so both send the same
    /// outer header.
    #[inline(always)]
    pub fn outer_source(&self, family: u8, hash: u32) -> [u32; 4] {
        if family == FAMILY_V4 {
            let mask = self.outer_src_v4_hostmask;
            [(self.outer_src_v4 & !mask) | (hash & mask), 0, 0, 0]
        } else {
            let mask = self.outer_src_v6_hostmask;
            let mut src = self.outer_src_v6;
            src[3] = (src[3] & !mask) | (hash & mask);
            src
        }
    }
}

/// Packet and byte counters (per CPU in the kernel; summed in userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
    /// New flows admitted and placed on a backend (from the VIP, or onto the backend).
    pub new_flows: u64,
}

macro_rules! reasons {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $label:literal,)+ }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
            pub const COUNT: u32 = Self::ALL.len() as u32;
            /// Stable name used in `lbctl stats` and JSON output.
            pub const fn label(self) -> &'static str {
                match self { $($name::$variant => $label,)+ }
            }
        }
    };
}

reasons!(
    /// Why the balancer returned what it returned. Every packet is counted under exactly one.
    Reason {
        /// Encapsulated and sent back out of the ingress interface (XDP_TX).
        Tx = "tx",
        /// Encapsulated and redirected to another interface (XDP_REDIRECT).
        Redirect = "redirect",
        /// Encapsulated, but the next hop's neighbour is unresolved: handed to the kernel.
        KernelNoNeigh = "pass_no_neigh",
        /// Not IPv4/IPv6 (ARP, LLDP, ...).
        PassNotIp = "pass_not_ip",
        /// IP, but not to a VIP.
        PassNotVip = "pass_not_vip",
        /// Headers truncated or inconsistent: the kernel validates and drops them.
        PassMalformed = "pass_malformed",
        /// Encapsulated for an egress interface missing from the redirect map: the kernel
        /// forwards it.
        KernelNoTxPort = "pass_no_tx_port",
        /// An IPv4 or IPv6 fragment to a VIP address (no ports to hash on).
        DropFragment = "drop_fragment",
        /// The encapsulated packet would exceed the egress MTU, and is not answered (IPv4
        /// without DF, an ICMP error, an MTU below the family's minimum; see
        /// `tx_packet_too_big`).
        DropOversize = "drop_oversize",
        /// The VIP has no backend to send a new flow to.
        DropNoBackend = "drop_no_backend",
        /// The FIB has no usable route to the backend (unreachable, blackhole, prohibited).
        DropNoRoute = "drop_no_route",
        /// The encapsulation could not make room in the frame, or cannot carry the family.
        DropEncapFailed = "drop_encap_failed",
        /// A new flow over its source prefix's limit.
        DropSourceLimit = "drop_source_limit",
        /// A packet without a connection-table entry (a new flow, a mid-connection packet,
        /// an ICMP error quoting such a flow) from a prefix an operator rule blocks.
        DropRuleBlock = "drop_rule_block",
        /// A new flow over an operator rule's limit for its client class.
        DropRuleLimit = "drop_rule_limit",
        /// A new flow over the VIP's budget (load shedding).
        DropVipBudget = "drop_vip_budget",
        /// The interface the packet arrived on does not forward (`net.ipv4.conf.<if>.forwarding`
        /// or its IPv6 twin is 0): `bpf_fib_lookup` refuses to route.
        DropForwardingDisabled = "drop_forwarding_disabled",
        /// To a VIP address, but to a port or protocol no VIP serves (an ICMP echo, say):
        /// the kernel would route it back to the router that sent it here, in a loop.
        DropNoService = "drop_no_service",
        /// Would exceed the egress MTU once encapsulated, and answered: an ICMP
        /// "fragmentation needed" (IPv4 with DF) or ICMPv6 "packet too big" carrying the MTU
        /// the client must use went back to it (XDP_TX; `spillway_lb_ptb`).
        TxPacketTooBig = "tx_packet_too_big",
        /// As `tx_packet_too_big`, but the per-source or the global rate of answers was
        /// spent: dropped unanswered (the client retransmits, and a later one is answered).
        DropOversizeLimited = "drop_oversize_limited",
        /// A later fragment (not the first, which carries the ports) of a datagram to a UDP
        /// VIP whose first fragment left no record here (it has not arrived yet, was
        /// refused, or its record expired or was evicted): dropped, never sent by a guess
        /// (`spillway_lb_frag`).
        DropFragmentUnmatched = "drop_fragment_unmatched",
        /// A first fragment to a UDP VIP from a source that has recorded its share of
        /// fragmented datagrams (`FRAGMENT_SOURCE_PER_S`): dropped before it is placed, so
        /// it takes neither a record nor a connection-table entry.
        DropFragmentLimited = "drop_fragment_limited",
        /// An ICMP or ICMPv6 echo request to a VIP address with a backend taking new flows,
        /// answered in place (XDP_TX, no bigger than the request; `spillway_lb_echo`).
        TxEchoReply = "tx_echo_reply",
        /// An echo request that would have been answered, but its source's or the total
        /// rate of answers (`lbd --echo-per-source`, `--echo-total`) was spent: dropped.
        DropEchoLimited = "drop_echo_limited",
    }
);

reasons!(
    /// How the QUIC program placed a QUIC VIP's short-header packets (long headers, which
    /// Maglev places, are not counted).
    QuicRouting {
        /// Sent to the backend its connection id names, whatever its 5-tuple.
        ByConnectionId = "quic_by_connection_id",
        /// The connection id did not decode (unknown config id, too short, a server id no
        /// backend of the VIP has): placed by the 5-tuple instead, never dropped.
        Fallback = "quic_fallback",
        /// An encrypted id decrypted (a miss of the cache of decoded ids, within the budget).
        Decrypted = "decrypted",
        /// An encrypted id found in the cache of decoded ids: no decryption.
        Cached = "cached",
        /// An encrypted id not in the cache when this CPU's decryption budget was spent:
        /// placed by the 5-tuple.
        MissOverBudget = "miss_over_budget",
    }
);

reasons!(
    /// Drops a limit in observe mode would have made (the packets were let through).
    Observed {
        SourceLimit = "would_drop_source_limit",
        RuleBlock = "would_drop_rule_block",
        RuleLimit = "would_drop_rule_limit",
        VipBudget = "would_drop_vip_budget",
    }
);

reasons!(
    /// Outcomes of the backend-side decapsulation program.
    DecapReason {
        /// Outer header stripped, inner packet passed to the stack.
        Decapsulated = "decapsulated",
        /// Not a tunnel packet.
        PassNotTunnel = "pass_not_tunnel",
        /// A tunnel packet to an address this host does not decapsulate for.
        PassNotLocal = "pass_not_local",
        /// Truncated or inconsistent headers.
        PassMalformed = "pass_malformed",
        /// A second-chance packet (a tunnel to the second candidate inside the tunnel to
        /// this host) of a connection this host has: both headers stripped, passed.
        SecondChanceLocal = "second_chance_local",
        /// A second-chance packet of a connection this host does not have: the outer
        /// header stripped and the rest sent back to the hop it came from (XDP_TX), which
        /// routes it to the second candidate.
        SecondChanceForwarded = "second_chance_forwarded",
        /// A tunnel to this host from an outer source outside `--allow-from` (not one of
        /// the balancers): dropped.
        DropNotAllowed = "drop_not_allowed",
        /// A tunnel from a balancer whose inner packet is not addressed to this host (a VIP
        /// on `lo` or its own address): dropped, so a tunnel is no way to make the host
        /// forward or reach loopback.
        DropInnerNotLocal = "drop_inner_not_local",
        /// A second-chance packet whose middle header does not come from the balancer that
        /// sent the outer one: dropped rather than sent on.
        DropSecondChanceSource = "drop_second_chance_source",
        /// A second-chance packet whose middle header's TTL (hop limit) would reach 0 if
        /// sent on: dropped.
        DropSecondChanceTtl = "drop_second_chance_ttl",
    }
);

reasons!(
    /// What the probe-encapsulation program (`spillway_probe`, tc egress on the probe device)
    /// did with a packet. The last one per backend id is kept for diagnosis.
    ProbeReason {
        /// Encapsulated and redirected with the next hop's MACs.
        Redirect = "redirect",
        /// Encapsulated and redirected; the kernel resolves the next hop's neighbour.
        RedirectNeigh = "redirect_neigh",
        /// No probe mark of this balancer: not ours.
        DropNotProbe = "drop_not_probe",
        /// The mark names no active backend, or one of another generation (removed, reused).
        DropNoBackend = "drop_no_backend",
        /// Not a TCP or UDP packet over IPv4 or IPv6 without options or extension headers.
        DropMalformed = "drop_malformed",
        /// The packet could not be encapsulated (no room, or IPv6 inside IPv4).
        DropEncapFailed = "drop_encap_failed",
        /// The encapsulated packet exceeds the egress MTU.
        DropOversize = "drop_oversize",
        /// The FIB has no usable route to the backend.
        DropNoRoute = "drop_no_route",
        /// The balancer's interface does not forward, so the FIB routes nothing arriving there
        /// (the data path drops that VIP traffic too: `drop_forwarding_disabled`).
        DropForwardingDisabled = "drop_forwarding_disabled",
        /// The redirect helper refused the egress.
        DropRedirectFailed = "drop_redirect_failed",
    }
);

/// Settings of the decapsulation program, slot 0 of its config array (`spw_decap_cfg`,
/// written by `lbd agent` before the program goes live).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapConfig {
    /// The UDP port GUE tunnels arrive on (network order, `--gue-port`); 0: GUE off.
    pub gue_port: u16,
    pub _pad: u16,
}

/// Settings of the probe-encapsulation program, slot 0 of its config array (not pinned: each
/// `lbd` writes it before its program goes live).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeConfig {
    /// The interface the balancer's XDP program runs on: the FIB lookup for a probe is made
    /// as for a packet arriving there, so it finds the next hop the data path uses.
    pub ingress_ifindex: u32,
    /// The top byte of this balancer's probe marks (see [`probe_mark`]).
    pub mark_tag: u32,
}

/// Bits of a probe mark below the tag: the backend's generation (low byte) and id.
pub const PROBE_MARK_TAG_SHIFT: u32 = 24;
pub const PROBE_MARK_TAG_MASK: u32 = 0xff << PROBE_MARK_TAG_SHIFT;
const PROBE_MARK_GENERATION_SHIFT: u32 = 16;
const PROBE_MARK_ID_MASK: u32 = 0xffff;

/// The socket mark of a probe to backend `id`: `tag` in the top byte (the probe routes match
/// it), the low byte of the backend's `generation` (a probe still in flight when its id is
/// reused is dropped, not sent to the new backend), and the id.
#[inline(always)]
pub const fn probe_mark(tag: u8, id: u32, generation: u32) -> u32 {
    ((tag as u32) << PROBE_MARK_TAG_SHIFT) | ((generation & 0xff) << PROBE_MARK_GENERATION_SHIFT) | (id & PROBE_MARK_ID_MASK)
}

/// The backend id and generation byte a probe mark carries.
#[inline(always)]
pub const fn probe_mark_backend(mark: u32) -> (u32, u32) {
    (mark & PROBE_MARK_ID_MASK, (mark >> PROBE_MARK_GENERATION_SHIFT) & 0xff)
}

/// True when `generation` is the one a probe mark carries (its low byte).
#[inline(always)]
pub const fn probe_generation_matches(generation: u32, mark_generation: u32) -> bool {
    generation & 0xff == mark_generation
}

const _: () = assert!(crate::limits::Capacity::MAX.backends <= PROBE_MARK_ID_MASK);

// Layout checks: these sizes are part of the pinned-map contract.
const _: () = assert!(size_of::<VipKey>() == 20);
const _: () = assert!(size_of::<VipMeta>() == 36);
const _: () = assert!(size_of::<VipSlot>() == 64);
const _: () = assert!(core::mem::offset_of!(VipSlot, meta.active) % 8 == 0);
const _: () = assert!(core::mem::offset_of!(VipSlot, meta.prior) % 8 == 0);
const _: () = assert!(size_of::<AddrKey>() == 20);
const _: () = assert!(size_of::<EchoConfig>() == 48);
const _: () = assert!(size_of::<FragmentKey>() == 40);
const _: () = assert!(size_of::<FragmentRecord>() == 20);
const _: () = assert!(size_of::<AllowKey>() == 20);
const _: () = assert!(size_of::<BackendInfo>() == 28);
/// Most backends the bench's cheapest hop (`spillway_hop`) spreads over.
pub const HOP_BACKENDS: usize = 4;

/// Bench only: one backend of [`HopConfig`] (the tunnel's outer destination, and the MAC
/// written without a FIB lookup).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopBackend {
    /// IPv4, network order.
    pub addr: u32,
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// Bench only: everything `spillway_hop` (the cheapest XDP hop that delivers a VIP's
/// packets to the same backends, for `cargo xtask bench --part e2e`) needs, slot 0 of its
/// one array. Addresses and the port in network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopConfig {
    pub vip: u32,
    /// The outer source (the balancer's address, which the agents trust).
    pub src: u32,
    pub src_mac: [u8; 6],
    pub port: u16,
    /// Backends in use, at most [`HOP_BACKENDS`].
    pub count: u32,
    pub backends: [HopBackend; HOP_BACKENDS],
}

const _: () = assert!(size_of::<FlowKey>() == 40);
const _: () = assert!(size_of::<FlowEntry>() == 32);
const _: () = assert!(size_of::<FlowBucket>() == 128);
const _: () = assert!(size_of::<LbConfig>() == 80);
const _: () = assert!(size_of::<Traffic>() == 24);
const _: () = assert!(size_of::<CachedNextHop>() == 32);
const _: () = assert!(size_of::<Limits>() == 56);
const _: () = assert!(size_of::<SourceKey>() == 24);
const _: () = assert!(size_of::<SourceState>() == 24);
const _: () = assert!(size_of::<RuleValue>() == 40);
const _: () = assert!(size_of::<RuleCounters>() == 16);
const _: () = assert!(size_of::<RuleSlotKey>() == 24);
const _: () = assert!(size_of::<RuleSlot>() == 72);
const _: () = assert!(size_of::<RuleLens>() == 16);
const _: () = assert!(size_of::<ProbeConfig>() == 8);
const _: () = assert!(size_of::<DecapConfig>() == 4);
const _: () = assert!(size_of::<HopBackend>() == 12);
const _: () = assert!(size_of::<HopConfig>() == 68);
const _: () = assert!(size_of::<QuicServerKey>() == 20);
const _: () = assert!(size_of::<QuicServerSlot>() == 64);
const _: () = assert!(size_of::<QuicHandover>() == 64);
const _: () = assert!(size_of::<QuicCidKey>() == 24);
const _: () = assert!(size_of::<DecryptBudget>() == 32);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY (all): repr(C), every field is Pod, and the explicit `_pad` fields leave no
    // implicit padding (sizes asserted above).
    macro_rules! pod {
        ($($t:ty),+) => {$(
            unsafe impl bytemuck::Zeroable for $t {}
            unsafe impl bytemuck::Pod for $t {}
            #[cfg(feature = "maps")]
            unsafe impl aya::Pod for $t {}
        )+};
    }
    pod!(
        VipKey,
        RingRef,
        VipMeta,
        VipSlot,
        QuicHandover,
        QuicCidKey,
        DecryptBudget,
        AddrKey,
        AllowKey,
        BackendInfo,
        FlowKey,
        FlowEntry,
        FlowBucket,
        LbConfig,
        Traffic,
        Rate,
        Limits,
        EchoConfig,
        Bucket,
        SourceKey,
        SourceState,
        RuleValue,
        RuleCounters,
        RuleSlotKey,
        RuleSlot,
        RuleLens,
        ProbeConfig,
        DecapConfig,
        HopBackend,
        HopConfig,
        QuicServerKey,
        QuicServer,
        QuicServerSlot
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_marks_carry_tag_generation_and_id() {
        let mark = probe_mark(0x53, 4095, 0x1_02);
        assert_eq!(mark, 0x5302_0fff);
        assert_eq!(mark & PROBE_MARK_TAG_MASK, 0x53 << PROBE_MARK_TAG_SHIFT);
        assert_eq!(probe_mark_backend(mark), (4095, 0x02));
        assert!(probe_generation_matches(0x7_02, 0x02));
        assert!(!probe_generation_matches(0x7_03, 0x02));
    }

    #[test]
    fn outer_source_takes_host_bits_from_the_hash() {
        let cfg = LbConfig {
            outer_src_v4: u32::from_be_bytes([10, 0, 0, 0]).to_be(),
            outer_src_v4_hostmask: 0xff00_0000,
            outer_src_v6: [1, 2, 3, 0x0400_0000],
            outer_src_v6_hostmask: 0x00ff_0000,
            ..LbConfig::default()
        };
        assert_eq!(cfg.outer_source(FAMILY_V4, 0x1234_5678), [0x1200_000a, 0, 0, 0]);
        assert_eq!(cfg.outer_source(FAMILY_V6, 0x1234_5678), [1, 2, 3, 0x0434_0000]);
        let host = LbConfig { outer_src_v4: 7, ..LbConfig::default() };
        assert_eq!(host.outer_source(FAMILY_V4, u32::MAX), [7, 0, 0, 0]);
    }
}
