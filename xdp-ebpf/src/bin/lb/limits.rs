//! Overload protection for new flows (a SYN, or a UDP packet without a connection-table
//! entry; established flows are never shed): operator rules, per-source buckets, the VIP's
//! budget, each optionally observe-only. Other packets without an entry (a TCP connection
//! that began elsewhere, an ICMP error about one) are charged to nothing, whether the table
//! is full or not; only blocks drop them.
//!
//! The source table also feeds `lbctl top-sources`. A flow needs a source bucket only when
//! its VIP has a per-source limit and no rule matched it; other new flows only touch the
//! table at random (`hash::in_sample`), one in `SOURCE_SAMPLE_UNLIMITED`, adding that many
//! to the counters (admitted or dropped, whatever dropped it: a rule, the budget), and adding the source if
//! the table does not hold it: their top-sources counts are unbiased estimates, and a
//! source that opened N new flows is missing only if none of them was sampled ((15/16)^N).
//! The LRU lookup and insert were a third of a new flow's cost; counting every refused flow
//! instead of a sample would add them to the refusals, which must stay cheap under a flood.
//! Rules are looked up only at the prefix lengths in use (a VIP flag says whether it has
//! rules of its own), and a rule's counters are per CPU: real drops and observe mode's
//! would-drops apart.
//!
//! Buckets use GCRA: the state is the theoretical arrival time (TAT) of the next flow. A flow
//! is admitted when `TAT + T - now <= burst * T`, which then advances TAT by `T = 1 s / rate`.
//! Only atomic adds touch a TAT under load, so the admitted rate is exact when one source's
//! packets arrive on several CPUs; a flow a plain read already shows over the limit is refused
//! without writing, so a flood refused by a bucket bounces no cache line between CPUs. The
//! one racy write is the catch-up of an idle bucket (`TAT < now`): CPUs catching up the same
//! bucket at the same instant may each lose the other's add, admitting at most `ncpu - 1`
//! extra flows per idle-to-busy transition — never under sustained overload, when TAT stays
//! ahead of now.

use core::ptr::{addr_of, read_volatile, write_volatile};

use spillway_common::{
    hash::{RULE_SEED, addr_hash, in_sample, rule_home},
    limits::{
        ANY_VIP, DEFAULT_SOURCE_PREFIX_V4, DEFAULT_SOURCE_PREFIX_V6, MAX_RULE_LENGTHS, RULE_SLOTS, SOURCE_SAMPLE_UNLIMITED, VIP_PROBES,
    },
    prefix::masked,
    types::{
        Bucket, FAMILY_V4, FlowKey, LIMIT_F_OBSERVE_BUDGET, LIMIT_F_OBSERVE_SOURCE, Limits, Observed, RULE_BLOCK, RULE_LIMIT, Rate, Reason,
        RuleValue, SourceKey, SourceState, VIP_F_SCOPED_RULES,
    },
};
use xdp_ebpf::atomic::add_u64;

use crate::maps::{BUDGET, LIMITS, OBSERVED, RULE_BUCKETS, RULE_COUNTERS, RULE_LENS, RULE_WOULD_DROP, RULES, SOURCES, default_limit_slot};
use crate::select::Vip;

/// Decides whether a packet without a table entry to `vip` may pass; `Err` carries the drop
/// reason. `flow_hash`: the flow's (the table seed's), which draws the sample. A `new_flow` goes through every limit; any other packet only through a block
/// (the rule's counters and observe mode apply; no bucket is charged).
#[inline(always)]
pub fn admit(key: &FlowKey, vip: &Vip, now: u64, new_flow: bool, flow_hash: u32) -> Result<(), Reason> {
    let rule = matching_rule(key, vip);
    if !new_flow {
        return match rule {
            Some(rule) if rule.action == RULE_BLOCK => apply_rule(rule, now),
            _ => Ok(()),
        };
    }
    let limits = effective_limits(vip.id);
    // Rules replace the per-source limit for the sources they match. A flow the per-source
    // limit applies to (enforced or observed) needs its source's bucket; any other only
    // feeds `top-sources`: a random sample updates the table, each counting for the flows it
    // stands for.
    let per_source = limits.filter(|l| rule.is_none() && l.per_source.per_s != 0);
    // What this flow counts for in its source's entry (0: not counted). A sample always
    // records its source: adding a new one on only 1 in 16 samples (1 in 256 flows) left
    // half the sources of 200 flows out of top-sources.
    let weight = if per_source.is_some() {
        1
    } else if in_sample(flow_hash, now, SOURCE_SAMPLE_UNLIMITED) {
        SOURCE_SAMPLE_UNLIMITED as u64
    } else {
        0
    };
    // Looked up before the limits, so that fewer values live across them.
    let source = if weight != 0 { source_state(key, vip.id, limits) } else { None };
    let verdict = decide(vip.id, limits, rule, per_source.and(source), now);
    if let Some(source) = source {
        // SAFETY: a live map value; shared by CPUs, hence atomic adds.
        let counter = unsafe { if verdict.is_ok() { &mut (*source).admitted } else { &mut (*source).dropped } };
        add(counter, weight);
    }
    verdict
}

