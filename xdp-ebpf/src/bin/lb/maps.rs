//! The balancer's maps. Names must match `spillway_common::limits::map_names`; sizes here
//! are `Capacity::DEFAULT`'s, and the loader sets the ones `lbd` was started with (and
//! checks every pinned map's shape before reusing it). The tables packets look up in are
//! arrays indexed by hashes the program computes itself: one inlined array access each, no
//! kernel hashing, locks or byte-wise key compares.

use core::ptr::{addr_of, read_volatile};

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, bpf_fib_lookup},
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{Array, DevMapHash, HashMap, LruHashMap, PerCpuArray, ProgramArray},
};
use spillway_common::{
    limits::{
        Capacity, ECHO_SOURCE_ENTRIES, FRAGMENT_SOURCE_ENTRIES, MAX_RULES, MAX_TX_PORTS, PTB_SOURCE_ENTRIES, QUIC_CID_CACHE_ENTRIES,
        RULE_SLOTS, SOURCE_TABLE_ENTRIES, VIP_FILTER_WORDS, VIP_PROBES,
    },
    types::{
        AddrKey, BackendInfo, Bucket, CachedNextHop, DecryptBudget, EchoConfig, FlowBucket, FragmentKey, FragmentRecord, LbConfig, Limits,
        Observed, QuicCidKey, QuicHandover, QuicServerSlot, Reason, RuleCounters, RuleLens, RuleSlot, SourceKey, SourceState, Traffic,
        VipSlot,
    },
};

const DEFAULT: Capacity = Capacity::DEFAULT;

/// Sizes the loader sets at load time (`.rodata`, so the verifier sees constants).
#[unsafe(no_mangle)]
static FLOW_BUCKET_MASK: u32 = DEFAULT.flow_buckets() - 1;
#[unsafe(no_mangle)]
static VIP_SLOT_MASK: u32 = DEFAULT.vip_slots() - 1;
#[unsafe(no_mangle)]
static DEFAULT_LIMIT_SLOT: u32 = DEFAULT.default_limit_slot();
/// Slots of the QUIC server-id index, minus one (read by `quic_program.rs`).
#[unsafe(no_mangle)]
pub static QUIC_SERVER_SLOT_MASK: u32 = DEFAULT.quic_server_slots() - 1;

/// `FLOW_BUCKET_MASK`: buckets of the connection table, minus one.
#[inline(always)]
pub fn flow_bucket_mask() -> u32 {
    // Volatile: the value is patched at load; the compiler must not fold the default.
    unsafe { core::ptr::read_volatile(&FLOW_BUCKET_MASK) }
}

#[inline(always)]
pub fn vip_slot_mask() -> u32 {
    unsafe { core::ptr::read_volatile(&VIP_SLOT_MASK) }
}

#[inline(always)]
pub fn default_limit_slot() -> u32 {
    unsafe { core::ptr::read_volatile(&DEFAULT_LIMIT_SLOT) }
}

#[map(name = "spw_cfg")]
pub static CONFIG: Array<LbConfig> = Array::with_max_entries(1, 0);

/// The VIP index (see `VipSlot`); written by the loader through a memory mapping, so a
/// table flip is one 8-byte store.
#[map(name = "spw_vips")]
pub static VIPS: Array<VipSlot> = Array::with_max_entries(DEFAULT.vip_slots(), BPF_F_MMAPABLE);

/// Bloom filter over VIP addresses (see `hash::vip_filter_slot`): a clear bit proves a
/// packet is not VIP traffic.
#[map(name = "spw_vip_filter")]
pub static VIP_FILTER: Array<u64> = Array::with_max_entries(VIP_FILTER_WORDS, 0);

#[map(name = "spw_vip_addrs")]
pub static VIP_ADDRS: HashMap<AddrKey, u32> = HashMap::with_max_entries(DEFAULT.vips, 0);

/// Every VIP's Maglev tables (active, standby, second chance), four 16-bit backend ids per
/// word (see `RingRef`).
#[map(name = "spw_rings")]
pub static RINGS: Array<u64> = Array::with_max_entries(DEFAULT.ring_words(), BPF_F_MMAPABLE);

#[map(name = "spw_backends")]
pub static BACKENDS: Array<BackendInfo> = Array::with_max_entries(DEFAULT.backend_slots(), 0);

/// The connection table (see `select.rs`): buckets of four entries, a flow in one of two.
#[map(name = "spw_flows")]
pub static FLOWS: Array<FlowBucket> = Array::with_max_entries(DEFAULT.flow_buckets(), BPF_F_MMAPABLE);

#[map(name = "spw_vip_stats")]
pub static VIP_STATS: PerCpuArray<Traffic> = PerCpuArray::with_max_entries(DEFAULT.vips, 0);

