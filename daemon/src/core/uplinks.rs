//! The interfaces the balancer runs on, as the uplink watch last saw them (`uplink_watch`):
//! their alerts, their part of `status` and the metrics, the one log line per change, and
//! the list a reloaded file asks for.

use spillway_api::InterfaceStatus;
use spillway_logging::event;

use super::{Core, Counters};
use crate::settings::{LIVE_IFACE, Settings};
use crate::store::Store;
use spillway_reconcile::Maps;

/// Whether the balancer's program drives an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Driven {
    /// It does: `how` it came to (`attached`, `took_over`, `reattached`).
    Yes { how: &'static str },
    /// It does not, and `why` (the last attach's error).
    No { why: String },
    /// There is no such interface: attached again once it comes back.
    Gone,
    /// Not by a link of its own, on purpose (`--xdp-attach none`): the operator's root
    /// program tail-calls it, which `lbd` cannot see.
    Unattached,
}

/// One interface as last checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UplinkState {
    pub name: String,
    pub driven: Driven,
    /// Up with a carrier.
    pub running: bool,
    /// The forwarding sysctls found at 0 (`None`: all on, or unreadable).
    pub forwarding_off: Option<String>,
    /// The alert about frames dropped on the way out of it, while it lasts.
    pub tx_drops: Option<String>,
}

impl UplinkState {
    /// As the API and the metrics name it (see [`InterfaceStatus::state`]).
    fn state(&self) -> &'static str {
        match (&self.driven, self.running) {
            (Driven::Gone, _) => "gone",
            (Driven::No { .. }, _) => "not_attached",
            (Driven::Yes { .. } | Driven::Unattached, false) => "down",
            (Driven::Yes { .. } | Driven::Unattached, true) => "up",
        }
    }

    fn alerts(&self, others: &str) -> impl Iterator<Item = String> {
        let name = &self.name;
        let carried = if others.is_empty() {
            "no other interface carries VIP traffic".to_owned()
        } else {
            format!("VIP traffic goes on through {others}")
        };
        let state = match &self.driven {
            Driven::Gone => Some(format!("ALERT: interface {name} is gone: {carried}; the balancer attaches to it again when it is back")),
            Driven::No { why } => Some(format!("ALERT: the balancer does not drive {name} ({why}): {carried}; retried at each check")),
            Driven::Yes { .. } | Driven::Unattached if !self.running => {
                Some(format!("ALERT: interface {name} is down: no VIP traffic arrives or leaves by it; {carried}"))
            }
            Driven::Yes { .. } | Driven::Unattached => None,
        };
        let forwarding = self.forwarding_off.as_ref().map(|sysctls| {
            format!(
                "ALERT: forwarding is disabled on {name} ({sysctls}): every VIP packet of that family arriving there is dropped \
                 (drop_forwarding_disabled in lbctl stats); set it back to 1"
            )
        });
        state.into_iter().chain(forwarding).chain(self.tx_drops.clone())
    }
}

/// Logs what changed on one interface since `before` (`None`: first seen).
fn log_change(before: Option<&UplinkState>, now: &UplinkState) {
    let iface = &now.name;
    if before.map(UplinkState::state) != Some(now.state()) {
        match (&now.driven, now.running) {
            (Driven::Gone, _) => event!(error, "interface_gone", iface = iface, message = "ALERT: the others carry on"),
            (Driven::No { why }, _) => event!(error, "interface_not_attached", iface = iface, error = why),
            (Driven::Yes { .. } | Driven::Unattached, false) => {
                event!(error, "interface_down", iface = iface, message = "ALERT: the others carry on")
            }
            (Driven::Yes { how }, true) => event!(info, "interface_up", iface = iface, attachment = how),
            (Driven::Unattached, true) => event!(info, "interface_up", iface = iface, attachment = "unattached"),
        }
    }
    let forwarding_before = before.and_then(|b| b.forwarding_off.as_ref());
    if forwarding_before != now.forwarding_off.as_ref() {
        match &now.forwarding_off {
            Some(sysctls) => {
                event!(
                    warn,
                    "forwarding_disabled",
                    iface = iface,
                    sysctls = sysctls,
                    effect = "VIP packets are dropped (drop_forwarding_disabled)"
                )
            }
            None if before.is_some() => event!(info, "forwarding_restored", iface = iface),
            None => {}
        }
    }
    if before.and_then(|b| b.tx_drops.as_ref()).is_some() != now.tx_drops.is_some() {
        match &now.tx_drops {
            Some(alert) => event!(error, "tx_drops", iface = iface, message = alert),
            None => event!(info, "tx_drops_ended", iface = iface),
        }
    }
}

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// The interfaces the balancer is to run on now: those it started with, or those the
    /// last applied file named.
    pub fn wanted_uplinks(&self) -> Vec<String> {
        self.wanted_uplinks.clone()
    }

    /// Makes `names` the interfaces to run on (at the start; a reloaded file changes them).
    pub fn set_wanted_uplinks(&mut self, names: Vec<String>) {
        self.wanted_uplinks = names;
    }

    /// Takes the interfaces `file` names, when they differ from those running and the
    /// command line named none (`RunningSettings::uplinks_from`): the uplink watch attaches
    /// and detaches the difference at its next check. Returns the note for the answer.
    pub fn take_uplinks(&mut self, file: &Settings) -> Option<String> {
        let wanted = self.info.settings.uplinks_from(file)?;
        let (from, to) = (self.wanted_uplinks.join(","), wanted.join(","));
        event!(info, "interfaces_changed", from = from, to = to);
        self.info.settings.effective.set(LIVE_IFACE, wanted.clone());
        self.wanted_uplinks = wanted;
        Some(format!("lbd.iface: the balancer moves from {from} to {to} while running (lbctl status shows each interface)"))
    }

    /// Records the interfaces as checked (in the wanted order), logging what changed.
    pub fn set_uplinks(&mut self, now: Vec<UplinkState>) {
        for state in &now {
            log_change(self.uplinks.iter().find(|b| b.name == state.name), state);
        }
        self.uplinks = now;
    }

    /// The interfaces' alerts, each naming which interfaces still carry traffic.
    pub(super) fn uplink_alerts(&self) -> Vec<String> {
        let up = |u: &&UplinkState| u.state() == "up";
        self.uplinks
            .iter()
            .flat_map(|u| {
                let others: Vec<&str> = self.uplinks.iter().filter(up).filter(|o| o.name != u.name).map(|o| o.name.as_str()).collect();
                u.alerts(&others.join(", ")).collect::<Vec<_>>()
            })
            .collect()
    }

    /// The interfaces as the API shows them.
    pub(super) fn interface_statuses(&self) -> Vec<InterfaceStatus> {
        self.uplinks
            .iter()
            .map(|u| InterfaceStatus {
                name: u.name.clone(),
                xdp_mode: self.info.xdp_mode.to_owned(),
                attachment: match u.driven {
                    Driven::Yes { how } => how.to_owned(),
                    Driven::Unattached => "unattached".to_owned(),
                    _ => "-".to_owned(),
                },
                state: u.state().to_owned(),
                forwarding_off: u.forwarding_off.clone(),
                error: match &u.driven {
                    Driven::No { why } => Some(why.clone()),
                    _ => None,
                },
            })
            .collect()
    }
}