/// `bucket`: the source's, when its per-source limit applies.
#[inline(always)]
fn decide(
    vip_id: u32,
    limits: Option<&Limits>,
    rule: Option<&RuleValue>,
    bucket: Option<*mut SourceState>,
    now: u64,
) -> Result<(), Reason> {
    let flags = limits.map_or(0, |l| l.flags);
    if let Some(rule) = rule {
        apply_rule(rule, now)?;
    } else if let (Some(l), Some(source)) = (limits, bucket)
        && !gcra_admit(unsafe { &mut (*source).bucket }, &l.per_source, now)
    {
        enforce(flags & LIMIT_F_OBSERVE_SOURCE != 0, Observed::SourceLimit, Reason::DropSourceLimit)?;
    }
    if let Some(l) = limits
        && l.vip_budget.per_s != 0
        && let Some(bucket) = BUDGET.get_ptr_mut(vip_id)
        && !gcra_admit(unsafe { &mut *bucket }, &l.vip_budget, now)
    {
        enforce(flags & LIMIT_F_OBSERVE_BUDGET != 0, Observed::VipBudget, Reason::DropVipBudget)?;
    }
    Ok(())
}

#[inline(always)]
fn apply_rule(rule: &RuleValue, now: u64) -> Result<(), Reason> {
    let Some(counters) = RULE_COUNTERS.get_ptr_mut(rule.id) else {
        return Ok(());
    };
    // SAFETY: a per-CPU slot, no other writer on this CPU while we run.
    let counters = unsafe { &mut *counters };
    counters.hits += 1;
    let over = match rule.action {
        RULE_BLOCK => Some((Observed::RuleBlock, Reason::DropRuleBlock)),
        RULE_LIMIT if RULE_BUCKETS.get_ptr_mut(rule.id).is_some_and(|bucket| !gcra_admit(unsafe { &mut *bucket }, &rule.rate, now)) => {
            Some((Observed::RuleLimit, Reason::DropRuleLimit))
        }
        // RULE_EXEMPT, or within the class's limit.
        _ => None,
    };
    let Some((observed, reason)) = over else {
        return Ok(());
    };
    let observe = rule.flags & LIMIT_F_OBSERVE_SOURCE != 0;
    // Real drops and would-drops apart: a rule that was observed, then enforced, shows both.
    if !observe {
        counters.dropped += 1;
    } else if let Some(would) = RULE_WOULD_DROP.get_ptr_mut(rule.id) {
        // SAFETY: a per-CPU slot, as above.
        unsafe { *would += 1 };
    }
    enforce(observe, observed, reason)
}

/// Counts the drop as observed and lets the flow through, or returns the drop.
#[inline(always)]
fn enforce(observe: bool, observed: Observed, reason: Reason) -> Result<(), Reason> {
    if !observe {
        return Err(reason);
    }
    if let Some(count) = OBSERVED.get_ptr_mut(observed as u32) {
        unsafe { *count += 1 };
    }
    Ok(())
}

/// The VIP's own limits, else the default, else none.
#[inline(always)]
fn effective_limits(vip_id: u32) -> Option<&'static Limits> {
    if let Some(l) = LIMITS.get(vip_id)
        && l.configured != 0
    {
        return Some(l);
    }
    LIMITS.get(default_limit_slot()).filter(|l| l.configured != 0)
}

/// The source prefix's entry, created if the table has none.
#[inline(always)]
fn source_state(key: &FlowKey, vip_id: u32, limits: Option<&Limits>) -> Option<*mut SourceState> {
    let prefix_len = match (key.family, limits) {
        (FAMILY_V4, Some(l)) => l.source_prefix_v4,
        (FAMILY_V4, None) => DEFAULT_SOURCE_PREFIX_V4,
        (_, Some(l)) => l.source_prefix_v6,
        (_, None) => DEFAULT_SOURCE_PREFIX_V6,
    };
    let skey = SourceKey { vip_id, family: key.family, _pad: [0; 3], prefix: masked(&key.src, prefix_len) };
    if let Some(state) = SOURCES.get_ptr_mut(&skey) {
        return Some(state);
    }
    // BPF_NOEXIST: of two CPUs creating the entry at once, the second keeps the first's.
    let _ = SOURCES.insert(&skey, &SourceState::default(), 1);
    SOURCES.get_ptr_mut(&skey)
}