#[map(name = "spw_be_stats")]
pub static BACKEND_STATS: PerCpuArray<Traffic> = PerCpuArray::with_max_entries(DEFAULT.backend_slots(), 0);

#[map(name = "spw_reasons")]
pub static REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Reason::COUNT, 0);

/// Per-CPU next hop per backend id (see `nexthop.rs`); never pinned, it refills itself.
#[map(name = "spw_nh_cache")]
pub static NEXTHOP_CACHE: PerCpuArray<CachedNextHop> = PerCpuArray::with_max_entries(DEFAULT.backend_slots(), 0);

/// A cache miss's `bpf_fib_lookup` parameters (`nexthop.rs`): 64 bytes the stack, shared by
/// the frames of a call chain, has no room for. Never pinned.
#[map(name = "spw_fib_params")]
pub static FIB_PARAMS: PerCpuArray<bpf_fib_lookup> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "spw_tx_ports")]
pub static TX_PORTS: DevMapHash = DevMapHash::with_max_entries(MAX_TX_PORTS, 0);

/// New-flow limits per VIP id, plus the default at `DEFAULT_LIMIT_SLOT`.
#[map(name = "spw_limits")]
pub static LIMITS: Array<Limits> = Array::with_max_entries(DEFAULT.vips + 1, 0);

/// Each VIP's budget bucket (shared by all CPUs; atomic adds).
#[map(name = "spw_budget")]
pub static BUDGET: Array<Bucket> = Array::with_max_entries(DEFAULT.vips, 0);

/// Per-source buckets and counters; the LRU forgets the quietest sources first. New flows
/// that need no per-source bucket only record a sample here (`limits.rs`).
#[map(name = "spw_sources")]
pub static SOURCES: LruHashMap<SourceKey, SourceState> = LruHashMap::with_max_entries(SOURCE_TABLE_ENTRIES, 0);

/// Operator rules by (scope, family, prefix length, masked address), placed like the VIP
/// index; written by the loader through a memory mapping (see `RuleSlot`).
#[map(name = "spw_rules")]
pub static RULES: Array<RuleSlot> = Array::with_max_entries(RULE_SLOTS, BPF_F_MMAPABLE);

/// The prefix lengths each scope's rules use (VIP id; the global rules at
/// `DEFAULT_LIMIT_SLOT`): a lookup probes the rule index at those lengths only.
#[map(name = "spw_rule_lens")]
pub static RULE_LENS: Array<RuleLens> = Array::with_max_entries(DEFAULT.vips + 1, 0);

/// Per rule id: the client class's bucket (shared by all CPUs).
#[map(name = "spw_rule_bucket")]
pub static RULE_BUCKETS: Array<Bucket> = Array::with_max_entries(MAX_RULES, 0);

/// Per rule id: hits and drops, per CPU (so a flood from a class bounces no cache line).
#[map(name = "spw_rule_ctrs")]
pub static RULE_COUNTERS: PerCpuArray<RuleCounters> = PerCpuArray::with_max_entries(MAX_RULES, 0);

/// Per rule id: what the rule would have dropped in observe mode, per CPU (a map of its own:
/// `RuleCounters` is pinned, and its shape stays).
#[map(name = "spw_rule_would")]
pub static RULE_WOULD_DROP: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_RULES, 0);

/// What limits in observe mode would have dropped.
#[map(name = "spw_observed")]
pub static OBSERVED: PerCpuArray<u64> = PerCpuArray::with_max_entries(Observed::COUNT, 0);

/// Slot 0: the IPv6 program (`spillway_lb_v6`), which the balancer tail-calls (`family.rs`).
/// Pinned, as a program array must be to keep its programs once `lbd` has closed it.
#[map(name = "spw_v6_prog")]
pub static V6_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Packets sent with a second candidate (`second_chance.rs`).
#[map(name = "spw_second_ch")]
pub static SECOND_CHANCE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// New flows forwarded without an entry because every candidate way was held (`select.rs`).
#[map(name = "spw_flows_full")]
pub static FLOWS_UNREMEMBERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: the second-chance program (`spillway_lb_second`), which the balancer tail-calls.
#[map(name = "spw_second_prog")]
pub static SECOND_CHANCE_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// What the balancer hands its second-chance program (per CPU: a tail call stays on it).
#[map(name = "spw_second_hand")]
pub static SECOND_CHANCE_HANDOVER: PerCpuArray<SecondChanceHandover> = PerCpuArray::with_max_entries(1, 0);

/// Slots 0, 1: the QUIC programs for IPv4 and IPv6 frames (`spillway_lb_quic`, `_v6`),
/// which the balancer tail-calls for a QUIC VIP's packets; 2, 3: the UDP programs
/// (`spillway_lb_udp`, `_v6`) they tail-call for the packets their id does not place.
#[map(name = "spw_quic_prog")]
pub static QUIC_PROGRAM: ProgramArray = ProgramArray::with_max_entries(4, 0);

