//! Announcing VIP addresses over BGP through a BIRD 2 daemon on the same host.
//!
//! `lbd` never speaks BGP: it writes a BIRD configuration include ([`include`]) listing the
//! addresses to announce and asks BIRD, over its control socket ([`bird`]), to load it.
//! BIRD keeps the sessions. Whether an address is announced, degraded or withdrawn is the
//! pure [`policy`]; its inputs are the data path's state, the desired state, and the other
//! balancers' announcements of the same address as this balancer's BIRD has them in its
//! table (the routers send every path back to each balancer with ADD-PATH).
//!
//! Crashes and restarts are hitless by construction: nothing is withdrawn when `lbd` stops
//! (the include stays, BIRD keeps announcing it), and a starting `lbd` takes the include
//! over as its starting point, so it rewrites nothing while the state is unchanged.

pub mod bird;
pub mod include;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::PathBuf,
};

use self::{
    bird::{Bird, BirdError},
    include::{GRACEFUL_SHUTDOWN, IncludeError, PROTOCOL4, PROTOCOL6, TABLE4, TABLE6},
};
use spillway_api::announce::{AnnouncementChanges, AnnouncementView, Announcements};
use spillway_logging::error_chain;
use spillway_logging::event;
use spillway_policy::announce::{Change, Fault, Policy, State};

