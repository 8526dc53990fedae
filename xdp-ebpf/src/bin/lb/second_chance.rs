//! Second chance (after GitHub GLB's): a TCP packet of a connection this balancer has no
//! entry for (it began on another balancer, which died or lost it to ECMP), whose slot the
//! VIP's last table change moved, may belong to either backend: the one the table gives it
//! now or the one the table before the change gave it. It goes to the first inside a tunnel
//! to the second (`encap::push_nested`); the first keeps it if it has the connection and
//! sends it on otherwise (`spillway_decap`). Such packets are never remembered (every one
//! of them needs both candidates) and never limited (they are not new connections).

use spillway_common::types::{BACKEND_ACTIVE, VipMeta};

use crate::{
    maps::{BACKENDS, PRIOR_RINGS, PRIOR_SIZE, RINGS, SECOND_CHANCE},
    select::Choice,
};

/// The flow's backend now and its backend before the VIP's last change, when they differ.
#[inline(always)]
pub fn candidates(vip: &VipMeta, hash: u32) -> Option<(Choice, Choice)> {
    let prior_size = *PRIOR_SIZE.get(vip.id)?;
    if prior_size == 0 || vip.ring_size == 0 {
        return None;
    }
    let first = *RINGS.get(VipMeta::ring_base(vip.id, vip.active_half) + hash % vip.ring_size)?;
    let second = *PRIOR_RINGS.get(VipMeta::prior_base(vip.id) + hash % prior_size)?;
    if first == second {
        return None;
    }
    Some((active(first)?, active(second)?))
}

#[inline(always)]
fn active(id: u32) -> Option<Choice> {
    let backend = *BACKENDS.get(id)?;
    (backend.state == BACKEND_ACTIVE).then_some(Choice { id, backend })
}

#[inline(always)]
pub fn count() {
    if let Some(n) = SECOND_CHANCE.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}