/// The server-id index: (VIP id, server id) -> backend id for the backends of QUIC VIPs,
/// placed like the VIP index (see `QuicServerSlot`); written by the loader through a memory
/// mapping.
#[map(name = "spw_quic_sids")]
pub static QUIC_SERVERS: Array<QuicServerSlot> = Array::with_max_entries(DEFAULT.quic_server_slots(), BPF_F_MMAPABLE);

/// What the balancer hands its QUIC programs, and how short headers were placed: one
/// `QuicHandover` per possible CPU (a tail call stays on its CPU; the loader sizes the map).
/// Indexed by CPU id rather than a per-CPU array, whose lookup first loads the map's per-CPU
/// pointer, which the store then waits for: that was half the balancer's hand-over (perf
/// samples 0.21% -> 0.12% of a `bench --part quic` run). Mmapable for its page-aligned
/// values: each slot is two whole cache lines. Pinned with the program array: during a
/// restart the old balancer hands over to the new programs.
#[map(name = "spw_quic_hand")]
pub static QUIC_HANDOVER: Array<QuicHandover> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// This CPU's slot of [`QUIC_HANDOVER`] (none on a CPU beyond its size: the packet then
/// goes as any UDP VIP's).
#[inline(always)]
pub fn quic_handover() -> Option<*mut QuicHandover> {
    // SAFETY: a helper without arguments (the verifier inlines it).
    let cpu = unsafe { bpf_get_smp_processor_id() };
    QUIC_HANDOVER.get_ptr_mut(cpu)
}

/// Slot 0: the "packet too big" program (`spillway_lb_ptb`), which the balancer tail-calls
/// for a packet too big for the egress once encapsulated (`ptb.rs`).
#[map(name = "spw_ptb_prog")]
pub static PTB_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// What the balancer hands its "packet too big" program (per CPU: a tail call stays on it).
#[map(name = "spw_ptb_hand")]
pub static PTB_HANDOVER: PerCpuArray<PtbHandover> = PerCpuArray::with_max_entries(1, 0);

/// Each source's bucket of answers (shared by all CPUs); the LRU forgets the quietest.
#[map(name = "spw_ptb_src")]
pub static PTB_SOURCES: LruHashMap<AddrKey, Bucket> = LruHashMap::with_max_entries(PTB_SOURCE_ENTRIES, 0);

/// The bucket of all answers (shared by all CPUs).
#[map(name = "spw_ptb_all")]
pub static PTB_GLOBAL: Array<Bucket> = Array::with_max_entries(1, 0);

/// Slots 0, 1: the fragment programs for IPv4 and IPv6 frames (`spillway_lb_frag`, `_v6`),
/// which the balancer tail-calls for a fragment (`fragment.rs`).
#[map(name = "spw_frag_prog")]
pub static FRAGMENT_PROGRAM: ProgramArray = ProgramArray::with_max_entries(2, 0);

/// Where each fragmented datagram's first fragment went (`fragment.rs`); the LRU forgets
/// the records used least recently. Sized by the loader (`--max-fragments`); never pinned.
#[map(name = "spw_frags")]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentRecord> = LruHashMap::with_max_entries(DEFAULT.fragments, 0);

/// Each source's bucket of fragment records (shared by all CPUs); the LRU forgets the
/// quietest.
#[map(name = "spw_frag_src")]
pub static FRAGMENT_SOURCES: LruHashMap<AddrKey, Bucket> = LruHashMap::with_max_entries(FRAGMENT_SOURCE_ENTRIES, 0);

/// Slot 0: the echo program (`spillway_lb_echo`), which the balancer tail-calls for other
/// traffic than TCP and UDP to a VIP address that answers echo requests (`echo.rs`).
#[map(name = "spw_echo_prog")]
pub static ECHO_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The echo answers' rate limits, written by `lbd` (all zero until then: nothing answered).
#[map(name = "spw_echo_cfg")]
pub static ECHO_CONFIG: Array<EchoConfig> = Array::with_max_entries(1, 0);

/// Each source's bucket of echo answers (shared by all CPUs); the LRU forgets the quietest.
#[map(name = "spw_echo_src")]
pub static ECHO_SOURCES: LruHashMap<AddrKey, Bucket> = LruHashMap::with_max_entries(ECHO_SOURCE_ENTRIES, 0);

/// The bucket of all echo answers (shared by all CPUs).
#[map(name = "spw_echo_all")]
pub static ECHO_TOTAL: Array<Bucket> = Array::with_max_entries(1, 0);

/// A slot of an open-addressed index the loader fills (the VIP index, the server-id index):
/// its home counts how many slots from it hold keys homed there.
pub trait Probed {
    /// That count, read from a live slot (volatile: the loader writes slots while packets
    /// read them).
    fn probes(slot: *const Self) -> u32;
}

