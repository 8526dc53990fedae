//! Keys and values of the BPF maps, identical on both sides of the kernel boundary.
//!
//! Addresses are `[u32; 4]` words in network byte order exactly as they sit in the packet;
//! an IPv4 address uses word 0 and leaves the rest zero. Ports are in network byte order too.
//! Explicit padding fields keep every byte initialised (the kernel hashes whole keys).

use core::mem::size_of;

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

/// Where a VIP's Maglev table lives and how big it is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VipMeta {
    /// Index of the VIP's pair of tables in the ring array (0..MAX_VIPS).
    pub id: u32,
    /// Table size M (prime); the slot is `flow_hash % ring_size`.
    pub ring_size: u32,
    /// Which of the two tables packets read. The loader fills the other one and then flips
    /// this field with one map update, so a packet never sees a half-written table.
    pub active_half: u32,
}

impl VipMeta {
    /// Index of slot 0 of the table `half` of this VIP in the flat ring array.
    #[inline(always)]
    pub const fn ring_base(id: u32, half: u32) -> u32 {
        (id * crate::limits::RING_HALVES + half) * crate::limits::MAX_RING_SIZE
    }
}

/// An address that some VIP uses; lets the program tell VIP-bound fragments from the host's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddrKey {
    pub addr: [u32; 4],
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Backend slot states.
pub const BACKEND_FREE: u8 = 0;
pub const BACKEND_ACTIVE: u8 = 1;

/// One backend of one VIP, indexed by backend id in the backend array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendInfo {
    pub addr: [u32; 4],
    pub family: u8,
    /// [`BACKEND_FREE`] or [`BACKEND_ACTIVE`]. A draining backend stays active (weight 0 only
    /// removes it from the Maglev table), so its flows keep flowing.
    pub state: u8,
    pub _pad: [u8; 2],
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

/// The backend a connection was given on its first packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowValue {
    pub backend_id: u32,
    pub generation: u32,
    /// `bpf_ktime_get_ns` when the flow was last refreshed (at most every
    /// `FLOW_TOUCH_INTERVAL_NS`).
    pub touched_ns: u64,
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

/// Static next hop: set when the operator pins the egress instead of using the FIB.
pub const CFG_F_STATIC_NEXTHOP: u32 = 1;

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
    pub flags: u32,
    pub tcp_idle_timeout_s: u32,
    pub udp_idle_timeout_s: u32,
    /// With [`CFG_F_STATIC_NEXTHOP`]: egress ifindex and the MACs to write.
    pub static_ifindex: u32,
    pub static_src_mac: [u8; 6],
    pub static_dst_mac: [u8; 6],
}

/// Packet and byte counters (per CPU in the kernel; summed in userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
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
        /// The encapsulated packet would exceed the egress MTU.
        DropOversize = "drop_oversize",
        /// The VIP has no backend to send a new flow to.
        DropNoBackend = "drop_no_backend",
        /// The FIB has no usable route to the backend (unreachable, blackhole, forwarding
        /// disabled, ...).
        DropNoRoute = "drop_no_route",
        /// The encapsulation could not make room in the frame, or cannot carry the family.
        DropEncapFailed = "drop_encap_failed",
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
    }
);

// Layout checks: these sizes are part of the pinned-map contract.
const _: () = assert!(size_of::<VipKey>() == 20);
const _: () = assert!(size_of::<VipMeta>() == 12);
const _: () = assert!(size_of::<AddrKey>() == 20);
const _: () = assert!(size_of::<BackendInfo>() == 28);
const _: () = assert!(size_of::<FlowKey>() == 40);
const _: () = assert!(size_of::<FlowValue>() == 16);
const _: () = assert!(size_of::<LbConfig>() == 56);
const _: () = assert!(size_of::<Traffic>() == 16);
const _: () = assert!(size_of::<CachedNextHop>() == 32);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY (all): repr(C), every field is Pod, and the explicit `_pad` fields leave no
    // implicit padding (sizes asserted above).
    macro_rules! pod {
        ($($t:ty),+) => {$(
            unsafe impl bytemuck::Zeroable for $t {}
            unsafe impl bytemuck::Pod for $t {}
            unsafe impl aya::Pod for $t {}
        )+};
    }
    pod!(VipKey, VipMeta, AddrKey, BackendInfo, FlowKey, FlowValue, LbConfig, Traffic);
}
