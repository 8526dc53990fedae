//! The balancer interface's forwarding sysctls. `bpf_fib_lookup` answers "forwarding
//! disabled" for packets that arrive on an interface that does not forward (it checks the
//! ingress device's `net.ipv4.conf.<if>.forwarding`, and `net.ipv6.conf.<if>.forwarding`),
//! so with either at 0 the balancer cannot route a single VIP packet of that family.
//! `lbd` refuses to start that way unless told to set them, and watches them afterwards.

use std::fs;
use std::io;
use std::path::PathBuf;

/// One forwarding sysctl of an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sysctl {
    /// As `sysctl` names it: `net.ipv4.conf.eth0.forwarding`.
    pub name: String,
    path: PathBuf,
}

impl Sysctl {
    fn of(family: &str, iface: &str) -> Sysctl {
        Sysctl {
            name: format!("net.{family}.conf.{iface}.forwarding"),
            path: PathBuf::from(format!("/proc/sys/net/{family}/conf/{iface}/forwarding")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardingError {
    #[error("reading {name}")]
    Read {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("setting {name} to 1")]
    Write {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// The forwarding sysctls of `iface` that are 0. IPv6's is skipped where the interface has
/// no IPv6 (disabled, or a kernel without it).
pub fn disabled(iface: &str) -> Result<Vec<Sysctl>, ForwardingError> {
    let mut off = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let sysctl = Sysctl::of(family, iface);
        match fs::read_to_string(&sysctl.path) {
            Ok(value) if value.trim() == "0" => off.push(sysctl),
            Ok(_) => {}
            Err(e) if family == "ipv6" && e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(ForwardingError::Read { name: sysctl.name, source }),
        }
    }
    Ok(off)
}

/// Sets each of `sysctls` to 1.
pub fn enable(sysctls: &[Sysctl]) -> Result<(), ForwardingError> {
    for sysctl in sysctls {
        fs::write(&sysctl.path, "1").map_err(|source| ForwardingError::Write { name: sysctl.name.clone(), source })?;
    }
    Ok(())
}

/// `a = 0, b = 0`: the names of `sysctls`, for messages.
pub fn describe(sysctls: &[Sysctl]) -> String {
    sysctls.iter().map(|s| format!("{} = 0", s.name)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_follow_sysctl_conventions() {
        let s = Sysctl::of("ipv6", "eth0");
        assert_eq!(s.name, "net.ipv6.conf.eth0.forwarding");
        assert_eq!(s.path, PathBuf::from("/proc/sys/net/ipv6/conf/eth0/forwarding"));
        assert_eq!(describe(&[Sysctl::of("ipv4", "lo"), s]), "net.ipv4.conf.lo.forwarding = 0, net.ipv6.conf.eth0.forwarding = 0");
    }

    #[test]
    fn an_unknown_interface_is_an_error_naming_the_sysctl() {
        let err = disabled("no-such-if0").unwrap_err();
        assert!(err.to_string().contains("net.ipv4.conf.no-such-if0.forwarding"), "{err}");
    }
}
