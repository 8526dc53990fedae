//! The interfaces the balancer runs on: one loaded program driving each through a link of
//! its own (`<pin-dir>/v<N>/links/<if>`, see `pins`), and the device map of the interfaces
//! it may redirect to. All of them share the one set of maps, so a flow keeps its backend
//! whichever interface its packets arrive on, and the FIB picks the way out per packet.

use std::fs::DirBuilder;
use std::os::unix::fs::DirBuilderExt;

use aya::{
    Ebpf,
    maps::{DevMapHash, MapData},
    programs::{Xdp, XdpMode},
};
use spillway_common::limits::{map_names, program_names};

use crate::{
    Balancer, DataplaneError,
    maps::named,
    netif,
    pins::{self, Attachment, PinError, PinLayout},
    xdp,
};

#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

/// Where a balancer link stands on one interface, as the kernel says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// The pinned link drives the interface.
    Drives,
    /// No link is pinned for it, or the pinned one drives nothing now (its interface was
    /// deleted, perhaps made again under the same name).
    Absent,
    /// The interface does not exist.
    NoInterface,
}

/// The balancer's program and what attaches it, taken from the loaded object once its
/// maps are handed to the core.
pub struct Uplinks {
    ebpf: Ebpf,
    tx_ports: DevMapHash<MapData>,
    layout: PinLayout,
    mode: XdpMode,
}

impl Balancer {
    /// The program, attached nowhere yet, and the redirect map, for [`Uplinks::attach`]; the
    /// maps stay with the caller. Creates the directory of the links.
    pub fn into_uplinks(self, layout: &PinLayout, mode: XdpMode) -> Result<(Uplinks, crate::BalancerMaps), UplinkError> {
        let Balancer { ebpf, maps, tx_ports } = self;
        let dir = layout.balancer_links();
        DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|source| PinError::CreateDir { path: dir, source })?;
        Ok((Uplinks { ebpf, tx_ports, layout: layout.clone(), mode }, maps))
    }
}

impl Uplinks {
    /// The balancer's entry program (pinned for an operator's root program: `entry`).
    pub fn program(&mut self) -> Result<&mut Xdp, DataplaneError> {
        xdp(&mut self.ebpf, program_names::BALANCER)
    }

    /// The loaded program's tag (hex), as `bpftool prog` shows it.
    pub fn program_tag(&mut self) -> String {
        self.program().ok().and_then(|p| p.info().ok()).map(|i| format!("{:016x}", i.tag())).unwrap_or_default()
    }

    /// Makes the program drive `iface`, taking its pinned link over when there is one (a
    /// restart: the kernel swaps programs atomically).
    pub fn attach(&mut self, iface: &str) -> Result<Attachment, UplinkError> {
        let (mode, link) = (self.mode, self.layout.balancer_link(iface));
        Ok(pins::attach_pinned(self.program()?, iface, mode, &link)?)
    }

    /// Where the link driving `iface` is pinned.
    pub fn link(&self, iface: &str) -> std::path::PathBuf {
        self.layout.balancer_link(iface)
    }

    /// Stops driving `iface` (its link unpinned); false when nothing drove it.
    pub fn detach(&self, iface: &str) -> Result<bool, PinError> {
        pins::detach_balancer(&self.layout, iface)
    }

    /// The interfaces with a pinned link, by name (whether it still drives them or not).
    pub fn linked(&self) -> Vec<String> {
        pins::linked_interfaces(&self.layout)
    }

    /// Whether the pinned link of `iface` drives it now.
    pub fn state(&self, iface: &str) -> LinkState {
        let Ok(ifindex) = netif::ifindex(iface) else { return LinkState::NoInterface };
        match pins::pinned_link_ifindex(&self.layout.balancer_link(iface)) {
            Some(driven) if driven == ifindex => LinkState::Drives,
            _ => LinkState::Absent,
        }
    }

    /// Makes `ifindexes` the interfaces the program may redirect to (the others are sent
    /// with XDP_TX when they leave by their own interface, or through the kernel).
    pub fn set_tx_ports(&mut self, ifindexes: &[u32]) -> Result<(), DataplaneError> {
        let have: Vec<u32> = named(map_names::TX_PORTS, self.tx_ports.keys().collect())?;
        for stale in have.iter().filter(|i| !ifindexes.contains(i)) {
            named(map_names::TX_PORTS, self.tx_ports.remove(*stale))?;
        }
        for &ifindex in ifindexes.iter().filter(|i| !have.contains(i)) {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .map_err(|source| DataplaneError::XdpMap { name: map_names::TX_PORTS, source })?;
        }
        Ok(())
    }
}
