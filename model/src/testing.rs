//! Address helpers for unit tests, here and in the crates above (feature `testing`).

use std::net::IpAddr;

use crate::Vip;

/// The VIP most unit tests serve.
pub const VIP: &str = "10.100.0.1:80/tcp";

/// A VIP from its text (`10.100.0.1:80/tcp`); panics if it does not parse.
pub fn vip(s: &str) -> Vip {
    s.parse().unwrap()
}

/// An address from its text; panics if it does not parse.
pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Backend `n`: 10.0.0.`n`.
pub fn be(n: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, n])
}
