//! Sizes of every BPF map and table, and the map names both sides agree on.
//!
//! Changing any number here, or a pinned map's value type (`types`), changes a pinned map's
//! shape: bump [`PIN_VERSION`] with it so a new `lbd` never reuses a map of the old shape.

/// Version of the pinned layout under the bpffs directory (`/sys/fs/bpf/spillway/v<N>`).
/// 5: `LbConfig` carries the clock's calibration. 6: the flow hash and the VIP index's
/// hash changed (a table entry or VIP slot placed by 5 would not be found where 6 looks).
/// 7: a VIP slot carries its QUIC-LB configuration, and the QUIC hand-over its counts.
/// 8: a server-id slot carries a copy of its backend's entry (a whole cache line).
/// 9: `spw_reasons` counts the fragments' reasons (`drop_fragment_unmatched`, `_limited`).
/// 10: `spw_reasons` counts the echo answers (`tx_echo_reply`, `drop_echo_limited`), a
/// `spw_vip_addrs` value carries `ADDR_F_*` flags, and `spw_echo_prog` is pinned.
pub const PIN_VERSION: u32 = 10;

/// How big the balancer's tables are. Chosen when `lbd` starts (its options); the maps are
/// created with these sizes, and pinned maps of another shape are refused by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// VIPs at once (each VIP's id indexes its counters and limits).
    pub vips: u32,
    /// Backends over all VIPs (a backend serving two VIPs counts twice); ids start at 1.
    pub backends: u32,
    /// Connections the table holds at once (see [`Capacity::flow_buckets`]).
    pub flows: u32,
    /// Maglev slots over all VIPs: a VIP with a table of M slots takes 2 M (its two tables),
    /// and 3 M once it has a second-chance table (the table before its last change).
    pub ring_slots: u32,
    /// Fragmented datagrams whose later fragments the record table (`spw_frags`, LRU) can
    /// follow at once.
    pub fragments: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Capacity {
    /// What an `lbd` without size options gets.
    pub const DEFAULT: Capacity = Capacity {
        vips: 64,
        backends: 4096,
        flows: 1 << 20,
        ring_slots: Capacity::ring_slots_for(64, DEFAULT_RING_SIZE),
        fragments: 1 << 16,
    };
    /// The largest of each: ids are 16 bits in flow entries and ring slots.
    pub const MAX: Capacity = Capacity { vips: 1 << 16, backends: (1 << 16) - 1, flows: 1 << 28, ring_slots: 1 << 30, fragments: 1 << 24 };

    /// Buckets of the connection table: room for twice `flows`, so even a full table's
    /// buckets almost never overflow (two choices of four ways; see `ARCHITECTURE.md`).
    pub const fn flow_buckets(&self) -> u32 {
        (self.flows.div_ceil(FLOW_WAYS / 2)).next_power_of_two()
    }

    /// Entries of the connection table (`flow_buckets` of `FLOW_WAYS`).
    pub const fn flow_entries(&self) -> u32 {
        self.flow_buckets() * FLOW_WAYS
    }

    /// Slots of the VIP index: [`INDEX_SLOTS_PER_KEY`] per VIP.
    pub const fn vip_slots(&self) -> u32 {
        (self.vips * INDEX_SLOTS_PER_KEY).next_power_of_two()
    }

    /// Slots of the per-(VIP, config id) maps of encrypted QUIC-LB ids (`spw_quic_cfgs`,
    /// `spw_quic_keys`): VIP id times [`QUIC_CONFIG_IDS_PER_VIP`] plus config id.
    pub const fn quic_config_slots(&self) -> u32 {
        self.vips * QUIC_CONFIG_IDS_PER_VIP
    }

    /// Slots of the QUIC server-id index: [`INDEX_SLOTS_PER_KEY`] per backend (every backend
    /// a QUIC VIP's at most).
    pub const fn quic_server_slots(&self) -> u32 {
        (self.backends * INDEX_SLOTS_PER_KEY).next_power_of_two()
    }

    /// Ring slots `vips` VIPs with tables of `ring_size` slots take: [`RING_TABLES`] each,
    /// every table a whole number of words.
    pub const fn ring_slots_for(vips: u32, ring_size: u32) -> u32 {
        vips * RING_TABLES * ring_size.div_ceil(RING_SLOTS_PER_WORD) * RING_SLOTS_PER_WORD
    }

    /// Words of the ring pool (four slots each).
    pub const fn ring_words(&self) -> u32 {
        self.ring_slots.div_ceil(RING_SLOTS_PER_WORD)
    }

    /// Slot of the limits array holding the default for VIPs without their own limit, and
    /// of the rule-lengths array holding the global rules'.
    pub const fn default_limit_slot(&self) -> u32 {
        self.vips
    }

    /// Array slots for backend ids (id 0 is never used).
    pub const fn backend_slots(&self) -> u32 {
        self.backends + 1
    }
}

