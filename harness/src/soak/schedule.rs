//! The seeded schedule: what the soak does to the fleet, step by step. The generator keeps
//! the desired state it leads to (the model), so it only proposes what an operator could
//! do to that state and the runner knows what every balancer must show after each step.
//! Step `n` of a seed is always the same step, whatever the timing of the run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::rng::Rng;

/// Weights an operator sets.
const WEIGHTS: [u32; 4] = [50, 100, 150, 200];
/// A VIP keeps this many backends taking new flows: nothing the schedule does needs
/// `--force`, and a backend killed during a flap leaves one to serve.
pub const MIN_ACTIVE: usize = 2;

/// The rules the schedule adds and removes: on prefixes no client of the fleet is in, so
/// they change the rule index (and its maps) while the traffic must not notice.
pub const RULES: [Rule; 3] = [
    Rule { cidr: "192.0.2.0/24", action: RuleAction::Block, echo_only: false },
    Rule { cidr: "198.51.100.0/24", action: RuleAction::Limit(1000), echo_only: true },
    Rule { cidr: "203.0.113.0/25", action: RuleAction::Exempt, echo_only: false },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub cidr: &'static str,
    pub action: RuleAction,
    /// Only on the echo VIP, else on every VIP.
    pub echo_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleAction {
    Block,
    Limit(u32),
    Exempt,
}

/// A backend in the set of both VIPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub weight: u32,
    pub drained: bool,
}

/// The fleet's desired state: the same backends on both VIPs, and rules (indexes into
/// [`RULES`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub members: BTreeMap<usize, Member>,
    pub rules: BTreeSet<usize>,
}

impl State {
    /// Backends `0..backends - 1` at weight 100, no rules: the last backend starts outside.
    pub fn initial(backends: usize) -> State {
        let members = (0..backends - 1).map(|b| (b, Member { weight: 100, drained: false })).collect();
        State { members, rules: BTreeSet::new() }
    }

    pub fn active(&self) -> usize {
        self.members.values().filter(|m| !m.drained).count()
    }

    /// Whether `b` takes new flows.
    pub fn is_active(&self, b: usize) -> bool {
        self.members.get(&b).is_some_and(|m| !m.drained)
    }
}

/// The fleet the schedule runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub balancers: usize,
    pub backends: usize,
}

/// One thing done to the fleet. Backends and balancers are indexes (backend 0 is `b1`,
/// balancer 0 `lb1`). Every fault is undone within its step (a killed process is started
/// again), so every change reaches every balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `lbctl backends add` on both VIPs, on every balancer.
    AddBackend {
        backend: usize,
        weight: u32,
    },
    RemoveBackend {
        backend: usize,
    },
    Drain {
        backend: usize,
    },
    /// Also undoes a drain.
    SetWeight {
        backend: usize,
        weight: u32,
    },
    /// `lbctl apply -f` of a whole new state, on every balancer.
    ApplyFile {
        state: State,
    },
    AddRule {
        rule: usize,
    },
    RemoveRule {
        rule: usize,
    },
    /// SIGKILL of the backend's echo and capacity servers (its connections die, its health
    /// checks fail), `down_ms` later started again.
    FlapServer {
        backend: usize,
        down_ms: u64,
    },
    /// SIGKILL of the backend's agent, started again at once.
    RestartAgent {
        backend: usize,
    },
    /// SIGKILL of the balancer's `lbd`, started again `down_ms` later.
    KillLbd {
        balancer: usize,
        down_ms: u64,
    },
    /// SIGKILL of the balancer's BIRD: the router drops it and ECMP moves its flows.
    KillBird {
        balancer: usize,
        down_ms: u64,
    },
    /// The balancer dies: link down, `lbd` and BIRD SIGKILLed; then all back.
    KillBalancer {
        balancer: usize,
        down_ms: u64,
    },
}

