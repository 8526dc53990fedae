//! Keeps the balancer on the interfaces it is to run on. Each check attaches the program
//! where it does not drive a wanted interface (one a reloaded file added, or one deleted
//! and made again), detaches it from those no longer wanted, points the redirect map at
//! the interfaces present, and tells the core how each one stands: driven, up, forwarding,
//! dropping frames on the way out. An interface that goes down or away is an ALERT; the
//! others carry on untouched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_dataplane::{
    forwarding, netif,
    pins::{self, Attachment, PinError},
    rtnl::Rtnl,
    uplinks::{LinkState, UplinkError, Uplinks},
};
use spillway_logging::{error_chain, event};
use spillway_reconcile::Maps;

use crate::core::{Counters, Driven, UplinkState};
use crate::probing::ProbePathState;
use crate::server::{self, SharedCore};
use crate::store::Store;
use crate::tx_drops::{self, TxDrops};

/// How often the interfaces are checked: a reloaded list, an interface back or gone, a
/// sysctl or a TX-drop counter is seen within this.
pub const CHECK: Duration = Duration::from_secs(2);

/// As the API names an attachment.
fn attachment_label(attachment: Attachment) -> &'static str {
    match attachment {
        Attachment::Attached => "attached",
        Attachment::TookOver { .. } => "took_over",
        Attachment::Reattached => "reattached",
    }
}

/// The uplinks and what the checks remember between rounds.
pub struct UplinkWatch {
    uplinks: Uplinks,
    /// Interfaces the program may redirect to besides the uplinks (`--tx-iface`).
    tx_only: Vec<String>,
    /// How the program came to drive each interface it drives, and that interface's index
    /// then.
    attachments: BTreeMap<String, (&'static str, u32)>,
    /// The last attach error of each interface it could not attach to (logged once).
    refusals: BTreeMap<String, String>,
    drops: BTreeMap<String, TxDrops>,
    tx_ports: Vec<u32>,
    /// Routed as if its probes arrived on the first interface that is up.
    probe_path: Option<Arc<ProbePathState>>,
    /// False with `--xdp-attach none`: the operator's root program calls the balancer, and
    /// nothing is attached.
    attaches: bool,
    /// The XDP mode asked for, as logged.
    mode: &'static str,
}

impl UplinkWatch {
    /// `mode`: the XDP mode asked for, as logged.
    pub fn new(uplinks: Uplinks, tx_only: Vec<String>, mode: &'static str, probe_path: Option<Arc<ProbePathState>>) -> Self {
        Self {
            uplinks,
            tx_only,
            mode,
            attachments: BTreeMap::new(),
            refusals: BTreeMap::new(),
            drops: BTreeMap::new(),
            tx_ports: Vec::new(),
            probe_path,
            attaches: true,
        }
    }

    /// Attaches the program to `iface` at the start, where a refusal stops `lbd`.
    pub fn attach_at_start(&mut self, iface: &str) -> Result<(), UplinkError> {
        let attachment = self.uplinks.attach(iface)?;
        self.note_attached(iface, attachment);
        Ok(())
    }

    /// The loaded program's tag (hex).
    pub fn program_tag(&mut self) -> String {
        self.uplinks.program_tag()
    }

    /// Logs how the program came to drive `iface` and remembers it; returns it as the API
    /// names it.
    fn note_attached(&mut self, iface: &str, attachment: Attachment) -> &'static str {
        let (mode, link, program_tag) = (self.mode, self.uplinks.link(iface), self.uplinks.program_tag());
        let link = link.display();
        match attachment {
            Attachment::Attached => event!(info, "attached", iface = iface, mode = mode, link = link, program_tag = program_tag),
            Attachment::Reattached => event!(
                info,
                "attached",
                iface = iface,
                mode = mode,
                link = link,
                program_tag = program_tag,
                note = "the old link's interface was gone"
            ),
            Attachment::TookOver { replaced_program_id } => {
                event!(info, "took_over", iface = iface, link = link, replaced_prog_id = replaced_program_id, program_tag = program_tag)
            }
        }
        let how = attachment_label(attachment);
        self.attachments.insert(iface.to_owned(), (how, netif::ifindex(iface).unwrap_or_default()));
        how
    }

    /// Attaches nothing (`--xdp-attach none`); the interfaces are still watched.
    pub fn leave_unattached(&mut self) {
        self.attaches = false;
    }

    /// One round (blocking: bpf, netlink, sysctls): makes the program drive exactly the
    /// `wanted` interfaces that exist, and returns how each wanted one stands, in order.
    pub fn check(&mut self, wanted: &[String]) -> Vec<UplinkState> {
        let states: Vec<UplinkState> = wanted.iter().map(|name| self.check_one(name)).collect();
        // Detached only after the wanted ones are driven: a list that swaps interfaces never
        // leaves the balancer on none.
        for name in self.uplinks.linked().into_iter().filter(|n| !wanted.contains(n)) {
            match self.uplinks.detach(&name) {
                Ok(_) => event!(info, "detached", iface = name, reason = "no longer in the interface list"),
                Err(e) => event!(error, "detach_failed", iface = name, error = error_chain(&e)),
            }
            self.attachments.remove(&name);
            self.drops.remove(&name);
        }
        self.update_tx_ports(wanted);
        self.follow_with_probes(&states);
        states
    }

