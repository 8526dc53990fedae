//! What the balancer host allows a desired state to hold, beyond the model's own rules: a VIP
//! on one of the host's own addresses takes the host's traffic to that port (SSH, BGP) into
//! the data path, and a backend of a family without an outer source cannot be reached (the
//! tunnel has no source address to send from). Only what a change adds is checked, so a state
//! already in force is never refused by a later change of the host.

use std::net::IpAddr;

use super::{DesiredState, Vip};

/// The host facts `lbd` found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Every address of the host's interfaces, with the interface's name.
    pub addresses: Vec<(String, IpAddr)>,
    /// Whether an IPv4 (IPv6) outer source is configured: `--outer-src` (`--outer-src6`) or
    /// an address of the balancer interface.
    pub outer_v4: bool,
    pub outer_v6: bool,
    /// The balancer interface, for messages.
    pub iface: String,
}

impl Default for Host {
    /// A host that refuses nothing (tests, and a core not told yet).
    fn default() -> Self {
        Self { addresses: Vec::new(), outer_v4: true, outer_v6: true, iface: String::new() }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error(
        "VIP {vip}: {} is an address of this balancer ({iface}): the balancer's own traffic to it (SSH, BGP) would go \
         to the VIP's backends, or be dropped while it has none (drop_no_backend); if that is meant, add it with \
         lbctl vips add --force (in a file: allow_local_address = true)",
        vip.addr
    )]
    LocalAddress { vip: Vip, iface: String },
    #[error(
        "backend {backend} of VIP {vip}: no IPv{family} outer source is configured (lbd's --outer-src{flag} / \
         outer_src{flag}, or an IPv{family} address on {iface}), and the tunnel to an IPv{family} backend needs one: \
         its packets could not be sent"
    )]
    NoOuterSource { vip: Vip, backend: IpAddr, family: u8, flag: &'static str, iface: String },
}

impl Host {
    /// Refuses what `next` adds to `before` that this host cannot serve: a VIP on one of its
    /// addresses (unless the VIP allows it) and a backend of a family without an outer source.
    pub fn check(&self, before: &DesiredState, next: &DesiredState) -> Result<(), HostError> {
        for (vip, config) in &next.vips {
            let old = before.vips.get(vip);
            if old.is_none()
                && !config.allow_local_address
                && let Some((iface, _)) = self.addresses.iter().find(|(_, addr)| *addr == vip.addr)
            {
                return Err(HostError::LocalAddress { vip: *vip, iface: iface.clone() });
            }
            for backend in config.backends.keys().filter(|b| old.is_none_or(|o| !o.backends.contains_key(b))) {
                let (ok, family, flag) = if backend.is_ipv4() { (self.outer_v4, 4, "") } else { (self.outer_v6, 6, "6") };
                if !ok {
                    return Err(HostError::NoOuterSource { vip: *vip, backend: *backend, family, flag, iface: self.iface.clone() });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(vip: &str, backends: &[&str]) -> (Vip, DesiredState) {
        let vip: Vip = vip.parse().unwrap();
        let mut state = DesiredState::default();
        state.add_vip(vip, 13).unwrap();
        for b in backends {
            state.add_backend(&vip, b.parse().unwrap(), 100).unwrap();
        }
        (vip, state)
    }

    fn host() -> Host {
        Host {
            addresses: vec![("eth0".into(), "10.77.0.2".parse().unwrap()), ("lo".into(), "127.0.0.1".parse().unwrap())],
            outer_v4: true,
            outer_v6: false,
            iface: "eth0".into(),
        }
    }

    #[test]
    fn a_vip_on_the_host_s_own_address_needs_allowing() {
        let (vip, mut next) = state("10.77.0.2:22/tcp", &[]);
        let err = host().check(&DesiredState::default(), &next).unwrap_err();
        assert_eq!(err, HostError::LocalAddress { vip, iface: "eth0".into() });
        assert!(err.to_string().contains("lbctl vips add --force (in a file: allow_local_address = true)"), "{err}");
        next.vips.get_mut(&vip).unwrap().allow_local_address = true;
        host().check(&DesiredState::default(), &next).unwrap();
        // Already in force: a later change does not refuse it.
        let (_, plain) = state("10.77.0.2:22/tcp", &[]);
        host().check(&plain, &plain).unwrap();
        host().check(&DesiredState::default(), &state("10.100.0.1:22/tcp", &[]).1).unwrap();
    }

    #[test]
    fn a_backend_needs_an_outer_source_of_its_family() {
        let (_, next) = state("10.100.0.1:80/tcp", &["10.0.0.101", "fd00::101"]);
        let err = host().check(&DesiredState::default(), &next).unwrap_err().to_string();
        assert!(err.contains("backend fd00::101 of VIP 10.100.0.1:80/tcp: no IPv6 outer source is configured"), "{err}");
        assert!(err.contains("--outer-src6 / outer_src6, or an IPv6 address on eth0"), "{err}");
        let (_, before) = state("10.100.0.1:80/tcp", &["fd00::101"]);
        host().check(&before, &next).unwrap();
        Host::default().check(&DesiredState::default(), &next).unwrap();
    }
}