/// Ways (entries) of a connection-table bucket; a flow may live in either of two buckets.
pub const FLOW_WAYS: u32 = 4;
/// Tables a VIP holds in the ring pool: the one packets read, the one the next change is
/// written into, and its second-chance table (`types::VipMeta::prior`).
pub const RING_TABLES: u32 = 3;
/// Maglev slots per word of the ring pool (16-bit backend ids).
pub const RING_SLOTS_PER_WORD: u32 = 4;
/// Most slots of the VIP index (and the rule and QUIC server-id indexes) a lookup scans from
/// a key's home slot.
pub const VIP_PROBES: u32 = 8;
/// Slots of those indexes per key they hold at most. A key takes the first free slot of its
/// window, and is refused when all of it is taken: with four slots a key, one placement in
/// 20 of 1,000 random homes refused a key before the index was full, and nearly every one of
/// 65,536; with sixteen, no key of 65,536 needed more than 6 of its 8 (simulated placements).
pub const INDEX_SLOTS_PER_KEY: u32 = 16;
/// Most backends in one VIP; keeps every Maglev table at least 64 slots per backend.
pub const MAX_BACKENDS_PER_VIP: u32 = 1024;
/// Largest Maglev table (also the default). Must be prime.
pub const MAX_RING_SIZE: u32 = 65537;
/// Default Maglev table size.
pub const DEFAULT_RING_SIZE: u32 = MAX_RING_SIZE;
/// A VIP's table changes that follow each other closer than this are one change (a slow
/// start ramps over 30 s): its second-chance table is the one in force before the first.
pub const SECOND_CHANCE_SETTLE_MS: u64 = 60_000;
/// Interfaces the balancer may redirect to.
pub const MAX_TX_PORTS: u32 = 64;
/// Addresses the backend agent decapsulates for, by default (`lbd agent --max-local-addrs`
/// sizes the map at load): a backend holding many VIPs on `lo` needs room for each.
pub const DEFAULT_LOCAL_ADDRS: u32 = 1024;
/// The most `--max-local-addrs` accepts.
pub const MAX_LOCAL_ADDRS: u32 = 1 << 16;
/// Prefixes the backend agent accepts tunnels from (`lbd agent --allow-from`).
pub const MAX_ALLOW_FROM: u32 = 256;
/// GUE's UDP port unless `--gue-port` says otherwise, on the balancer and the agents alike
/// (the one IANA assigned to GUE).
pub const DEFAULT_GUE_PORT: u16 = 6080;
/// Operator rules (CIDR, optionally per VIP) and their counters.
pub const MAX_RULES: u32 = 1024;
/// Distinct prefix lengths the rules of one scope (the global rules, or one VIP's) may use
/// per family: a new flow probes the rule index once per length in use, longest first.
pub const MAX_RULE_LENGTHS: usize = 8;
/// Slots of the rule index ([`INDEX_SLOTS_PER_KEY`] per rule).
pub const RULE_SLOTS: u32 = INDEX_SLOTS_PER_KEY * MAX_RULES;
const _: () = assert!(RULE_SLOTS.is_power_of_two());
/// Sources tracked for per-source limits and `lbctl top-sources` (LRU: the quietest go).
pub const SOURCE_TABLE_ENTRIES: u32 = 1 << 16;
/// Encrypted connection ids the cache of decoded ids (`spw_quic_cids`, LRU) holds: one per
/// live id an honest client uses, whatever the VIP.
pub const QUIC_CID_CACHE_ENTRIES: u32 = 1 << 17;
/// Encrypted connection ids one CPU decrypts a second, at most, after a burst of as many
/// (`spw_quic_budget`): a miss of the cache costs one to four AES blocks, so this keeps a
/// flood of random ids to a fraction of a core (`cargo xtask bench --part quic` measures a
/// miss).
pub const QUIC_DECRYPTS_PER_S: u64 = 50_000;
/// Slots of each VIP in the per-(VIP, config id) maps: one per config id (§3.1: 0..=6, and
/// the reserved 7).
pub const QUIC_CONFIG_IDS_PER_VIP: u32 = 8;
/// For a VIP without a per-source limit (enforced or observed), and for flows a rule
/// matches, only one new flow in this many (chosen at random) updates the source table,
/// adding its source if new and this many to its counters: the table then only feeds
/// `lbctl top-sources`, whose counts become estimates, and most new flows skip the LRU
/// lookup and insert. A power of two.
pub const SOURCE_SAMPLE_UNLIMITED: u32 = 16;
const _: () = assert!(SOURCE_SAMPLE_UNLIMITED.is_power_of_two());
/// `RuleSlotKey::scope` of a rule that applies to every VIP.
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

