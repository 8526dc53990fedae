//! What `lbd` announces through BIRD, as `lbctl vips list` and the metrics show it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The announcement of one VIP address (a host route for every VIP on it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnouncementView {
    pub address: IpAddr,
    /// `announced`, `degraded` (announced with GRACEFUL_SHUTDOWN) or `withdrawn`.
    pub state: String,
    /// Why: `serving`, `no_backends`, `program_detached`, `interface_down`,
    /// `forwarding_disabled`, `restored`.
    pub reason: String,
    /// Seconds in this state.
    pub for_s: u64,
    /// Other balancers announcing the address normally, as this balancer's BIRD sees them
    /// (absent: unknown, BIRD did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<u32>,
    /// Other balancers that must announce it before this one may withdraw it.
    pub floor: u32,
    /// Withdrawal due but held by the floor (kept announced, degraded).
    pub held: bool,
}

impl AnnouncementView {
    /// Not announced normally for a fault (having no backends is no fault: nothing to carry).
    pub fn is_fault(&self) -> bool {
        self.state != "announced" && self.reason != "no_backends"
    }
}

/// Every announcement, and how BIRD took the last change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcements {
    pub routes: Vec<AnnouncementView>,
    /// Why BIRD could not be asked or refused the last configuration (absent: it took it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bird_error: Option<String>,
    /// Changes of state since `lbd` started, per address and state entered.
    pub changes: Vec<AnnouncementChanges>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnouncementChanges {
    pub address: IpAddr,
    pub state: String,
    pub count: u64,
}