/// The most specific of the rules scoped to this VIP and the global ones (at equal length
/// the scoped rule wins): the rule index is probed at the prefix lengths in use only, longest
/// first, so without rules this costs one array read. Each scope's longest length is probed
/// inline (a rule-limited flow, with one length per scope as is usual, makes no call), the
/// shorter ones through [`spillway_rule_slot`].
#[inline(always)]
fn matching_rule(key: &FlowKey, vip: &Vip) -> Option<&'static RuleValue> {
    let none = [0u8; MAX_RULE_LENGTHS];
    let lens = |slot| match RULE_LENS.get(slot) {
        Some(l) if key.family == FAMILY_V4 => l.v4,
        Some(l) => l.v6,
        None => none,
    };
    let mut found: Option<&'static RuleValue> = None;
    // Both lists are longest first: the first scoped match is the VIP's most specific rule,
    // and only a strictly longer global one beats it.
    if vip.flags & VIP_F_SCOPED_RULES != 0 {
        for (i, len) in lens(vip.id).into_iter().enumerate() {
            if len == 0 {
                break;
            }
            found = rule_at(key, vip.id, len - 1, i == 0);
            if found.is_some() {
                break;
            }
        }
    }
    let beat = found.map_or(0, |rule| rule.addr_prefix_len as u32 + 1);
    for (i, len) in lens(default_limit_slot()).into_iter().enumerate() {
        if (len as u32) <= beat {
            break;
        }
        if let Some(rule) = rule_at(key, ANY_VIP, len - 1, i == 0) {
            return Some(rule);
        }
    }
    found
}

/// The rule of `scope` for the source's `/len` prefix, if there is one; probed `inline` or
/// by a call.
#[inline(always)]
fn rule_at(key: &FlowKey, scope: u32, len: u8, inline: bool) -> Option<&'static RuleValue> {
    let slot = if inline { rule_slot(key, scope, len)? } else { spillway_rule_slot(key, scope, len as u32).checked_sub(1)? };
    RULES.get(slot).map(|s| &s.value)
}

/// [`rule_slot`] as a BPF global function (`#[unsafe(no_mangle)]` gives it BTF linkage
/// global), verified once on its own for any arguments: inline, its probe sequence, unrolled
/// for each of up to 2 * MAX_RULE_LENGTHS lengths, was walked once per state the path brought
/// to the limits (most of the balancer's verifier budget). A call costs ~20 ns here
/// (ARCHITECTURE.md, "verifier budget"), paid only by flows probed at a scope's second
/// length or beyond, once per length. The rule's slot + 1; 0: none.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn spillway_rule_slot(key: *const FlowKey, scope: u32, len: u32) -> u32 {
    // SAFETY: the caller passes its own key; the verifier assumes a global function's
    // pointer argument may be NULL, so that is checked rather than assumed away.
    let Some(key) = (unsafe { key.as_ref() }) else {
        return 0;
    };
    rule_slot(key, scope, len as u8).map_or(0, |slot| slot + 1)
}

/// The slot of `scope`'s rule for the source's `/len` prefix in the rule index. The key is
/// compared field by field, not copied out: the function's frame, on top of the balancer's
/// (512 bytes for the two), has no room for two copies of it.
#[inline(always)]
fn rule_slot(key: &FlowKey, scope: u32, len: u8) -> Option<u32> {
    let addr = masked(&key.src, len);
    let mask = RULE_SLOTS - 1;
    let home = rule_home(addr_hash(&addr, RULE_SEED), scope, key.family, len, mask);
    // SAFETY (all): live map values, written by the loader as the VIP index is (family
    // published last, cleared first).
    let probes = unsafe { read_volatile(addr_of!((*RULES.get_ptr(home)?).probes)) };
    for i in 0..VIP_PROBES {
        if i >= probes {
            break;
        }
        let index = (home + i) & mask;
        let slot = RULES.get_ptr(index)?;
        unsafe {
            let k = addr_of!((*slot).key);
            if read_volatile(addr_of!((*k).family)) == key.family
                && read_volatile(addr_of!((*k).scope)) == scope
                && read_volatile(addr_of!((*k).prefix_len)) == len
                && read_volatile(addr_of!((*k)._pad)) == [0; 2]
                && (0..4).all(|w| read_volatile(addr_of!((*k).addr[w])) == addr[w])
            {
                return Some(index);
            }
        }
    }
    None
}

/// GCRA admission (see the module docs); a zero rate admits everything.
#[inline(always)]
pub(crate) fn gcra_admit(bucket: &mut Bucket, rate: &Rate, now: u64) -> bool {
    let (interval, tolerance) = (rate.interval_ns, rate.tolerance_ns);
    if rate.per_s == 0 {
        return true;
    }
    let tat: *mut u64 = &mut bucket.tat_ns;
    // SAFETY: a live, 8-byte aligned map value; volatile so every read sees other CPUs' adds.
    unsafe {
        let seen = read_volatile(tat);
        // Over the limit already: refuse without writing (the add below could only fail).
        if seen.max(now) + interval - now > tolerance {
            return false;
        }
        if seen < now {
            write_volatile(tat, now);
        }
        add_u64(tat, interval);
        if read_volatile(tat).saturating_sub(now) > tolerance {
            add_u64(tat, interval.wrapping_neg());
            return false;
        }
    }
    true
}

#[inline(always)]
fn add(counter: &mut u64, n: u64) {
    // SAFETY: a live, 8-byte aligned map value shared by CPUs.
    unsafe { add_u64(counter, n) };
}