impl Op {
    /// A short name, for counting steps by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::AddBackend { .. } => "add_backend",
            Op::RemoveBackend { .. } => "remove_backend",
            Op::Drain { .. } => "drain",
            Op::SetWeight { .. } => "set_weight",
            Op::ApplyFile { .. } => "apply_file",
            Op::AddRule { .. } => "add_rule",
            Op::RemoveRule { .. } => "remove_rule",
            Op::FlapServer { .. } => "flap_server",
            Op::RestartAgent { .. } => "restart_agent",
            Op::KillLbd { .. } => "kill_lbd",
            Op::KillBird { .. } => "kill_bird",
            Op::KillBalancer { .. } => "kill_balancer",
        }
    }

    /// Whether ECMP moves flows between balancers (the router's set of next hops changes).
    pub fn moves_flows(&self) -> bool {
        matches!(self, Op::KillBird { .. } | Op::KillBalancer { .. })
    }

    /// The balancer whose processes this step kills, if any.
    pub fn balancer(&self) -> Option<usize> {
        match self {
            Op::KillLbd { balancer, .. } | Op::KillBird { balancer, .. } | Op::KillBalancer { balancer, .. } => Some(*balancer),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |i: &usize| format!("b{}", i + 1);
        let lb = |i: &usize| format!("lb{}", i + 1);
        match self {
            Op::AddBackend { backend, weight } => write!(f, "add {} weight {weight}", b(backend)),
            Op::RemoveBackend { backend } => write!(f, "remove {}", b(backend)),
            Op::Drain { backend } => write!(f, "drain {}", b(backend)),
            Op::SetWeight { backend, weight } => write!(f, "set {} weight {weight}", b(backend)),
            Op::ApplyFile { state } => {
                let members: Vec<String> = state
                    .members
                    .iter()
                    .map(|(i, m)| format!("{}:{}{}", b(i), m.weight, if m.drained { " drained" } else { "" }))
                    .collect();
                write!(f, "apply a file with [{}] rules {:?}", members.join(", "), state.rules)
            }
            Op::AddRule { rule } => write!(f, "add rule {}", RULES[*rule].cidr),
            Op::RemoveRule { rule } => write!(f, "remove rule {}", RULES[*rule].cidr),
            Op::FlapServer { backend, down_ms } => write!(f, "kill the servers of {} for {down_ms} ms", b(backend)),
            Op::RestartAgent { backend } => write!(f, "kill and restart the agent of {}", b(backend)),
            Op::KillLbd { balancer, down_ms } => write!(f, "SIGKILL lbd of {} for {down_ms} ms", lb(balancer)),
            Op::KillBird { balancer, down_ms } => write!(f, "SIGKILL BIRD of {} for {down_ms} ms", lb(balancer)),
            Op::KillBalancer { balancer, down_ms } => write!(f, "kill balancer {} for {down_ms} ms", lb(balancer)),
        }
    }
}

/// One step: its number (from 1), what to do, and the pause after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub index: usize,
    pub op: Op,
    pub pause_ms: u64,
}

/// The steps of a seed, endless: the runner takes them until its time is up.
#[derive(Clone, Debug)]
pub struct Schedule {
    rng: Rng,
    shape: Shape,
    state: State,
    next: usize,
}

impl Schedule {
    pub fn new(seed: u64, shape: Shape) -> Schedule {
        Schedule { rng: Rng::new(seed), shape, state: State::initial(shape.backends), next: 1 }
    }

    /// The desired state after the steps taken so far.
    pub fn state(&self) -> &State {
        &self.state
    }

    fn op(&mut self) -> Op {
        let shape = self.shape;
        let roll = self.rng.below(100);
        let proposed = match roll {
            0..=11 => self.add(),
            12..=21 => self.remove(),
            22..=29 => self.drain(),
            30..=39 => None, // set_weight, below
            40..=46 => Some(self.apply_file()),
            47..=56 => Some(self.toggle_rule()),
            57..=68 => {
                let backend = self.rng.below(shape.backends as u64) as usize;
                Some(Op::FlapServer { backend, down_ms: self.rng.range(500, 3000) })
            }
            69..=73 => Some(Op::RestartAgent { backend: self.rng.below(shape.backends as u64) as usize }),
            74..=84 => Some(Op::KillLbd { balancer: self.balancer(), down_ms: self.rng.range(0, 1500) }),
            85..=92 => Some(Op::KillBird { balancer: self.balancer(), down_ms: self.rng.range(200, 3000) }),
            _ => Some(Op::KillBalancer { balancer: self.balancer(), down_ms: self.rng.range(500, 3000) }),
        };
        proposed.unwrap_or_else(|| self.set_weight())
    }

    fn balancer(&mut self) -> usize {
        self.rng.below(self.shape.balancers as u64) as usize
    }

    fn weight(&mut self) -> u32 {
        self.rng.pick(&WEIGHTS)
    }

    fn add(&mut self) -> Option<Op> {
        let outside: Vec<usize> = (0..self.shape.backends).filter(|b| !self.state.members.contains_key(b)).collect();
        if outside.is_empty() {
            return None;
        }
        let backend = self.rng.pick(&outside);
        Some(Op::AddBackend { backend, weight: self.weight() })
    }

