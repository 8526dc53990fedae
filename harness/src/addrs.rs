//! The address plan: one IPv4 /24 and one IPv6 /64 shared by all hosts, plus
//! the virtual service addresses (VIPs) the balancer announces.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The IPv4 virtual service address. Clients route it to the balancer;
/// backends hold it on `lo` so they accept (and answer from) it in DSR mode.
pub const VIP4: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
/// The IPv6 virtual service address, as [`VIP4`].
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 1);
/// The IPv4 prefix clients route via the balancer.
pub const VIP4_NET: &str = "10.100.0.0/24";
/// The IPv6 prefix clients route via the balancer.
pub const VIP6_NET: &str = "fd00:100::/64";

/// The balancer's own IPv4 address.
pub const LB4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The balancer's own IPv6 address.
pub const LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

/// A fleet's router (`crate::fleet`): on the host network, and towards its clients.
pub const ROUTER4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
pub const ROUTER_EDGE4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub const ROUTER_EDGE6: Ipv6Addr = Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, 1);
/// The fleet clients' network, behind the router.
pub const EDGE4_NET: &str = "10.1.0.0/24";
pub const EDGE6_NET: &str = "fd01::/64";
/// Most balancers of a fleet: `lb<n>` is 10.0.0.1+n, below the clients' .11.
pub const MAX_FLEET_BALANCERS: usize = 8;

/// IPv4 address of fleet balancer `lb<n>` (1-based): 10.0.0.1+n (lb1 is [`LB4`]).
pub fn balancer4(n: usize) -> Ipv4Addr {
    host4(1 + n)
}

/// IPv6 address of fleet balancer `lb<n>`: fd00::1+n.
pub fn balancer6(n: usize) -> Ipv6Addr {
    host6(1 + n)
}

/// IPv4 address of fleet client `c<n>`, behind the router: 10.1.0.10+n.
pub fn edge_client4(n: usize) -> Ipv4Addr {
    let last = u8::try_from(10 + n).expect("host number within the address plan");
    Ipv4Addr::new(10, 1, 0, last)
}

/// IPv6 address of fleet client `c<n>`: fd01::10+n (hex).
pub fn edge_client6(n: usize) -> Ipv6Addr {
    let last = u16::try_from(0x10 + n).expect("host number within the address plan");
    Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, last)
}

/// Prefix lengths of the shared host network.
pub(crate) const HOST_PREFIX4: u8 = 24;
pub(crate) const HOST_PREFIX6: u8 = 64;

/// Clients are c1.. at .10+n, so at most 89 of them before reaching .100.
pub const MAX_CLIENTS: usize = 89;
/// Backends are b1.. at .100+n, so at most 154 of them (up to .254).
pub const MAX_BACKENDS: usize = 154;

/// IPv4 address of client `c<n>` (1-based): 10.0.0.10+n.
pub fn client4(n: usize) -> Ipv4Addr {
    host4(10 + n)
}

/// IPv6 address of client `c<n>` (1-based): fd00::10+n (hex, so c1 = fd00::11).
pub fn client6(n: usize) -> Ipv6Addr {
    host6(0x10 + n)
}

/// IPv4 address of backend `b<n>` (1-based): 10.0.0.100+n.
pub fn backend4(n: usize) -> Ipv4Addr {
    host4(100 + n)
}

/// IPv6 address of backend `b<n>` (1-based): fd00::100+n (hex, so b1 = fd00::101).
pub fn backend6(n: usize) -> Ipv6Addr {
    host6(0x100 + n)
}

fn host4(last: usize) -> Ipv4Addr {
    let last = u8::try_from(last).expect("host number within the address plan");
    Ipv4Addr::new(10, 0, 0, last)
}

fn host6(last: usize) -> Ipv6Addr {
    let last = u16::try_from(last).expect("host number within the address plan");
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)
}
