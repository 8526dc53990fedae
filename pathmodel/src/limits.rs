//! New-flow limits as the operator's documentation states them: the most specific matching
//! rule (a VIP's own rule wins at equal length) replaces the per-source limit; then the VIP's
//! budget. Buckets are GCRA: a flow is admitted while the bucket's clock (TAT) runs at most
//! the tolerance ahead of now, and moves it one interval; observe mode drops nothing.

use std::collections::HashMap;

use spillway_common::{
    limits::ANY_VIP,
    prefix::masked,
    types::{FAMILY_V4, FlowKey, LIMIT_F_OBSERVE_BUDGET, LIMIT_F_OBSERVE_SOURCE, RULE_BLOCK, RULE_LIMIT, Rate, Reason, RuleValue},
};

use crate::state::MapState;

/// The buckets the program keeps: each a theoretical arrival time, 0 when new.
#[derive(Default)]
pub(crate) struct Buckets {
    /// By (VIP id, family, source prefix).
    sources: HashMap<(u32, u8, [u32; 4]), u64>,
    budgets: HashMap<u32, u64>,
    rules: HashMap<u32, u64>,
}

/// The buckets of answers the program sends itself (echo replies, packets too big): one
/// per source prefix, and one for all sources.
#[derive(Default)]
pub(crate) struct AnswerBuckets {
    sources: HashMap<(u8, [u32; 4]), u64>,
    all: u64,
}

impl AnswerBuckets {
    /// An answer to `src` is due: one is taken from its prefix's bucket (IPv4 /32, IPv6
    /// `prefix_v6`), then from the bucket of all.
    pub(crate) fn admit(&mut self, (src, family, prefix_v6): (&[u32; 4], u8, u8), (per_source, all): (&Rate, &Rate), now: u64) -> bool {
        let prefix = if family == FAMILY_V4 { 32 } else { prefix_v6 };
        gcra(self.sources.entry((family, masked(src, prefix))).or_default(), per_source, now) && gcra(&mut self.all, all, now)
    }
}

/// GCRA on `tat`; a zero rate admits everything.
pub(crate) fn gcra(tat: &mut u64, rate: &Rate, now: u64) -> bool {
    if rate.per_s == 0 {
        return true;
    }
    let start = (*tat).max(now);
    if start + rate.interval_ns - now > rate.tolerance_ns {
        return false;
    }
    *tat = start + rate.interval_ns;
    true
}

/// The rule for the flow's source: longest prefix, the VIP's own before a global one.
fn matching_rule<'a>(state: &'a MapState, key: &FlowKey, vip_id: u32) -> Option<&'a RuleValue> {
    state
        .rules
        .iter()
        .filter(|(k, _)| (k.scope == vip_id || k.scope == ANY_VIP) && k.family == key.family && masked(&key.src, k.prefix_len) == k.addr)
        .max_by_key(|(k, _)| (k.prefix_len, k.scope != ANY_VIP))
        .map(|(_, v)| v)
}

impl Buckets {
    /// Whether a packet without a table entry may pass. A new flow meets every limit; any
    /// other packet only a block.
    pub(crate) fn admit(&mut self, state: &MapState, key: &FlowKey, vip_id: u32, now: u64, new_flow: bool) -> Result<(), Reason> {
        let rule = matching_rule(state, key, vip_id);
        if !new_flow {
            return match rule {
                Some(r) if r.action == RULE_BLOCK => self.apply_rule(r, now),
                _ => Ok(()),
            };
        }
        let limits = state.limits_of(vip_id);
        let flags = limits.map_or(0, |l| l.flags);
        if let Some(rule) = rule {
            self.apply_rule(rule, now)?;
        } else if let Some(l) = limits.filter(|l| l.per_source.per_s != 0) {
            let len = if key.family == FAMILY_V4 { l.source_prefix_v4 } else { l.source_prefix_v6 };
            let tat = self.sources.entry((vip_id, key.family, masked(&key.src, len))).or_default();
            if !gcra(tat, &l.per_source, now) {
                enforce(flags & LIMIT_F_OBSERVE_SOURCE != 0, Reason::DropSourceLimit)?;
            }
        }
        if let Some(l) = limits.filter(|l| l.vip_budget.per_s != 0)
            && !gcra(self.budgets.entry(vip_id).or_default(), &l.vip_budget, now)
        {
            enforce(flags & LIMIT_F_OBSERVE_BUDGET != 0, Reason::DropVipBudget)?;
        }
        Ok(())
    }

    fn apply_rule(&mut self, rule: &RuleValue, now: u64) -> Result<(), Reason> {
        let over = match rule.action {
            RULE_BLOCK => Some(Reason::DropRuleBlock),
            RULE_LIMIT if !gcra(self.rules.entry(rule.id).or_default(), &rule.rate, now) => Some(Reason::DropRuleLimit),
            _ => None,
        };
        match over {
            Some(reason) => enforce(rule.flags & LIMIT_F_OBSERVE_SOURCE != 0, reason),
            None => Ok(()),
        }
    }
}

fn enforce(observe: bool, reason: Reason) -> Result<(), Reason> {
    if observe { Ok(()) } else { Err(reason) }
}