    fn remove(&mut self) -> Option<Op> {
        let spare = self.state.active() > MIN_ACTIVE;
        let removable: Vec<usize> = self.state.members.iter().filter(|(_, m)| m.drained || spare).map(|(b, _)| *b).collect();
        (!removable.is_empty()).then(|| Op::RemoveBackend { backend: self.rng.pick(&removable) })
    }

    fn drain(&mut self) -> Option<Op> {
        if self.state.active() <= MIN_ACTIVE {
            return None;
        }
        let active: Vec<usize> = self.state.members.iter().filter(|(_, m)| !m.drained).map(|(b, _)| *b).collect();
        Some(Op::Drain { backend: self.rng.pick(&active) })
    }

    fn set_weight(&mut self) -> Op {
        let members: Vec<usize> = self.state.members.keys().copied().collect();
        let backend = self.rng.pick(&members);
        Op::SetWeight { backend, weight: self.weight() }
    }

    /// A new state: each backend in with odds of two in three, some drained, at least
    /// [`MIN_ACTIVE`] active; a random subset of the rules.
    fn apply_file(&mut self) -> Op {
        let mut state = State::default();
        for b in 0..self.shape.backends {
            if self.rng.chance(67) {
                let drained = self.rng.chance(20);
                state.members.insert(b, Member { weight: self.weight(), drained });
            }
        }
        let mut b = 0;
        while state.active() < MIN_ACTIVE {
            if !state.is_active(b) {
                state.members.insert(b, Member { weight: self.weight(), drained: false });
            }
            b += 1;
        }
        state.rules = (0..RULES.len()).filter(|_| self.rng.chance(50)).collect();
        Op::ApplyFile { state }
    }

    fn toggle_rule(&mut self) -> Op {
        let rule = self.rng.below(RULES.len() as u64) as usize;
        if self.state.rules.contains(&rule) { Op::RemoveRule { rule } } else { Op::AddRule { rule } }
    }
}

/// The state after `op` (faults change none).
pub fn apply(state: &mut State, op: &Op) {
    match op {
        Op::AddBackend { backend, weight } => {
            state.members.insert(*backend, Member { weight: *weight, drained: false });
        }
        Op::RemoveBackend { backend } => {
            state.members.remove(backend);
        }
        Op::Drain { backend } => {
            if let Some(m) = state.members.get_mut(backend) {
                m.drained = true;
            }
        }
        Op::SetWeight { backend, weight } => {
            if let Some(m) = state.members.get_mut(backend) {
                *m = Member { weight: *weight, drained: false };
            }
        }
        Op::ApplyFile { state: new } => *state = new.clone(),
        Op::AddRule { rule } => {
            state.rules.insert(*rule);
        }
        Op::RemoveRule { rule } => {
            state.rules.remove(rule);
        }
        Op::FlapServer { .. } | Op::RestartAgent { .. } | Op::KillLbd { .. } | Op::KillBird { .. } | Op::KillBalancer { .. } => {}
    }
}

impl Iterator for Schedule {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        let op = self.op();
        apply(&mut self.state, &op);
        let step = Step { index: self.next, op, pause_ms: self.rng.range(100, 1500) };
        self.next += 1;
        Some(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape { balancers: 2, backends: 4 };

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let a: Vec<Step> = Schedule::new(42, SHAPE).take(500).collect();
        let b: Vec<Step> = Schedule::new(42, SHAPE).take(500).collect();
        assert_eq!(a, b);
        let c: Vec<Step> = Schedule::new(43, SHAPE).take(500).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn every_kind_comes_and_the_state_stays_servable() {
        let mut kinds = BTreeSet::new();
        let mut schedule = Schedule::new(1, SHAPE);
        for step in schedule.by_ref().take(2000) {
            kinds.insert(step.op.kind());
            assert!(step.op.balancer().is_none_or(|b| b < SHAPE.balancers), "{}", step.op);
            assert!((100..=1500).contains(&step.pause_ms));
        }
        assert_eq!(kinds.len(), 12, "{kinds:?}");
        let mut schedule = Schedule::new(2, SHAPE);
        for _ in 0..2000 {
            schedule.next();
            let state = schedule.state();
            assert!(state.active() >= MIN_ACTIVE, "{state:?}");
            assert!(state.members.keys().all(|b| *b < SHAPE.backends), "{state:?}");
        }
    }
}
