//! Whether each VIP address is announced, degraded or withdrawn: a pure function of what
//! the balancer sees (its data path, its desired state, the other balancers' announcements
//! in its BGP table) and of time, so every step can be tested.
//!
//! The rules, per address (a host route for the VIPs on it):
//! - no VIP on it has a backend (none configured; draining ones count, they carry
//!   established flows): withdrawn, the operator's decision and the same on every balancer;
//! - the data path forwards: announced. Load never enters: overload is shed at the edge;
//! - the data path cannot forward (program detached, interface down, forwarding off):
//!   *degraded* at once (announced with GRACEFUL_SHUTDOWN, so routers prefer the others),
//!   and withdrawn only once it has been degraded for `hold_ms` and at least `floor` other
//!   balancers announce the address normally. The hold lets the others' degradations reach
//!   this balancer first, so balancers failing together all stay announced rather than all
//!   leaving: a withdrawal can never take the fleet below the floor. A withdrawn address is
//!   announced again (degraded) as soon as fewer than `floor` others announce it normally.
//!
//! Unknown peers (BIRD did not answer) never allow a withdrawal nor force a re-announcement.

use std::{collections::BTreeMap, fmt, net::IpAddr};

/// Why the data path cannot forward an address's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The XDP program is no longer attached to the interface.
    ProgramDetached,
    /// The interface is down or has no carrier.
    InterfaceDown,
    /// The interface does not forward this family (`bpf_fib_lookup` refuses every packet).
    ForwardingDisabled,
}

impl Fault {
    pub const fn label(self) -> &'static str {
        match self {
            Fault::ProgramDetached => "program_detached",
            Fault::InterfaceDown => "interface_down",
            Fault::ForwardingDisabled => "forwarding_disabled",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Announced,
    /// Announced with lowered preference (GRACEFUL_SHUTDOWN).
    Degraded,
    Withdrawn,
}

impl State {
    pub const ALL: [State; 3] = [State::Announced, State::Degraded, State::Withdrawn];

    pub const fn label(self) -> &'static str {
        match self {
            State::Announced => "announced",
            State::Degraded => "degraded",
            State::Withdrawn => "withdrawn",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The data path forwards and a VIP on the address has backends.
    Serving,
    /// No VIP on the address has a backend.
    NoBackends,
    /// No VIP uses the address any more.
    NoVip,
    Fault(Fault),
    /// Found announced (degraded) when `lbd` started; decided on the first step.
    Restored,
}

impl Reason {
    pub const fn label(self) -> &'static str {
        match self {
            Reason::Serving => "serving",
            Reason::NoBackends => "no_backends",
            Reason::NoVip => "no_vip",
            Reason::Fault(f) => f.label(),
            Reason::Restored => "restored",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One address's announcement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub state: State,
    pub reason: Reason,
    /// When `state` began.
    pub since_ms: u64,
    /// Degraded past the hold, but kept announced by the floor.
    pub held: bool,
    /// Other balancers announcing the address normally, as last seen (`None`: unknown).
    pub peers: Option<u32>,
}

/// What a step changed for one address (to log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub prefix: IpAddr,
    pub from: State,
    pub to: State,
    pub reason: Reason,
    /// The floor started (`true`) or stopped holding a due withdrawal.
    pub held: bool,
    pub peers: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct Policy {
    floor: u32,
    hold_ms: u64,
    routes: BTreeMap<IpAddr, Route>,
}

impl Policy {
    pub fn new(floor: u32, hold_ms: u64) -> Self {
        Self { floor, hold_ms, routes: BTreeMap::new() }
    }

    pub fn floor(&self) -> u32 {
        self.floor
    }

    /// Takes over what a previous `lbd` left announced (`degraded` per address), so a
    /// restart changes nothing by itself.
    pub fn restore(&mut self, announced: impl IntoIterator<Item = (IpAddr, bool)>, now_ms: u64) {
        for (prefix, degraded) in announced {
            let (state, reason) = if degraded { (State::Degraded, Reason::Restored) } else { (State::Announced, Reason::Serving) };
            self.routes.insert(prefix, Route { state, reason, since_ms: now_ms, held: false, peers: None });
        }
    }

    /// Every address with its announcement (withdrawn ones while a VIP still uses them).
    pub fn routes(&self) -> &BTreeMap<IpAddr, Route> {
        &self.routes
    }

    /// The addresses to announce, each with whether it is degraded.
    pub fn announced(&self) -> Vec<(IpAddr, bool)> {
        self.routes.iter().filter(|(_, r)| r.state != State::Withdrawn).map(|(p, r)| (*p, r.state == State::Degraded)).collect()
    }