    /// Probes leave as if they arrived on the first interface that is up: with the first
    /// uplink down they take another, instead of failing and failing the backends with them.
    fn follow_with_probes(&self, states: &[UplinkState]) {
        let Some(Ok(path)) = self.probe_path.as_deref() else { return };
        let up = states.iter().find(|s| s.running && matches!(s.driven, Driven::Yes { .. } | Driven::Unattached));
        let Some((name, ifindex)) = up.and_then(|s| Some((&s.name, netif::ifindex(&s.name).ok()?))) else { return };
        if let Err(e) = path.set_ingress(name, ifindex) {
            event!(error, "probe_path_ingress_not_set", iface = name, error = error_chain(&e));
        }
    }

    fn check_one(&mut self, name: &str) -> UplinkState {
        let driven = match self.uplinks.state(name) {
            LinkState::NoInterface => {
                self.attachments.remove(name);
                Driven::Gone
            }
            LinkState::Drives => Driven::Yes { how: self.attachments.get(name).map_or("took_over", |a| a.0) },
            LinkState::Absent if !self.attaches => Driven::Unattached,
            LinkState::Absent => match (self.attachments.get(name), netif::ifindex(name)) {
                // Its link was detached by someone else (bpftool, another tool taking the
                // hook) while the interface stayed: not fought over; a restart attaches again.
                (Some((_, attached)), Ok(now)) if *attached == now => Driven::No {
                    why: "its link was detached by something other than lbd; lbd attaches it again when it restarts".to_owned(),
                },
                // New in the list, or the interface was deleted and made again.
                _ => self.attach(name),
            },
        };
        if driven == Driven::Gone {
            return UplinkState { name: name.to_owned(), driven, running: false, forwarding_off: None, tx_drops: None };
        }
        let forwarding_off = match forwarding::disabled(name) {
            Ok(off) => (!off.is_empty()).then(|| forwarding::describe(&off)),
            Err(e) => {
                event!(warn, "forwarding_check_failed", iface = name, error = error_chain(&e));
                None
            }
        };
        UplinkState {
            name: name.to_owned(),
            running: netif::is_running(name).unwrap_or(false),
            tx_drops: self.tx_drops(name),
            driven,
            forwarding_off,
        }
    }

    fn attach(&mut self, name: &str) -> Driven {
        match self.uplinks.attach(name) {
            Ok(attachment) => {
                self.refusals.remove(name);
                Driven::Yes { how: self.note_attached(name, attachment) }
            }
            Err(e) => {
                let why = refusal(&e);
                if self.refusals.get(name) != Some(&why) {
                    event!(error, "attach_failed", iface = name, error = why);
                }
                self.refusals.insert(name.to_owned(), why.clone());
                Driven::No { why }
            }
        }
    }

    /// The TX-drop alert in force on `name`.
    fn tx_drops(&mut self, name: &str) -> Option<String> {
        let link = match Rtnl::open().and_then(|mut r| r.link(name)) {
            Ok(link) => link?,
            Err(e) => {
                event!(warn, "tx_drops_check_failed", iface = name, error = error_chain(&e));
                return None;
            }
        };
        let dropped = self.drops.entry(name.to_owned()).or_default().observe(link.tx_dropped?, Instant::now())?;
        Some(tx_drops::alert(name, dropped, link.kind.as_deref()))
    }

    /// The redirect map holds every wanted interface and `--tx-iface` that exists now (an
    /// interface made again has a new index).
    fn update_tx_ports(&mut self, wanted: &[String]) {
        let ifindexes: Vec<u32> = wanted.iter().chain(&self.tx_only).filter_map(|name| netif::ifindex(name).ok()).collect();
        if ifindexes == self.tx_ports {
            return;
        }
        match self.uplinks.set_tx_ports(&ifindexes) {
            Ok(()) => self.tx_ports = ifindexes,
            Err(e) => event!(error, "tx_ports_not_set", error = error_chain(&e)),
        }
    }
}

/// Why an attach failed, with the holder of a taken interface named.
fn refusal(error: &UplinkError) -> String {
    match error {
        UplinkError::Pin(pin @ PinError::Attach { iface, .. }) => match pins::xdp_holder(iface) {
            Some(holder) => format!("{}: another XDP program drives it: {holder}", error_chain(pin)),
            None => error_chain(pin),
        },
        UplinkError::Pin(pin) => error_chain(pin),
        UplinkError::Dataplane(e) => error_chain(e),
    }
}

/// Checks the interfaces every [`CHECK`], from the list the core holds (a reloaded file's).
pub async fn watch<M, S>(core: SharedCore<M, S>, mut watch: UplinkWatch)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let mut tick = tokio::time::interval(CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let core = core.clone();
        let round = move || {
            let wanted = server::lock(&core).wanted_uplinks();
            let states = watch.check(&wanted);
            let mut core = server::lock(&core);
            core.set_uplinks(states);
            core.watch_flow_table();
            watch
        };
        match tokio::task::spawn_blocking(round).await {
            Ok(back) => watch = back,
            Err(e) => {
                event!(error, "interface_watch_failed", error = e, effect = "interfaces are no longer checked until lbd restarts");
                return;
            }
        }
    }
}
