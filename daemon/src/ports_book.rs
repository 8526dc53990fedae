//! The latest port report of every host (the balancer's own, each backend's agent's), what
//! an agent's polls gave (a report, a failure, an ignored answer), and the [`Pressure`] a
//! report means for its backend: the core's record, which the pressure task fills.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Instant,
};

use spillway_api::PortsView;
use spillway_model::ports_report::{Level, PortsReport};
use spillway_policy::health::Pressure;

/// Logged (and repeated) while the balancer's own ports are critical, an alert meanwhile.
pub const LB_PORTS_CRITICAL_ALERT: &str = "ALERT: this balancer's own ephemeral ports are at the critical threshold (see lbctl ports)";

/// What a report means for the backend: connects failing for want of ports since the last
/// poll is `Exhausted`; any destination at the critical threshold is `Critical`.
pub fn classify(previous: Option<&PortsReport>, report: &PortsReport) -> Pressure {
    let failures = |r: &PortsReport| r.destinations.iter().map(|d| d.failures).sum::<u64>();
    if previous.is_some_and(|p| failures(report) > failures(p)) {
        return Pressure::Exhausted;
    }
    if report.level() == Level::Critical { Pressure::Critical } else { Pressure::None }
}

/// What one poll of an agent gave.
#[derive(Debug)]
pub enum AgentPoll {
    /// A report signed by the agent for this poll (boxed: the others are a line of text).
    Report(Box<PortsReport>),
    /// No report: the agent is unreachable or answered an error.
    Failed(String),
    /// An answer that cannot be told to be the agent's (why): ignored.
    Unauthenticated(String),
}

impl AgentPoll {
    /// The outcome of `agent_polls_total`.
    pub const fn outcome(&self) -> &'static str {
        match self {
            AgentPoll::Report(_) => "ok",
            AgentPoll::Failed(_) => "error",
            AgentPoll::Unauthenticated(_) => "unauthenticated",
        }
    }
}

struct Entry {
    at: Instant,
    report: Result<PortsReport, String>,
}

/// Failed polls in a row after which an agent counts as unreachable: one poll lost to a
/// busy host is no outage.
pub const UNREACHABLE_AFTER_POLLS: u32 = 2;

/// An agent whose polls fail.
#[derive(Clone, Debug)]
pub struct Unreachable {
    /// When its first failed poll in a row began.
    pub since: Instant,
    pub failed_polls: u32,
    /// Its last poll's error.
    pub error: String,
    /// It answered this `lbd` before: it stopped, rather than never ran.
    pub answered_before: bool,
}

impl Unreachable {
    pub fn counts(&self) -> bool {
        self.failed_polls >= UNREACHABLE_AFTER_POLLS
    }
}

/// The latest report of every host.
#[derive(Default)]
pub struct PortsBook {
    local: Option<Entry>,
    agents: BTreeMap<IpAddr, Entry>,
    /// Why each agent's last unauthenticated answer was ignored, until an authentic one.
    rejected: BTreeMap<IpAddr, String>,
    /// Agents whose last polls failed, until one answers.
    unreachable: BTreeMap<IpAddr, Unreachable>,
}

impl PortsBook {
    pub fn record_local(&mut self, report: Result<PortsReport, String>) {
        self.local = Some(Entry { at: Instant::now(), report });
    }

    /// The balancer's own ports are at the critical threshold.
    pub fn local_critical(&self) -> bool {
        self.local.as_ref().is_some_and(|e| e.report.as_ref().is_ok_and(|r| r.level() == Level::Critical))
    }

    /// Keeps `report` and returns the backend's pressure. An agent that cannot be reached
    /// says nothing about pressure: `None`, so a missing agent never costs a backend weight.
    pub fn record_agent(&mut self, backend: IpAddr, report: Result<PortsReport, String>) -> Pressure {
        let previous = self.agents.get(&backend).and_then(|e| e.report.as_ref().ok());
        let pressure = match &report {
            Ok(r) => {
                self.rejected.remove(&backend);
                self.unreachable.remove(&backend);
                classify(previous, r)
            }
            Err(error) => {
                let answered_before = previous.is_some();
                let failing = self.unreachable.entry(backend).or_insert_with(|| Unreachable {
                    since: Instant::now(),
                    failed_polls: 0,
                    error: String::new(),
                    answered_before,
                });
                failing.failed_polls += 1;
                failing.error.clone_from(error);
                Pressure::None
            }
        };
        self.agents.insert(backend, Entry { at: Instant::now(), report });
        pressure
    }

    /// Notes that `backend`'s answer was ignored (`why`); the report kept and the pressure
    /// are unchanged. True when this is news (not the reason already noted).
    pub fn record_rejected(&mut self, backend: IpAddr, why: String) -> bool {
        // Something answers: the ignored answer's ALERT says more than "unreachable".
        self.unreachable.remove(&backend);
        self.rejected.insert(backend, why.clone()).as_ref() != Some(&why)
    }

    /// The agents whose last answer was ignored, and why.
    pub fn rejected(&self) -> impl Iterator<Item = (&IpAddr, &String)> {
        self.rejected.iter()
    }

    /// `backend`'s agent, when it has failed [`UNREACHABLE_AFTER_POLLS`] polls in a row.
    pub fn unreachable(&self, backend: IpAddr) -> Option<&Unreachable> {
        self.unreachable.get(&backend).filter(|u| u.counts())
    }

    /// `backend`'s agent, when it answered this `lbd` before and has stopped: an ALERT.
    pub fn stopped_agent(&self, backend: IpAddr) -> Option<&Unreachable> {
        self.unreachable(backend).filter(|u| u.answered_before)
    }

    /// Every agent that answered this `lbd` before and has stopped.
    pub fn stopped_agents(&self) -> impl Iterator<Item = (&IpAddr, &Unreachable)> {
        self.unreachable.iter().filter(|(_, u)| u.counts() && u.answered_before)
    }

    /// Forgets hosts that are no longer backends.
    pub fn retain(&mut self, backends: &BTreeSet<IpAddr>) {
        self.agents.retain(|addr, _| backends.contains(addr));
        self.rejected.retain(|addr, _| backends.contains(addr));
        self.unreachable.retain(|addr, _| backends.contains(addr));
    }

    pub fn view(&self, host: Option<IpAddr>) -> PortsView {
        let (name, entry) = match host {
            None => ("lb".to_owned(), self.local.as_ref()),
            Some(addr) => (addr.to_string(), self.agents.get(&addr)),
        };
        match entry {
            None => PortsView {
                host: name,
                report: None,
                error: Some(match host {
                    None => "no report yet".to_owned(),
                    Some(_) => "not a backend of any VIP, or not polled yet".to_owned(),
                }),
                age_s: 0,
                stale: None,
            },
            Some(Entry { at, report }) => PortsView {
                host: name,
                report: report.as_ref().ok().cloned(),
                error: report.as_ref().err().cloned(),
                age_s: at.elapsed().as_secs(),
                // The report kept is the last authentic one; later answers were ignored.
                stale: host
                    .and_then(|addr| self.rejected.get(&addr))
                    .filter(|_| report.is_ok())
                    .map(|why| format!("last good report {} s ago; since then: answers ignored, {why}", at.elapsed().as_secs())),
            },
        }
    }
}
