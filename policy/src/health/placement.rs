//! Where a VIP's new flows go across zones, and how many it admits. Runs after the health
//! plan (which decided each backend's weight), so ejection caps and panic are already in the
//! weights this sees.
//!
//! - New flows stay in the balancer's own zone (backends without a zone count as local).
//! - They spill to other zones only while local capacity is short of what it was declared
//!   to be, and only up to the other zones' declared *spare* capacity.
//! - When every backend declares a capacity (new flows per second), the VIP admits at most
//!   what the programmed backends can take: local capacity in service plus the spill. What
//!   does not fit is shed at the edge by the VIP budget, never pushed onto another zone (or
//!   onto the survivors of this one) beyond its capacity.
//!
//! A backend's capacity in service is its declared capacity scaled by its programmed weight
//! over its configured weight: slow start and slowness lower it, an ejected backend has none,
//! and a failed backend kept in by the ejection cap (or by fail-open panic) counts fully,
//! since it is in the table.

use std::{collections::BTreeMap, net::IpAddr};

/// One backend as the health plan left it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    pub backend: IpAddr,
    pub zone: Option<&'a str>,
    /// The operator's weight; 0 = draining (ignored here: it has no new flows either way).
    pub configured_weight: u32,
    /// The weight the health plan gave it.
    pub weight: u32,
    pub capacity_per_s: Option<u32>,
    /// Declared spare capacity for other zones; derived from `capacity_per_s` when unset.
    pub spare_per_s: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub weights: BTreeMap<IpAddr, u32>,
    /// New flows per second the VIP admits; `None` when some backend declares no capacity,
    /// or none serves.
    pub budget_per_s: Option<u32>,
    /// Flows per second sent to other zones (0 when no zone is short or none has spare).
    pub spill_per_s: u32,
}

