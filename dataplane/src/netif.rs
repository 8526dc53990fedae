//! The host's interfaces and addresses, as the daemon and the agent need them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nix::{
    errno::Errno,
    ifaddrs::getifaddrs,
    net::if_::{InterfaceFlags, if_nametoindex},
};

#[derive(Debug, thiserror::Error)]
pub enum NetifError {
    #[error("no interface named {name:?}")]
    UnknownInterface { name: String },
    #[error("listing the host's addresses")]
    Addresses(#[source] Errno),
}

pub fn ifindex(name: &str) -> Result<u32, NetifError> {
    if_nametoindex(name).map_err(|_| NetifError::UnknownInterface { name: name.to_owned() })
}

/// Every address of every interface (lo included), in the kernel's order.
pub fn addresses() -> Result<Vec<(String, IpAddr)>, NetifError> {
    let all = getifaddrs().map_err(NetifError::Addresses)?;
    Ok(all
        .filter_map(|ifa| {
            let storage = ifa.address?;
            let addr = match (storage.as_sockaddr_in(), storage.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (_, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some((ifa.interface_name, addr))
        })
        .collect())
}

/// Whether `iface` is up and has its carrier (`IFF_UP` and `IFF_RUNNING`).
pub fn is_running(iface: &str) -> Result<bool, NetifError> {
    let all = getifaddrs().map_err(NetifError::Addresses)?;
    let wanted = InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING;
    let mut found = false;
    for ifa in all.filter(|ifa| ifa.interface_name == iface) {
        found = true;
        if ifa.flags.contains(wanted) {
            return Ok(true);
        }
    }
    if found { Ok(false) } else { Err(NetifError::UnknownInterface { name: iface.to_owned() }) }
}

/// The first IPv4 address of `iface`.
pub fn first_ipv4(all: &[(String, IpAddr)], iface: &str) -> Option<Ipv4Addr> {
    all.iter().find_map(|(name, addr)| match addr {
        IpAddr::V4(v4) if name == iface => Some(*v4),
        _ => None,
    })
}

/// The first IPv6 address of `iface` that is routable beyond the link.
pub fn first_global_ipv6(all: &[(String, IpAddr)], iface: &str) -> Option<Ipv6Addr> {
    all.iter().find_map(|(name, addr)| match addr {
        IpAddr::V6(v6) if name == iface && is_global_v6(v6) => Some(*v6),
        _ => None,
    })
}

fn is_global_v6(addr: &Ipv6Addr) -> bool {
    !(addr.is_loopback() || addr.is_unspecified() || addr.is_multicast() || addr.is_unicast_link_local())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_usable_address_of_the_interface() {
        let all: Vec<(String, IpAddr)> =
            [("lo", "127.0.0.1"), ("eth0", "fe80::1"), ("eth0", "10.0.0.5"), ("eth0", "fd00::5"), ("eth0", "10.0.0.6")]
                .iter()
                .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
                .collect();
        assert_eq!(first_ipv4(&all, "eth0"), Some("10.0.0.5".parse().unwrap()));
        assert_eq!(first_global_ipv6(&all, "eth0"), Some("fd00::5".parse().unwrap()));
        assert_eq!(first_ipv4(&all, "eth1"), None);
    }

    #[test]
    fn loopback_is_listed() {
        let all = addresses().unwrap();
        assert!(all.iter().any(|(_, a)| a.is_loopback()), "{all:?}");
        assert_eq!(ifindex("lo").unwrap(), 1);
        assert!(is_running("lo").unwrap());
        assert!(is_running("no-such-if0").is_err());
        assert!(ifindex("no-such-if0").is_err());
    }
}