    /// Decides every address anew. `wanted`: the addresses some VIP uses, each with whether
    /// one of those VIPs has a backend; `fault`: why the data path cannot forward an
    /// address's family, if it cannot; `peers`: other balancers announcing it normally.
    pub fn step(
        &mut self,
        wanted: &BTreeMap<IpAddr, bool>,
        fault: &dyn Fn(IpAddr) -> Option<Fault>,
        peers: &dyn Fn(IpAddr) -> Option<u32>,
        now_ms: u64,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        let gone: Vec<IpAddr> = self.routes.keys().filter(|p| !wanted.contains_key(p)).copied().collect();
        for prefix in gone {
            if let Some(old) = self.routes.remove(&prefix).filter(|r| r.state != State::Withdrawn) {
                changes.push(Change {
                    prefix,
                    from: old.state,
                    to: State::Withdrawn,
                    reason: Reason::NoVip,
                    held: false,
                    peers: old.peers,
                });
            }
        }
        for (&prefix, &has_backends) in wanted {
            let peers = peers(prefix);
            let old = self.routes.get(&prefix).copied();
            let from = old.map_or(State::Withdrawn, |r| r.state);
            let (to, reason, held) = self.decide(old, has_backends, fault(prefix), peers, now_ms);
            let since_ms = if to == from && old.is_some() { old.map_or(now_ms, |r| r.since_ms) } else { now_ms };
            let was_held = old.is_some_and(|r| r.held);
            if to != from || held != was_held || old.is_some_and(|r| r.reason != reason && to != State::Withdrawn) {
                changes.push(Change { prefix, from, to, reason, held, peers });
            }
            self.routes.insert(prefix, Route { state: to, reason, since_ms, held, peers });
        }
        changes
    }

