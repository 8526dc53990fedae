//! Sizes of every BPF map and table, and the map names both sides agree on.
//!
//! Changing any number here changes a pinned map's shape: bump [`PIN_VERSION`] with it so a
//! new `lbd` never reuses a map of the old shape.

/// Version of the pinned layout under the bpffs directory (`/sys/fs/bpf/spillway/v<N>`).
pub const PIN_VERSION: u32 = 3;

/// Most VIPs one balancer serves.
pub const MAX_VIPS: u32 = 64;
/// Most backends over all VIPs (a backend serving two VIPs counts twice). Id 0 is never used.
pub const MAX_BACKENDS: u32 = 4096;
/// Most backends in one VIP; keeps every Maglev table at least 64 slots per backend.
pub const MAX_BACKENDS_PER_VIP: u32 = 1024;
/// Largest Maglev table (also the default). Must be prime.
pub const MAX_RING_SIZE: u32 = 65537;
/// Default Maglev table size.
pub const DEFAULT_RING_SIZE: u32 = MAX_RING_SIZE;
/// Every VIP owns two tables (double buffering); see `types::VipMeta::active_half`.
pub const RING_HALVES: u32 = 2;
/// Slots in the flat ring array holding every VIP's two tables.
pub const RING_MAP_ENTRIES: u32 = MAX_VIPS * RING_HALVES * MAX_RING_SIZE;
/// Slots of the second-chance tables: one table per VIP (`types::VipMeta::prior_base`).
pub const PRIOR_RING_ENTRIES: u32 = MAX_VIPS * MAX_RING_SIZE;
/// A VIP's table changes that follow each other closer than this are one change (a slow
/// start ramps over 30 s): its second-chance table is the one in force before the first.
pub const SECOND_CHANCE_SETTLE_MS: u64 = 60_000;
/// Connection-table entries (LRU). ~2^20 flows at ~120 bytes each including kernel overhead.
pub const FLOW_TABLE_ENTRIES: u32 = 1 << 20;
/// Interfaces the balancer may redirect to.
pub const MAX_TX_PORTS: u32 = 64;
/// Addresses the backend agent decapsulates for.
pub const MAX_LOCAL_ADDRS: u32 = 64;
/// Operator rules (CIDR, optionally per VIP) and their counters.
pub const MAX_RULES: u32 = 1024;
/// Sources tracked for per-source limits and `lbctl top-sources` (LRU: the quietest go).
pub const SOURCE_TABLE_ENTRIES: u32 = 1 << 16;
/// For a VIP without a per-source limit (enforced or observed), only one new flow in this
/// many (chosen at random) updates the source table, adding this many to its counters: the
/// table then only feeds `lbctl top-sources`, whose counts become estimates, and most new
/// flows skip the LRU lookup and insert. A power of two.
pub const SOURCE_SAMPLE_UNLIMITED: u32 = 16;
const _: () = assert!(SOURCE_SAMPLE_UNLIMITED.is_power_of_two());
/// Slot of the limits array holding the default for VIPs without their own limit.
pub const DEFAULT_LIMIT_SLOT: u32 = MAX_VIPS;
/// `RuleKey::vip_id` of a rule that applies to every VIP.
pub const ANY_VIP: u32 = u32::MAX;
/// Default source prefixes that share one per-source bucket.
pub const DEFAULT_SOURCE_PREFIX_V4: u8 = 32;
pub const DEFAULT_SOURCE_PREFIX_V6: u8 = 64;
/// Words (64 bits each) of the VIP address pre-filter: a one-hash Bloom filter that lets
/// non-VIP traffic pass after one inlined array read instead of two hash lookups.
pub const VIP_FILTER_WORDS: u32 = 1024;
/// How long a CPU reuses a backend's `bpf_fib_lookup` result before asking again. Bounds
/// how stale a next hop can be (route or neighbour change) and makes the lookup's cost
/// (~440 ns here) vanish from the per-packet path.
pub const NEXTHOP_CACHE_TTL_NS: u64 = 1_000_000_000;

/// Default idle timeouts after which a connection-table entry is treated as a new flow.
pub const DEFAULT_TCP_IDLE_TIMEOUT_S: u32 = 900;
pub const DEFAULT_UDP_IDLE_TIMEOUT_S: u32 = 120;
/// A flow entry's timestamp is refreshed at most this often, so hits rarely write.
pub const FLOW_TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

/// Map names (at most 15 bytes: BPF_OBJ_NAME_LEN).
pub mod map_names {
    pub const CONFIG: &str = "spw_cfg";
    pub const VIPS: &str = "spw_vips";
    pub const VIP_ADDRS: &str = "spw_vip_addrs";
    pub const RINGS: &str = "spw_rings";
    pub const BACKENDS: &str = "spw_backends";
    pub const FLOWS: &str = "spw_flows";
    pub const VIP_STATS: &str = "spw_vip_stats";
    pub const BACKEND_STATS: &str = "spw_be_stats";
    pub const REASONS: &str = "spw_reasons";
    pub const TX_PORTS: &str = "spw_tx_ports";
    pub const VIP_FILTER: &str = "spw_vip_filter";
    pub const NEXTHOP_CACHE: &str = "spw_nh_cache";
    pub const LIMITS: &str = "spw_limits";
    pub const BUDGET_STATE: &str = "spw_budget";
    pub const SOURCES: &str = "spw_sources";
    pub const RULES: &str = "spw_rules";
    pub const RULE_STATS: &str = "spw_rule_stats";
    pub const RULE_COUNT: &str = "spw_rule_count";
    pub const OBSERVED: &str = "spw_observed";
    pub const VIP_NEW_FLOWS: &str = "spw_vip_nflows";
    pub const BACKEND_NEW_FLOWS: &str = "spw_be_nflows";
    pub const LOCAL_ADDRS: &str = "spw_local_addrs";
    pub const DECAP_REASONS: &str = "spw_decap_rsn";
    pub const PROBE_CONFIG: &str = "spw_probe_cfg";
    pub const PROBE_REASONS: &str = "spw_probe_rsn";
    pub const PROBE_LAST: &str = "spw_probe_last";
    pub const PRIOR_RINGS: &str = "spw_prior_rings";
    pub const PRIOR_SIZE: &str = "spw_prior_size";
    pub const SECOND_CHANCE: &str = "spw_second_ch";
}

/// Program names in the eBPF objects.
pub mod program_names {
    pub const BALANCER: &str = "spillway_lb";
    pub const DECAP: &str = "spillway_decap";
    pub const FLOOR: &str = "spillway_floor";
    /// The probe encapsulation (tc egress on the probe device), in the balancer's object.
    pub const PROBE: &str = "spillway_probe";
}

const fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// True for a table size the balancer accepts: prime, and large enough for Maglev to spread.
pub const fn valid_ring_size(n: u32) -> bool {
    n >= 13 && n <= MAX_RING_SIZE && is_prime(n)
}

const _: () = assert!(valid_ring_size(DEFAULT_RING_SIZE));
const _: () = assert!(MAX_BACKENDS_PER_VIP <= MAX_BACKENDS);
const _: () = assert!(RING_MAP_ENTRIES as u64 == MAX_VIPS as u64 * 2 * MAX_RING_SIZE as u64);