impl Probed for VipSlot {
    #[inline(always)]
    fn probes(slot: *const Self) -> u32 {
        // SAFETY: a live map value.
        unsafe { read_volatile(addr_of!((*slot).probes)) }
    }
}

impl Probed for QuicServerSlot {
    #[inline(always)]
    fn probes(slot: *const Self) -> u32 {
        // SAFETY: a live map value.
        unsafe { read_volatile(addr_of!((*slot).probes)) }
    }
}

/// The first slot that `holds` the key among those a key homed at `home` may occupy in
/// `index` (`mask + 1` slots): at most the home's count of them and never more than
/// `VIP_PROBES`, so a key nobody has costs one slot read, or a few.
#[inline(always)]
pub fn probe<S: Probed>(index: &Array<S>, home: u32, mask: u32, holds: impl Fn(*const S) -> bool) -> Option<*const S> {
    // The home is read once for its count and its key: each lookup is a helper call to the
    // compiler, so it would not merge two.
    let first = index.get_ptr(home)?;
    let probes = S::probes(first);
    if probes == 0 {
        return None;
    }
    if holds(first) {
        return Some(first);
    }
    for i in 1..VIP_PROBES {
        if i >= probes {
            break;
        }
        let slot = index.get_ptr((home + i) & mask)?;
        if holds(slot) {
            return Some(slot);
        }
    }
    None
}

/// The balancer's hand-over to the second-chance program.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SecondChanceHandover {
    pub vip_id: u32,
    /// Backend ids: the flow's now, and before the VIP's last change.
    pub first: u32,
    pub second: u32,
    /// The flow hash the outer headers take their entropy from.
    pub flow_hash: u32,
}

/// The balancer's hand-over to the "packet too big" program.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PtbHandover {
    pub vip_id: u32,
    /// The MTU to advise: the egress MTU less the encapsulation's overhead.
    pub mtu: u32,
}

/// Slot 0: the operator's XDP program (`lbd --pass-to`), which the balancer tail-calls for
/// the frames it does not serve (`pass_to.rs`); empty without the option. Pinned, so the
/// program stays in it while no `lbd` runs.
#[map(name = "spw_pass_to")]
pub static PASS_TO_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Frames that found [`PASS_TO_PROGRAM`] empty while `lbd --pass-to` was set (they passed).
#[map(name = "spw_pass_to_miss")]
pub static PASS_TO_MISSING: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Slots 0, 1: the crypt programs (`spillway_lb_quic_crypt`, `_v6`), which the QUIC
/// programs tail-call for a short header of an encrypted config id not decoded yet: their
/// own stack for the AES and the Feistel network. Held open by the loader, not pinned.
#[map(name = "spw_quic_crypt_prog")]
pub static QUIC_CRYPT_PROGRAM: ProgramArray = ProgramArray::with_max_entries(2, 0);

/// Per (VIP id * 8 + config id): the QUIC-LB configuration of a config id that is not the
/// one in the VIP slot (`QuicLbConfig::to_word`; 0: none), so two config ids are live at
/// once while a key is rotated (draft §3.1). Read only by the QUIC programs.
#[map(name = "spw_quic_cfgs")]
pub static QUIC_CONFIGS: Array<u32> = Array::with_max_entries(DEFAULT.quic_config_slots(), 0);

/// Encrypted connection ids already decoded: (VIP id, id) -> the server id's index words
/// (`ServerId::words`). Only ids that named a backend of the VIP are inserted, at most a
/// CPU's decryption budget a second (`quic_crypto.rs`).
#[map(name = "spw_quic_cids")]
pub static QUIC_CID_CACHE: LruHashMap<QuicCidKey, [u32; 4]> = LruHashMap::with_max_entries(QUIC_CID_CACHE_ENTRIES, 0);

/// Each CPU's working memory for decrypting an id (slot 0): no room on the stack.
#[map(name = "spw_quic_scratch")]
pub static QUIC_CRYPT_SCRATCH: PerCpuArray<CryptScratch> = PerCpuArray::with_max_entries(1, 0);

/// The crypt program's working memory, a CPU's: the cache key and the decoder's scratch.
#[repr(C)]
pub struct CryptScratch {
    pub key: QuicCidKey,
    pub decoder: spillway_common::quic_lb::encrypted::Scratch,
    /// The server id found: `ServerId::words`.
    pub words: [u32; 4],
    /// `quic_crypto::Found`, for the QUIC program the crypt program tail-calls back.
    pub found: u32,
}

/// Each CPU's budget of decryptions (slot 0), written by the loader.
#[map(name = "spw_quic_budget")]
pub static QUIC_DECRYPT_BUDGET: PerCpuArray<DecryptBudget> = PerCpuArray::with_max_entries(1, 0);