    fn decide(
        &self,
        old: Option<Route>,
        has_backends: bool,
        fault: Option<Fault>,
        peers: Option<u32>,
        now_ms: u64,
    ) -> (State, Reason, bool) {
        if !has_backends {
            return (State::Withdrawn, Reason::NoBackends, false);
        }
        let Some(fault) = fault else { return (State::Announced, Reason::Serving, false) };
        let reason = Reason::Fault(fault);
        let enough = self.floor == 0 || peers.is_some_and(|n| n >= self.floor);
        match old {
            Some(Route { state: State::Degraded, since_ms, .. }) => {
                if now_ms.saturating_sub(since_ms) < self.hold_ms {
                    (State::Degraded, reason, false)
                } else if enough {
                    (State::Withdrawn, reason, false)
                } else {
                    (State::Degraded, reason, true)
                }
            }
            Some(Route { state: State::Announced, .. }) => (State::Degraded, reason, false),
            // Withdrawn (or never announced): back on, degraded, only to keep the floor.
            _ if peers.is_some_and(|n| n < self.floor) => (State::Degraded, reason, false),
            _ => (State::Withdrawn, reason, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: u64 = 10_000;

    fn addr() -> IpAddr {
        "10.100.0.1".parse().unwrap()
    }

    fn wanted(has_backends: bool) -> BTreeMap<IpAddr, bool> {
        BTreeMap::from([(addr(), has_backends)])
    }

    /// One step with the data path `fault` and `peers` other balancers announcing normally.
    fn step(p: &mut Policy, fault: Option<Fault>, peers: Option<u32>, now_ms: u64) -> State {
        p.step(&wanted(true), &|_| fault, &|_| peers, now_ms);
        p.routes()[&addr()].state
    }

    #[test]
    fn a_serving_address_is_announced_and_load_is_no_input() {
        let mut p = Policy::new(1, HOLD);
        let changes = p.step(&wanted(true), &|_| None, &|_| Some(0), 0);
        assert_eq!(changes.len(), 1);
        assert_eq!((changes[0].from, changes[0].to, changes[0].reason), (State::Withdrawn, State::Announced, Reason::Serving));
        assert_eq!(p.announced(), vec![(addr(), false)]);
        // Nothing changes, nothing is reported.
        assert!(p.step(&wanted(true), &|_| None, &|_| Some(0), 5_000).is_empty());
    }

    #[test]
    fn a_fault_degrades_at_once_and_withdraws_after_the_hold_when_peers_suffice() {
        let mut p = Policy::new(1, HOLD);
        step(&mut p, None, Some(1), 0);
        let fault = Some(Fault::ProgramDetached);
        assert_eq!(step(&mut p, fault, Some(1), 1_000), State::Degraded);
        assert_eq!(p.announced(), vec![(addr(), true)]);
        assert_eq!(step(&mut p, fault, Some(1), 1_000 + HOLD - 1), State::Degraded);
        assert_eq!(step(&mut p, fault, Some(1), 1_000 + HOLD), State::Withdrawn);
        assert_eq!(p.routes()[&addr()].reason, Reason::Fault(Fault::ProgramDetached));
        assert!(p.announced().is_empty());
        // Repaired: announced again at once.
        assert_eq!(step(&mut p, None, Some(1), 20_000), State::Announced);
    }

    #[test]
    fn the_floor_holds_a_withdrawal_until_enough_others_announce() {
        let mut p = Policy::new(2, HOLD);
        step(&mut p, None, Some(1), 0);
        let fault = Some(Fault::InterfaceDown);
        step(&mut p, fault, Some(1), 0);
        let changes = p.step(&wanted(true), &|_| fault, &|_| Some(1), HOLD);
        assert_eq!(changes.len(), 1);
        assert!(changes[0].held && changes[0].to == State::Degraded, "{changes:?}");
        assert!(p.routes()[&addr()].held);
        // Unknown peers never allow it either.
        assert_eq!(step(&mut p, fault, None, 2 * HOLD), State::Degraded);
        assert_eq!(step(&mut p, fault, Some(2), 3 * HOLD), State::Withdrawn);
        // Peers fell below the floor again: back on, degraded.
        assert_eq!(step(&mut p, fault, Some(1), 4 * HOLD), State::Degraded);
        // Unknown peers do not force it back off or on.
        assert_eq!(step(&mut p, fault, None, 4 * HOLD + 1), State::Degraded);
    }

    #[test]
    fn balancers_failing_together_all_stay_announced() {
        // Two balancers, floor 1: each sees the other's route; a degraded route is no peer.
        let (mut a, mut b) = (Policy::new(1, HOLD), Policy::new(1, HOLD));
        let fault = Some(Fault::ProgramDetached);
        let normal = |p: &Policy| u32::from(p.routes()[&addr()].state == State::Announced);
        step(&mut a, None, Some(1), 0);
        step(&mut b, None, Some(1), 0);
        for t in (0..=5 * HOLD).step_by(500) {
            let (seen_by_a, seen_by_b) = (normal(&b), normal(&a));
            step(&mut a, fault, Some(seen_by_a), t);
            step(&mut b, fault, Some(seen_by_b), t);
            assert!(a.announced().len() + b.announced().len() >= 1, "both withdrew at {t}");
        }
        assert_eq!((a.routes()[&addr()].state, b.routes()[&addr()].state), (State::Degraded, State::Degraded));
    }

    #[test]
    fn no_backends_withdraws_and_a_removed_vip_is_forgotten() {
        let mut p = Policy::new(1, HOLD);
        step(&mut p, None, Some(0), 0);
        p.step(&wanted(false), &|_| None, &|_| Some(0), 1);
        assert_eq!(p.routes()[&addr()].reason, Reason::NoBackends);
        assert!(p.announced().is_empty());
        step(&mut p, None, Some(0), 2);
        let changes = p.step(&BTreeMap::new(), &|_| None, &|_| None, 3);
        assert_eq!((changes[0].to, changes[0].reason), (State::Withdrawn, Reason::NoVip));
        assert!(p.routes().is_empty());
    }

    #[test]
    fn an_address_never_announced_stays_off_while_the_data_path_is_down_unless_the_floor_needs_it() {
        let mut p = Policy::new(1, HOLD);
        let fault = Some(Fault::ForwardingDisabled);
        assert_eq!(step(&mut p, fault, Some(1), 0), State::Withdrawn);
        assert_eq!(step(&mut p, fault, Some(0), 1), State::Degraded);
    }

    #[test]
    fn a_restored_route_is_kept_until_decided() {
        let mut p = Policy::new(1, HOLD);
        p.restore([(addr(), true)], 0);
        assert_eq!(p.announced(), vec![(addr(), true)]);
        let changes = p.step(&wanted(true), &|_| None, &|_| Some(1), 1);
        assert_eq!((changes[0].from, changes[0].to), (State::Degraded, State::Announced));
        let mut p = Policy::new(1, HOLD);
        p.restore([(addr(), false)], 0);
        assert!(p.step(&wanted(true), &|_| None, &|_| Some(1), 1).is_empty(), "a restart changes nothing by itself");
    }

    #[test]
    fn floor_zero_withdraws_after_the_hold_without_knowing_peers() {
        let mut p = Policy::new(0, HOLD);
        step(&mut p, None, None, 0);
        step(&mut p, Some(Fault::InterfaceDown), None, 0);
        assert_eq!(step(&mut p, Some(Fault::InterfaceDown), None, HOLD), State::Withdrawn);
    }
}