/// "Packet too big" answers (`spillway_lb_ptb`): each source (an IPv4 address, an IPv6
/// /64) gets at most `PTB_SOURCE_BURST + 1` at once and `PTB_SOURCE_PER_S` a second after
/// that, and all sources together `PTB_GLOBAL_PER_S` (burst `PTB_GLOBAL_BURST`). An answer
/// is a reflection to an address that may be spoofed; one is all a connection needs.
pub const PTB_SOURCE_PER_S: u32 = 10;
pub const PTB_SOURCE_BURST: u32 = 10;
pub const PTB_GLOBAL_PER_S: u32 = 1000;
pub const PTB_GLOBAL_BURST: u32 = 100;
/// Sources whose answers are counted (LRU: a source forgotten starts with a full bucket).
pub const PTB_SOURCE_ENTRIES: u32 = 4096;
/// The IPv6 prefix that shares one source bucket (a link's hosts; an IPv4 address is one).
pub const PTB_SOURCE_PREFIX_V6: u8 = 64;

/// Echo requests to a VIP address (`spillway_lb_echo`): answers a second per source (an
/// IPv4 address, an IPv6 /64) and for all sources together, each with a burst of one
/// second's worth (`lbd --echo-per-source`, `--echo-total`). An answer goes to a source
/// that may be spoofed; a person pinging sends one a second.
pub const DEFAULT_ECHO_PER_SOURCE: u32 = 10;
pub const DEFAULT_ECHO_TOTAL: u32 = 1000;
/// Sources whose answers are counted (LRU: a source forgotten starts with a full bucket).
pub const ECHO_SOURCE_ENTRIES: u32 = 4096;
/// The IPv6 prefix that shares one source bucket (a link's hosts; an IPv4 address is one).
pub const ECHO_SOURCE_PREFIX_V6: u8 = 64;

/// Fragmented datagrams to UDP VIPs (`spillway_lb_frag`): each source (an IPv4 address, an
/// IPv6 /64) records at most `FRAGMENT_SOURCE_BURST + 1` datagrams at once and
/// `FRAGMENT_SOURCE_PER_S` a second after that, and a record is followed for
/// `FRAGMENT_RECORD_TICKS`: so a source holds at most `BURST + 1 + PER_S x` that long of the
/// records later fragments can follow, and its first fragments beyond are
/// dropped (`drop_fragment_limited`). The fragments of one datagram leave their sender back
/// to back, so a record is needed for a moment only.
pub const FRAGMENT_SOURCE_PER_S: u32 = 2000;
pub const FRAGMENT_SOURCE_BURST: u32 = 200;
/// Sources whose fragment records are counted (LRU: a source forgotten starts with a full
/// bucket).
pub const FRAGMENT_SOURCE_ENTRIES: u32 = 1 << 14;
/// The IPv6 prefix that shares one source bucket (a host's privacy addresses).
pub const FRAGMENT_SOURCE_PREFIX_V6: u8 = 64;
/// How long a first fragment's record is followed, in connection-table ticks (about half a
/// second): a later fragment after that finds no record, never one of an older datagram
/// that happened to reuse the identification.
pub const FRAGMENT_RECORD_TICKS: u32 = 1 << 9;

