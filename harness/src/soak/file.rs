//! The model as the fleet's configuration file (`lbctl apply -f`), and as what
//! `lbctl backends list` and `lbctl rules list` must show.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::schedule::{RULES, RuleAction, State};

/// A backend's slow start ([`health`]): `lbd`'s default, on the wall clock in ten steps.
pub const SLOW_START_MS: u64 = 30_000;

/// The health checks of both VIPs: fast (a flap is seen within about a second and a half; a
/// probe may take 500 ms on a busy host), slow start on ([`SLOW_START_MS`]: a backend added,
/// given a weight again or readmitted ramps up, and the balancers program the same ramp),
/// short hold-downs (the schedule flaps a backend often and wants it back within its step),
/// and every failed backend ejected (a flap of a heavy backend must take it out, not be
/// capped).
fn health() -> String {
    format!(
        "[vips.health]\nprobe = {{ kind = \"tcp\" }}\n[vips.health.policy]\ninterval_ms = 500\ntimeout_ms = 500\n\
         slow_start_ms = {SLOW_START_MS}\nhold_down_base_ms = 500\nhold_down_max_ms = 1000\nmax_ejection_fraction = 1.0\n\
         panic_threshold = 0.1\n"
    )
}

/// The file declaring `state` for `vips` (the first is the echo VIP), `addrs[b]` the
/// address of backend `b`.
pub fn render(state: &State, vips: &[String], addrs: &[String]) -> String {
    let mut toml = String::from("# The soak's desired state, applied on every balancer.\n");
    for vip in vips {
        let _ = write!(toml, "\n[[vips]]\nvip = \"{vip}\"\n{}", health());
        for (b, m) in &state.members {
            let _ = write!(toml, "\n[[vips.backends]]\naddress = \"{}\"\nweight = {}\n", addrs[*b], m.weight);
            if m.drained {
                toml.push_str("drain = true\n");
            }
        }
    }
    for r in &state.rules {
        let rule = RULES[*r];
        let _ = write!(toml, "\n[[rules]]\ncidr = \"{}\"\n", rule.cidr);
        if rule.echo_only {
            let _ = writeln!(toml, "vip = \"{}\"", vips[0]);
        }
        match rule.action {
            RuleAction::Block => toml.push_str("action = \"block\"\n"),
            RuleAction::Exempt => toml.push_str("action = \"exempt\"\n"),
            RuleAction::Limit(n) => {
                let _ = write!(toml, "action = \"limit\"\nper_s = {n}\n");
            }
        }
    }
    toml
}

/// A VIP's backends as `lbctl backends list -o json` shows them: (address, weight, state).
pub fn backends_of(state: &State, addrs: &[String]) -> BTreeSet<(String, u64, String)> {
    state
        .members
        .iter()
        .map(|(b, m)| {
            let (weight, st) = if m.drained { (0, "draining") } else { (u64::from(m.weight), "active") };
            (addrs[*b].clone(), weight, st.to_owned())
        })
        .collect()
}

/// The rules as `lbctl rules list -o json` shows them: (cidr, vip or `*`, action).
pub fn rules_of(state: &State, echo_vip: &str) -> BTreeSet<(String, String, String)> {
    state
        .rules
        .iter()
        .map(|r| {
            let rule = RULES[*r];
            let action = match rule.action {
                RuleAction::Block => "block",
                RuleAction::Limit(_) => "limit",
                RuleAction::Exempt => "exempt",
            };
            (rule.cidr.to_owned(), if rule.echo_only { echo_vip.to_owned() } else { "*".to_owned() }, action.to_owned())
        })
        .collect()
}