/// Where BIRD is and how the fleet decides withdrawals.
#[derive(Clone, Debug)]
pub struct AnnounceConfig {
    /// BIRD's control socket.
    pub socket: PathBuf,
    /// The include `lbd` writes (and `bird.conf` includes).
    pub include: PathBuf,
    /// Other balancers that must announce an address normally before this one withdraws it.
    pub floor: u32,
    /// How long an address stays degraded before it may be withdrawn.
    pub hold_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    #[error(transparent)]
    Include(#[from] IncludeError),
    #[error(transparent)]
    Bird(#[from] BirdError),
}

pub struct Announcer {
    config: AnnounceConfig,
    policy: Policy,
    /// The include text BIRD last loaded from us (`None`: not since `lbd` started).
    loaded: Option<String>,
    /// The last problem with BIRD or the include, logged once per distinct message.
    error: Option<String>,
    changes: BTreeMap<(IpAddr, State), u64>,
}

impl Announcer {
    /// Takes over what the include announces now (left by an earlier `lbd`).
    pub fn start(config: AnnounceConfig, now_ms: u64) -> Result<Self, AnnounceError> {
        let mut policy = Policy::new(config.floor, config.hold_ms);
        let existing = include::read(&config.include)?.unwrap_or_default();
        let restored = include::parse(&existing);
        event!(
            info,
            "announcements_restored",
            include = config.include.display(),
            announced = restored.iter().filter(|(_, d)| !d).count(),
            degraded = restored.iter().filter(|(_, d)| *d).count(),
            floor = config.floor,
            hold_s = config.hold_ms / 1000
        );
        policy.restore(restored, now_ms);
        Ok(Self { config, policy, loaded: None, error: None, changes: BTreeMap::new() })
    }

    /// One round: asks BIRD what the other balancers announce, decides every address
    /// (`wanted`: the VIP addresses, each with whether a VIP on it has a backend; `fault`:
    /// why the data path cannot forward an address's family), logs each change, and has BIRD
    /// load the include if it differs from what BIRD has.
    pub fn step(&mut self, wanted: &BTreeMap<IpAddr, bool>, fault: &dyn Fn(IpAddr) -> Option<Fault>, now_ms: u64) -> Announcements {
        let mut bird = Bird::connect(&self.config.socket);
        let peers: BTreeMap<IpAddr, Option<u32>> = match &mut bird {
            Ok(bird) => {
                let local = local_addresses();
                wanted.keys().map(|&prefix| (prefix, peers(bird, prefix, &local).ok())).collect()
            }
            Err(_) => BTreeMap::new(),
        };
        let changes = self.policy.step(wanted, fault, &|p| peers.get(&p).copied().flatten(), now_ms);
        for change in &changes {
            self.log(change);
            if change.to != change.from {
                *self.changes.entry((change.prefix, change.to)).or_default() += 1;
            }
        }
        let result = self.publish(bird);
        self.note(result.err());
        self.view(now_ms)
    }

    /// Writes the include if it differs from what it should hold (also while BIRD is down:
    /// it reads the file when it starts), and has BIRD load it unless BIRD already did.
    fn publish(&mut self, bird: Result<Bird, BirdError>) -> Result<(), AnnounceError> {
        let text = include::render(&self.policy.announced());
        if include::read(&self.config.include)?.as_deref() != Some(&text) {
            include::write(&self.config.include, &text)?;
            self.loaded = None;
        }
        if self.loaded.as_deref() != Some(&text) {
            bird?.configure()?;
            self.loaded = Some(text);
        }
        Ok(())
    }

    /// Records the round's outcome; a new problem is logged once, its end too.
    fn note(&mut self, error: Option<AnnounceError>) {
        let message = error.map(|e| error_chain(&e));
        if message == self.error {
            return;
        }
        match &message {
            Some(m) => event!(
                error,
                "bird_failed",
                socket = self.config.socket.display(),
                error = m,
                effect = "announcements cannot change until BIRD answers and accepts the configuration"
            ),
            None => event!(info, "bird_ok", socket = self.config.socket.display()),
        }
        self.error = message;
    }

    fn log(&self, c: &Change) {
        let prefix = host_route(c.prefix);
        let peers = c.peers.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        let floor = self.policy.floor();
        match c.to {
            State::Announced => event!(info, "announce", prefix = prefix, reason = c.reason, from = c.from.label()),
            State::Withdrawn => {
                event!(warn, "withdraw", prefix = prefix, reason = c.reason, from = c.from.label(), peers = peers, floor = floor)
            }
            State::Degraded if c.held => event!(
                warn,
                "withdraw_held",
                prefix = prefix,
                reason = c.reason,
                peers = peers,
                floor = floor,
                effect = "fewer other balancers announce it than the floor: kept announced, degraded"
            ),
            State::Degraded => event!(
                warn,
                "announce_degraded",
                prefix = prefix,
                reason = c.reason,
                from = c.from.label(),
                peers = peers,
                floor = floor,
                community = "GRACEFUL_SHUTDOWN"
            ),
        }
    }

    fn view(&self, now_ms: u64) -> Announcements {
        let routes = self
            .policy
            .routes()
            .iter()
            .map(|(prefix, r)| AnnouncementView {
                address: *prefix,
                state: r.state.label().to_owned(),
                reason: r.reason.label().to_owned(),
                for_s: now_ms.saturating_sub(r.since_ms) / 1000,
                peers: r.peers,
                floor: self.policy.floor(),
                held: r.held,
            })
            .collect();
        let changes = self
            .changes
            .iter()
            .map(|((address, state), count)| AnnouncementChanges { address: *address, state: state.label().to_owned(), count: *count })
            .collect();
        Announcements { routes, bird_error: self.error.clone(), changes }
    }
}

/// `lbd --cleanup`: announces nothing any more (the balancer is being taken apart).
pub fn withdraw_all(config: &AnnounceConfig) -> Result<usize, AnnounceError> {
    let announced = include::read(&config.include)?.map(|t| include::parse(&t).len()).unwrap_or(0);
    include::write(&config.include, &include::render(&[]))?;
    Bird::connect(&config.socket)?.configure()?;
    Ok(announced)
}

/// Other balancers announcing `prefix` normally: distinct BGP next hops (each balancer
/// announces with itself as next hop; routers keep it) of paths without GRACEFUL_SHUTDOWN,
/// this host's own addresses excepted.
fn peers(bird: &mut Bird, prefix: IpAddr, local: &BTreeSet<IpAddr>) -> Result<u32, BirdError> {
    let table = if prefix.is_ipv4() { TABLE4 } else { TABLE6 };
    let routes = bird.routes(table, prefix)?;
    let hops: BTreeSet<IpAddr> = routes
        .iter()
        .filter(|r| r.protocol != PROTOCOL4 && r.protocol != PROTOCOL6 && !r.communities.contains(&GRACEFUL_SHUTDOWN))
        .filter_map(|r| r.next_hop)
        .filter(|hop| !local.contains(hop))
        .collect();
    Ok(hops.len() as u32)
}

fn local_addresses() -> BTreeSet<IpAddr> {
    spillway_dataplane::netif::addresses().map(|all| all.into_iter().map(|(_, a)| a).collect()).unwrap_or_default()
}

/// `10.0.0.1/32`, `fd00::1/128`.
pub fn host_route(addr: IpAddr) -> String {
    format!("{addr}/{}", if addr.is_ipv4() { 32 } else { 128 })
}