/// Default idle timeouts after which a connection-table entry is treated as a new flow.
pub const DEFAULT_TCP_IDLE_TIMEOUT_S: u32 = 900;
pub const DEFAULT_UDP_IDLE_TIMEOUT_S: u32 = 120;
/// Connection-table timestamps count ticks of 2^20 ns (about 1.05 ms) in 31 bits.
pub const FLOW_TICK_SHIFT: u32 = 20;
/// A flow entry's timestamp is refreshed at most this often (in ticks, about 1 s), so hits
/// rarely write.
pub const FLOW_TOUCH_TICKS: u32 = 1 << 10;
/// A confirmed entry idle this long (in ticks, about 4.3 s) may give its way to a new flow
/// when every candidate way is live: nobody holds an entry without sending on it (a blind
/// sender can confirm entries, so confirmation alone buys nothing lasting).
pub const FLOW_HOLD_TICKS: u32 = 4 * FLOW_TOUCH_TICKS;

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
    pub const RULE_BUCKETS: &str = "spw_rule_bucket";
    pub const RULE_COUNTERS: &str = "spw_rule_ctrs";
    /// Per rule id, per CPU: observe mode's would-drops (`spw_rule_ctrs` counts real drops).
    pub const RULE_WOULD_DROP: &str = "spw_rule_would";
    pub const RULE_LENS: &str = "spw_rule_lens";
    pub const OBSERVED: &str = "spw_observed";
    pub const LOCAL_ADDRS: &str = "spw_local_addrs";
    pub const DECAP_REASONS: &str = "spw_decap_rsn";
    pub const ALLOW_FROM: &str = "spw_allow_from";
    pub const DECAP_CONFIG: &str = "spw_decap_cfg";
    pub const PROBE_CONFIG: &str = "spw_probe_cfg";
    pub const PROBE_REASONS: &str = "spw_probe_rsn";
    pub const PROBE_LAST: &str = "spw_probe_last";
    pub const SECOND_CHANCE: &str = "spw_second_ch";
    /// New flows forwarded without an entry: every candidate way was held (per CPU).
    pub const FLOWS_UNREMEMBERED: &str = "spw_flows_full";
    pub const SECOND_CHANCE_PROGRAM: &str = "spw_second_prog";
    pub const SECOND_CHANCE_HANDOVER: &str = "spw_second_hand";
    /// Slot 0: the balancer's IPv6 program (`spillway_lb_v6`), which `spillway_lb` tail-calls.
    pub const V6_PROGRAM: &str = "spw_v6_prog";
    /// QUIC VIPs (their QUIC-LB configuration is in their VIP slot): the server ids of their
    /// backends, and the program array of the QUIC programs (slots 0, 1: IPv4, IPv6) and of
    /// the UDP programs they fall back to (2, 3).
    pub const QUIC_SERVERS: &str = "spw_quic_sids";
    pub const QUIC_PROGRAM: &str = "spw_quic_prog";
    /// What the balancer hands its QUIC programs, and how short headers were placed
    /// (`types::QuicHandover`, per CPU); userspace reads only the counts.
    pub const QUIC_HANDOVER: &str = "spw_quic_hand";
    /// Encrypted QUIC-LB ids: each (VIP, config id)'s configuration when it is not the one
    /// in the VIP slot, its key's crypto context (a kptr, made by the syscall program
    /// `spillway_quic_key`), the cache of ids decoded, and each CPU's decryption budget.
    /// None is pinned: a starting `lbd` writes them all again.
    pub const QUIC_CONFIGS: &str = "spw_quic_cfgs";
    pub const QUIC_CRYPT_PROGRAM: &str = "spw_quic_crypt_prog";
    pub const QUIC_KEYS: &str = "spw_quic_keys";
    pub const QUIC_CID_CACHE: &str = "spw_quic_cids";
    pub const QUIC_DECRYPT_BUDGET: &str = "spw_quic_budget";
    /// A next-hop cache miss's FIB lookup parameters (per CPU); never read by userspace.
    pub const FIB_PARAMS: &str = "spw_fib_params";
    /// Slot 0: the "packet too big" program (`spillway_lb_ptb`), which the balancer
    /// tail-calls for an oversize packet, and what it hands it (per CPU; never read by
    /// userspace).
    pub const PTB_PROGRAM: &str = "spw_ptb_prog";
    pub const PTB_HANDOVER: &str = "spw_ptb_hand";
    /// Its rate limits: per source (LRU) and global (one bucket).
    pub const PTB_SOURCES: &str = "spw_ptb_src";
    pub const PTB_GLOBAL: &str = "spw_ptb_all";
    /// Slot 0: the operator's XDP program (`lbd --pass-to`) that frames Spillway does not
    /// serve are tail-called to, and (per CPU) those that found it missing.
    pub const PASS_TO_PROGRAM: &str = "spw_pass_to";
    pub const PASS_TO_MISSING: &str = "spw_pass_to_miss";
    /// Slots 0, 1: the fragment programs (`spillway_lb_frag`, `_v6`), which the balancer
    /// tail-calls for a fragment to a VIP address; the records their later fragments follow
    /// (LRU, `Capacity::fragments`), and each source's bucket of records (LRU).
    pub const FRAGMENT_PROGRAM: &str = "spw_frag_prog";
    pub const FRAGMENTS: &str = "spw_frags";
    pub const FRAGMENT_SOURCES: &str = "spw_frag_src";
    /// Slot 0: the echo program (`spillway_lb_echo`), which the balancer tail-calls for
    /// other traffic than TCP and UDP to a VIP address that answers echo requests; its rate
    /// limits (`types::EchoConfig`), and its buckets per source (LRU) and for all.
    pub const ECHO_PROGRAM: &str = "spw_echo_prog";
    pub const ECHO_CONFIG: &str = "spw_echo_cfg";
    pub const ECHO_SOURCES: &str = "spw_echo_src";
    pub const ECHO_TOTAL: &str = "spw_echo_all";
    /// Bench only: the cheapest hop's [`crate::types::HopConfig`].
    pub const HOP_CONFIG: &str = "spw_hop_cfg";
}

