//! Wire layouts of the headers the programs read or write (all fields network byte order).

pub const ETH_LEN: usize = 14;
pub const VLAN_LEN: usize = 4;
pub const IPV4_LEN: usize = 20;
pub const IPV6_LEN: usize = 40;

/// EtherTypes, as they read from the wire into a native `u16` on this little-endian target.
pub const ETH_P_IPV4: u16 = 0x0800u16.to_be();
pub const ETH_P_IPV6: u16 = 0x86DDu16.to_be();
pub const ETH_P_8021Q: u16 = 0x8100u16.to_be();

#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct VlanHdr {
    pub tci: u16,
    pub proto: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag_off: u16,
    pub ttl: u8,
    pub proto: u8,
    pub check: u16,
    pub src: u32,
    pub dst: u32,
}

/// More-fragments flag and fragment offset bits of `frag_off` (host order).
pub const IPV4_MF_OFFSET_MASK: u16 = 0x3FFF;
/// Don't-fragment bit (host order).
pub const IPV4_DF: u16 = 0x4000;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6Hdr {
    /// Version, traffic class and flow label.
    pub vtc_flow: u32,
    pub payload_len: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

/// IPv6 extension header numbers the parser walks over or stops at.
pub const IPV6_HOP_BY_HOP: u8 = 0;
pub const IPV6_ROUTING: u8 = 43;
pub const IPV6_FRAGMENT: u8 = 44;
pub const IPV6_DEST_OPTS: u8 = 60;

/// The common prefix of every extension header walked over.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6ExtHdr {
    pub next_hdr: u8,
    /// Length in 8-byte units, not counting the first 8 bytes.
    pub len: u8,
}

/// The IPv6 fragment extension header.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6FragHdr {
    pub next_hdr: u8,
    pub _reserved: u8,
    /// Offset in 8-byte units (the top 13 bits), then two reserved bits and M (more).
    pub offset_flags: u16,
    pub id: u32,
}
pub const IPV6_FRAG_LEN: usize = 8;
/// The offset's bits of an IPv6 fragment header's `offset_flags` (host order).
pub const IPV6_FRAG_OFFSET_MASK: u16 = 0xFFF8;
/// The offset's bits of an IPv4 header's `frag_off` (host order).
pub const IPV4_OFFSET_MASK: u16 = 0x1FFF;

/// First four bytes of TCP and UDP headers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ports {
    pub src: u16,
    pub dst: u16,
}

/// A UDP header (GUE's outer one).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UdpHdr {
    pub src: u16,
    pub dst: u16,
    pub len: u16,
    pub check: u16,
}

pub const TCP_LEN: usize = 20;
/// Offset of the TCP flags byte, and the bits that make a connection request.
pub const TCP_FLAGS_OFFSET: usize = 13;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;
pub const UDP_LEN: usize = 8;

/// ICMP and ICMPv6 share this prefix; an error message's quoted packet follows at +8.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IcmpHdr {
    pub kind: u8,
    pub code: u8,
    pub check: u16,
    pub rest: u32,
}

pub const ICMP_LEN: usize = 8;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_FRAG_NEEDED: u8 = 4;
pub const ICMPV6_PKT_TOO_BIG: u8 = 2;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
pub const ICMPV6_ECHO_REPLY: u8 = 129;
/// TTL and hop limit of the answers the balancer sends.
pub const ANSWER_TTL: u8 = 64;

const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_LEN);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == IPV4_LEN);
const _: () = assert!(core::mem::size_of::<Ipv6Hdr>() == IPV6_LEN);
const _: () = assert!(core::mem::size_of::<IcmpHdr>() == ICMP_LEN);
const _: () = assert!(core::mem::size_of::<UdpHdr>() == UDP_LEN);
