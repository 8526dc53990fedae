//! Minimizing a case the program and the model disagree on: fewer steps, a smaller state,
//! a shorter last frame, each change kept only while the case still fails, until none helps.

use spillway_model::DesiredState;

use super::{Difference, Lab, case::Case};

/// Replays at most (each reloads the state and replays the steps).
const ATTEMPTS: usize = 3000;

struct Shrinker<'l, 'e> {
    lab: &'l mut Lab<'e>,
    case: Case,
    difference: Difference,
    attempts: usize,
}

impl Shrinker<'_, '_> {
    /// Keeps `candidate` if it still fails (cut after the step that fails).
    fn try_keep(&mut self, mut candidate: Case) -> bool {
        if self.attempts >= ATTEMPTS {
            return false;
        }
        self.attempts += 1;
        match self.lab.run(&candidate, None) {
            Err(difference) => {
                candidate.steps.truncate(difference.step + 1);
                (self.case, self.difference) = (candidate, difference);
                true
            }
            Ok(()) => false,
        }
    }

    fn drop_steps(&mut self) {
        let mut i = 0;
        while i + 1 < self.case.steps.len() {
            let mut candidate = self.case.clone();
            candidate.steps.remove(i);
            if !self.try_keep(candidate) {
                i += 1;
            }
        }
    }

    /// Without the state before and the changes between frames, then one thing less at a
    /// time in each state, from the start again after each success.
    fn shrink_state(&mut self) {
        if self.case.before.is_some() {
            self.try_keep(Case { before: None, ..self.case.clone() });
        }
        for n in 0..self.case.steps.len() {
            if self.case.steps.get(n).is_some_and(|s| s.declare.is_some()) {
                let mut candidate = self.case.clone();
                candidate.steps[n].declare = None;
                self.try_keep(candidate);
            }
        }
        'smaller: loop {
            for state in smaller_states(&self.case.state) {
                if self.try_keep(Case { state, ..self.case.clone() }) {
                    continue 'smaller;
                }
            }
            let befores: Vec<DesiredState> = self.case.before.iter().flat_map(smaller_states).collect();
            for before in befores {
                if self.try_keep(Case { before: Some(before), ..self.case.clone() }) {
                    continue 'smaller;
                }
            }
            return;
        }
    }

    fn shorten_last_frame(&mut self) {
        let last = self.case.steps.len() - 1;
        for len in 14..self.case.steps[last].frame.len() {
            let mut candidate = self.case.clone();
            candidate.steps[last].frame.truncate(len);
            if self.try_keep(candidate) {
                return;
            }
        }
    }
}

pub fn minimize(lab: &mut Lab, mut case: Case, difference: Difference) -> (Case, Difference) {
    case.steps.truncate(difference.step + 1);
    let mut shrinker = Shrinker { lab, case, difference, attempts: 0 };
    loop {
        let before = shrinker.case.clone();
        shrinker.drop_steps();
        shrinker.shrink_state();
        shrinker.shorten_last_frame();
        if shrinker.case == before || shrinker.attempts >= ATTEMPTS {
            return (shrinker.case, shrinker.difference);
        }
    }
}

/// The state with one thing less, each way there is.
fn smaller_states(state: &DesiredState) -> Vec<DesiredState> {
    let mut out = Vec::new();
    for rule in state.rules.keys() {
        let mut s = state.clone();
        s.remove_rule(rule).unwrap();
        out.push(s);
    }
    if state.default_limits.is_some() {
        let mut s = state.clone();
        s.clear_limits(None).unwrap();
        out.push(s);
    }
    for (vip, config) in &state.vips {
        if config.limits.is_some() {
            let mut s = state.clone();
            s.clear_limits(Some(vip)).unwrap();
            out.push(s);
        }
        let mut s = state.clone();
        s.remove_vip(vip).unwrap();
        out.push(s);
        for backend in config.backends.keys() {
            let mut s = state.clone();
            s.remove_backend(vip, *backend).unwrap();
            out.push(s);
        }
    }
    out
}