/// Program names in the eBPF objects.
pub mod program_names {
    pub const BALANCER: &str = "spillway_lb";
    /// Tail-called by the balancer for second-chance packets.
    pub const SECOND_CHANCE: &str = "spillway_lb_second";
    /// Tail-called by the balancer for packets too big for the egress once encapsulated.
    pub const PACKET_TOO_BIG: &str = "spillway_lb_ptb";
    /// Tail-called by the balancer for IPv6 frames.
    pub const BALANCER_V6: &str = "spillway_lb_v6";
    /// Tail-called by the balancer (and its IPv6 program) for a QUIC VIP's packets.
    pub const BALANCER_QUIC: &str = "spillway_lb_quic";
    pub const BALANCER_QUIC_V6: &str = "spillway_lb_quic_v6";
    /// Tail-called by those for the packets their connection id does not place.
    /// The QUIC programs' tail call for a short header of an encrypted config id.
    pub const BALANCER_QUIC_CRYPT: &str = "spillway_lb_quic_crypt";
    pub const BALANCER_QUIC_CRYPT_V6: &str = "spillway_lb_quic_crypt_v6";
    pub const BALANCER_UDP: &str = "spillway_lb_udp";
    pub const BALANCER_UDP_V6: &str = "spillway_lb_udp_v6";
    /// Tail-called by the balancer (and its IPv6 program) for a fragment to a VIP address.
    pub const FRAGMENT: &str = "spillway_lb_frag";
    pub const FRAGMENT_V6: &str = "spillway_lb_frag_v6";
    /// Tail-called by the balancer (and its IPv6 program) for other traffic than TCP and UDP
    /// to a VIP address that answers echo requests.
    pub const ECHO: &str = "spillway_lb_echo";
    /// Test-run by the loader to read jiffies (the clock's calibration); never attached.
    pub const CLOCK: &str = "spillway_clock";
    pub const DECAP: &str = "spillway_decap";
    pub const FLOOR: &str = "spillway_floor";
    /// Bench only: the cheapest XDP hop to the backends (`cargo xtask bench --part e2e`).
    pub const HOP: &str = "spillway_hop";
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
const _: () = assert!(MAX_BACKENDS_PER_VIP <= Capacity::DEFAULT.backends);
