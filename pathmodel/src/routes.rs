//! The next hop without the static one: the kernel's routes as a balancer's lookup meets
//! them, reduced to what a host with connected subnets has: each interface's prefixes, its
//! MAC and MTU, and the neighbours resolved on it. No route: dropped; a route without a
//! neighbour entry: the kernel is handed the packet to resolve it.

use std::collections::BTreeMap;

use spillway_common::prefix::masked;

/// One interface.
#[derive(Clone, Debug, Default)]
pub struct Link {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub mtu: usize,
    /// Connected prefixes: (family, address, length).
    pub prefixes: Vec<(u8, [u32; 4], u8)>,
    /// Resolved neighbours by (family, address).
    pub neighbours: BTreeMap<(u8, [u32; 4]), [u8; 6]>,
}

#[derive(Clone, Debug, Default)]
pub struct Routes {
    pub links: Vec<Link>,
}

pub(crate) enum NextHop {
    /// The egress and the MACs to write (source, destination).
    Resolved {
        ifindex: u32,
        macs: ([u8; 6], [u8; 6]),
    },
    NoNeigh,
    NoRoute,
    /// Too big for the egress: its MTU.
    FragNeeded {
        mtu: usize,
    },
}

impl Routes {
    /// Where a packet of `len` bytes to `addr` goes.
    pub(crate) fn next_hop(&self, addr: &[u32; 4], family: u8, len: usize) -> NextHop {
        let on = |link: &&Link| link.prefixes.iter().any(|&(f, prefix, bits)| f == family && masked(addr, bits) == prefix);
        let Some(link) = self.links.iter().find(on) else {
            return NextHop::NoRoute;
        };
        if len > link.mtu {
            return NextHop::FragNeeded { mtu: link.mtu };
        }
        match link.neighbours.get(&(family, *addr)) {
            Some(mac) => NextHop::Resolved { ifindex: link.ifindex, macs: (link.mac, *mac) },
            None => NextHop::NoNeigh,
        }
    }
}