/// Places `candidates` for a balancer in `local_zone`. `spare_fraction` is the share of a
/// remote backend's capacity it can lend when it declares no spare of its own.
pub fn place(local_zone: Option<&str>, candidates: &[Candidate<'_>], spare_fraction: f64) -> Placement {
    let active: Vec<&Candidate<'_>> = candidates.iter().filter(|c| c.configured_weight > 0).collect();
    let is_local = |c: &Candidate<'_>| local_zone.is_none() || c.zone.is_none_or(|z| Some(z) == local_zone);
    let mut weights: BTreeMap<IpAddr, u32> = candidates.iter().map(|c| (c.backend, c.weight)).collect();
    // A VIP without a serving backend declares no capacity: no budget (an empty `all` would
    // say it declared 0, which the budget turns into 1 new flow a second).
    let declared = !active.is_empty() && active.iter().all(|c| c.capacity_per_s.is_some());
    let (local, remote): (Vec<&Candidate<'_>>, Vec<&Candidate<'_>>) = active.iter().partition(|c| is_local(c));

    if !declared {
        // Without capacities there is nothing to size a spill by: stay local while any
        // local backend is programmed, else use the other zones as the health plan left them.
        if local.iter().any(|c| c.weight > 0) {
            for c in &remote {
                weights.insert(c.backend, 0);
            }
        }
        return Placement { weights, budget_per_s: None, spill_per_s: 0 };
    }

    let local_full: u64 = local.iter().map(|c| capacity(c)).sum();
    let local_now: u64 = local.iter().map(|c| in_service(c, capacity(c))).sum();
    let spares: Vec<(IpAddr, u64)> = remote
        .iter()
        .map(|c| {
            let spare = c.spare_per_s.map_or_else(|| (capacity(c) as f64 * spare_fraction).floor() as u64, u64::from);
            (c.backend, in_service(c, spare))
        })
        .collect();
    let spare_total: u64 = spares.iter().map(|(_, s)| s).sum();
    let spill = local_full.saturating_sub(local_now).min(spare_total);

    if spill > 0 {
        // Weights in flows per second: each local backend its capacity in service, the other
        // zones their spare, scaled so that together they take exactly the spill.
        for c in &local {
            weights.insert(c.backend, to_weight(in_service(c, capacity(c))));
        }
        for (backend, spare) in &spares {
            weights.insert(*backend, to_weight(spare * spill / spare_total));
        }
    } else {
        for c in &remote {
            weights.insert(c.backend, 0);
        }
    }
    Placement { weights, budget_per_s: Some(to_weight(local_now + spill)), spill_per_s: to_weight(spill) }
}

fn capacity(c: &Candidate<'_>) -> u64 {
    u64::from(c.capacity_per_s.unwrap_or(0))
}

/// `figure` scaled by the backend's programmed share of its configured weight.
fn in_service(c: &Candidate<'_>, figure: u64) -> u64 {
    if c.configured_weight == 0 {
        return 0;
    }
    figure * u64::from(c.weight.min(c.configured_weight)) / u64::from(c.configured_weight)
}

fn to_weight(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_model::testing::be;

    /// `(zone, weight the health plan gave, capacity)`; configured weight 100 each.
    fn candidates(spec: &[(&'static str, u32, Option<u32>)]) -> Vec<Candidate<'static>> {
        spec.iter()
            .enumerate()
            .map(|(i, (zone, weight, capacity))| Candidate {
                backend: be(i as u8 + 1),
                zone: (!zone.is_empty()).then_some(*zone),
                configured_weight: 100,
                weight: *weight,
                capacity_per_s: *capacity,
                spare_per_s: None,
            })
            .collect()
    }

    fn weights(p: &Placement) -> Vec<u32> {
        p.weights.values().copied().collect()
    }

    #[test]
    fn healthy_local_zone_keeps_every_new_flow() {
        let c = candidates(&[("a", 100, Some(500)), ("a", 100, Some(500)), ("b", 100, Some(500))]);
        let p = place(Some("a"), &c, 0.2);
        assert_eq!(weights(&p), [100, 100, 0]);
        assert_eq!(p.budget_per_s, Some(1000));
        assert_eq!(p.spill_per_s, 0);
    }

    #[test]
    fn a_failed_local_zone_spills_only_the_remote_spare_and_the_budget_sheds_the_rest() {
        // Zone a ejected by the health plan; zone b lends 20% of 2 × 500.
        let c = candidates(&[("a", 0, Some(500)), ("a", 0, Some(500)), ("b", 100, Some(500)), ("b", 100, Some(500))]);
        let p = place(Some("a"), &c, 0.2);
        assert_eq!(p.spill_per_s, 200);
        assert_eq!(p.budget_per_s, Some(200));
        assert_eq!(weights(&p), [0, 0, 100, 100]);
    }

    #[test]
    fn a_partly_failed_local_zone_spills_its_shortfall_in_proportion() {
        let mut c = candidates(&[("a", 100, Some(500)), ("a", 0, Some(500)), ("b", 100, Some(1000))]);
        c[2].spare_per_s = Some(800);
        let p = place(Some("a"), &c, 0.2);
        // Short by 500, b lends up to 800: 500 spill, 500 local.
        assert_eq!(p.spill_per_s, 500);
        assert_eq!(p.budget_per_s, Some(1000));
        assert_eq!(weights(&p), [500, 0, 500]);
    }

    #[test]
    fn slow_start_lowers_capacity_in_service() {
        let c = candidates(&[("", 100, Some(400)), ("", 25, Some(400)), ("", 0, Some(400))]);
        let p = place(None, &c, 0.2);
        assert_eq!(p.budget_per_s, Some(500));
        assert_eq!(weights(&p), [100, 25, 0]);
    }

    #[test]
    fn without_capacities_zones_still_prefer_local_but_nothing_is_budgeted() {
        let c = candidates(&[("a", 100, None), ("b", 100, None)]);
        let p = place(Some("a"), &c, 0.2);
        assert_eq!((weights(&p), p.budget_per_s), (vec![100, 0], None));
        let c = candidates(&[("a", 0, None), ("b", 100, None)]);
        assert_eq!(weights(&place(Some("a"), &c, 0.2)), [0, 100]);
    }

    #[test]
    fn without_a_local_zone_every_backend_is_local() {
        let c = candidates(&[("a", 100, Some(100)), ("b", 0, Some(100))]);
        let p = place(None, &c, 0.2);
        assert_eq!((weights(&p), p.budget_per_s), (vec![100, 0], Some(100)));
    }

    #[test]
    fn draining_backends_neither_count_nor_receive() {
        let mut c = candidates(&[("a", 100, Some(100)), ("a", 0, Some(100)), ("b", 100, Some(100))]);
        c[1].configured_weight = 0;
        let p = place(Some("a"), &c, 0.5);
        assert_eq!((weights(&p), p.budget_per_s), (vec![100, 0, 0], Some(100)));
    }

    #[test]
    fn a_vip_without_serving_backends_has_no_budget() {
        assert_eq!(place(None, &[], 0.2).budget_per_s, None);
        let mut c = candidates(&[("", 0, Some(100))]);
        c[0].configured_weight = 0;
        assert_eq!(place(None, &c, 0.2).budget_per_s, None, "only a draining backend");
    }
}
